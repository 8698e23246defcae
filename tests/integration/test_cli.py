"""The `contextd` command as a user runs it: serve on the embedded default,
shut down gracefully without losing acknowledged work, migrate, configure."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from contextd_client import Client, ContextdError, RetryPolicy
from contextd_client.v1 import content_pb2 as pb
from contextd_lab.service import SERVING, ServerProcess
from contextd_storage import migrate


def user(text: str) -> pb.Item:
    return pb.Item(role=pb.ROLE_USER, content=[pb.ContentBlock(text=pb.TextBlock(text=text))])


def health(target: str, service: str = "") -> int:
    with grpc.insecure_channel(target) as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return int(response.status)


def test_serve_on_the_embedded_default_and_keep_data_across_restarts(tmp_path: Path) -> None:
    server = ServerProcess(cwd=tmp_path).wait_serving()
    try:
        assert health(server.target) == health_pb2.HealthCheckResponse.SERVING
        assert health(server.target, "contextd.v1.ContextService") == health_pb2.HealthCheckResponse.SERVING
        with Client(server.target) as client:
            client.create_session("kept")
            client.append_items("kept", [user("remember me")])
    finally:
        server.terminate()
    assert server.wait() == 0
    assert any("stopped" in line for line in server.log)
    assert (tmp_path / "contextd.db").exists()

    again = ServerProcess(cwd=tmp_path).wait_serving()
    try:
        with Client(again.target) as client:
            assert client.render_openai("kept") == [{"role": "user", "content": "remember me"}]
    finally:
        again.stop()


def test_shutdown_drains_and_loses_nothing_acknowledged(tmp_path: Path) -> None:
    server = ServerProcess("--grace-seconds", "5", cwd=tmp_path).wait_serving()
    acked: list[str] = []
    failures: list[ContextdError] = []
    stop = threading.Event()

    def write() -> None:
        with Client(server.target, retry=RetryPolicy(max_attempts=1), timeout=5) as client:
            client.create_session("busy")
            n = 0
            while not stop.is_set():
                try:
                    client.append_items("busy", [user(f"item {n}")])
                    acked.append(f"item {n}")
                except ContextdError as error:
                    failures.append(error)
                    return
                n += 1

    writer = threading.Thread(target=write)
    writer.start()
    while len(acked) < 50:
        threading.Event().wait(0.01)
    server.terminate()
    assert server.wait() == 0
    stop.set()
    writer.join(10)
    # A call cut off by the shutdown is refused as retryable, never INTERNAL.
    assert all(f.code in ("UNAVAILABLE", "CANCELLED") for f in failures), failures

    again = ServerProcess(cwd=tmp_path).wait_serving()
    try:
        with Client(again.target) as client:
            stored = [m["content"] for m in client.render_openai("busy")]
    finally:
        again.stop()
    assert stored[: len(acked)] == acked  # every acknowledged append survived, in order
    assert len(stored) - len(acked) <= 1  # at most the one whose answer the shutdown cut off


def test_a_call_in_flight_at_sigterm_completes_within_the_grace_period(tmp_path: Path) -> None:
    import sqlite3

    server = ServerProcess("--grace-seconds", "8", cwd=tmp_path).wait_serving()
    with Client(server.target, timeout=20, retry=RetryPolicy(max_attempts=1)) as client:
        client.create_session("slow")
        # Another process holds the database's write lock, so the next append
        # waits inside the server: it is in flight when the signal arrives.
        blocker = sqlite3.connect(tmp_path / "contextd.db", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        outcome: list[object] = []
        caller = threading.Thread(target=lambda: outcome.append(client.append_items("slow", [user("in flight")])))
        caller.start()
        threading.Event().wait(0.5)
        server.terminate()
        threading.Event().wait(1.0)
        assert caller.is_alive() and server.process.poll() is None  # draining, not dead
        blocker.execute("COMMIT")
        blocker.close()
        caller.join(20)
    assert server.wait() == 0
    assert len(outcome) == 1 and getattr(outcome[0], "first_seq", None) == 1, outcome
    again = ServerProcess(cwd=tmp_path).wait_serving()
    try:
        with Client(again.target) as client:
            assert client.render_openai("slow") == [{"role": "user", "content": "in flight"}]
    finally:
        again.stop()


def test_a_second_signal_stops_without_waiting_for_the_grace_period(tmp_path: Path) -> None:
    import sqlite3

    server = ServerProcess("--grace-seconds", "60", cwd=tmp_path).wait_serving()
    with Client(server.target, timeout=30, retry=RetryPolicy(max_attempts=1)) as client:
        client.create_session("stuck")
        blocker = sqlite3.connect(tmp_path / "contextd.db", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # the next append waits inside the server
        failures: list[ContextdError] = []

        def append() -> None:
            try:
                client.append_items("stuck", [user("never")])
            except ContextdError as error:
                failures.append(error)

        caller = threading.Thread(target=append)
        caller.start()
        threading.Event().wait(0.5)
        server.terminate()
        threading.Event().wait(0.5)
        server.terminate()
        try:
            assert server.wait(timeout=10) == 0  # well inside the 60 s grace period
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        caller.join(10)
    assert [f.code for f in failures] in (["CANCELLED"], ["UNAVAILABLE"])
    assert any("second signal" in line for line in server.log)


# Generous for a loaded machine: without the bound the process stays up as long as the call
# in flight does (60 s here). bench/startup.py measures the tight figure (grace + 0.5 s).
EXIT_MARGIN_SECONDS = 5.0


def call_in_flight(call: Callable[[], object], outcome: list[str]) -> threading.Thread:
    def run() -> None:
        try:
            call()
            outcome.append("completed")
        except ContextdError as error:
            outcome.append(error.code)

    caller = threading.Thread(target=run)
    caller.start()
    threading.Event().wait(0.5)  # under way inside the server
    return caller


def test_sigterm_ends_the_process_after_the_grace_period_even_with_a_driver_thread_blocked(tmp_path: Path) -> None:
    import sqlite3

    # The append waits in SQLite's busy handler, on the driver's thread, for up to a minute.
    server = ServerProcess("--grace-seconds", "1", "--lock-timeout-ms", "60000", cwd=tmp_path).wait_serving()
    outcome: list[str] = []
    with Client(server.target, timeout=90, retry=RetryPolicy(max_attempts=1)) as client:
        client.create_session("held")
        blocker = sqlite3.connect(tmp_path / "contextd.db", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock throughout
        try:
            caller = call_in_flight(lambda: client.append_items("held", [user("in flight")]), outcome)
            signalled = time.monotonic()
            server.terminate()
            code = server.wait(timeout=90)
            took = time.monotonic() - signalled
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        caller.join(10)
    assert (code, took < 1 + EXIT_MARGIN_SECONDS) == (0, True), (code, took, server.log)
    assert outcome in (["UNAVAILABLE"], ["CANCELLED"]), outcome


SLOW_RENDERS = """
import sys, time
import contextd.view_service

