"""The event feed in process, on a real database: a watcher that does not read is cut off
once its buffer is full (writers never wait for it, and it resumes from the log at its
own pace); other watchers are unaffected."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from contextd.engine.errors import WatchLagging
from contextd.watch import EventFeed, Heartbeat, WatchSettings
from contextd_storage import events, migrate
from contextd_storage.database import Database
from contextd_storage.events import NewEvent
from contextd_storage.history import HistoryStore


@pytest.fixture
async def feed(tmp_path: Path) -> AsyncIterator[EventFeed]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'feed.db'}"
    await migrate.upgrade(url)
    db = Database(url)
    running = EventFeed(HistoryStore(db), WatchSettings(poll_seconds=0.05, buffer_events=3, heartbeat_seconds=30))
    db.on_events = running.wake
    running.start()
    yield running
    await running.close()
    await db.close()


async def _write(db: Database, session_id: str, n: int, start: int = 0) -> None:
    for k in range(start, start + n):
        async with db.write() as conn:
            await events.record(conn, NewEvent("t", session_id, "items_appended", {"first_seq": k + 1}))


async def test_a_watcher_that_does_not_read_is_cut_off_and_writers_never_wait(feed: EventFeed) -> None:
    slow = feed.watch("t", "", "")
    assert isinstance(await anext(slow), Heartbeat)  # joined
    await asyncio.wait_for(_write(feed.db, "other", 10), 10)  # nobody reads: the writes go on regardless
    for _ in range(200):  # the feed hands the events on, and finds the buffer full
        if any(w.ended for w in feed._watchers):
            break
        await asyncio.sleep(0.05)
    with pytest.raises(WatchLagging):  # ended at once: its client resumes from the log at its own pace
        await anext(slow)


async def test_a_burst_past_the_buffer_reaches_a_watcher_that_keeps_reading(feed: EventFeed) -> None:
    """Ten events written at once to watchers whose buffer holds three: the feed hands them on in
    parts no larger than the buffer, so one that keeps reading gets them all."""
    quick = feed.watch("t", "", "")
    assert isinstance(await anext(quick), Heartbeat)
    async with feed.db.write() as conn:
        for k in range(10):
            await events.record(conn, NewEvent("t", "s", "items_appended", {"first_seq": k + 1}))
    seen: list[object] = []
    while len(seen) < 10:
        event = await asyncio.wait_for(anext(quick), 10)
        if not isinstance(event, Heartbeat):
            seen.append(event)
    assert [e.body["first_seq"] for e in seen] == list(range(1, 11))  # type: ignore[attr-defined]
    await quick.aclose()


async def test_a_lagging_watcher_does_not_hold_up_another(feed: EventFeed) -> None:
    slow, quick = feed.watch("t", "", ""), feed.watch("t", "", "")
    assert isinstance(await anext(slow), Heartbeat) and isinstance(await anext(quick), Heartbeat)

    async def next_event() -> object:
        while isinstance(event := await anext(quick), Heartbeat):
            pass
        return event

    # One event at a time, each read by the quick watcher before the next is written.
    seen = []
    for k in range(8):
        await _write(feed.db, "s", 1, start=k)
        seen.append(await asyncio.wait_for(next_event(), 10))
    assert [e.body["first_seq"] for e in seen] == list(range(1, 9))  # type: ignore[attr-defined]
    for _ in range(200):  # meanwhile the slow one fell more than its buffer behind
        if sum(w.ended is not None for w in feed._watchers) == 1:
            break
        await asyncio.sleep(0.05)
    with pytest.raises(WatchLagging):
        await anext(slow)
    await quick.aclose()


@pytest.mark.parametrize("prune", [True, False])
async def test_only_a_feed_that_prunes_deletes_events_past_the_retention_window(tmp_path: Path, prune: bool) -> None:
    """A server's render processes start their feed without pruning: the serving process's does."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'feed.db'}"
    await migrate.upgrade(url)
    db = Database(url)
    running = EventFeed(HistoryStore(db), WatchSettings(retention_seconds=1, poll_seconds=0.05))
    running.start(prune=prune)
    try:
        await _write(db, "s", 3)
        kept: list[object] = [object()]
        for _ in range(40):  # pruning, every tenth of the window, deletes them soon past it
            await asyncio.sleep(0.1)
            async with db.read() as conn:
                kept, _ = await events.read(conn, events.OLDEST)
            if not kept:
                break
        assert len(kept) == (0 if prune else 3)
    finally:
        await running.close()
        await db.close()
