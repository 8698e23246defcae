"""The `contextd` command: serve, migrate, prune, certificates, watch, health, mcp, config.

    contextd serve [--listen HOST:PORT] [--database-url URL] [--redis-url URL] ...
    contextd migrate [--revision REV | --downgrade REV]
    contextd prune --session ID [--tenant T] [--format F] [--budget N] [--apply]
    contextd certificates verify --session ID [--tenant T]
    contextd watch [--session ID] [--cursor C] [--target HOST:PORT] [--api-key-file F] [--tls-ca F]
    contextd health [--target HOST:PORT] [--service NAME] [--tls-ca F]
    contextd mcp [--session ID] [--target HOST:PORT] [--transport stdio|streamable-http] [--listen HOST:PORT]
    contextd config [--markdown]

Every setting has an environment variable (service/contextd/config.py); each command
takes as flags the settings it uses (`serve` and `config` all of them).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from contextd.config import ConfigError, Settings, env_name, markdown_table
from contextd.logs import configure_logging
from contextd.proxy import ANTHROPIC, OPENAI

# The settings an operator command reads; the rest still come from the environment.
_MIGRATE_SETTINGS = ("database_url", "log_level", "log_format")
_OPERATOR_SETTINGS = ("database_url", "lock_timeout_ms", "log_level", "log_format")
_MCP_LISTEN = "127.0.0.1:8000"
_PROXY_LISTEN = "127.0.0.1:8787"
_PROXY_SETTINGS = ("log_level", "log_format", "otel_exporter", "otel_endpoint", "metrics_listen", "metrics_interval_ms")


def _add_setting_flags(parser: argparse.ArgumentParser, only: Sequence[str] | None = None) -> None:
    for f in dataclasses.fields(Settings):
        if only is not None and f.name not in only:
            continue
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{f.metadata['help']} [{env_name(f.name)}, default: {f.default!r}]"
        if isinstance(f.default, bool):
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            choices = f.metadata["choices"] or None
            parser.add_argument(flag, dest=f.name, type=type(f.default), choices=choices, default=None, help=help_text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="contextd", description="A context service for LLM agents.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the gRPC server")
    _add_setting_flags(serve)
    migrate = commands.add_parser("migrate", help="upgrade (or downgrade) the database schema")
    _add_setting_flags(migrate, _MIGRATE_SETTINGS)
    migrate.add_argument("--revision", default="head", help="upgrade to this revision (default: head)")
    migrate.add_argument("--downgrade", metavar="REVISION", help="downgrade to this revision instead ('base': empty)")
    prune = commands.add_parser("prune", help="show (and with --apply, take) what the session's rules would prune")
    _add_setting_flags(prune, _OPERATOR_SETTINGS)
    _add_session_flags(prune)
    # engine.view.ViewFormat's values, spelled out: the engine is not imported to parse a command line.
    formats = ["openai_chat", "anthropic_messages", "openai_responses", "bedrock_converse"]
    prune.add_argument("--format", default="openai_chat", choices=formats)
    prune.add_argument("--budget", type=int, default=0, help="the view's budget in tokens (default: none)")
    prune.add_argument("--apply", action="store_true", help="apply every eligible edit now and certify it")
    certificates = commands.add_parser("certificates", help="the certificate log")
    certificate_commands = certificates.add_subparsers(dest="certificates_command", required=True)
    verify = certificate_commands.add_parser("verify", help="check a session's certificate hash chain")
    _add_setting_flags(verify, _OPERATOR_SETTINGS)
    _add_session_flags(verify)
    watch = commands.add_parser("watch", help="print a running server's session events as they come (JSON lines)")
    watch.add_argument("--session", default="", help="the session to watch (default: every session of the tenant)")
    watch.add_argument("--cursor", default="", help="resume after this cursor (default: from now on)")
    watch.add_argument("--target", default="127.0.0.1:50051", help="the server (default: 127.0.0.1:50051)")
    watch.add_argument("--api-key-file", help="a file holding the API key (the tenant's sessions are watched)")
    watch.add_argument("--tls-ca", help="PEM file of the CA that signed the server's certificate (TLS)")
    watch.add_argument("--heartbeats", action="store_true", help="print heartbeats too")
    health = commands.add_parser(
        "health", help="ask a server's gRPC health service; exit 0 when SERVING (a container's health check)"
    )
    health.add_argument("--target", default="127.0.0.1:50051", help="the server (default: 127.0.0.1:50051)")
    health.add_argument("--service", default="", help="the service to ask about (default: the server as a whole)")
    health.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer (default: 3)")
    health.add_argument("--tls-ca", help="PEM file of the CA that signed the server's certificate (TLS)")
    mcp = commands.add_parser(
        "mcp", help="serve contextd's agent tools to an MCP host (stdio, or streamable HTTP), through a running server"
    )
    _add_setting_flags(mcp, ("log_level", "log_format"))
    mcp.add_argument(
        "--session",
        help="the session the tools act on; over HTTP, the default for requests without an x-contextd-session header",
    )
    _add_remote_flags(mcp, "the tools see the key's tenant", "a tool call", 10.0)
    mcp.add_argument("--transport", default="stdio", choices=["stdio", "streamable-http"], help="(default: stdio)")
    mcp.add_argument(
        "--listen",
        dest="mcp_listen",
        metavar="HOST:PORT",
        help=f"where streamable HTTP answers, at /mcp (default: {_MCP_LISTEN}; port 0: any free one)",
    )
    proxy = commands.add_parser(
        "proxy",
        help="an HTTP proxy for the OpenAI and Anthropic APIs that sends contextd's views in place of "
        "the conversations (point an SDK's base_url at it)",
    )
    _add_setting_flags(proxy, _PROXY_SETTINGS)
    _add_remote_flags(proxy, "the sessions are its tenant's; a request's x-contextd-api-key wins", "a request", 2.0)
    proxy.add_argument(
        "--listen",
        dest="proxy_listen",
        metavar="HOST:PORT",
        default=_PROXY_LISTEN,
        help=f"where the proxy answers (default: {_PROXY_LISTEN}; port 0: any free one)",
    )
    proxy.add_argument(
        "--openai-upstream", default=OPENAI, help=f"where OpenAI requests go (default: {OPENAI})", metavar="URL"
    )
    proxy.add_argument(
        "--anthropic-upstream",
        default=ANTHROPIC,
        help=f"where Anthropic requests go (default: {ANTHROPIC})",
        metavar="URL",
    )
    proxy.add_argument(
        "--budget",
        type=int,
        default=0,
        help="the views' budget in tokens when a request names none in x-contextd-budget "
        "(default: 0, the model's window less the answer's room)",
    )
    proxy.add_argument(
        "--grace-seconds",
        type=float,
        default=25.0,
        help="after SIGTERM, seconds the answers under way have to finish (default: 25)",
    )
    proxy.add_argument(
        "--backoff",
        type=float,
        default=5.0,
        help="seconds the proxy sends requests unchanged after contextd failed (default: 5)",
    )
    config = commands.add_parser("config", help="print the effective configuration")
    _add_setting_flags(config)
    config.add_argument("--markdown", action="store_true", help="print the settings table for the README")
    return parser


def _add_remote_flags(parser: argparse.ArgumentParser, tenant: str, call: str, timeout: float) -> None:
    """How a command beside the server reaches it (`contextd mcp`, `contextd proxy`)."""
    parser.add_argument("--target", default="127.0.0.1:50051", help="the contextd server (default: 127.0.0.1:50051)")
    parser.add_argument("--api-key-file", help=f"a file holding the API key ({tenant})")
    parser.add_argument("--tls-ca", help="PEM file of the CA that signed the server's certificate (TLS)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=timeout,
        help=f"seconds {call} may spend on contextd, retries included (default: {timeout:g})",
    )


def _connection(args: argparse.Namespace) -> Any:
    """The `--target`, `--api-key-file`, `--tls-ca` and `--timeout` of a command beside the
    server, as a `remote.Connection`; None, said on stderr, when a file cannot be read."""
    import grpc

    from contextd.remote import Connection

    try:
        api_key = Path(args.api_key_file).read_text().strip() if args.api_key_file else None
        credentials = grpc.ssl_channel_credentials(Path(args.tls_ca).read_bytes()) if args.tls_ca else None
    except OSError as exc:
        print(f"contextd: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return None
    return Connection(args.target, api_key, credentials, args.timeout)


def _add_session_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--session", required=True, help="the session id")
    parser.add_argument("--tenant", default="default", help="the session's tenant (default: default)")


def _settings(args: argparse.Namespace) -> Settings:
    names = {f.name for f in dataclasses.fields(Settings)}
    overrides: dict[str, Any] = {k: v for k, v in vars(args).items() if k in names}
    return Settings.load(os.environ, overrides)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = _settings(args)
    except ConfigError as exc:
        print(f"contextd: configuration error: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings)
    if args.command == "config":
        if args.markdown:
            print(markdown_table())
        else:
            for name, value in settings.redacted().items():
                print(f"{name} = {value}")
        return 0
    if args.command == "migrate":
        return _migrate(settings, args.revision, args.downgrade)
    if args.command in ("prune", "certificates"):
        return _operate(settings, args)
    if args.command == "watch":
        return _watch(args)
    if args.command == "health":
        return _health(args)
    if args.command == "mcp":
        return _mcp(args)
    if args.command == "proxy":
        return _proxy(settings, args)
    from contextd.api.server import StartupError, serve

    runner = asyncio.Runner()
    try:
        runner.run(serve(settings))
    except StartupError as exc:
        print(f"contextd: cannot start: {exc}", file=sys.stderr)
        runner.close()
        return 1
    except KeyboardInterrupt:  # Ctrl-C before the server was up
        runner.close()
        return 130
    # The server has stopped and closed what it owns (pool, stash, spans). What can
    # remain is not worth the wait: a task of a call cancelled mid-flight waiting on a
    # database driver thread (an SQLite busy wait, say), which closing the loop would
    # wait for; a render thread past the grace period, which the interpreter would join;
    # and the heap, which it would free object by object (a second on a large replica).
    logging.shutdown()
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(0)


def _operate(settings: Settings, args: argparse.Namespace) -> int:
    from contextd import admin
    from contextd.engine.errors import ContextdError, SessionNotFound

    try:
        if args.command == "prune":
            return admin.prune(settings, args.tenant, args.session, args.format, args.budget, args.apply)
        return admin.verify(settings, args.tenant, args.session)
    except SessionNotFound:
        hint = _tenants_hint(settings, args.tenant)
        print(f"contextd: session {args.session!r} not found in tenant {args.tenant!r}{hint}", file=sys.stderr)
        return 1
    except ContextdError as exc:
        print(f"contextd: {exc.message}", file=sys.stderr)
        return 1


def _watch(args: argparse.Namespace) -> int:
    """Print each event as one JSON object a line, until interrupted (or the session is deleted)."""
    import json

    import grpc

    from contextd_client import Client, ContextdError

    try:
        api_key = Path(args.api_key_file).read_text().strip() if args.api_key_file else None
        credentials = grpc.ssl_channel_credentials(Path(args.tls_ca).read_bytes()) if args.tls_ca else None
    except OSError as exc:
        print(f"contextd: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    with Client(args.target, api_key=api_key, credentials=credentials) as client:
        watch = client.watch_session(args.session, cursor=args.cursor, heartbeats=args.heartbeats)
        try:
            for event in watch:
                line = {"cursor": event.cursor, "session_id": event.session_id, "time": event.time.isoformat()}
                print(json.dumps(line | {"kind": event.kind, **event.details}), flush=True)
        except ContextdError as exc:
            print(f"contextd: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print(f"contextd: stopped; resume with --cursor {watch.cursor}", file=sys.stderr)
            return 130
    return 0


def _health(args: argparse.Namespace) -> int:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    if args.tls_ca:
        try:
            authority = Path(args.tls_ca).read_bytes()
        except OSError as exc:
            print(f"contextd: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
            return 2
        channel = grpc.secure_channel(args.target, grpc.ssl_channel_credentials(authority))
    else:
        channel = grpc.insecure_channel(args.target)
    with channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout
            )
        except grpc.RpcError as exc:
            print(f"contextd: {args.target}: {exc.code().name} {exc.details()}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
    print(status)
    return 0 if answer.status == health_pb2.HealthCheckResponse.SERVING else 1


def _mcp(args: argparse.Namespace) -> int:
    """Serve the agent tools over MCP until the host closes stdin (stdio) or a signal (HTTP)."""
    from contextd.remote import bind

    if args.transport == "stdio" and args.mcp_listen is not None:
        print("contextd: --listen is for --transport streamable-http", file=sys.stderr)
        return 2
    try:
        from contextd import mcp_server
    except ModuleNotFoundError as exc:  # the MCP SDK and its server are an extra
        if (exc.name or "").partition(".")[0] not in ("mcp", "mcp_types", "starlette", "uvicorn"):
            raise
        print(f"contextd: the mcp command needs the mcp extra: pip install 'contextd[mcp]' ({exc})", file=sys.stderr)
        return 2
    connection = _connection(args)
    if connection is None:
        return 2
    if args.transport == "stdio":
        if not args.session:
            logging.getLogger(__name__).warning("no --session: every tool call will be refused")
        try:
            asyncio.run(mcp_server.serve_stdio(connection, args.session))
        except KeyboardInterrupt:
            return 130
        return 0
    listen = args.mcp_listen or _MCP_LISTEN
    try:
        listening = bind(listen)
    except (OSError, ValueError) as exc:
        print(f"contextd: cannot listen on {listen}: {exc}", file=sys.stderr)
        return 1
    with listening:
        asyncio.run(mcp_server.serve_http(connection, args.session, listening))
    return 0


def _proxy(settings: Settings, args: argparse.Namespace) -> int:
    """Serve the proxy until SIGINT or SIGTERM."""
    from contextd.remote import bind

    try:
        from contextd.proxy.serve import serve
    except ModuleNotFoundError as exc:  # its HTTP stack is an extra
        if (exc.name or "").partition(".")[0] not in ("starlette", "uvicorn", "httpx2"):
            raise
        extra = "pip install 'contextd[proxy]'"
        print(f"contextd: the proxy command needs the proxy extra: {extra} ({exc})", file=sys.stderr)
        return 2
    from contextd.proxy.app import Settings as ProxySettings

    connection = _connection(args)
    if connection is None:
        return 2
    # A request whose contextd is down goes upstream unchanged, which costs the agent nothing:
    # better soon than after riding out a restart.
    connection = dataclasses.replace(connection, retry_budget=min(0.5, connection.timeout))
    proxy = ProxySettings(
        connection, args.openai_upstream, args.anthropic_upstream, args.budget, args.backoff, grace=args.grace_seconds
    )
    try:
        listening = bind(args.proxy_listen)
    except (OSError, ValueError) as exc:
        print(f"contextd: cannot listen on {args.proxy_listen}: {exc}", file=sys.stderr)
        return 1
    with listening:
        asyncio.run(serve(settings, proxy, listening))
    return 0


def _tenants_hint(settings: Settings, tenant: str) -> str:
    """With API keys on, sessions belong to the keys' tenants: say which, when `tenant` is none of them."""
    tenants = sorted(set(settings.tenant_keys().values()))
    if not tenants or tenant in tenants:
        return ""
    return f" (API keys are on, so sessions belong to the tenants they name: {', '.join(tenants)}; pass --tenant)"


def _migrate(settings: Settings, revision: str, downgrade_to: str | None) -> int:
    from sqlalchemy.exc import DBAPIError

    from contextd_storage import migrate

    try:
        if downgrade_to:
            asyncio.run(migrate.downgrade(settings.database_url, downgrade_to))
        else:
            asyncio.run(migrate.upgrade(settings.database_url, revision))
        current = asyncio.run(migrate.current_revision(settings.database_url))
    except (OSError, DBAPIError) as exc:
        print(f"contextd: cannot migrate {settings.redacted()['database_url']}: {exc}", file=sys.stderr)
        return 1
    print(f"database at revision {current or 'base'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