render = contextd.view_service._render

def slow(*args, **kwargs):
    time.sleep(60)  # on the render thread: nothing can interrupt it
    return render(*args, **kwargs)

contextd.view_service._render = slow
from contextd.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_ends_the_process_after_the_grace_period_even_with_a_render_under_way(tmp_path: Path) -> None:
    command = [sys.executable, "-c", SLOW_RENDERS, "serve", "--listen", "127.0.0.1:0", "--grace-seconds", "1"]
    outcome: list[str] = []
    with subprocess.Popen(command, cwd=tmp_path, stderr=subprocess.PIPE, text=True) as process:
        assert process.stderr is not None
        log = []
        for line in process.stderr:
            log.append(line)
            if match := SERVING.search(line):
                break
        assert match is not None, log
        with Client(f"127.0.0.1:{match.group(1)}", timeout=90, retry=RetryPolicy(max_attempts=1)) as client:
            client.create_session("rendering")
            client.append_items("rendering", [user("a render takes a minute")])
            caller = call_in_flight(lambda: client.render_openai("rendering"), outcome)
            signalled = time.monotonic()
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=90)
            took = time.monotonic() - signalled
            caller.join(10)
        log.append(process.stderr.read())
    assert (code, took < 1 + EXIT_MARGIN_SECONDS) == (0, True), (code, took, log)
    assert outcome in (["UNAVAILABLE"], ["CANCELLED"]), outcome


