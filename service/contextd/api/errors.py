"""Domain errors to gRPC statuses.

Each error leaves the server as a status code, a message for humans, and
two machine-readable forms of the same facts:

* trailing metadata `contextd-reason` plus one `contextd-<key>` per fact
  (`contextd-current-version`, `contextd-field`, `contextd-retry-after-ms`),
  readable by any gRPC client without extra protos;
* the standard `grpc-status-details-bin` google.rpc.Status with an ErrorInfo
  (domain "contextd.v1"), a BadRequest listing every bad field, and a
  RetryInfo when a retry is expected to succeed.
"""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

from contextd.engine.errors import (
    CallNotFound,
    ContextdError,
    EventsExpired,
    EventsOff,
    IdempotencyKeyReused,
    InvalidArgument,
    ItemRedacted,
    OriginalNotFound,
    QuotaExceeded,
    RateLimited,
    Retryable,
    SessionBusy,
    SessionExists,
    SessionNotFound,
    StorageUnavailable,
    TooManyWatches,
    Unauthenticated,
    UsageAlreadyReported,
    VersionConflict,
    ViewTooLarge,
    WatchLagging,
)

DOMAIN = "contextd.v1"
DETAILS_KEY = "grpc-status-details-bin"
REASON_KEY = "contextd-reason"

_CODES: list[tuple[type[ContextdError], grpc.StatusCode]] = [
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (SessionNotFound, grpc.StatusCode.NOT_FOUND),
    (OriginalNotFound, grpc.StatusCode.NOT_FOUND),
    (ItemRedacted, grpc.StatusCode.NOT_FOUND),
    (CallNotFound, grpc.StatusCode.NOT_FOUND),
    (UsageAlreadyReported, grpc.StatusCode.ALREADY_EXISTS),
    (SessionExists, grpc.StatusCode.ALREADY_EXISTS),
    (IdempotencyKeyReused, grpc.StatusCode.ALREADY_EXISTS),
    (VersionConflict, grpc.StatusCode.ABORTED),
    (WatchLagging, grpc.StatusCode.ABORTED),
    (EventsExpired, grpc.StatusCode.OUT_OF_RANGE),
    (EventsOff, grpc.StatusCode.FAILED_PRECONDITION),
    (SessionBusy, grpc.StatusCode.UNAVAILABLE),
    (StorageUnavailable, grpc.StatusCode.UNAVAILABLE),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (ViewTooLarge, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (RateLimited, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (QuotaExceeded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (TooManyWatches, grpc.StatusCode.RESOURCE_EXHAUSTED),
    # Any other "not now" (a busy pool of render workers, say): the server could not take it.
    (Retryable, grpc.StatusCode.UNAVAILABLE),
]


def status_code(error: ContextdError) -> grpc.StatusCode:
    for kind, code in _CODES:
        if isinstance(error, kind):
            return code
    return grpc.StatusCode.INTERNAL


def _pack(message: object) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)  # type: ignore[arg-type]
    return packed


# Errors travel in HTTP/2 trailers, which clients cap (gRPC's default: 8 KiB for all of
# them): a message echoing a hostile value (a 200,000-character name) is cut short.
MAX_MESSAGE_CHARS = 1000
MAX_DESCRIPTION_CHARS = 300
MAX_VIOLATIONS = 20
MAX_FACT_CHARS = 200


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text):,} characters)"


def status_message(error: ContextdError) -> str:
    """The error's message as sent: bounded."""
    return _short(error.message, MAX_MESSAGE_CHARS)


def _ascii(value: str) -> str:
    """Plain metadata values must be printable ASCII: escape the rest, and keep them short."""
    escaped = value.encode("unicode_escape").decode("ascii")
    return escaped if len(escaped) <= MAX_FACT_CHARS else escaped[:MAX_FACT_CHARS] + "..."


def trailing_metadata(error: ContextdError, code: grpc.StatusCode) -> tuple[tuple[str, str | bytes], ...]:
    facts = {key: _short(value, MAX_FACT_CHARS) for key, value in error.metadata.items()}
    details = [_pack(error_details_pb2.ErrorInfo(reason=error.reason, domain=DOMAIN, metadata=facts))]
    if isinstance(error, InvalidArgument):
        details.append(
            _pack(
                error_details_pb2.BadRequest(
                    field_violations=[
                        error_details_pb2.BadRequest.FieldViolation(
                            field=_short(v.field, MAX_FACT_CHARS),
                            description=_short(v.description, MAX_DESCRIPTION_CHARS),
                        )
                        for v in error.violations[:MAX_VIOLATIONS]
                    ]
                )
            )
        )
    if isinstance(error, Retryable):
        delay = duration_pb2.Duration()
        delay.FromMilliseconds(error.retry_after_ms)
        details.append(_pack(error_details_pb2.RetryInfo(retry_delay=delay)))
    status = status_pb2.Status(code=code.value[0], message=status_message(error), details=details)
    metadata: list[tuple[str, str | bytes]] = [(DETAILS_KEY, status.SerializeToString()), (REASON_KEY, error.reason)]
    metadata.extend((f"contextd-{key.replace('_', '-')}", _ascii(value)) for key, value in error.metadata.items())
    return tuple(metadata)
