"""The server interceptor every contextd RPC passes through.

For each call, in order: open a SERVER span (continuing the caller's trace
from the metadata), resolve the tenant from the API key, admit the call
under the tenant's rate (service/contextd/admission.py), decode the request from its
bytes (api/decoding.py: a malformed message is INVALID_ARGUMENT naming the
field, decided before any work), run the handler, and turn whatever it
raised into a status. Domain errors map through api/errors.py; anything
else is logged with a reference id and answered INTERNAL with that id only,
so no stack trace or internal detail reaches a client. When the call ends,
its duration, sizes and status are recorded (contextd/metrics.py).

Streaming handlers are wrapped as async generators, never in the
`context.write()` style, which breaks under interceptors.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import grpc
from google.protobuf import message_factory
from opentelemetry import propagate
from opentelemetry.trace import SpanKind, Status, StatusCode

from contextd import metrics
from contextd.admission import Admission
from contextd.api.auth import ApiKeys
from contextd.api.decoding import RequestDecoder
from contextd.api.errors import status_code, status_message, trailing_metadata
from contextd.api.outage_log import OutageLog
from contextd.api.responses import Encoded, passing_encoded
from contextd.config import TenantLimits
from contextd.engine.errors import ContextdError, LimitExceeded
from contextd.render_processes import Relayed
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
    def __init__(
        self,
        api_keys: ApiKeys,
        max_request_bytes: int,
        admission: Admission | None = None,
        measure_calls: bool = True,
    ) -> None:
        self._api_keys = api_keys
        self._max_request_bytes = max_request_bytes
        self._admission = admission or Admission(TenantLimits())
        self._outages = OutageLog(log)
        self._measure = measure_calls

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
            with _Call(method, metadata, context, len(data), self._measure) as call:
                try:
                    with self._api_keys.acting_as(metadata) as tenant:
                        call.tenant = tenant
                        request = await self._admit(tenant, decode, data)
                        call.session_id = getattr(request, "session_id", "")
                        response = await inner(request, context)
                        call.responded(response)
                        return response
                except grpc.aio.AbortError:
                    raise
                except Exception as exc:
                    await call.abort(exc, self._outages)

        return behavior

    def _stream(
        self, method: str, decode: RequestDecoder, inner: Any
    ) -> Callable[[bytes, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Any]]:
        async def behavior(data: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            metadata: Metadata = tuple(context.invocation_metadata() or ())
            with _Call(method, metadata, context, len(data), self._measure) as call:
                try:
                    with self._api_keys.acting_as(metadata) as tenant:
                        call.tenant = tenant
                        request = await self._admit(tenant, decode, data)
                        call.session_id = getattr(request, "session_id", "")
                        async for response in inner(request, context):
                            call.responded(response)
                            yield response
                except grpc.aio.AbortError:
                    raise
                except Exception as exc:
                    await call.abort(exc, self._outages)

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


class _Call:
    """One RPC as telemetry sees it: its SERVER span (continuing the caller's trace) and, when
    it ends, its duration and sizes under the semantic conventions for RPC, by status."""

    def __init__(
        self,
        method: str,
        metadata: Metadata,
        context: grpc.aio.ServicerContext[Any, Any],
        request_bytes: int,
        measured: bool = True,
    ) -> None:
        self.method = method[1:]  # package.Service/Method
        self.context = context
        self.measured = measured
        self.tenant = ""
        self.session_id = ""
        self.response_bytes = 0
        self.recorded = False
        carrier: Mapping[str, str] = {k: v for k, v in metadata if isinstance(v, str)}
        self._span = tracer.start_as_current_span(
            self.method,
            context=propagate.extract(carrier),
            kind=SpanKind.SERVER,
            attributes={"rpc.system.name": "grpc", "rpc.method": self.method},
            record_exception=False,  # abort() records what failed; an abort is not an exception here
            set_status_on_exception=False,
        )
        if measured:
            metrics.rpc_request_size.record(request_bytes, {"rpc.system.name": "grpc", "rpc.method": self.method})

    def __enter__(self) -> _Call:
        self.started = time.perf_counter()
        self.span = self._span.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if not self.recorded:
            self._record(_status_name(self.context) or "OK")
        self._span.__exit__(*exc_info)

    def _record(self, status: str) -> None:
        """The call's metrics and status attributes; before its answer leaves, where that can be."""
        self.recorded = True
        if self.tenant:
            self.span.set_attribute("contextd.tenant", self.tenant)
        self.span.set_attribute("rpc.response.status_code", status)
        if status != "OK":
            self.span.set_attribute("error.type", status)
        if not self.measured:
            return
        if self.tenant and self.session_id:
            metrics.active_sessions.seen(self.tenant, self.session_id)
        attributes = {
            "rpc.system.name": "grpc",
            "rpc.method": self.method,
            "rpc.response.status_code": status,
            metrics.TENANT: self.tenant,
        }
        if status != "OK":
            attributes["error.type"] = status
        metrics.rpc_duration.record(time.perf_counter() - self.started, attributes)
        if status == "OK":
            metrics.rpc_response_size.record(
                self.response_bytes, {"rpc.system.name": "grpc", "rpc.method": self.method}
            )

    def responded(self, response: Any) -> None:
        self.response_bytes += len(response.data) if isinstance(response, Encoded) else response.ByteSize()

    async def abort(self, exc: Exception, outages: OutageLog) -> None:
        """Answer the call with the status `exc` maps to (INTERNAL, with a reference, when it
        maps to none); never returns."""
        span = self.span
        if isinstance(exc, Relayed):  # a render process's answer, passed on as it was given
            if exc.reason:
                span.set_attribute("contextd.error_reason", exc.reason)
                self._failed(exc.reason)
            span.set_status(Status(StatusCode.ERROR, exc.reason or exc.code.name))
            self._record(exc.code.name)
            await self.context.abort(exc.code, exc.details, exc.trailers)
        if isinstance(exc, ContextdError):
            code = status_code(exc)
            span.set_attribute("contextd.error_reason", exc.reason)
            self._failed(exc.reason)
            if code is grpc.StatusCode.UNAVAILABLE:
                outages.failed(exc.reason, f"/{self.method}: {status_message(exc)}")
            span.set_status(Status(StatusCode.ERROR, exc.reason))
            self._record(code.name)
            await self.context.abort(code, status_message(exc), trailing_metadata(exc, code))
        reference = uuid.uuid4().hex[:12]
        log.error("/%s failed (reference %s)", self.method, reference, exc_info=exc)
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        self._record(grpc.StatusCode.INTERNAL.name)
        message = f"internal error (reference {reference}); see the server log"
        await self.context.abort(grpc.StatusCode.INTERNAL, message)

    def _failed(self, reason: str) -> None:
        if self.measured:
            metrics.failures.add(1, {metrics.TENANT: self.tenant, "contextd.error_reason": reason})


def _status_name(context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
    """The status a handler set itself (context.abort, set_code), if any."""
    code = context.code()
    if code is None:
        return None
    if isinstance(code, grpc.StatusCode):
        return code.name
    return next((c.name for c in grpc.StatusCode if c.value[0] == code), str(code))