def contextd(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "contextd", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_migrate_up_and_down(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'm.db'}"
    up = contextd("migrate", "--database-url", url, cwd=tmp_path)
    assert up.returncode == 0 and f"database at revision {migrate.head_revision()}" in up.stdout
    down = contextd("migrate", "--database-url", url, "--downgrade", "base", cwd=tmp_path)
    assert down.returncode == 0 and "database at revision base" in down.stdout


def test_bad_configuration_is_reported_without_a_traceback(tmp_path: Path) -> None:
    env_error = contextd("serve", cwd=tmp_path, env={"CONTEXTD_MAX_ITEM_BYTES": "lots"})
    assert env_error.returncode == 2
    assert "CONTEXTD_MAX_ITEM_BYTES='lots'" in env_error.stderr and "Traceback" not in env_error.stderr
    bad_choice = contextd("serve", cwd=tmp_path, env={"CONTEXTD_OTEL_EXPORTER": "jaeger"})
    assert bad_choice.returncode == 2 and "otel_exporter must be one of none, console, otlp" in bad_choice.stderr
    bad_keys = contextd("config", "--api-keys", "no-colon", cwd=tmp_path)
    assert bad_keys.returncode == 2 and "api_keys entries are tenant:key" in bad_keys.stderr


def test_startup_problems_are_explained_without_a_traceback(tmp_path: Path) -> None:
    running = ServerProcess(cwd=tmp_path).wait_serving()
    try:
        taken = contextd("serve", "--listen", running.target, "--database-url", "sqlite:///other.db", cwd=tmp_path)
    finally:
        running.stop()
    unreachable = contextd("serve", "--database-url", "postgresql://nobody@127.0.0.1:1/none", cwd=tmp_path)
    unmigrated = contextd("serve", "--database-url", "sqlite:///fresh.db", "--no-migrate-on-start", cwd=tmp_path)
    in_memory = contextd("serve", "--database-url", "sqlite://", cwd=tmp_path)
    unknown = contextd("serve", "--database-url", "mysql://root@db/x", cwd=tmp_path)
    for result, code, words in [
        (taken, 1, f"cannot start: cannot listen on {running.target}"),
        (unreachable, 1, "cannot start: cannot reach the database at postgresql+asyncpg://nobody@127.0.0.1:1/none"),
        (unmigrated, 1, f"has schema revision none, not {migrate.head_revision()}: run `contextd migrate`"),
        (in_memory, 2, "an in-memory SQLite database cannot be shared"),
        (unknown, 2, "database_url must be postgresql://user@host/db or sqlite:///path/file.db"),
    ]:
        assert (result.returncode, "Traceback" in result.stderr) == (code, False), result.stderr
        assert words in result.stderr


def test_plain_database_urls_get_the_async_driver(tmp_path: Path) -> None:
    shown = contextd("config", "--database-url", "postgresql://app@db/contextd", cwd=tmp_path)
    assert "database_url = postgresql+asyncpg://app@db/contextd" in shown.stdout


def test_config_shows_settings_but_hides_secrets(tmp_path: Path) -> None:
    shown = contextd(
        "config",
        "--database-url",
        "postgresql+asyncpg://app:hunter2@db.internal/contextd",
        cwd=tmp_path,
        env={"CONTEXTD_API_KEYS": "acme:s3cret", "CONTEXTD_LOCK_TIMEOUT_MS": "750"},
    )
    assert shown.returncode == 0
    assert "s3cret" not in shown.stdout and "hunter2" not in shown.stdout
    assert "api_keys = ***" in shown.stdout and "lock_timeout_ms = 750" in shown.stdout
    assert "database_url = postgresql+asyncpg://app:***@db.internal/contextd" in shown.stdout


@pytest.mark.parametrize("reachable", [True, False])
def test_serving_with_redis_configured(tmp_path: Path, redis_url: str, reachable: bool) -> None:
    url = redis_url if reachable else "redis://127.0.0.1:1/0"
    server = ServerProcess("--redis-url", url, cwd=tmp_path).wait_serving()
    try:
        with Client(server.target) as client:
            client.create_session("with-redis")
    finally:
        server.stop()
    expected = "redis reachable" if reachable else "redis unreachable"
    assert any(expected in line for line in server.log), server.log


def test_operator_commands_show_their_own_flags_only(tmp_path: Path) -> None:
    for command in (("prune",), ("certificates", "verify"), ("migrate",)):
        usage = contextd(*command, "--help", cwd=tmp_path)
        assert usage.returncode == 0 and "--database-url" in usage.stdout
        assert not {"--listen", "--redis-url", "--api-keys", "--tls-cert"} & set(usage.stdout.split()), command
    assert "--listen" in contextd("serve", "--help", cwd=tmp_path).stdout


def test_prune_and_verify_a_session_of_a_tenant_and_name_the_tenant_when_it_is_not_found(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'ops.db'}"
    keys = {"CONTEXTD_API_KEYS": "acme:k-acme,globex:k-globex"}
    server = ServerProcess("--database-url", url, cwd=tmp_path, env=keys).wait_serving()
    with server, Client(server.target, api_key="k-acme") as client:
        client.create_session("ops")
        client.append_items("ops", [user("hello"), user("again")])
        client.render_openai("ops")

    pruned = contextd("prune", "--database-url", url, "--session", "ops", "--tenant", "acme", cwd=tmp_path, env=keys)
    assert pruned.returncode == 0, pruned.stderr
    assert "session ops (tenant acme)" in pruned.stdout and "would be taken (dry run" in pruned.stdout
    verified = contextd(
        "certificates", "verify", "--database-url", url, "--session", "ops", "--tenant", "acme", cwd=tmp_path
    )
    assert verified.returncode == 0 and "chain intact" in verified.stdout

    missing = contextd("prune", "--database-url", url, "--session", "ops", cwd=tmp_path, env=keys)
    assert missing.returncode == 1
    assert "session 'ops' not found in tenant 'default'" in missing.stderr
    assert "tenants they name: acme, globex; pass --tenant" in missing.stderr
    assert "Traceback" not in missing.stderr
    # Without keys there is no other tenant to point at: the tenant is named all the same.
    plain = contextd(
        "certificates", "verify", "--database-url", url, "--session", "nope", "--tenant", "acme", cwd=tmp_path
    )
    assert plain.returncode == 1 and plain.stderr.strip() == "contextd: session 'nope' not found in tenant 'acme'"


def test_watch_prints_each_event_as_a_json_line_as_it_happens(tmp_path: Path) -> None:
    import json

    with ServerProcess(cwd=tmp_path) as server, Client(server.target) as client:
        client.create_session("watched")
        command = [sys.executable, "-m", "contextd", "watch", "--target", server.target]
        with subprocess.Popen(
            [*command, "--session", "watched", "--heartbeats"], stdout=subprocess.PIPE, text=True
        ) as watcher:
            assert watcher.stdout is not None
            opening = json.loads(watcher.stdout.readline())  # joined: nothing after this is missed
            assert opening["kind"] == "heartbeat" and opening["cursor"]
            client.append_items("watched", [user("hello")], author="cli-test")
            appended = json.loads(watcher.stdout.readline())
            assert (appended["kind"], appended["session_id"]) == ("items_appended", "watched")
            assert (appended["first_seq"], appended["last_seq"], appended["author"]) == (1, 1, "cli-test")
            client.delete_session("watched")
            assert json.loads(watcher.stdout.readline())["kind"] == "session_deleted"
            assert watcher.wait(20) == 0  # the watch of a deleted session is over

        missing = subprocess.run([*command, "--session", "nope"], capture_output=True, text=True, timeout=60)
        assert (missing.returncode == 1 and "SESSION_NOT_FOUND" in missing.stderr) or "not found" in missing.stderr
        assert "Traceback" not in missing.stderr


def test_health_answers_zero_while_serving_and_one_when_nothing_answers(tmp_path: Path) -> None:
    def health_command(target: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "contextd", "health", "--target", target, "--timeout", "5"]
        return subprocess.run(command, capture_output=True, text=True, timeout=60)

    with ServerProcess(cwd=tmp_path) as server:
        serving = health_command(server.target)
        assert (serving.returncode, serving.stdout.strip()) == (0, "SERVING")
        port = server.port
    gone = health_command(f"127.0.0.1:{port}")
    assert gone.returncode == 1 and "UNAVAILABLE" in gone.stderr


def test_watch_and_health_name_a_file_they_cannot_read(tmp_path: Path) -> None:
    missing = str(tmp_path / "absent.pem")
    for command in (["watch", "--api-key-file", missing], ["health", "--tls-ca", missing]):
        done = subprocess.run([sys.executable, "-m", "contextd", *command], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, command
        assert f"cannot read {missing}" in done.stderr and "Traceback" not in done.stderr
