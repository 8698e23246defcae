"""Metrics: every call, append, render, decision, usage report and stash lookup is counted,
under the semantic conventions for RPC and contextd's own names, with bounded attributes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import metrics as otel_metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from contextd.config import Settings
from contextd.metrics import ActiveSessions, _exemplar_filter, _readers
from contextd_client import Client, NotFound, Usage, ViewFormat

_READER = InMemoryMetricReader()


_PROVIDER: list[MeterProvider] = []


@pytest.fixture(scope="session")
def reader() -> InMemoryMetricReader:
    # The global provider can be set once per process; the instruments contextd made at
    # import are proxies that follow it.
    if not _PROVIDER:
        _PROVIDER.append(MeterProvider([_READER]))
        otel_metrics.set_meter_provider(_PROVIDER[0])
    return _READER


class Snapshot:
    """Every data point of every metric of contextd's meter at one moment: name -> [(attributes,
    point)]. Other libraries in the process record into the same global provider (an agent
    framework's tool metrics, say) and are not contextd's to bound."""

    def __init__(self, reader: InMemoryMetricReader, meter: str = "contextd") -> None:
        self.points: dict[str, list[tuple[dict[str, Any], Any]]] = {}
        data = reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                if scope.scope.name != meter:
                    continue
                for metric in scope.metrics:
                    self.points[metric.name] = [(dict(p.attributes or {}), p) for p in metric.data.data_points]

    def total(self, name: str, **where: Any) -> float:
        """The sum of the matching points' values (a histogram's: its count)."""
        found = 0.0
        for attributes, point in self.points.get(name, ()):
            if all(attributes.get(_key(k)) == v for k, v in where.items()):
                found += point.count if hasattr(point, "count") else point.value
        return found

    def attribute_keys(self, name: str) -> set[str]:
        return {key for attributes, _ in self.points.get(name, ()) for key in attributes}


def _key(name: str) -> str:
    return {
        "method": "rpc.method",
        "status": "rpc.response.status_code",
        "tenant": "contextd.tenant",
        "stage": "contextd.stage",
        "read": "contextd.read",
        "part": "contextd.view.part",
        "decision": "contextd.decision",
        "source": "contextd.cache.source",
        "kind": "contextd.cache.kind",
        "result": "contextd.stash.result",
        "basis": "contextd.cost.basis",
    }.get(name, name)


@pytest.fixture
def snapshot(reader: InMemoryMetricReader) -> Iterator[Any]:
    """Metrics before the test; call it again for after (`meter`: another than contextd's)."""
    yield lambda meter="contextd": Snapshot(reader, meter)


METHOD = "contextd.v1.ContextService/"
BULKY = "\n".join(f"line {n}: value = compute({n})" for n in range(200))


def test_calls_are_counted_by_method_and_status_under_the_rpc_conventions(
    snapshot: Any, client: Client, session_id: str
) -> None:
    before = snapshot()
    client.get_session(session_id)
    with pytest.raises(NotFound):
        client.get_session("missing-for-metrics")
    after = snapshot()

    def grew(**where: Any) -> float:
        return after.total("rpc.server.call.duration", **where) - before.total("rpc.server.call.duration", **where)

    assert grew(method=METHOD + "GetSession", status="OK", tenant="default") == 1
    assert grew(method=METHOD + "GetSession", status="NOT_FOUND", **{"error.type": "NOT_FOUND"}) == 1
    assert after.attribute_keys("rpc.server.call.duration") == {
        "rpc.system.name",
        "rpc.method",
        "rpc.response.status_code",
        "contextd.tenant",
        "error.type",
    }
    assert after.total("rpc.server.request.size", method=METHOD + "GetSession") > before.total(
        "rpc.server.request.size", method=METHOD + "GetSession"
    )
    failed = after.total("contextd.errors", **{"contextd.error_reason": "SESSION_NOT_FOUND"})
    assert failed - before.total("contextd.errors", **{"contextd.error_reason": "SESSION_NOT_FOUND"}) == 1


def test_appends_renders_decisions_and_usage_are_counted(snapshot: Any, client: Client, session_id: str) -> None:
    messages = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Fix it."}]
    for n in range(6):  # the same command and output again and again: the rules remove the repeats
        call = {"id": f"c{n}", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "cat a.py"}'}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": BULKY},
        ]
    before = snapshot()
    appended = client.append_openai(session_id, messages)
    view = client.render_view(session_id, ViewFormat.OPENAI_CHAT, budget_tokens=1500)
    client.report_usage(session_id, view.view_version, Usage("anthropic", cache_read_tokens=700, input_tokens=50))
    after = snapshot()

    def grew(name: str, **where: Any) -> float:
        return after.total(name, **where) - before.total(name, **where)

    assert grew("contextd.items.appended", tenant="default") == len(appended.receipts) == len(messages)
    assert grew("contextd.items.appended.size", tenant="default") >= len(BULKY) * 6
    assert grew("contextd.render.duration", stage="all") == 1
    for stage in ("load", "propose", "judge", "apply", "budget", "show", "record", "carry"):
        assert grew("contextd.render.duration", stage=stage) == 1, stage
    # What it read first: the history and the view state (no kept carries on this server).
    assert [grew("contextd.render.reads", read=r) for r in ("history", "carry", "state")] == [1, 0, 1]
    assert grew("contextd.view.tokens", tenant="default") == view.total_tokens
    assert grew("contextd.view.size", part="sent", tenant="default") > len(view.messages_json)
    assert grew("contextd.view.size", part="held") == 0  # (the client held no view of the session)

    decided = Counter(c.decision.upper() for c in view.certificates)
    assert decided["PRUNE"] > 0, decided  # the fixture must make the rules work
    for outcome, n in decided.items():
        assert grew("contextd.decisions", decision=outcome, tenant="default") == n, outcome
    removed = sum(c.tokens_removed - c.placeholder_tokens for c in view.certificates if c.decision == "prune")
    assert grew("contextd.tokens.removed", tenant="default") == removed > 0
    reasons = {c.reason for c in view.certificates if c.decision == "prune"}
    assert {a["contextd.reason"] for a, _ in after.points["contextd.tokens.removed"]} >= reasons

    assert grew("contextd.cache.tokens", source="reported", kind="read") == 700
    assert grew("contextd.cache.tokens", source="reported", kind="uncached") == 50
    predicted = sum(grew("contextd.cache.tokens", source="predicted", kind=k) for k in ("read", "write", "uncached"))
    assert predicted > 0
    # The call's cost with the view, and sending the whole history: the rules' prunes made it cheaper.
    with_view, whole = grew("contextd.cost", basis="view"), grew("contextd.cost", basis="whole_history")
    assert 0 < with_view < whole
    assert grew("contextd.session.lock.wait") >= 3  # the append, the render and the report each took the lock
    assert grew("contextd.edits.deferred", tenant="default") == 1
    assert after.total("contextd.sessions.active", tenant="default") >= 1

    # Rendered again, by a client that holds the view: what it held is not sent again, and counted so.
    again = client.render_view(session_id, ViewFormat.OPENAI_CHAT, budget_tokens=1500)
    held = snapshot()
    assert (
        held.total("contextd.view.size", part="held") - after.total("contextd.view.size", part="held")
        >= len(again.messages_json.encode()) // 2
    )
    after = held
    handle = next(c.handle for c in view.certificates if c.decision == "prune" and c.handle)
    client.retrieve(session_id, handle)  # stashed when the render pruned it
    later = snapshot()
    hits = later.total("contextd.stash.lookups", result="hit") - after.total("contextd.stash.lookups", result="hit")
    assert hits == 1


