"""A render's reads of its session's records (storage/contextd_storage/views.py), on both backends."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import select

from contextd.engine.model import Role, TextBlock
from contextd.engine.retraction import retraction
from contextd.engine.state import ViewState, state_to_json
from contextd_storage import schema, views
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


async def test_a_state_held_from_before_the_last_full_copy_is_caught_up_by_the_changes_since(
    store: HistoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process holding a session's state from before the last full copy (a replica that rendered
    a while ago, a carry kept in Redis) catches it up by the changes stored since, as long as it
    is from after the copy before that: the changes since that one are kept."""
    from contextd.engine.changes import change_to_json
    from contextd.engine.pipeline import render
    from contextd_storage.state_cache import StateCache
    from tests.service.engine.test_carry_strategies import budgeted, file_reads

    monkeypatch.setattr(views, "MOST_CHANGES", 2)  # a copy every third render
    session_id = f"s-{uuid.uuid4().hex[:10]}"
    await store.create_session("tenant", session_id, {})
    key = await store.session_key("tenant", session_id)
    items = file_reads(8)
    made = [ViewState()]  # the state of each version, as the engine made it
    snapshots = []
    for n in range(3, 17, 2):  # versions 1 to 7: copies at 1, 4 and 7
        out = render(budgeted(items, 0, n, made[-1], None))
        async with store.db.write("tenant", session_id) as conn:
            before = await views.read_state(conn, key)
            change = change_to_json(out.change)  # type: ignore[arg-type]
            copy = state_to_json(out.state) if before.copy_due(len(change)) else None
            await views.save_state(conn, key, before, change, copy)
        made.append(out.state)
        snapshots.append(before.snapshot_version)
        if n == 9:  # version 4, stored as a copy; version 5 next
            assert copy is not None

    async def read(held: int) -> views.StoredState:
        cache = StateCache()
        cache.put(key, made[held])
        async with store.db.read() as conn:
            return await views.read_state(conn, key, cache)

    async with store.db.read() as conn:
        whole = await views.read_state(conn, key)
    assert (whole.state.view_version, whole.snapshot_version) == (7, 7)
    for held, caught_up in ((6, True), (5, True), (4, True), (3, False), (2, False)):
        stored = await read(held)
        assert (stored.since is made[held]) is caught_up, held  # else read from the copy
        assert len(stored.changes) == (7 - held if caught_up else 0), held
        assert state_to_json(stored.state) == state_to_json(whole.state), held


async def test_a_copy_made_after_its_render_is_stored_under_the_renders_stored_since(
    store: HistoryStore,
) -> None:
    """`save_copy`: a full copy made after the render that stored its state as a change. Renders
    stored since keep their changes, which catch the copy up (counted as the changes since it);
    the changes up to the copy before it go, as `save_state` lets them go; a copy is not stored
    when another was stored since the render's (another replica's), or it is no more recent."""
    from contextd.engine.changes import change_to_json
    from contextd.engine.pipeline import render
    from tests.service.engine.test_carry_strategies import budgeted, file_reads

    session_id = f"s-{uuid.uuid4().hex[:10]}"
    await store.create_session("tenant", session_id, {})
    key = await store.session_key("tenant", session_id)
    items = file_reads(8)
    made, changes_made = [ViewState()], [""]
    for n in range(3, 13, 2):  # versions 1 to 5, each stored as a change but the first (a copy)
        out = render(budgeted(items, 0, n, made[-1], None))
        change = change_to_json(out.change)  # type: ignore[arg-type]
        async with store.db.write("tenant", session_id) as conn:
            before = await views.read_state(conn, key)
            copy = state_to_json(out.state) if not before.snapshot_version else None
            await views.save_state(conn, key, before, change, copy)
        made.append(out.state)
        changes_made.append(change)

    async def stored() -> tuple[views.StoredState, list[int]]:
        async with store.db.read() as conn:
            read = await views.read_state(conn, key)
            table = schema.view_state_changes
            changes = await conn.execute(select(table.c.view_version).where(table.c.session_key == key))
            return read, sorted(v for (v,) in changes)

    before, changes = await stored()
    assert (before.snapshot_version, changes) == (1, [1, 2, 3, 4, 5])
    async with store.db.write("tenant", session_id) as conn:
        assert await views.save_copy(conn, key, state_to_json(made[4]), 4, after=1)  # (a render stored 5 since)
        # Another replica's render of 5 found the copy due too: the copy stored meanwhile stands.
        assert not await views.save_copy(conn, key, state_to_json(made[5]), 5, after=1)
    after, changes = await stored()
    assert (after.snapshot_version, after.change_bytes, after.snapshot_bytes) == (
        4,
        len(changes_made[5]),
        len(state_to_json(made[4])),
    )
    assert changes == [2, 3, 4, 5]  # (those since the copy before it: a state held from 2 on catches up)
    assert state_to_json(after.state) == state_to_json(made[5])  # the copy, caught up by the change since
    async with store.db.write("tenant", session_id) as conn:
        assert not await views.save_copy(conn, key, state_to_json(made[4]), 4, after=4)  # as recent as the one stored
        assert not await views.save_copy(conn, key, state_to_json(made[3]), 3, after=4)
        assert await views.save_copy(conn, key, state_to_json(made[5]), 5, after=4)
    after, changes = await stored()
    assert (after.snapshot_version, after.change_bytes, changes) == (5, 0, [5])
    assert state_to_json(after.state) == state_to_json(made[5])
