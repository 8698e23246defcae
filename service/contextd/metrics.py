"""Metrics: what a dashboard of contextd shows, through OpenTelemetry.

The instruments are made here on the global meter, once per process; until a
provider is installed (`configure_metrics`), they are the API's no-op proxies
and recording costs a function call. Readers follow the configuration: OTLP
beside the spans (`--otel-exporter otlp`), and a Prometheus scrape endpoint
(`--metrics-listen`), served by the Prometheus client library through the
OpenTelemetry Prometheus exporter. Both are imported only when configured.

Names: RPCs under the current semantic conventions for RPC
(`rpc.server.call.duration` in seconds, with `rpc.system.name`, `rpc.method`
and `rpc.response.status_code`); the rest under `contextd.`. Attributes are
bounded: the tenant at most (tenants are the configured API keys'), never a
session id, handle or seq. docs/metrics.md lists every metric.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Histogram, Observation

from contextd.config import Settings
from contextd_storage.stash import Stash

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import ExemplarFilter, MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader

    from contextd.engine.certificates import CertificateBody
    from contextd.engine.timing import Usage
    from contextd_storage.kept_carries import KeptCarries

meter = metrics.get_meter("contextd")

# Seconds: from a cached GetSession (about a millisecond) to a cold render of a long session.
DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SIZE_BUCKETS = tuple(float(4**k) for k in range(3, 14))  # 64 B to 64 MiB
COUNT_BUCKETS = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0)

TENANT = "contextd.tenant"


def _histogram(name: str, unit: str, description: str, buckets: Sequence[float]) -> Histogram:
    return meter.create_histogram(name, unit=unit, description=description, explicit_bucket_boundaries_advisory=buckets)


rpc_duration = _histogram(
    "rpc.server.call.duration", "s", "Duration of the RPCs the server answered.", DURATION_BUCKETS
)
rpc_request_size = _histogram(
    "rpc.server.request.size", "By", "Size of the request messages (uncompressed).", SIZE_BUCKETS
)
rpc_response_size = _histogram(
    "rpc.server.response.size", "By", "Size of the response messages (uncompressed).", SIZE_BUCKETS
)

render_duration = _histogram(
    "contextd.render.duration",
    "s",
    "Time of the engine's render, in all (contextd.stage=all) and by stage.",
    DURATION_BUCKETS,
)
render_reads = _histogram(
    "contextd.render.reads",
    "s",
    "Time a render spent reading what it resumes from before the engine's render, by what it read (contextd.read).",
    DURATION_BUCKETS,
)
tokens_sent = meter.create_counter(
    "contextd.view.tokens", unit="{token}", description="Tokens of the views rendered (what the model is sent)."
)
view_size = meter.create_counter(
    "contextd.view.size",
    unit="By",
    description="Bytes of the views rendered (their messages and items): sent in responses (contextd.view.part=sent), "
    "or held by the caller and left out (held: known_view_token).",
)
tokens_removed = meter.create_counter(
    "contextd.tokens.removed",
    unit="{token}",
    description="Tokens the rules' decisions took out of views, net of placeholders, by reason and ladder level.",
)
decisions = meter.create_counter(
    "contextd.decisions", unit="{decision}", description="Decisions of renders, by outcome."
)
deferred_waiting = _histogram(
    "contextd.edits.deferred", "{edit}", "Deferred edits waiting in the session after each render.", COUNT_BUCKETS
)
cache_tokens = meter.create_counter(
    "contextd.cache.tokens",
    unit="{token}",
    description="Prompt-cache tokens of model calls: predicted at render, reported by ReportUsage; "
    "by kind (read, write, uncached).",
)
cost = meter.create_counter(
    "contextd.cost",
    unit="USD",
    description="Model calls made with views, priced at the session policy's prices as each render predicted "
    "them (basis view), beside the same calls sending the whole history, each caching its prompt "
    "(basis whole_history).",
)
items_appended = meter.create_counter("contextd.items.appended", unit="{item}", description="Items appended.")
bytes_appended = meter.create_counter(
    "contextd.items.appended.size", unit="By", description="Bytes of the items appended."
)
lock_wait = _histogram(
    "contextd.session.lock.wait",
    "s",
    "Wait for a session's lock (this replica's queue, then the database's lock).",
    DURATION_BUCKETS,
)
failures = meter.create_counter(
    "contextd.errors",
    unit="{error}",
    description="Calls that failed on a condition an operator watches, by reason "
    "(SESSION_BUSY, DATABASE_UNAVAILABLE, DATABASE_BUSY, RATE_LIMITED, QUOTA_EXCEEDED, ...).",
)
watches = meter.create_up_down_counter(
    "contextd.watch.streams", unit="{stream}", description="WatchSession streams open on this replica, by tenant."
)
watch_events = meter.create_counter(
    "contextd.watch.events.read",
    unit="{event}",
    description="Session events this replica's feed read from the log for its watchers.",
)


_stashes: weakref.WeakSet[Stash] = weakref.WeakSet()


def watch_stash(stash: Stash) -> None:
    """Report `stash`'s counts (its own, kept as it works) at each collection."""
    _stashes.add(stash)


