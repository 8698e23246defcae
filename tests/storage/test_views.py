"""A render's reads of its session's records (storage/contextd_storage/views.py), on both backends."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from contextd.engine.model import Role, TextBlock
from contextd.engine.retraction import retraction
from contextd.engine.state import ViewState, state_to_json
from contextd_storage import views
from contextd_storage.database import Database
from contextd_storage.history import HistoryStore
from tests.helpers import counter, make_item


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[HistoryStore]:
    db = Database(database_url)
    yield HistoryStore(db)
    await db.close()


async def _reads_one_by_one(store: HistoryStore, key: int) -> tuple[object, ...]:
    async with store.db.read() as conn:
        stored = await views.read_state(conn, key)
        return (
            stored.state,
            stored.snapshot_version,
            stored.change_bytes,
            await views.pinned(conn, key),
            await views.proposals(conn, key),
            await views.load_mutations(conn, key),
        )


async def _reads_at_once(store: HistoryStore, key: int) -> tuple[object, ...]:
    async with store.db.read() as conn:
        reads = await views.render_reads(conn, key)
    stored = reads.stored
    return (stored.state, stored.snapshot_version, stored.change_bytes, reads.pins, reads.proposals, reads.durable)


async def test_a_renders_reads_in_one_statement_are_the_reads_one_by_one(store: HistoryStore) -> None:
    session_id = f"s-{uuid.uuid4().hex[:10]}"
    await store.create_session("tenant", session_id, {})
    key = await store.session_key("tenant", session_id)
    never_rendered = await _reads_at_once(store, key)
    assert never_rendered == (ViewState(), 0, 0, frozenset(), [], ())

    items = [make_item(Role.USER, TextBlock(f"turn {n} with a fact KEY_{n}"), seq=n) for n in range(1, 8)]
    async with store.db.write("tenant", session_id) as conn:
        await views.save_state(conn, key, views.StoredState(ViewState()), "", state_to_json(ViewState()))
        await views.pin(conn, key, [5, 2, 7])
        await views.propose(conn, key, [3, 1], "read twice")
        await views.propose(conn, key, [6], 'it\'s stale; "quoted" and ünïcode')
        # In an order that is not the items': the edits come back as they were made.
        edits = [retraction(items[s - 1], redact, counter()) for s, redact in ((4, False), (1, True), (6, False))]
        await views.append_mutations(conn, key, edits)
    after = await _reads_at_once(store, key)
    assert after == await _reads_one_by_one(store, key)
    assert after[3] == frozenset({2, 5, 7})
    assert [(p.seq, p.reason) for p in after[4]] == [(3, "read twice"), (1, "read twice"), (6, after[4][2].reason)]
    assert [e.edit for e in after[5]] == [e.edit for e in edits]


async def _render_records(db: Database, key: int, session_id: str) -> dict[str, list[tuple[object, ...]]]:
    from sqlalchemy import text

    queries = {
        "view_states": "SELECT view_version, state, snapshot_version, snapshot_bytes, change_bytes "
        "FROM view_states WHERE session_key = :key",
        "view_state_changes": "SELECT view_version, change FROM view_state_changes WHERE session_key = :key "
        "ORDER BY view_version",
        "calls": "SELECT view_version, view_format, total_tokens, predicted_cache_read, predicted_cache_write, "
        "predicted_uncached, provider FROM calls WHERE session_key = :key ORDER BY view_version",
        "events": "SELECT kind, CAST(body AS TEXT), tenant FROM events WHERE session_id = :session_id ORDER BY id",
    }
    async with db.read() as conn:
        return {
            name: [tuple(r) for r in await conn.execute(text(q), {"key": key, "session_id": session_id})]
            for name, q in queries.items()
        }


async def test_on_postgres_a_renders_records_in_one_statement_are_those_written_one_by_one(postgres_url: str) -> None:
    from contextd.engine.timing import Usage
    from contextd_storage.events import NewEvent

    db = Database(postgres_url)
    store = HistoryStore(db)
    written = []
    try:
        for at_once in (True, False):
            session_id = f"s-{uuid.uuid4().hex[:10]}"
            await store.create_session("tenant", session_id, {})
            key = await store.session_key("tenant", session_id)
            async with db.write("tenant", session_id) as conn:
                await views.save_state(conn, key, views.StoredState(ViewState()), "", state_to_json(ViewState()))
            for version in (1, 2, 3):
                before = views.StoredState(ViewState(view_version=version), snapshot_version=1, change_bytes=7)
                call = (
                    None if version == 2 else views.CallRecord(version + 1, "anthropic", 900 + version, Usage(1, 2, 3))
                )
                told = [NewEvent("tenant", session_id, "view_rendered", {"view_version": version + 1, "n": "ü\x00"})]
                told += [NewEvent("tenant", session_id, "decisions_made", {"total": version})] * (version - 1)
                async with db.write("tenant", session_id) as conn:
                    change = f'{{"applied": [], "version": {version}}}'
                    await views.save_render(conn, key, before, change, None, call, told, at_once=at_once)
            written.append(await _render_records(db, key, session_id))
    finally:
        await db.close()
    at_once_records, one_by_one = written
    assert len(at_once_records["events"]) == 1 + 6 and len(at_once_records["calls"]) == 2
    assert at_once_records == one_by_one


async def test_with_events_turned_off_appends_and_renders_record_none(database_url: str) -> None:
    from contextd.engine.timing import Usage
    from contextd_storage import events
    from contextd_storage.events import NewEvent
    from contextd_storage.rows import AppendRequest, PreparedItem

    db = Database(database_url)
    events.turn_off(db.engine)
    store = HistoryStore(db)
    session_id = f"s-{uuid.uuid4().hex[:10]}"
    try:
        await store.create_session("tenant", session_id, {})
        one = make_item(Role.USER, TextBlock("hello"))
        await store.append(AppendRequest("tenant", session_id, [PreparedItem(one, "a" * 64, 1)], "h", "k"))
        key = await store.session_key("tenant", session_id)
        async with db.write("tenant", session_id) as conn:
            await views.save_state(conn, key, views.StoredState(ViewState()), "", state_to_json(ViewState()))
        async with db.write("tenant", session_id) as conn:
            before = views.StoredState(ViewState(view_version=1), snapshot_version=1)
            told = [NewEvent("tenant", session_id, "view_rendered", {})]
            await views.save_render(conn, key, before, "{}", None, views.CallRecord(2, "x", 1, Usage(0, 0, 1)), told)
            assert id(conn) not in events.WRITTEN
        records = await _render_records(db, key, session_id)
    finally:
        await db.close()
    assert records["events"] == [] and len(records["calls"]) == 1
