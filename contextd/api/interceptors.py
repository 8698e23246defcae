"""The server interceptor every contextd RPC passes through.

For each call, in order: open a SERVER span (continuing the caller's trace
from the metadata), resolve the tenant from the API key, run the handler,
and turn whatever it raised into a status. Domain errors map through
api/errors.py; anything else is logged with a reference id and answered
INTERNAL with that id only, so no stack trace or internal detail reaches a
client.

Streaming handlers are wrapped as async generators, never in the
`context.write()` style, which breaks under interceptors.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import grpc
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from contextd.api.auth import ApiKeys
from contextd.api.errors import status_code, trailing_metadata
from contextd.engine.errors import ContextdError, LimitExceeded
from contextd.telemetry import tracer

log = logging.getLogger("contextd.api")

SERVICE_PREFIX = "/contextd.v1."


class ServiceInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, api_keys: ApiKeys, max_request_bytes: int) -> None:
        self._api_keys = api_keys
        self._max_request_bytes = max_request_bytes

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or not method.startswith(SERVICE_PREFIX):
            return handler  # health and reflection are served as they are
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(method, handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._stream(method, handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    def _unary(self, method: str, inner: Any) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]:
        async def behavior(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            metadata = _metadata(context)
            with _server_span(method, metadata) as span:
                try:
                    with self._api_keys.acting_as(metadata) as tenant:
                        span.set_attribute("contextd.tenant", tenant)
                        self._check_size(request)
                        return await inner(request, context)
                except grpc.aio.AbortError:
                    raise
                except Exception as exc:
                    await _abort(context, span, method, exc)

        return behavior

    def _stream(
        self, method: str, inner: Any
    ) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Any]]:
        async def behavior(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            metadata = _metadata(context)
            with _server_span(method, metadata) as span:
                try:
                    with self._api_keys.acting_as(metadata) as tenant:
                        span.set_attribute("contextd.tenant", tenant)
                        self._check_size(request)
                        async for response in inner(request, context):
                            yield response
                except grpc.aio.AbortError:
                    raise
                except Exception as exc:
                    await _abort(context, span, method, exc)

        return behavior

    def _check_size(self, request: Any) -> None:
        size = request.ByteSize()
        if size > self._max_request_bytes:
            raise LimitExceeded.at(
                "request",
                f"{size:,} bytes, over the limit of {self._max_request_bytes:,} bytes per message (max_message_bytes)",
            )


def _metadata(context: grpc.aio.ServicerContext[Any, Any]) -> dict[str, str]:
    return {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}


@contextmanager
def _server_span(method: str, metadata: Mapping[str, str]) -> Iterator[trace.Span]:
    service, _, name = method[1:].partition("/")
    started = time.perf_counter()
    with tracer.start_as_current_span(
        f"{service}/{name}",
        context=propagate.extract(metadata),
        kind=SpanKind.SERVER,
        attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": name},
        record_exception=False,  # _abort records what failed; an abort is not an exception here
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        finally:
            span.set_attribute("rpc.duration_ms", round((time.perf_counter() - started) * 1000, 3))


async def _abort(context: grpc.aio.ServicerContext[Any, Any], span: trace.Span, method: str, exc: Exception) -> None:
    if isinstance(exc, ContextdError):
        code = status_code(exc)
        span.set_attribute("contextd.error_reason", exc.reason)
        if code is grpc.StatusCode.UNAVAILABLE:
            log.warning("%s: %s", method, exc.message, exc_info=exc.__cause__ is not None)
        span.set_status(Status(StatusCode.ERROR, exc.reason))
        await context.abort(code, exc.message, trailing_metadata(exc, code))
    reference = uuid.uuid4().hex[:12]
    log.error("%s failed (reference %s)", method, reference, exc_info=exc)
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error (reference {reference}); see the server log")
