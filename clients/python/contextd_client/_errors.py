"""The client's exceptions. Callers never need to import grpc to handle errors."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc

REASON_KEY = "contextd-reason"
_PREFIX = "contextd-"


class ContextdError(Exception):
    """A call to contextd failed.

    `code` is the gRPC status name (e.g. ``"NOT_FOUND"``), `reason` the
    service's stable reason (e.g. ``"SESSION_NOT_FOUND"``), `metadata` the
    facts the service attached (e.g. ``{"current_version": "12"}``).
    """

    def __init__(self, code: str, message: str, reason: str = "", metadata: dict[str, str] | None = None) -> None:
        super().__init__(f"{code}: {message}" + (f" [{reason}]" if reason else ""))
        self.code = code
        self.message = message
        self.reason = reason
        self.metadata = metadata or {}
        self.idempotency_key: str | None = None
        """For a failed append: the key it used. Appending the same items with
        this key again is safe; it writes them at most once."""


class InvalidArgument(ContextdError):
    """The request was refused as malformed or over a limit; `field` names the culprit."""

    @property
    def field(self) -> str:
        return self.metadata.get("field", "")


class NotFound(ContextdError):
    pass


class AlreadyExists(ContextdError):
    pass


class VersionConflict(ContextdError):
    """An append with an expected version found the session at another version."""

    @property
    def current_version(self) -> int:
        return int(self.metadata.get("current_version", "0"))


class Unavailable(ContextdError):
    """The service (or the session's lock) was unavailable, after the client's retries."""


class DeadlineExceeded(ContextdError):
    pass


class Unauthenticated(ContextdError):
    pass


class Unimplemented(ContextdError):
    pass


_CLASSES: dict[grpc.StatusCode, type[ContextdError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.ABORTED: VersionConflict,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
}


def trailers(error: grpc.RpcError) -> Iterator[tuple[str, str | bytes]]:
    """(key, value) pairs of an error's trailing metadata, from sync or asyncio calls alike."""
    metadata: Any = error.trailing_metadata() or ()
    yield from metadata


def error_from_rpc(error: grpc.RpcError) -> ContextdError:
    """Translate a gRPC error into the matching ContextdError."""
    code = error.code()
    details = error.details() or ""
    reason = ""
    metadata: dict[str, str] = {}
    for key, value in trailers(error):
        if not isinstance(value, str) or not key.startswith(_PREFIX):
            continue
        if key == REASON_KEY:
            reason = value
        else:
            metadata[key[len(_PREFIX) :].replace("-", "_")] = value
    kind = _CLASSES.get(code, ContextdError)
    return kind(code.name, details, reason, metadata)
