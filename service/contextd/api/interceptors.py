"""The server interceptor every contextd RPC passes through.

For each call, in order: open a SERVER span (continuing the caller's trace
from the metadata), resolve the tenant from the API key, admit the call
under the tenant's rate (service/contextd/admission.py), decode the request from its
bytes (api/decoding.py: a malformed message is INVALID_ARGUMENT naming the
field, decided before any work), run the handler, and turn whatever it
raised into a status. Domain errors map through api/errors.py; anything
else is logged with a reference id and answered INTERNAL with that id only,
so no stack trace or internal detail reaches a client.

Streaming handlers are wrapped as async generators, never in the
`context.write()` style, which breaks under interceptors.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import grpc
from google.protobuf import message_factory
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from contextd.admission import Admission
from contextd.api.auth import ApiKeys
from contextd.api.decoding import RequestDecoder
from contextd.api.errors import status_code, status_message, trailing_metadata
from contextd.api.outage_log import OutageLog
from contextd.api.responses import passing_encoded
from contextd.config import TenantLimits
from contextd.engine.errors import ContextdError, LimitExceeded
from contextd.telemetry import tracer
from contextd_client.v1 import contextd_pb2

log = logging.getLogger("contextd.api")

_SERVICE = contextd_pb2.DESCRIPTOR.services_by_name["ContextService"]
_DECODERS = {
    f"/{_SERVICE.full_name}/{m.name}": RequestDecoder(message_factory.GetMessageClass(m.input_type))
    for m in _SERVICE.methods
}

Metadata = Sequence[tuple[str, str | bytes]]


class ServiceInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, api_keys: ApiKeys, max_request_bytes: int, admission: Admission | None = None) -> None:
        self._api_keys = api_keys
        self._max_request_bytes = max_request_bytes
        self._admission = admission or Admission(TenantLimits())
        self._outages = OutageLog(log)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        decode = _DECODERS.get(method)
        if handler is None or decode is None:
            return handler  # health and reflection are served as they are
        # The handler gets the request's bytes (no deserializer): decoding them is the
        # interceptor's, after authentication and admission, with errors a client can act on.
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(method, decode, handler.unary_unary),
                response_serializer=passing_encoded(handler.response_serializer),
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._stream(method, decode, handler.unary_stream),
                response_serializer=handler.response_serializer,
            )
        return handler

    def _unary(
        self, method: str, decode: RequestDecoder, inner: Any
    ) -> Callable[[bytes, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]:
        async def behavior(data: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            metadata: Metadata = tuple(context.invocation_metadata() or ())
            with _server_span(method, metadata) as span:
                try:
                    with self._api_keys.acting_as(metadata) as tenant:
                        span.set_attribute("contextd.tenant", tenant)
                        request = await self._admit(tenant, decode, data)
                        return await inner(request, context)
                except grpc.aio.AbortError:
                    raise
                except Exception as exc:
                    await _abort(context, span, method, exc, self._outages)

        return behavior

    def _stream(
        self, method: str, decode: RequestDecoder, inner: Any
    ) -> Callable[[bytes, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Any]]:
        async def behavior(data: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            metadata: Metadata = tuple(context.invocation_metadata() or ())
            with _server_span(method, metadata) as span:
                try:
                    with self._api_keys.acting_as(metadata) as tenant:
                        span.set_attribute("contextd.tenant", tenant)
                        request = await self._admit(tenant, decode, data)
                        async for response in inner(request, context):
                            yield response
                except grpc.aio.AbortError:
                    raise
                except Exception as exc:
                    await _abort(context, span, method, exc, self._outages)

        return behavior

    async def _admit(self, tenant: str, decode: RequestDecoder, data: bytes) -> Any:
        """The request, once the tenant's rate admits the call and its bytes are within the limit."""
        await self._admission.admit_call(tenant)
        if len(data) > self._max_request_bytes:
            raise LimitExceeded.at(
                "request",
                f"{len(data):,} bytes, over the limit of {self._max_request_bytes:,} bytes per message "
                "(max_message_bytes)",
            )
        return decode(data)


@contextmanager
def _server_span(method: str, metadata: Metadata) -> Iterator[trace.Span]:
    service, _, name = method[1:].partition("/")
    started = time.perf_counter()
    carrier: Mapping[str, str] = {k: v for k, v in metadata if isinstance(v, str)}
    with tracer.start_as_current_span(
        f"{service}/{name}",
        context=propagate.extract(carrier),
        kind=SpanKind.SERVER,
        attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": name},
        record_exception=False,  # _abort records what failed; an abort is not an exception here
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        finally:
            span.set_attribute("rpc.duration_ms", round((time.perf_counter() - started) * 1000, 3))


async def _abort(
    context: grpc.aio.ServicerContext[Any, Any], span: trace.Span, method: str, exc: Exception, outages: OutageLog
) -> None:
    if isinstance(exc, ContextdError):
        code = status_code(exc)
        span.set_attribute("contextd.error_reason", exc.reason)
        if code is grpc.StatusCode.UNAVAILABLE:
            outages.failed(exc.reason, f"{method}: {status_message(exc)}")
        span.set_status(Status(StatusCode.ERROR, exc.reason))
        await context.abort(code, status_message(exc), trailing_metadata(exc, code))
    reference = uuid.uuid4().hex[:12]
    log.error("%s failed (reference %s)", method, reference, exc_info=exc)
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error (reference {reference}); see the server log")