def _stash_counts(_: CallbackOptions) -> Iterable[Observation]:
    live = list(_stashes)
    for counted, result in (("hits", "hit"), ("misses", "miss")):
        yield Observation(sum(getattr(s.stats, counted) for s in live), {"contextd.stash.result": result})


def _stash_work(_: CallbackOptions) -> Iterable[Observation]:
    live = list(_stashes)
    for what in ("writes", "skipped", "evicted"):
        yield Observation(sum(getattr(s.stats, what) for s in live), {"contextd.stash.operation": what})


meter.create_observable_counter(
    "contextd.stash.lookups",
    [_stash_counts],
    unit="{lookup}",
    description="Handles looked up in the stash, by result (hit, miss; a miss goes to the durable history).",
)
meter.create_observable_counter(
    "contextd.stash.operations",
    [_stash_work],
    unit="{operation}",
    description="Stash writes, evictions, and calls skipped because Redis did not answer (degraded mode).",
)

_carries: weakref.WeakSet[KeptCarries] = weakref.WeakSet()


def watch_carries(carries: KeptCarries) -> None:
    """Report the counts of `carries` (its own, kept as it works) at each collection."""
    _carries.add(carries)


def _carry_counts(_: CallbackOptions) -> Iterable[Observation]:
    live = list(_carries)
    for what in ("kept", "loaded", "warmed", "followed", "resumed", "missed", "refused", "dropped"):
        yield Observation(sum(getattr(c.stats, what) for c in live), {"contextd.carry.operation": what})


meter.create_observable_counter(
    "contextd.carries",
    [_carry_counts],
    unit="{carry}",
    description="Sessions' carries kept in Redis for other replicas and restarts: written, read (of those, read "
    "as the replica started), resumed from, not found, refused, or not written.",
)


class ActiveSessions:
    """Sessions with a call on this replica within the last `window` seconds, per tenant."""

    def __init__(self, window: float = 300.0, most: int = 1_000_000) -> None:
        self.window = window
        self.most = most
        self._seen: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def seen(self, tenant: str, session_id: str) -> None:
        with self._lock:
            self._seen.pop((tenant, session_id), None)
            self._seen[(tenant, session_id)] = time.monotonic()  # insertion order: oldest first
            if len(self._seen) > self.most:
                self._seen.pop(next(iter(self._seen)))

    def counts(self) -> dict[str, int]:
        cutoff = time.monotonic() - self.window
        with self._lock:
            while self._seen:
                first = next(iter(self._seen))
                if self._seen[first] >= cutoff:
                    break
                del self._seen[first]
            out: dict[str, int] = {}
            for tenant, _ in self._seen:
                out[tenant] = out.get(tenant, 0) + 1
        return out


active_sessions = ActiveSessions()


def _active(_: CallbackOptions) -> Iterable[Observation]:
    return [Observation(n, {TENANT: tenant}) for tenant, n in active_sessions.counts().items()]


meter.create_observable_up_down_counter(
    "contextd.sessions.active",
    [_active],
    unit="{session}",
    description="Sessions with a call on this replica in the last 5 minutes.",
)


