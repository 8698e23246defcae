"""The session event log: cursors, order, commit-with-the-change, and pruning with its mark."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from contextd_storage import events, migrate
from contextd_storage.database import Database
from contextd_storage.events import OLDEST, Cursor, NewEvent
from tests import backends


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url)
    yield database
    await database.close()


def test_cursors_spell_two_numbers_and_nothing_else() -> None:
    assert Cursor.decode("12-34") == Cursor(12, 34) and Cursor(12, 34).encode() == "12-34"
    assert Cursor.decode("0-0") == OLDEST
    assert Cursor(1, 9) < Cursor(2, 0) < Cursor(2, 1)
    for bad in ("", "1", "1-", "-1-2", "01-2", "1-2-3", "a-b", " 1-2", "9223372036854775808-0"):
        with pytest.raises(ValueError):
            Cursor.decode(bad)


async def _record(db: Database, tenant: str, session_id: str, n: int) -> None:
    for k in range(n):
        async with db.write() as conn:
            await events.record(conn, NewEvent(tenant, session_id, "items_appended", {"first_seq": k + 1}))


async def _read_all(db: Database, after: Cursor, expect: int, **where: str) -> list[events.Event]:
    """Every event after `after`, page by page, once `expect` of them are final. (On a Postgres
    server that other transactions share, a new event is final when they are done: soon.)"""
    deadline = time.monotonic() + 20
    while True:
        found: list[events.Event] = []
        cursor = after
        while True:
            async with db.read() as conn:
                page, cursor = await events.read(conn, cursor, limit=3, **where)  # type: ignore[arg-type]
            found += page
            if len(page) < 3:
                break
        if len(found) >= expect or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.05)


async def test_events_read_back_in_order_by_tenant_and_session_and_page_by_page(db: Database) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    async with db.read() as conn:
        start = await events.horizon(conn)
    await _record(db, tenant, "a", 4)
    await _record(db, tenant, "b", 2)
    await _record(db, "someone-else", "a", 2)
    mine = await _read_all(db, start, 6, tenant=tenant)
    assert [(e.session_id, e.body["first_seq"]) for e in mine] == [
        (s, n) for s, k in (("a", 4), ("b", 2)) for n in range(1, k + 1)
    ]
    assert [e.cursor for e in mine] == sorted(e.cursor for e in mine)
    only_a = await _read_all(db, start, 4, tenant=tenant, session_id="a")
    assert [e.body["first_seq"] for e in only_a] == [1, 2, 3, 4]
    after_second = await _read_all(db, mine[1].cursor, 4, tenant=tenant)
    assert after_second == mine[2:]


async def test_an_event_rolled_back_with_its_change_was_never_there(db: Database) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    async with db.read() as conn:
        start = await events.horizon(conn)
    told: list[int] = []
    db.on_events = lambda: told.append(1)
    with pytest.raises(RuntimeError):
        async with db.write() as conn:
            await events.record(conn, NewEvent(tenant, "s", "items_appended", {}))
            raise RuntimeError("the change failed")
    assert await _read_all(db, start, 0, tenant=tenant) == [] and told == []
    await _record(db, tenant, "s", 1)
    assert len(await _read_all(db, start, 1, tenant=tenant)) == 1 and told == [1]


async def test_on_postgres_an_event_committed_late_is_not_skipped(postgres_url: str) -> None:
    """Transaction A takes the lower id but commits after B: a reader must not move past
    B's event while A's could still appear before it."""
    db = Database(postgres_url)
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    try:
        async with db.read() as conn:
            start = await events.horizon(conn)
        a_wrote, a_may_commit = asyncio.Event(), asyncio.Event()

        async def slow_writer() -> None:
            async with db.write() as conn:
                await events.record(conn, NewEvent(tenant, "s", "items_appended", {"who": "a"}))
                a_wrote.set()
                await a_may_commit.wait()

        slow = asyncio.create_task(slow_writer())
        await a_wrote.wait()
        async with db.write() as conn:
            await events.record(conn, NewEvent(tenant, "s", "items_appended", {"who": "b"}))
        async with db.read() as conn:
            held, reached = await events.read(conn, start, tenant=tenant)
        assert held == [] and reached < Cursor(2**62, 0)  # B is committed but not final yet
        a_may_commit.set()
        await slow
        after = await _read_all(db, reached, 2, tenant=tenant)
        assert [e.body["who"] for e in after] == ["a", "b"]
    finally:
        await db.close()


@pytest.fixture(params=["sqlite", "postgres"])
async def own_db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    """A migrated database of this test's own (pruning is for the whole log)."""
    if request.param == "sqlite":
        url, server = f"sqlite+aiosqlite:///{tmp_path / 'events.db'}", None
    else:
        server = request.getfixturevalue("postgres_server_url")
        url = backends.create_database(server, "contextd_events")
    await migrate.upgrade(url)
    database = Database(url)
    yield database
    await database.close()
    if server is not None:
        backends.drop_database(server, url)


async def test_pruning_deletes_old_events_and_marks_where_the_kept_ones_begin(own_db: Database) -> None:
    async with own_db.read() as conn:
        assert await events.pruned_through(conn) == OLDEST
    await _record(own_db, "t", "s", 3)
    cut = datetime.now(UTC) + timedelta(milliseconds=1)
    await asyncio.sleep(0.01)
    await _record(own_db, "t", "s", 2)
    async with own_db.write() as conn:
        assert await events.prune(conn, cut, batch=2) == 3
    kept = await _read_all(own_db, OLDEST, 2, tenant="t")
    assert [e.body["first_seq"] for e in kept] == [1, 2]
    async with own_db.read() as conn:
        mark = await events.pruned_through(conn)
    assert OLDEST < mark < kept[0].cursor
    async with own_db.write() as conn:
        assert await events.prune(conn, cut) == 0
