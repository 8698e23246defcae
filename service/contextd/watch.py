"""WatchSession: a session's events (or a tenant's), live and from a cursor (DESIGN section 8).

Events are rows written with the change they record (contextd_storage/events.py),
so they reach a watcher on any replica whichever replica made the change. Each
replica reads them once for all its watchers: one `EventFeed` follows the log
(`watch_poll_ms` apart, and at once after a commit of its own) while someone
watches, and hands each event to the bounded queue of every watcher whose tenant
(and session) it matches. A watch is its catch-up (the events after its cursor,
read from the log up to where the feed stood when it joined) followed by its
queue: the feed has every event after that point, so nothing is missed and
nothing comes twice.

A watcher never slows a writer: the writers' only cost is their event's row. A
slow watcher's queue fills; past `watch_buffer_events` the feed stops filling it
and its stream ends with WATCH_LAGGING, and it resumes from its last cursor (from
the log, at its own pace). An idle stream gets a heartbeat every
`watch_heartbeat_seconds`, whose cursor moves on with the log, so a watcher that
resumes from it reads only what is new; a watch without a cursor starts with one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from contextd import metrics
from contextd.engine.errors import (
    ContextdError,
    EventsExpired,
    EventsOff,
    InvalidArgument,
    ServerStopping,
    SessionNotFound,
    TooManyWatches,
    WatchLagging,
)
from contextd.sessions import check_session_id
from contextd_storage import events
from contextd_storage.events import OLDEST, Cursor, Event
from contextd_storage.history import HistoryStore

log = logging.getLogger("contextd.watch")

READ_BATCH = 500
"""Events one read of the log takes (the feed's, or a catch-up's)."""


@dataclass(frozen=True, slots=True)
class WatchSettings:
    events: bool = True
    """Whether this server records events at all (off: watches are refused)."""
    retention_seconds: int = 86400
    poll_seconds: float = 0.2
    heartbeat_seconds: float = 15.0
    buffer_events: int = 1000
    max_per_tenant: int = 100


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Nothing for the watcher since its last answer; `cursor` is where it stands now."""

    cursor: Cursor
    time: datetime


class _Watcher:
    def __init__(self, tenant: str, session_id: str, buffer: int) -> None:
        self.tenant = tenant
        self.session_id = session_id
        self.queue: asyncio.Queue[Event | None] = asyncio.Queue(buffer)
        self.position = OLDEST
        """Every event of this watcher at or before this cursor is in its queue, or was sent."""
        self.sent = OLDEST
        """Events at or before this cursor were sent (by the catch-up): the queue skips them."""
        self.ended: ContextdError | None = None
        self.joined: asyncio.Future[Cursor] = asyncio.get_running_loop().create_future()

    def wants(self, event: Event) -> bool:
        return event.tenant == self.tenant and (not self.session_id or event.session_id == self.session_id)

    def offer(self, event: Event) -> None:
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.end(WatchLagging(self.queue.maxsize))

    def end(self, error: ContextdError) -> None:
        if self.ended is None:
            self.ended = error
            if not self.joined.done():  # still waiting to join: it ends there
                self.joined.set_exception(error)
            with contextlib.suppress(asyncio.QueueFull):
                self.queue.put_nowait(None)  # wakes the stream (a full queue wakes it anyway)