BOUNDED = {
    "rpc.system.name",
    "rpc.method",
    "rpc.response.status_code",
    "error.type",
    "contextd.tenant",
    "contextd.stage",
    "contextd.read",
    "contextd.view.part",
    "contextd.decision",
    "contextd.reason",
    "contextd.level",
    "contextd.cache.source",
    "contextd.cache.kind",
    "contextd.cost.basis",
    "contextd.stash.result",
    "contextd.stash.operation",
    "contextd.carry.operation",
    "contextd.error_reason",
}


def test_attributes_are_bounded_never_a_session_handle_or_seq(snapshot: Any, client: Client, session_id: str) -> None:
    client.append_openai(session_id, [{"role": "user", "content": "hello"}])
    client.render_view(session_id, ViewFormat.OPENAI_CHAT)
    now = snapshot()
    assert {key for name in now.points for key in now.attribute_keys(name)} <= BOUNDED
    values = {str(v) for points in now.points.values() for attributes, _ in points for v in attributes.values()}
    assert session_id not in values


def test_active_sessions_forget_what_is_older_than_the_window() -> None:
    active = ActiveSessions(window=60.0, most=3)
    for n in range(5):
        active.seen("a", f"s{n}")
    active.seen("b", "s0")
    assert active.counts() == {"a": 2, "b": 1}  # at most 3 kept: the oldest went
    active.window = 0.0
    assert active.counts() == {}


def test_readers_follow_the_configuration() -> None:
    assert _readers(Settings()) == []
    prometheus = _readers(Settings(metrics_listen="127.0.0.1:0"))
    assert [type(r).__name__ for r in prometheus] == ["PrometheusMetricReader"]
    otlp = _readers(Settings(otel_exporter="otlp", otel_endpoint="http://127.0.0.1:4317", metrics_interval_ms=60000))
    assert [type(r).__name__ for r in otlp] == ["PeriodicExportingMetricReader"]
    for reader in (*prometheus, *otlp):
        reader.shutdown()


@pytest.mark.parametrize(
    ("settings", "environment", "linked"),
    [
        (Settings(metrics_listen="127.0.0.1:0"), "", False),  # no spans leave: no ids to follow
        (Settings(otel_exporter="otlp", metrics_listen="127.0.0.1:0"), "", True),
        (Settings(metrics_listen="127.0.0.1:0"), "always_on", True),  # the variable decides
    ],
)
def test_exemplars_link_measurements_to_spans_only_where_spans_are_exported(
    settings: Settings, environment: str, linked: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    if environment:
        monkeypatch.setenv("OTEL_METRICS_EXEMPLAR_FILTER", environment)
    reader = InMemoryMetricReader()
    provider = MeterProvider([reader], exemplar_filter=_exemplar_filter(settings))
    histogram = provider.get_meter("t").create_histogram("h")
    sampled = SpanContext(0x1F, 0x2F, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    with trace.use_span(NonRecordingSpan(sampled)):
        histogram.record(0.02, {"k": "v"})
    data = reader.get_metrics_data()
    assert data is not None
    (point,) = data.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points
    assert [e.trace_id for e in point.exemplars] == ([0x1F] if linked else [])
    provider.shutdown()


def test_bad_metrics_addresses_are_refused() -> None:
    from contextd.config import ConfigError

    for bad in ("9464", "host:port", "0.0.0.0:99999"):
        with pytest.raises(ConfigError, match="metrics_listen"):
            Settings.load({}, {"metrics_listen": bad})
