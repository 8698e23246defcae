"""Domain errors. The api layer maps each to a gRPC status (api/errors.py).

Every error has a stable `reason` (documented in docs/errors.md) that
clients can branch on, a message for humans, and string metadata with the
facts a client needs to react (the current version, the field at fault).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FieldViolation:
    field: str
    """Path of the bad field in the request, e.g. ``items[3].content[0].text``."""
    description: str


class ContextdError(Exception):
    reason = "INTERNAL"

    def __init__(self, message: str, metadata: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.metadata: dict[str, str] = dict(metadata or {})


class InvalidArgument(ContextdError):
    reason = "INVALID_ARGUMENT"

    def __init__(self, violations: Sequence[FieldViolation], reason: str | None = None) -> None:
        if not violations:
            raise ValueError("InvalidArgument needs at least one violation")
        self.violations = tuple(violations)
        first = self.violations[0]
        more = f" (and {len(self.violations) - 1} more)" if len(self.violations) > 1 else ""
        super().__init__(f"{first.field}: {first.description}{more}", {"field": first.field})
        if reason:
            self.reason = reason

    @classmethod
    def at(cls, field: str, description: str, reason: str | None = None) -> InvalidArgument:
        return cls([FieldViolation(field, description)], reason)


class LimitExceeded(InvalidArgument):
    """A request over a configured size limit (still INVALID_ARGUMENT)."""

    reason = "LIMIT_EXCEEDED"


class SessionNotFound(ContextdError):
    reason = "SESSION_NOT_FOUND"

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} not found", {"session_id": session_id})


class OriginalNotFound(ContextdError):
    """A handle (or seq) that names nothing of this session: never an empty answer."""

    reason = "ORIGINAL_NOT_FOUND"

    def __init__(self, session_id: str, what: str) -> None:
        super().__init__(f"{what} names nothing in session {session_id!r}", {"session_id": session_id})


class ItemRedacted(ContextdError):
    """The item was redacted (RetractItems with redact): its content is never returned."""

    reason = "ITEM_REDACTED"

    def __init__(self, session_id: str, seq: int) -> None:
        super().__init__(
            f"seq {seq} of session {session_id!r} was redacted: its content is not returned",
            {"session_id": session_id, "seq": str(seq)},
        )


class SessionExists(ContextdError):
    reason = "SESSION_EXISTS"

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} already exists", {"session_id": session_id})


class VersionConflict(ContextdError):
    reason = "VERSION_CONFLICT"

    def __init__(self, session_id: str, expected: int, current: int) -> None:
        super().__init__(
            f"session {session_id!r} is at version {current}, not the expected {expected}",
            {"session_id": session_id, "expected_version": str(expected), "current_version": str(current)},
        )
        self.expected = expected
        self.current = current


class IdempotencyKeyReused(ContextdError):
    reason = "IDEMPOTENCY_KEY_REUSED"

    def __init__(self, session_id: str, key: str) -> None:
        super().__init__(
            f"idempotency key {key!r} was already used in session {session_id!r} for a different batch",
            {"session_id": session_id, "idempotency_key": key},
        )


class Retryable(ContextdError):
    """The call could not be taken now and a retry after `retry_after_ms` is expected to work."""

    def __init__(self, message: str, retry_after_ms: int, metadata: Mapping[str, str] | None = None) -> None:
        super().__init__(message, {**(metadata or {}), "retry_after_ms": str(retry_after_ms)})
        self.retry_after_ms = retry_after_ms


class SessionBusy(Retryable):
    """The per-session lock was not acquired within the bounded wait."""

    reason = "SESSION_BUSY"

    def __init__(self, session_id: str, waited_ms: int, retry_after_ms: int) -> None:
        what = f"session {session_id!r}" if session_id else "the database"
        super().__init__(
            f"{what} is busy: other writers held it for {waited_ms} ms; retry",
            retry_after_ms,
            {"session_id": session_id},
        )


class RateLimited(Retryable):
    """The tenant is over one of its rates (calls, or appended bytes, per second)."""

    reason = "RATE_LIMITED"

    def __init__(self, tenant: str, what: str, limit: int, retry_after_ms: int) -> None:
        super().__init__(
            f"tenant {tenant!r} is over its limit of {limit:,} {what} per second; retry in {retry_after_ms} ms",
            retry_after_ms,
            {"limit": str(limit), "per": what},
        )


class QuotaExceeded(ContextdError):
    """What the call asks for can never fit the tenant's limit as it stands: no retry helps."""

    reason = "QUOTA_EXCEEDED"

    def __init__(self, message: str, limit: int) -> None:
        super().__init__(message, {"limit": str(limit)})


