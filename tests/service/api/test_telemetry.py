"""Spans: one per RPC and one per storage call, with session, item and token
attributes, continuing the caller's trace."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from contextd import view_service
from contextd.config import Settings
from contextd.telemetry import _exporter, instrument_storage
from contextd_client import Client, NotFound, ViewFormat
from contextd_client.v1 import content_pb2 as pb
from contextd_client.v1 import contextd_pb2 as api
from contextd_client.v1 import contextd_pb2_grpc
from tests.conftest import ServerThread
from tests.service.api.test_abandoned_renders import given_up, slowed_once
from tests.service.api.test_view_engine import conversation

_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def spans_exporter() -> InMemorySpanExporter:
    # The global provider can be set once per process; the tracer contextd
    # took at import is a proxy that follows it.
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    trace.set_tracer_provider(provider)
    return _EXPORTER


@pytest.fixture
def spans(spans_exporter: InMemorySpanExporter) -> Iterator[InMemorySpanExporter]:
    spans_exporter.clear()
    yield spans_exporter


def _finished(spans: InMemorySpanExporter, suffix: str) -> ReadableSpan:
    """The finished span whose name ends with `suffix`, waiting briefly: an
    aborted call's answer can reach the client before its span closes."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        found = [s for s in spans.get_finished_spans() if s.name.endswith(suffix)]
        if found:
            return found[-1]
        time.sleep(0.01)
    raise AssertionError(f"no span ending in {suffix!r}")


def _named(spans: tuple[ReadableSpan, ...], name: str, session_id: str) -> ReadableSpan:
    matching = [s for s in spans if s.name == name and (s.attributes or {}).get("contextd.session_id") == session_id]
    assert len(matching) == 1, [s.name for s in spans]
    return matching[0]


def test_rpc_and_storage_spans_carry_session_items_and_tokens(
    spans: InMemorySpanExporter, client: Client, session_id: str
) -> None:
    user = pb.Item(role=pb.ROLE_USER, content=[pb.ContentBlock(text=pb.TextBlock(text="count these tokens"))])
    appended = client.append_items(session_id, [user, user])
    client.render_view(session_id, ViewFormat.OPENAI_CHAT, budget_tokens=3)
    finished = spans.get_finished_spans()

    rpc = _named(finished, "contextd.v1.ContextService/AppendItems", session_id)
    assert rpc.kind is trace.SpanKind.SERVER
    attributes = dict(rpc.attributes or {})
    tokens = sum(r.token_count for r in appended.receipts)
    assert (attributes["contextd.items"], attributes["contextd.tokens"], attributes["contextd.tenant"]) == (
        2,
        tokens,
        "default",
    )
    storage = _named(finished, "storage.append", session_id)
    assert storage.parent is not None and storage.parent.span_id == rpc.context.span_id
    assert dict(storage.attributes or {})["contextd.tokens"] == tokens

    render = _named(finished, "contextd.v1.ContextService/RenderView", session_id)
    render_attributes = dict(render.attributes or {})
    assert render_attributes["contextd.items"] == 2 and render_attributes["contextd.over_budget"] is True
    assert (
        render_attributes["contextd.warnings"] == "OVER_BUDGET" and render_attributes["contextd.volatile_content"] == 0
    )
    # The first render: nothing cached to reuse, and the caller did not ask the view for a breakpoint.
    assert (render_attributes["contextd.stable_prefix_tokens"], render_attributes["contextd.cache_breakpoint_seq"]) == (
        0,
        0,
    )
    load = _named(finished, "storage.load_history", session_id)
    assert load.parent is not None and load.parent.span_id == render.context.span_id


def test_failed_calls_record_the_reason(spans: InMemorySpanExporter, client: Client) -> None:
    with pytest.raises(NotFound):
        client.get_session("missing-for-telemetry")
    span = _finished(spans, "/GetSession")
    assert span.status.status_code is trace.StatusCode.ERROR
    assert dict(span.attributes or {})["contextd.error_reason"] == "SESSION_NOT_FOUND"


def test_the_server_span_continues_the_callers_trace(spans: InMemorySpanExporter, server: ServerThread) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    with grpc.insecure_channel(server.target) as channel:
        stub = contextd_pb2_grpc.ContextServiceStub(channel)
        stub.ListSessions(
            api.ListSessionsRequest(page_size=1), metadata=(("traceparent", f"00-{trace_id}-00f067aa0ba902b7-01"),)
        )
    span = _finished(spans, "/ListSessions")
    assert format(span.context.trace_id, "032x") == trace_id
    assert span.parent is not None and format(span.parent.span_id, "016x") == "00f067aa0ba902b7"


