"""WatchSession for both clients: a session's events as they come, resumed from the
last cursor after a disconnect, so a watcher sees every event once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from contextd_client._errors import error_from_rpc
from contextd_client._retry import RetryPolicy
from contextd_client.v1 import contextd_pb2 as api

LAGGING = "WATCH_LAGGING"


@dataclass(frozen=True, slots=True)
class SessionEvent:
    """One event of a watch (or, when asked for, a heartbeat)."""

    cursor: str
    """Pass it to `watch_session(cursor=...)` to resume after this event."""
    session_id: str
    """Empty on a heartbeat."""
    time: datetime
    kind: str
    """The event's name in the API: "items_appended", "view_rendered", "decisions_made",
    "deferred_applied", "handle_retrieved", "items_pinned", "items_unpinned",
    "prune_proposed", "usage_reported", "policy_updated", "session_created",
    "session_deleted", or "heartbeat"."""
    details: dict[str, Any]
    """Its fields (WatchSessionResponse in contextd.proto), enums as lower-case names
    ("prune", "openai_chat")."""


def _fields(message: Message) -> dict[str, Any]:
    return {f.name: _value(f, getattr(message, f.name)) for f in message.DESCRIPTOR.fields}


def _value(field: Any, value: Any) -> Any:
    if field.is_repeated:
        return [_one(field, v) for v in value]
    return _one(field, value)


def _one(field: Any, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return _fields(value)
    if field.type == FieldDescriptor.TYPE_ENUM and (enum := field.enum_type) is not None:
        prefix = "".join(f"_{c}" if c.isupper() else c.upper() for c in enum.name).lstrip("_") + "_"
        named = enum.values_by_number.get(value)
        return named.name.removeprefix(prefix).lower() if named is not None else value
    return value


def event_from_proto(response: api.WatchSessionResponse) -> SessionEvent:
    kind = response.WhichOneof("event") or ""
    details = _fields(getattr(response, kind)) if kind else {}
    at = response.time.ToDatetime(tzinfo=UTC)
    return SessionEvent(response.cursor, response.session_id, at, kind, details)


class WatchProgress:
    """Where a watch stands, and whether (and when) it goes on after its stream failed."""

    def __init__(
        self, session_id: str, cursor: str, retry: RetryPolicy, heartbeats: bool, clock: Callable[[], float]
    ) -> None:
        self.session_id = session_id
        self.cursor = cursor
        self.retry = retry
        self.heartbeats = heartbeats
        self.clock = clock
        self._failures = 0
        self._failing_since = 0.0
        self.resumed = 0
        """Times the watch was reopened after its stream failed."""

    def request(self) -> api.WatchSessionRequest:
        return api.WatchSessionRequest(session_id=self.session_id, cursor=self.cursor)

    def received(self, response: api.WatchSessionResponse) -> SessionEvent | None:
        """Note the answer's cursor; the event to hand on (None for a heartbeat unless asked)."""
        self.cursor = response.cursor
        self._failures = 0
        if response.HasField("heartbeat") and not self.heartbeats:
            return None
        return event_from_proto(response)

    def reconnect_after(self, error: grpc.RpcError) -> float:
        """Seconds to wait before resuming; raises the error as a ContextdError when resuming
        cannot help (a bad cursor, events past retention, no such session) or the retry
        policy's budget is spent without one answer."""
        now = self.clock()
        if self._failures == 0:
            self._failing_since = now
        self._failures += 1
        failure = error_from_rpc(error)
        if error.code() == grpc.StatusCode.ABORTED and failure.reason == LAGGING:
            delay: float | None = 0.0  # it fell behind: the log has what it missed
        else:
            delay = self.retry.delay(self._failures, error, now - self._failing_since)
        if delay is None:
            raise failure from None
        self.resumed += 1
        return delay


class _OpenWatch:
    """What both flavours of an open watch hold: how to open its stream, where it stands,
    and the stream it is reading (to cancel)."""

    def __init__(self, open_stream: Callable[[api.WatchSessionRequest], Any], progress: WatchProgress) -> None:
        self._open = open_stream
        self._progress = progress
        self._stream: Any = None
        self._closed = False

    @property
    def cursor(self) -> str:
        return self._progress.cursor

    @property
    def resumed(self) -> int:
        """Times the watch was reopened after a disconnect (or after falling behind)."""
        return self._progress.resumed

    def close(self) -> None:
        self._closed = True
        if self._stream is not None:
            self._stream.cancel()


class Watch(_OpenWatch):
    """An open watch: iterate it for events. `cursor` is where it stands (a later watch
    resumes from it); `close()` ends it, from any thread."""

    def __iter__(self) -> Iterator[SessionEvent]:
        while not self._closed:
            self._stream = self._open(self._progress.request())
            try:
                for response in self._stream:
                    event = self._progress.received(response)
                    if event is not None:
                        yield event
                return  # ended by the server: the watched session was deleted
            except grpc.RpcError as error:
                if self._closed:
                    return
                time.sleep(self._progress.reconnect_after(error))

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncWatch(_OpenWatch):
    """`Watch` for asyncio: iterate it with `async for`."""

    async def __aiter__(self) -> AsyncIterator[SessionEvent]:
        while not self._closed:
            self._stream = self._open(self._progress.request())
            try:
                async for response in self._stream:
                    event = self._progress.received(response)
                    if event is not None:
                        yield event
                return
            except grpc.RpcError as error:
                if self._closed:
                    return
                await asyncio.sleep(self._progress.reconnect_after(error))

    async def __aenter__(self) -> AsyncWatch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
