"""OpenTelemetry tracing: one span per RPC (api/interceptors.py), per
storage call (`traced`), with session, item and token attributes, and per
database statement and Redis command (`instrument_storage`).

The exporter is chosen by configuration: none (the default: no provider is
installed and spans cost nothing), console, or OTLP over gRPC. The SDK is
imported only when an exporter is configured.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from opentelemetry import trace

from contextd.config import Settings

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from sqlalchemy.ext.asyncio import AsyncEngine

tracer = trace.get_tracer("contextd")

P = ParamSpec("P")
R = TypeVar("R")

AttributeValue = str | int | float | bool


def traced(name: str) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Run an async function inside a span called `name`."""

    def decorate(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(fn)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            with tracer.start_as_current_span(name):
                return await fn(*args, **kwargs)

        return wrapper

    return decorate


def annotate(**attributes: AttributeValue) -> None:
    """Set `contextd.<name>` attributes on the current span, if one records."""
    span = trace.get_current_span()
    if span.is_recording():
        for key, value in attributes.items():
            span.set_attribute(f"contextd.{key}", value)


def configure_tracing(settings: Settings) -> TracerProvider | None:
    """Install the configured exporter; returns the provider to shut down at exit."""
    exporter = _exporter(settings)
    if exporter is None:
        return None
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=resource(settings))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


def resource(settings: Settings) -> Resource:
    """The process as its spans and metrics name it: `service_name` (with what
    OTEL_RESOURCE_ATTRIBUTES adds); a render process (contextd/render_processes.py) is an
    instance of its own, or its counters would be taken for its parent's."""
    from opentelemetry.sdk.resources import Resource

    named = Resource.create({"service.name": settings.service_name})
    if not settings.render_worker:
        return named
    parent = named.attributes.get("service.instance.id") or socket.gethostname()
    return named.merge(
        Resource({"service.instance.id": f"{parent}/render-{os.getpid()}", "contextd.process": "render"})
    )


def instrument_storage(engine: AsyncEngine) -> None:
    """Spans for every database statement and Redis command (with the `db.*` attributes of the
    semantic conventions), by the OpenTelemetry instrumentation packages; imported only when
    spans are exported."""
    from opentelemetry.instrumentation.redis import RedisInstrumentor
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

    # Its declared range ends before SQLAlchemy 2.1, whose cursor-execution events it hooks are
    # those of 2.0; tests/service/api/test_telemetry.py holds the spans to it.
    SQLAlchemyInstrumentor().instrument(engine=engine.sync_engine, skip_dep_check=True)
    if not RedisInstrumentor().is_instrumented_by_opentelemetry:
        RedisInstrumentor().instrument()


def _exporter(settings: Settings) -> SpanExporter | None:
    if settings.otel_exporter == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if settings.otel_exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=settings.otel_endpoint or None)
    return None
