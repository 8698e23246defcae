"""The one configuration object.

Every setting is a field of `Settings` with its default, its environment
variable and its help text. The CLI derives its flags from the same fields
(`--database-url` for `database_url`), and the README's configuration table
is printed by `contextd config --markdown` (a test keeps the two in step).
Precedence: flag, then environment variable, then default. Nothing else in
the code reads the environment.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ENV_PREFIX = "CONTEXTD_"


MAX_MESSAGE_BYTES = 1 << 30
"""gRPC takes message sizes as 32-bit ints, and the server receives up to twice this."""


class ConfigError(ValueError):
    pass


def _setting(default: Any, help: str, choices: tuple[str, ...] = (), off: bool = False) -> Any:
    """A setting; with `off`, 0 is allowed and turns it off (numbers are positive otherwise)."""
    return field(default=default, metadata={"help": help, "choices": choices, "off": off})


@dataclass(frozen=True, slots=True)
class Settings:
    listen: str = _setting("127.0.0.1:50051", "Address the gRPC server listens on (host:port).")
    database_url: str = _setting(
        "sqlite+aiosqlite:///contextd.db",
        "SQLAlchemy URL of the history store: postgresql+asyncpg://user@host/db in production; "
        "the default is an SQLite file in the working directory.",
    )
    redis_url: str = _setting(
        "",
        "Redis URL for the stash of pruned originals, shared by replicas, e.g. redis://127.0.0.1:6379/0; "
        "without it the stash is in process (one replica). Either way the durable record answers a miss.",
    )
    redis_cluster: bool = _setting(
        False,
        "redis_url names a node of a Redis Cluster: the stash and the shared rate limits use the cluster client "
        "(a session's stash keys share one hash slot).",
    )
    stash_ttl_seconds: float = _setting(
        3600.0, "How long a pruned original stays in the stash unused (each Retrieve renews it)."
    )
    stash_session_bytes: int = _setting(
        64 * 1_048_576, "Most bytes of originals one session keeps in the stash (least recently used go first)."
    )
    carry_secret: str = _setting(
        "",
        "Secret (16 or more characters, the same on every replica) that signs the engine's work on each session "
        "kept in Redis (--redis-url), so that a restarted or new replica resumes a session without deriving it "
        "again; empty: nothing is kept. What is kept is read as a pickle: only bytes this secret signed are read.",
    )
    carry_ttl_seconds: float = _setting(
        3600.0, "How long a session's kept work (--carry-secret) stays in Redis after it was written."
    )
    carry_keep_seconds: float = _setting(
        600.0,
        "How often a replica keeps again the work on a session of 1,000 items or more that it goes on "
        "rendering (--carry-secret), so that another replica, or this one after a crash, resumes from "
        "recent work. 0: only when it derives a session, lets one go, or stops.",
        off=True,
    )
    carry_warm_seconds: float = _setting(
        10.0,
        "How long a starting replica may spend, before its service's health says SERVING (readiness), reading back the "
        "work kept (--carry-secret) on the sessions used most recently, so that their first renders on it "
        "cost what a render after one append does (a rolling restart). It stops sooner once half of "
        "--session-cache-bytes is taken; those it has no time for, --carry-follow-seconds reads once it serves "
        "(unless 0), within the same half. "
        "0: each session's is read at its first render.",
        off=True,
    )
    carry_follow_seconds: float = _setting(
        1.0,
        "How often a replica looks in Redis for the work other replicas kept (--carry-secret) since it last looked, "
        "and reads back that of the sessions it holds nothing of, while half of --session-cache-bytes is free and a "
        "render thread is to spare: their first renders on it then skip that reading, which grows with the session "
        "(in a rolling restart, the replicas left read the sessions of the one that stops; the replica that starts, "
        "those --carry-warm-seconds had no time for). Each replica may hold "
        "every session in use: with routing that keeps a session on one replica, set 0. 0: each session's is read at "
        "its first render.",
        off=True,
    )
    max_page_tokens: int = _setting(2000, "Most tokens one Retrieve page holds, whatever the client asks.")
    migrate_on_start: bool = _setting(
        True, "Upgrade the database schema when the server starts (one replica at a time on Postgres)."
    )
    max_item_bytes: int = _setting(1_048_576, "Largest item accepted, in bytes of text and data.")
    max_batch_items: int = _setting(1000, "Most items in one AppendItems call.")
    max_message_bytes: int = _setting(16 * 1_048_576, "Largest gRPC message the server receives or sends, in bytes.")
    lock_timeout_ms: int = _setting(
        5000, "Longest wait for a session's lock before the call fails with UNAVAILABLE (SESSION_BUSY)."
    )
    db_pool_size: int = _setting(
        10, "Postgres connections each server process keeps (it may open as many again under bursts)."
    )
    render_threads: int = _setting(
        4,
        "Renders that run at once in each server process, each on a thread of its own (off the event loop); "
        "one tenant takes at most all but one of them.",
    )
    render_processes: int = _setting(
        0,
        "Processes beside the serving one that run the renders (each a replica on a local socket, with "
        "--render-threads threads; a session's renders go to one of them), so that renders neither hold up the "
        "process's other calls nor share its core. 0: renders run on this process's threads.",
        off=True,
    )
    render_worker: bool = _setting(
        False,
        "Set by a server on the render processes it starts (--render-processes); not for operators: such a "
        "process serves its parent alone, ends with it, and leaves the call metrics to it.",
    )
    render_share: str = _setting(
        "",
        "Set by a server on the render processes it starts (--render-processes), as index/count; not for "
        "operators: which sessions' renders come to the process.",
    )
    session_cache_bytes: int = _setting(
        512 * 1_048_576,
        "Memory each server process keeps sessions in, between calls: half for their decoded histories, half "
        "for their view states and the engine's work to resume (least recently used sessions go first, and are "
        "read again from the database).",
    )
    memo_bytes: int = _setting(
        256 * 1_048_576,
        "Memory each server process keeps what the engine derived from items in (rendered messages, compressions, "
        "observations; the oldest go first, and are derived again).",
    )
    grace_seconds: float = _setting(10.0, "On SIGTERM, how long in-flight calls get to finish.")
    reflection: bool = _setting(True, "Serve gRPC reflection (for grpcurl and similar tools).")
    api_keys: str = _setting(
        "",
        "Comma-separated tenant:key pairs (a tenant may have several keys, e.g. while rotating; a key names "
        "one tenant). When set, every call needs `authorization: Bearer <key>` "
        "and sees only its tenant's sessions; when empty, auth is off and all calls use tenant 'default'.",
    )
    tenant_requests_per_second: int = _setting(
        0,
        "Calls per second each tenant may make, counted across replicas in Redis (--redis-url; each replica "
        "on its own without it or while Redis is down); past it a call is RESOURCE_EXHAUSTED (RATE_LIMITED) "
        "with a retry delay. 0: no limit.",
        off=True,
    )
    tenant_append_bytes_per_second: int = _setting(
        0, "Bytes of items each tenant may append per second, counted as calls are. 0: no limit.", off=True
    )
    tenant_stored_bytes: int = _setting(
        0,
        "Bytes of items each tenant may keep in the history, over all its sessions (deleting a session frees "
        "its bytes); an append past it is RESOURCE_EXHAUSTED (QUOTA_EXCEEDED). 0: no limit.",
        off=True,
    )
    tenant_limits: str = _setting(
        "",
        'Per-tenant overrides of the three limits above, as JSON: {"team-a": {"requests_per_second": 50, '
        '"append_bytes_per_second": 1048576, "stored_bytes": 1073741824}} (0: no limit for that tenant).',
    )
    tls_cert: str = _setting(
        "",
        "PEM certificate chain the server presents (with --tls-key); empty: plaintext. Reloaded for new "
        "connections when the file changes.",
    )
    tls_key: str = _setting("", "PEM private key of --tls-cert.")
    tls_client_ca: str = _setting(
        "", "PEM CA certificates that client certificates must chain to (mutual TLS); empty: no client certificate."
    )
    otel_exporter: str = _setting(
        "none", "Where OpenTelemetry spans and metrics go.", choices=("none", "console", "otlp")
    )
    otel_endpoint: str = _setting(
        "", "OTLP/gRPC endpoint for otel_exporter=otlp, e.g. http://127.0.0.1:4317 (empty: the exporter's default)."
    )
    metrics_listen: str = _setting(
        "", "host:port of a Prometheus scrape endpoint (/metrics) for the metrics, e.g. 0.0.0.0:9464; empty: none."
    )
    metrics_interval_ms: int = _setting(
        15000, "How often metrics are pushed to the OTLP or console exporter, in milliseconds."
    )
    watch_events: bool = _setting(
        True,
        "Record session events for WatchSession (a row in each change's transaction); off: WatchSession answers "
        "FAILED_PRECONDITION.",
    )
    watch_retention_seconds: int = _setting(
        86400, "How long session events are kept for WatchSession: a watcher may resume from a cursor this old."
    )
    watch_poll_ms: int = _setting(
        200,
        "How often a replica with watchers reads new events (others' events arrive within this; its own at once).",
    )
    watch_heartbeat_seconds: float = _setting(
        15.0, "A watch with no event for this long gets a heartbeat, with a cursor to resume from."
    )
    watch_buffer_events: int = _setting(
        1000, "Events held for one slow watcher; past this its watch ends (WATCH_LAGGING) and it resumes."
    )
    watch_max_per_tenant: int = _setting(100, "Most watches one tenant may have open on one replica.")
    service_name: str = _setting("contextd", "OpenTelemetry service.name.")
    log_level: str = _setting("info", "Log level.", choices=("debug", "info", "warning", "error"))
    log_format: str = _setting(
        "text", "Log lines as text, or as one JSON object a line with trace and span ids.", choices=("text", "json")
    )

    @classmethod
    def load(cls, environ: Mapping[str, str], overrides: Mapping[str, Any] | None = None) -> Settings:
        """Settings from `environ` (CONTEXTD_* variables) with `overrides` (e.g. CLI flags) on top."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = environ.get(env_name(f.name))
            if raw is not None:
                values[f.name] = _parse(f, raw, env_name(f.name))
        for name, value in (overrides or {}).items():
            if value is not None:
                values[name] = value
        if "database_url" in values:
            values["database_url"] = normalize_database_url(values["database_url"])
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        for f in dataclasses.fields(self):
            choices = f.metadata["choices"]
            value = getattr(self, f.name)
            if choices and value not in choices:
                raise ConfigError(f"{f.name} must be one of {', '.join(choices)}, not {value!r}")
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if number and (value < 0 or (value == 0 and not f.metadata["off"])):
                allowed = "positive or 0 (off)" if f.metadata["off"] else "positive"
                raise ConfigError(f"{f.name} must be {allowed}, not {value}")
        if self.max_message_bytes > MAX_MESSAGE_BYTES:
            most = f"at most {MAX_MESSAGE_BYTES} (1 GiB)"
            raise ConfigError(f"max_message_bytes must be {most}, not {self.max_message_bytes}")
        if ":" not in self.listen:
            raise ConfigError(f"listen must be host:port, not {self.listen!r}")
        if self.metrics_listen:
            _, colon, port = self.metrics_listen.rpartition(":")
            if not colon or not port.isdigit() or int(port) > 65535:
                raise ConfigError(f"metrics_listen must be host:port, not {self.metrics_listen!r}")
            if int(port) and int(port) + self.render_processes > 65535:
                raise ConfigError(
                    f"metrics_listen: port {port} leaves no ports for the {self.render_processes} render processes "
                    "(each is scraped on the next port after it)"
                )
        normalize_database_url(self.database_url)
        if self.redis_url and urlsplit(self.redis_url).scheme not in ("redis", "rediss", "unix"):
            raise ConfigError(
                f"redis_url must be redis://, rediss:// or unix://, not {_hide_password(self.redis_url)!r}"
            )
        if self.carry_secret and not self.redis_url:
            raise ConfigError("carry_secret signs what is kept in Redis: set redis_url too, or no carry_secret")
        if self.carry_secret and len(self.carry_secret) < 16:
            raise ConfigError(f"carry_secret must be 16 characters or more, not {len(self.carry_secret)}")
        index, _, count = self.render_share.partition("/")
        if self.render_share and not (index.isdigit() and count.isdigit() and int(index) < int(count)):
            raise ConfigError(f"render_share must be index/count (index below count), not {self.render_share!r}")
        if "change-me" in self.carry_secret.lower():
            raise ConfigError("carry_secret is a placeholder (it says CHANGE-ME): set a secret of your own")
        self.tenant_keys()
        self.limits_of_tenants()
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("tls_cert and tls_key go together: set both, or neither for plaintext")
        if self.tls_client_ca and not self.tls_cert:
            raise ConfigError("tls_client_ca needs tls_cert and tls_key: mutual TLS is TLS first")

    def receive_limit(self) -> int:
        """gRPC's receive ceiling for the server's channels: above `max_message_bytes` (twice it,
        within gRPC's largest), so that a request between the two is refused by the service with
        INVALID_ARGUMENT naming the limit rather than by gRPC with a bare RESOURCE_EXHAUSTED."""
        return min(2 * self.max_message_bytes, 2**31 - 1)

    def tenant_keys(self) -> dict[str, str]:
        """API key -> tenant, from `api_keys`."""
        keys: dict[str, str] = {}
        for pair in filter(None, (p.strip() for p in self.api_keys.split(","))):
            tenant, sep, key = pair.partition(":")
            if not sep or not tenant or not key:
                raise ConfigError("api_keys entries are tenant:key; one is not")
            if not TENANT.fullmatch(tenant):
                raise ConfigError(f"api_keys: tenant {tenant[:40]!r} is not 1-128 characters of A-Z a-z 0-9 . _ -")
            if key in keys:
                # Which tenant would the key act as? Refused rather than guessed.
                raise ConfigError(
                    f"api_keys: tenant {tenant!r} has a key that is listed already"
                    + (" for it" if keys[key] == tenant else f" for tenant {keys[key]!r}")
                    + "; each key names one tenant, once"
                )
            keys[key] = tenant
        return keys

    def limits_of_tenants(self) -> TenantLimits:
        """The tenants' limits: the defaults and the overrides of `tenant_limits`."""
        default = TenantLimit(
            self.tenant_requests_per_second, self.tenant_append_bytes_per_second, self.tenant_stored_bytes
        )
        if not self.tenant_limits.strip():
            return TenantLimits(default)
        try:
            given = json.loads(self.tenant_limits)
        except ValueError as exc:
            raise ConfigError(f"tenant_limits is not JSON: {exc}") from None
        if not isinstance(given, dict):
            raise ConfigError("tenant_limits must be a JSON object of tenant: {limit: number}")
        overrides: dict[str, TenantLimit] = {}
        known = {f.name for f in dataclasses.fields(TenantLimit)}
        for tenant, limits in given.items():
            if not TENANT.fullmatch(tenant):
                raise ConfigError(f"tenant_limits: {tenant[:40]!r} is not a tenant (1-128 of A-Z a-z 0-9 . _ -)")
            if not isinstance(limits, dict) or set(limits) - known:
                raise ConfigError(f"tenant_limits: {tenant}'s limits are an object of {', '.join(sorted(known))}")
            for name, value in limits.items():
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise ConfigError(f"tenant_limits: {tenant}.{name} must be a whole number, 0 or more")
            overrides[tenant] = dataclasses.replace(default, **limits)
        return TenantLimits(default, overrides)

    def redacted(self) -> dict[str, Any]:
        """The settings with secrets (API keys, URL passwords) masked, for display."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name in ("api_keys", "carry_secret"):
            if values[name]:
                values[name] = "***"
        for name in ("database_url", "redis_url"):
            values[name] = _hide_password(values[name])
        return values


TENANT = re.compile(r"[A-Za-z0-9._-]{1,128}")


@dataclass(frozen=True, slots=True)
class TenantLimit:
    """One tenant's limits; 0 for none."""

    requests_per_second: int = 0
    append_bytes_per_second: int = 0
    stored_bytes: int = 0


