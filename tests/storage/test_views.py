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