class ViewTooLarge(ContextdError):
    """A rendered view over the message size the server may send."""

    reason = "VIEW_TOO_LARGE"

    def __init__(self, session_id: str, size: int, limit: int) -> None:
        super().__init__(
            f"the view of session {session_id!r} is {size:,} bytes, over the limit of {limit:,} bytes per message "
            "(max_message_bytes); render with a budget or raise the limit",
            {"session_id": session_id, "view_bytes": str(size), "max_message_bytes": str(limit)},
        )


class CallNotFound(ContextdError):
    """ReportUsage for a view version the session never rendered (or a dry run's)."""

    reason = "CALL_NOT_FOUND"

    def __init__(self, session_id: str, view_version: int) -> None:
        super().__init__(
            f"session {session_id!r} has no render with view version {view_version}",
            {"session_id": session_id, "view_version": str(view_version)},
        )


class UsageAlreadyReported(ContextdError):
    """ReportUsage with other figures for a call whose usage was reported already."""

    reason = "USAGE_ALREADY_REPORTED"

    def __init__(self, session_id: str, view_version: int) -> None:
        super().__init__(
            f"the call made with view version {view_version} of session {session_id!r} has other usage reported "
            "already",
            {"session_id": session_id, "view_version": str(view_version)},
        )


class StorageUnavailable(Retryable):
    """The database cannot serve the call now: nothing of it was written (or, when the answer
    to a COMMIT was lost, all of it was: a retry with the same idempotency key tells)."""

    reason = "DATABASE_UNAVAILABLE"
    """Refused, lost, shutting down, starting up, in recovery or read-only (a failover)."""

    def __init__(self, message: str, retry_after_ms: int, reason: str | None = None) -> None:
        super().__init__(message, retry_after_ms)
        if reason:
            self.reason = reason


class EventsExpired(ContextdError):
    """A watch resumed from a cursor older than the events the service still keeps."""

    reason = "EVENTS_EXPIRED"

    def __init__(self, cursor: str, oldest: str, retention_seconds: int) -> None:
        super().__init__(
            f"the events after cursor {cursor} are no longer kept (events are kept {retention_seconds:,} s): "
            f"the retained events begin after cursor {oldest}; watch from there or from now (no cursor)",
            {"cursor": cursor, "oldest_cursor": oldest},
        )


class EventsOff(ContextdError):
    """WatchSession on a server that records no events (watch_events is off)."""

    reason = "EVENTS_OFF"

    def __init__(self) -> None:
        super().__init__("this server records no session events (watch_events is off): nothing to watch")


class WatchLagging(Retryable):
    """A watcher fell further behind the events than its buffer holds; it resumes from its cursor."""

    reason = "WATCH_LAGGING"

    def __init__(self, buffered: int) -> None:
        super().__init__(
            f"this watch fell more than {buffered:,} events behind (watch_buffer_events): resume from its last cursor",
            0,
        )


class TooManyWatches(ContextdError):
    """The tenant already has as many watches open on this replica as it may."""

    reason = "TOO_MANY_WATCHES"

    def __init__(self, tenant: str, limit: int) -> None:
        super().__init__(
            f"tenant {tenant!r} has {limit:,} watches open on this server, its limit (watch_max_per_tenant)",
            {"limit": str(limit)},
        )


class ServerStopping(Retryable):
    """The server is shutting down: the call (a watch, say) goes on at another replica."""

    reason = "SERVER_STOPPING"

    def __init__(self) -> None:
        super().__init__("this server is shutting down: retry (a watch resumes from its last cursor)", 0)


DATABASE_BUSY = "DATABASE_BUSY"
"""StorageUnavailable's reason when every pooled connection of this server stayed busy."""


class Unauthenticated(ContextdError):
    reason = "UNAUTHENTICATED"