@dataclass(frozen=True, slots=True)
class TenantLimits:
    default: TenantLimit = TenantLimit()
    overrides: Mapping[str, TenantLimit] = field(default_factory=dict)

    def of(self, tenant: str) -> TenantLimit:
        return self.overrides.get(tenant, self.default)

    @property
    def any(self) -> bool:
        """Whether any tenant has a limit at all."""
        return any(dataclasses.astuple(limit) != (0, 0, 0) for limit in (self.default, *self.overrides.values()))


_DRIVERS = {
    "postgresql": "postgresql+asyncpg",
    "postgres": "postgresql+asyncpg",
    "postgresql+asyncpg": "postgresql+asyncpg",
    "sqlite": "sqlite+aiosqlite",
    "sqlite+aiosqlite": "sqlite+aiosqlite",
}


def normalize_database_url(url: str) -> str:
    """The URL with contextd's async driver (postgresql:// -> postgresql+asyncpg://); ConfigError if unusable."""
    scheme, sep, rest = url.partition("://")
    driver = _DRIVERS.get(scheme.lower())
    if not sep or driver is None:
        raise ConfigError(
            f"database_url must be postgresql://user@host/db or sqlite:///path/file.db, not {_hide_password(url)!r}"
        )
    if driver == "sqlite+aiosqlite" and rest.lstrip("/") in ("", ":memory:"):
        raise ConfigError(
            "database_url: an in-memory SQLite database cannot be shared by the server's connections; "
            "give a file path, e.g. sqlite:///contextd.db"
        )
    return f"{driver}://{rest}"


def _hide_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _parse(f: dataclasses.Field[Any], raw: str, source: str) -> Any:
    default: Any = f.default
    kind = type(default)
    try:
        if kind is bool:
            lowered = raw.strip().lower()
            if lowered not in _TRUE | _FALSE:
                raise ValueError(f"expected one of {sorted(_TRUE | _FALSE)}")
            return lowered in _TRUE
        if kind is int:
            return int(raw.replace("_", ""))
        if kind is float:
            return float(raw)
        return raw
    except ValueError as exc:
        raise ConfigError(f"{source}={raw!r}: {exc}") from None


def markdown_table() -> str:
    """The README's configuration table."""
    rows = ["| setting | environment variable | default | meaning |", "| --- | --- | --- | --- |"]
    for f in dataclasses.fields(Settings):
        default = f.default
        shown = "(empty)" if default == "" else str(default).lower() if isinstance(default, bool) else str(default)
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata["help"]
        if f.metadata["choices"]:
            help_text += " One of: " + ", ".join(f"`{c}`" for c in f.metadata["choices"]) + "."
        rows.append(f"| `{flag}` | `{env_name(f.name)}` | `{shown}` | {help_text} |")
    return "\n".join(rows)