def record_render(
    tenant: str,
    seconds: float,
    stages: Sequence[tuple[str, float]],
    tokens: int,
    certificates: Sequence[CertificateBody],
    waiting: int,
    predicted: Usage | None,
    costs: tuple[float, float] | None = None,
) -> None:
    """What one committed (or dry-run) render did; `costs`: its model call's, with the view and
    with the whole history (timing.call_costs)."""
    who = {TENANT: tenant}
    render_duration.record(seconds, {"contextd.stage": "all"})
    for stage, spent in stages:
        render_duration.record(spent, {"contextd.stage": stage})
    tokens_sent.add(tokens, who)
    outcomes: dict[str, int] = {}
    removed: dict[tuple[str, int], int] = {}
    for c in certificates:
        outcomes[c.decision.name] = outcomes.get(c.decision.name, 0) + 1
        if net := c.net_tokens_removed:
            removed[(c.reason, c.level)] = removed.get((c.reason, c.level), 0) + net
    for outcome, n in outcomes.items():
        decisions.add(n, {TENANT: tenant, "contextd.decision": outcome})
    for (reason, level), n in removed.items():
        tokens_removed.add(n, {TENANT: tenant, "contextd.reason": reason or "unknown", "contextd.level": level})
    deferred_waiting.record(waiting, who)
    if predicted is not None:
        record_cache(tenant, "predicted", predicted.cache_read, predicted.cache_write, predicted.uncached)
    if costs is not None:
        cost.add(costs[0], {TENANT: tenant, "contextd.cost.basis": "view"})
        cost.add(costs[1], {TENANT: tenant, "contextd.cost.basis": "whole_history"})


def record_view_size(tenant: str, sent: int, held: int) -> None:
    """A render's response: its bytes, and those of the view the caller held (left out)."""
    view_size.add(sent, {TENANT: tenant, "contextd.view.part": "sent"})
    if held:
        view_size.add(held, {TENANT: tenant, "contextd.view.part": "held"})


def record_reads(reads: Sequence[tuple[str, float]]) -> None:
    """What a render read before the engine's render, and how long each took (`contextd.render.reads`)."""
    for read, spent in reads:
        render_reads.record(spent, {"contextd.read": read})


def record_cache(tenant: str, source: str, read: int, write: int, uncached: int) -> None:
    for kind, n in (("read", read), ("write", write), ("uncached", uncached)):
        if n:
            cache_tokens.add(n, {TENANT: tenant, "contextd.cache.source": source, "contextd.cache.kind": kind})


def record_append(tenant: str, items: int, size: int) -> None:
    who = {TENANT: tenant}
    items_appended.add(items, who)
    bytes_appended.add(size, who)


def configure_metrics(settings: Settings) -> MeterProvider | None:
    """Install a meter provider with the configured readers; returns it to shut down at exit
    (None, and nothing imported, when no reader is configured)."""
    readers = _readers(settings)
    if not readers:
        return None
    from opentelemetry.sdk.metrics import MeterProvider

    from contextd.telemetry import resource

    provider = MeterProvider(
        readers,
        resource=resource(settings),
        exemplar_filter=_exemplar_filter(settings),
    )
    metrics.set_meter_provider(provider)
    return provider


def _exemplar_filter(settings: Settings) -> ExemplarFilter | None:
    """Exemplars (a measurement's trace and span ids) only where they can lead somewhere: with
    the spans exported (`--otel-exporter otlp`), the SDK's default (`OTEL_METRICS_EXEMPLAR_FILTER`,
    else trace-based). Without, none: offering each measurement to the exemplar reservoirs is a
    third of what recording it costs (bench/metrics_overhead.py), for ids no reader could follow.
    The variable, when set, decides in both cases."""
    if settings.otel_exporter == "otlp" or os.environ.get("OTEL_METRICS_EXEMPLAR_FILTER"):
        return None
    from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter

    return AlwaysOffExemplarFilter()


def _readers(settings: Settings) -> list[MetricReader]:
    readers: list[MetricReader] = []
    if settings.otel_exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        exporter = OTLPMetricExporter(endpoint=settings.otel_endpoint or None)
        readers.append(PeriodicExportingMetricReader(exporter, export_interval_millis=settings.metrics_interval_ms))
    elif settings.otel_exporter == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader

        readers.append(
            PeriodicExportingMetricReader(ConsoleMetricExporter(), export_interval_millis=settings.metrics_interval_ms)
        )
    if settings.metrics_listen:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader

        readers.append(PrometheusMetricReader())
    return readers


def serve_prometheus(listen: str) -> Any:
    """Serve the Prometheus exposition of the default registry on `listen` (host:port), on a
    thread of the Prometheus client's; returns its server, to shut down at exit."""
    from prometheus_client import start_http_server

    host, _, port = listen.rpartition(":")
    server, _thread = start_http_server(int(port), addr=host.strip("[]") or "0.0.0.0")
    return server