class EventFeed:
    """This replica's reader of the event log, for all its watchers (see the module's text)."""

    def __init__(self, store: HistoryStore, settings: WatchSettings | None = None) -> None:
        self.store = store
        self.db = store.db
        self.settings = settings or WatchSettings()
        self._watchers: set[_Watcher] = set()
        self._joining: list[_Watcher] = []
        self._per_tenant: Counter[str] = Counter()
        self._position = OLDEST
        self._woken = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._batch = max(1, min(READ_BATCH, self.settings.buffer_events))

    def start(self, *, prune: bool = True) -> None:
        """Follow the log for watchers; `prune`: and delete what is past the retention window
        (one process of a server does: its render processes leave it to the serving one)."""
        self._tasks = [asyncio.create_task(self._follow(), name="contextd-event-feed")]
        if prune:
            self._tasks.append(asyncio.create_task(self._prune(), name="contextd-event-pruning"))

    async def close(self) -> None:
        """End every watch (SERVER_STOPPING: its client resumes at another replica) and stop."""
        self._stopping = True
        for watcher in (*self._watchers, *self._joining):
            watcher.end(ServerStopping())
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def wake(self) -> None:
        """Events were committed here: read them now (Database.on_events)."""
        if self._watchers or self._joining:
            self._woken.set()

    async def watch(self, tenant: str, session_id: str, cursor: str) -> AsyncIterator[Event | Heartbeat]:
        """The events of `session_id` (every session of `tenant` when empty) after `cursor`
        ("": from now on, starting with a heartbeat that says where that is)."""
        if session_id:
            check_session_id(session_id)
        after = _cursor(cursor)
        if not self.settings.events:
            raise EventsOff()
        if self._stopping:
            raise ServerStopping()
        if self._per_tenant[tenant] >= self.settings.max_per_tenant:
            raise TooManyWatches(tenant, self.settings.max_per_tenant)
        watcher = _Watcher(tenant, session_id, self.settings.buffer_events)
        self._per_tenant[tenant] += 1
        metrics.watches.add(1, {metrics.TENANT: tenant})
        try:
            gone: SessionNotFound | None = None
            if session_id:
                try:
                    await self.store.session_key(tenant, session_id)
                except SessionNotFound as missing:
                    if after is None:
                        raise
                    gone = missing  # its deletion may be after the cursor: the catch-up tells
            self._joining.append(watcher)
            self._woken.set()
            joined = await watcher.joined
            if after is None:
                yield Heartbeat(joined, datetime.now(UTC))
            else:
                async for event in self._catch_up(watcher, after, joined):
                    yield event
                    if _ends(watcher, event):
                        return
                if gone is not None:
                    raise gone  # and its deletion was before the cursor
                # Another replica's cursor may be ahead of where this one joined: nothing twice.
                watcher.sent = max(after, joined)
            async for answer in self._live(watcher):
                yield answer
                if isinstance(answer, Event) and _ends(watcher, answer):
                    return
        finally:
            self._leave(watcher)

    async def _catch_up(self, watcher: _Watcher, after: Cursor, through: Cursor) -> AsyncIterator[Event]:
        """The watcher's events after `after` up to where it joined the feed, from the log."""
        while after < through:
            async with self.db.read() as conn:
                pruned = await events.pruned_through(conn)
                if after != OLDEST and after < pruned:
                    raise EventsExpired(after.encode(), pruned.encode(), self.settings.retention_seconds)
                found, after = await events.read(
                    conn,
                    after,
                    through=through,
                    tenant=watcher.tenant,
                    session_id=watcher.session_id,
                    limit=READ_BATCH,
                )
            for event in found:
                if watcher.ended is not None:
                    raise watcher.ended
                yield event

    async def _live(self, watcher: _Watcher) -> AsyncIterator[Event | Heartbeat]:
        while True:
            if watcher.ended is not None:
                raise watcher.ended
            try:
                async with asyncio.timeout(self.settings.heartbeat_seconds):
                    event = await watcher.queue.get()
            except TimeoutError:
                if watcher.queue.empty() and watcher.ended is None:
                    yield Heartbeat(max(watcher.position, watcher.sent), datetime.now(UTC))
                continue
            if event is not None and event.cursor > watcher.sent:
                yield event

    def _leave(self, watcher: _Watcher) -> None:
        self._watchers.discard(watcher)
        if watcher in self._joining:
            self._joining.remove(watcher)
        self._per_tenant[watcher.tenant] -= 1
        if not self._per_tenant[watcher.tenant]:
            del self._per_tenant[watcher.tenant]
        metrics.watches.add(-1, {metrics.TENANT: watcher.tenant})

    async def _follow(self) -> None:
        failing_since: float | None = None
        while True:
            if not self._watchers and not self._joining:
                self._woken.clear()
                await self._woken.wait()
                continue
            try:
                full = await self._step()
                failing_since = None
            except Exception as exc:  # the database, mostly: watchers wait; the feed tries again
                now = time.monotonic()
                if failing_since is None:
                    failing_since = now
                    log.warning("cannot read session events (%s); watchers wait while it retries", exc)
                await asyncio.sleep(min(5.0, max(self.settings.poll_seconds, now - failing_since)))
                continue
            if full:
                continue  # more to read now
            self._woken.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.poll_seconds):
                    await self._woken.wait()

    async def _step(self) -> bool:
        """One read of the log, handed to the watchers; True when it read a whole batch."""
        async with self.db.read() as conn:
            if self._joining and not self._watchers:
                self._position = await events.horizon(conn)  # nobody watched: nothing to hand on before
            joining, self._joining = self._joining, []
            for watcher in joining:
                watcher.position = self._position
                if not watcher.joined.done():  # else its watch has ended already
                    watcher.joined.set_result(self._position)
                    self._watchers.add(watcher)
            # No more at once than a watcher's buffer holds: a burst reaches a watcher that keeps
            # reading in parts, each read while the next is fetched; only one that stops is cut off.
            found, position = await events.read(conn, self._position, limit=self._batch)
        watchers = [w for w in self._watchers if w.ended is None]
        for event in found:
            for watcher in watchers:
                if watcher.ended is None and watcher.wants(event):
                    watcher.offer(event)
        self._position = position
        for watcher in watchers:
            watcher.position = position
        metrics.watch_events.add(len(found))
        return len(found) == self._batch

    async def _prune(self) -> None:
        """Delete events past the retention window, every tenth of the window (at most 10 minutes)."""
        every = min(600.0, self.settings.retention_seconds / 10)
        while True:
            await asyncio.sleep(every)
            try:
                before = datetime.now(UTC) - timedelta(seconds=self.settings.retention_seconds)
                async with self.db.write() as conn:
                    deleted = await events.prune(conn, before)
                if deleted:
                    log.info("pruned %d session events older than %s", deleted, before.isoformat())
            except Exception as exc:  # tried again next time; the log only grows meanwhile
                log.warning("cannot prune session events (%s)", exc)


def _cursor(value: str) -> Cursor | None:
    if not value:
        return None
    try:
        return Cursor.decode(value)
    except ValueError as exc:
        raise InvalidArgument.at("cursor", f"{exc}; pass a cursor from an earlier response, or none") from None


def _ends(watcher: _Watcher, event: Event) -> bool:
    """A watch of one session ends with that session's deletion."""
    return bool(watcher.session_id) and event.kind == "session_deleted"