def test_the_exporter_follows_the_configuration() -> None:
    assert _exporter(Settings()) is None
    assert isinstance(_exporter(Settings(otel_exporter="console")), ConsoleSpanExporter)
    otlp = _exporter(Settings(otel_exporter="otlp", otel_endpoint="http://127.0.0.1:4317"))
    assert isinstance(otlp, OTLPSpanExporter)
    otlp.shutdown()


def test_volatile_content_in_the_system_prompt_shows_on_the_render_span(
    spans: InMemorySpanExporter, client: Client, session_id: str
) -> None:
    client.append_openai(
        session_id, [{"role": "system", "content": "Today is 2026-11-30."}, {"role": "user", "content": "hi"}]
    )
    view = client.render_view(session_id, ViewFormat.OPENAI_CHAT)
    assert [w.code for w in view.warnings] == ["VOLATILE_CONTENT"]
    render = _named(spans.get_finished_spans(), "contextd.v1.ContextService/RenderView", session_id)
    assert dict(render.attributes or {})["contextd.volatile_content"] == 1


def test_the_clients_trace_continues_into_the_service(spans: InMemorySpanExporter, server: ServerThread) -> None:
    tracer = trace.get_tracer("agent")
    seen: list[str] = []

    class Recording(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
        def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
            seen.append(details.method)
            return continuation(details, request)

    with tracer.start_as_current_span("agent turn") as turn, Client(server.target, interceptors=[Recording()]) as c:
        list(c.list_sessions())
    rpc = _finished(spans, "/ListSessions")
    assert rpc.context.trace_id == turn.get_span_context().trace_id
    assert rpc.parent is not None and rpc.parent.span_id == turn.get_span_context().span_id
    assert seen and seen[-1].endswith("/ListSessions")


def test_database_statements_and_redis_commands_get_spans_of_their_own(
    spans: InMemorySpanExporter, make_server: Any, redis_url: str
) -> None:
    from opentelemetry.instrumentation.redis import RedisInstrumentor
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

    server = make_server(redis_url=redis_url)
    assert server._running is not None
    instrument_storage(server._running.db.engine)
    try:
        with Client(server.target) as c:
            session = c.create_session().id
            c.append_openai(session, [{"role": "user", "content": "x " * 3000}, {"role": "assistant", "content": "ok"}])
            c.render_view(session, ViewFormat.OPENAI_CHAT)
            with pytest.raises(NotFound):  # the stash is asked first (a miss), then the history
                c.retrieve(session, "0123456789abcdef")
        finished = spans.get_finished_spans()
    finally:
        SQLAlchemyInstrumentor().uninstrument()
        RedisInstrumentor().uninstrument()
    rpc = _named(finished, "contextd.v1.ContextService/AppendItems", session)
    by_id = {s.context.span_id: s for s in finished}

    def under_rpc(span: ReadableSpan) -> bool:
        while span.parent is not None and span.parent.span_id in by_id:
            span = by_id[span.parent.span_id]
        return span is rpc

    def system(span: ReadableSpan) -> str:
        attributes = dict(span.attributes or {})
        return str(attributes.get("db.system.name") or attributes.get("db.system") or "")

    statements = [s for s in finished if system(s) == "sqlite"]
    assert any(under_rpc(s) for s in statements), [s.name for s in finished]
    assert any(system(s) == "redis" for s in finished)


def test_a_render_whose_caller_gave_up_says_so_on_the_calls_span(
    spans: InMemorySpanExporter, server: ServerThread, client: Client, session_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    conversation(client, session_id)
    slowed_once(monkeypatch, view_service, "_render")
    given_up(server.target, session_id)
    render = _finished(spans, "ContextService/RenderView")
    assert {k: v for k, v in (render.attributes or {}).items() if k.startswith("contextd.")} == {
        "contextd.tenant": "default",
        "contextd.session_id": session_id,
        "contextd.abandoned": True,
    }
    assert client.render_view(session_id, ViewFormat.OPENAI_CHAT).view_version == 2  # (once it is stored)
