"""The history store on both backends: dense sequence numbers, idempotency,
expected versions, tool-call linking, the bounded session lock."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import itertools
import json
import re
import threading
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from contextd.engine.codec import content_hash
from contextd.engine.errors import (
    IdempotencyKeyReused,
    InvalidArgument,
    SessionBusy,
    SessionExists,
    SessionNotFound,
    StorageUnavailable,
    VersionConflict,
)
from contextd.engine.model import (
    DocumentBlock,
    ImageBlock,
    ItemContent,
    ReasoningBlock,
    Role,
    Source,
    TextBlock,
    ToolEffect,
    ToolEffectKind,
    ToolResultBlock,
    ToolUseBlock,
)
from contextd.engine.prefix import Prefix
from contextd_storage import history, migrate, rows, search
from contextd_storage.database import Database
from contextd_storage.history import HistoryStore, item_bytes
from contextd_storage.rows import BULK_ITEMS, AppendRequest, PreparedItem
from tests import backends


@pytest.fixture
async def store(database_url: str, request: pytest.FixtureRequest) -> AsyncIterator[HistoryStore]:
    db = Database(database_url, lock_timeout_ms=getattr(request, "param", 300))
    yield HistoryStore(db)
    await db.close()


@pytest.fixture
async def session(store: HistoryStore) -> str:
    session_id = f"s-{uuid.uuid4().hex[:10]}"
    await store.create_session("tenant", session_id, {"purpose": "test"})
    return session_id


def text_item(text_: str, role: Role = Role.USER) -> ItemContent:
    return ItemContent(role=role, content=(TextBlock(text_),))


def request(
    session_id: str, items: list[ItemContent], key: str = "", expected: int | None = None, tenant: str = "tenant"
) -> AppendRequest:
    prepared = [PreparedItem(i, content_hash(i), len(i.content)) for i in items]
    digest = hashlib.sha256("|".join(p.content_hash for p in prepared).encode()).hexdigest()
    return AppendRequest(
        tenant, session_id, prepared, request_hash=digest, idempotency_key=key, expected_version=expected
    )


# 40 writers queue on one session: each may wait for all the others (long on a loaded machine).
@pytest.mark.parametrize("store", [30_000], indirect=True)
async def test_concurrent_appends_get_dense_contiguous_seqs(store: HistoryStore, session: str) -> None:
    batches = [[text_item(f"task {t} item {n}") for n in range(1 + t % 4)] for t in range(40)]
    results = await asyncio.gather(*(store.append(request(session, b, key=f"k{t}")) for t, b in enumerate(batches)))
    total = sum(len(b) for b in batches)
    spans = sorted((r.first_seq, r.last_seq) for r in results)
    assert spans[0][0] == 1 and spans[-1][1] == total
    for (_, last), (first, _) in itertools.pairwise(spans):
        assert first == last + 1  # no gap, no overlap
    for result, batch in zip(results, batches, strict=True):
        assert result.last_seq - result.first_seq + 1 == len(batch)
    loaded_session, items = await store.load_history("tenant", session)
    assert loaded_session.version == total
    assert [i.seq for i in items] == list(range(1, total + 1))
    by_seq = {i.seq: i for i in items}
    for result, batch in zip(results, batches, strict=True):
        stored = [by_seq[s].content for s in range(result.first_seq, result.last_seq + 1)]
        assert stored == [b.content for b in batch]  # each batch's own order kept


async def test_the_history_read_is_a_prefix_of_one_list_the_cache_extends_and_stays_as_it_was_read(
    store: HistoryStore, session: str
) -> None:
    await store.append(request(session, [text_item("a"), text_item("b")]))
    _, first = await store.load_history("tenant", session)
    await store.append(request(session, [text_item("c")]))
    _, second = await store.load_history("tenant", session)
    assert isinstance(first, Prefix) and isinstance(second, Prefix) and second.base is first.base  # no copy
    assert [i.seq for i in first] == [1, 2] and [i.seq for i in second] == [1, 2, 3]
    # Calls reading the same new items at once extend the one list by them once (their
    # connections opened before, so that their reads interleave).
    await asyncio.gather(*(store.load_history("tenant", session) for _ in range(4)))
    await store.append(request(session, [text_item(f"d{n}") for n in range(5)]))
    read = await asyncio.gather(*(store.load_history("tenant", session) for _ in range(4)))
    assert all(items.base is first.base and len(items) == 8 for _, items in read)
    assert [i.seq for i in first.base] == list(range(1, 9)) and [i.seq for i in first] == [1, 2]


async def test_retried_append_returns_the_first_result_and_writes_nothing(store: HistoryStore, session: str) -> None:
    first = await store.append(request(session, [text_item("a"), text_item("b")], key="same"))
    again = await store.append(request(session, [text_item("a"), text_item("b")], key="same"))
    assert not first.replayed and again.replayed
    assert (again.first_seq, again.last_seq, again.receipts) == (first.first_seq, first.last_seq, first.receipts)
    loaded, items = await store.load_history("tenant", session)
    assert loaded.version == 2 and len(items) == 2


async def test_a_retry_is_recognised_even_when_its_expected_version_is_stale(store: HistoryStore, session: str) -> None:
    first = await store.append(request(session, [text_item("a")], key="cond", expected=0))
    again = await store.append(request(session, [text_item("a")], key="cond", expected=0))
    assert again.replayed and again.version == first.version == 1


async def test_reusing_a_key_for_another_batch_is_refused(store: HistoryStore, session: str) -> None:
    await store.append(request(session, [text_item("a")], key="k"))
    with pytest.raises(IdempotencyKeyReused) as refused:
        await store.append(request(session, [text_item("different")], key="k"))
    assert refused.value.metadata["idempotency_key"] == "k"
    assert (await store.get_session("tenant", session)).version == 1


async def test_expected_version_mismatch_is_a_conflict_naming_the_current_version(
    store: HistoryStore, session: str
) -> None:
    await store.append(request(session, [text_item("a"), text_item("b")]))
    with pytest.raises(VersionConflict) as conflict:
        await store.append(request(session, [text_item("c")], expected=1))
    assert (conflict.value.expected, conflict.value.current) == (1, 2)
    assert conflict.value.metadata["current_version"] == "2"
    result = await store.append(request(session, [text_item("c")], expected=2))
    assert result.first_seq == 3


async def test_tool_results_link_to_calls_across_batches(store: HistoryStore, session: str) -> None:
    call = ItemContent(
        role=Role.ASSISTANT,
        content=(ToolUseBlock("c1", "read_file", '{"path": "a.py"}'), ToolUseBlock("c2", "bash", '{"cmd": "ls"}')),
    )
    await store.append(request(session, [call]))
    results = [
        ItemContent(role=Role.TOOL, content=(ToolResultBlock("c2", (TextBlock("a.py"),)),)),
        ItemContent(role=Role.TOOL, content=(ToolResultBlock("c1", (TextBlock("print(1)"),), is_error=True),)),
    ]
    await store.append(request(session, results))
    _, items = await store.load_history("tenant", session)
    assert [(i.tool_result.name, i.tool_result.is_error) for i in items[1:] if i.tool_result] == [
        ("bash", False),
        ("read_file", True),
    ]


@pytest.mark.parametrize(
    ("batch", "field", "problem"),
    [
        (
            [ItemContent(role=Role.TOOL, content=(ToolResultBlock("nope", ()),))],
            "items[0].content[0].tool_result.tool_use_id",
            "no earlier tool_use has id 'nope'",
        ),
        (
            [ItemContent(role=Role.TOOL, content=(ToolResultBlock("c1", ()),))],
            "items[0].content[0].tool_result.tool_use_id",
            "already has a result",
        ),
        (
            [ItemContent(role=Role.ASSISTANT, content=(ToolUseBlock("c1", "ls", "{}"),))],
            "items[0].content[0].tool_use.id",
            "already used in this session",
        ),
        (
            [ItemContent(role=Role.TOOL, content=(ToolResultBlock("c3", (), name="rm"),))],
            "items[0].content[0].tool_result.name",
            "does not match the call's tool 'ls'",
        ),
    ],
)
async def test_bad_tool_links_are_refused_and_nothing_is_written(
    store: HistoryStore, session: str, batch: list[ItemContent], field: str, problem: str
) -> None:
    calls = ItemContent(role=Role.ASSISTANT, content=(ToolUseBlock("c1", "ls", "{}"), ToolUseBlock("c3", "ls", "{}")))
    answer = ItemContent(role=Role.TOOL, content=(ToolResultBlock("c1", ()),))
    await store.append(request(session, [calls, answer]))
    with pytest.raises(InvalidArgument) as refused:
        await store.append(request(session, [text_item("ok"), *batch]))
    violation = refused.value.violations[0]
    assert (violation.field.replace("items[1]", "items[0]"), problem in violation.description) == (field, True)
    assert (await store.get_session("tenant", session)).version == 2


def rich_items(turn: int = 1) -> list[ItemContent]:
    observed = datetime(2026, 11, 1, 12, 30, tzinfo=UTC)
    return [
        ItemContent(role=Role.SYSTEM, content=(TextBlock("Be terse."),)),
        ItemContent(
            role=Role.USER,
            content=(
                TextBlock("look: ünïcode ✓"),
                ImageBlock("image/png", data=base64.b64decode("iVBORw0KGgo="), detail="low"),
                DocumentBlock("application/pdf", uri="https://example.com/a.pdf", title="spec"),
            ),
            name="alice",
            metadata={"turn": "1"},
        ),
        ItemContent(
            role=Role.ASSISTANT,
            content=(ReasoningBlock("thinking", signature="sig"), ToolUseBlock(f"r{turn}", "read", '{"path": "x"}')),
        ),
        ItemContent(
            role=Role.TOOL,
            content=(ToolResultBlock(f"r{turn}", (TextBlock("contents"),), name="read"),),
            source=Source("file:///x", "v2", observed),
            tool_effect=ToolEffect(ToolEffectKind.READ, "path"),
        ),
    ]


async def test_a_history_let_go_of_while_it_is_read_is_weighed_whole_again(
    store: HistoryStore, session: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.append(request(session, [text_item("a"), text_item("b")]))
    await store.load_history("tenant", session)
    await store.append(request(session, [text_item(f"c{n}") for n in range(40)]))
    decode = history.off_loop

    async def evicting(*args: Any) -> Any:  # the cache lets the session go as its rows are decoded
        for key in list(store.cache._entries):
            store.cache.discard(key)
        return await decode(*args)

    monkeypatch.setattr(history, "off_loop", evicting)
    _, items = await store.load_history("tenant", session)
    assert len(items) == 42 and store.cache.held_bytes == sum(map(item_bytes, items))


@pytest.mark.parametrize("copies", [1, 20])  # decoded on the event loop, and off it (BULK_ITEMS)
async def test_items_come_back_as_they_went_in(
    store: HistoryStore, session: str, monkeypatch: pytest.MonkeyPatch, copies: int
) -> None:
    decoded_on: set[int] = set()
    decode = rows.item_of

    def noted(row: Any) -> Any:
        decoded_on.add(threading.get_ident())
        return decode(row)

    monkeypatch.setattr(rows, "item_of", noted)
    rich = [item for turn in range(copies) for item in rich_items(turn)]
    await store.append(request(session, rich))
    _, items = await store.load_history("tenant", session)
    # A long history's rows are decoded on a worker thread: the event loop (every other call of
    # the replica) is not held by them.
    assert len(decoded_on) == 1 and (threading.get_ident() in decoded_on) == (len(rich) <= BULK_ITEMS)
    for stored, sent in zip(items, rich, strict=True):
        assert (stored.role, stored.content, stored.source, stored.tool_effect, stored.name, dict(stored.metadata)) == (
            sent.role,
            sent.content,
            sent.source,
            sent.tool_effect,
            sent.name,
            dict(sent.metadata),
        )
        assert stored.created_at.tzinfo is not None


@pytest.mark.parametrize(
    "text",
    [
        '[{"type": "text", "text": "caf\\u00e9 \\ud83d\\ude00 \\"quoted\\"\\n", "item_id": ""}]',
        '{"a": "x", "a": "y", "b": [true, false, null], "c": {}}',  # (a key twice: the last holds)
        '[{"type": "text", "text": "half a pair: \\ud800"}]',  # a lone surrogate: orjson refuses it
    ],
)
def test_a_json_column_reads_as_json_reads_it(text: str) -> None:
    assert rows.decoded(text) == json.loads(text)


def test_an_items_json_columns_hold_no_numbers() -> None:
    """What lets `rows.decoded` read with orjson: it reads an integer past 64 bits otherwise."""

    def leaves(value: Any) -> list[Any]:
        if isinstance(value, dict):
            return [leaf for member in value.values() for leaf in leaves(member)]
        if isinstance(value, list):
            return [leaf for member in value for leaf in leaves(member)]
        return [value]

    now = datetime.now(UTC)
    written = [rows.item_row(1, seq, c, PreparedItem(c, "", 0), "", now) for seq, c in enumerate(rich_items(), 1)]
    found = {type(leaf) for row in written for leaf in leaves([row["content"], row["metadata"]])}
    assert str in found and found <= {str, bool, type(None)}


async def test_sessions_are_per_tenant(store: HistoryStore, session: str) -> None:
    with pytest.raises(SessionNotFound):
        await store.get_session("other-tenant", session)
    with pytest.raises(SessionNotFound):
        await store.append(request(session, [text_item("x")], tenant="other-tenant"))
    await store.create_session("other-tenant", session, {})  # the same id is free in another tenant
    with pytest.raises(SessionExists):
        await store.create_session("tenant", session, {})


async def test_list_sessions_pages_through_everything(store: HistoryStore) -> None:
    tenant = f"lister-{uuid.uuid4().hex[:6]}"
    for n in range(7):
        await store.create_session(tenant, f"s{n}", {})
    seen, token = [], ""
    while True:
        page, token = await store.list_sessions(tenant, 3, token)
        seen.extend(s.id for s in page)
        assert len(page) <= 3
        if not token:
            break
    assert seen == [f"s{n}" for n in range(7)]
    with pytest.raises(InvalidArgument, match="page_token"):
        await store.list_sessions(tenant, 3, "garbage")


async def test_a_held_session_lock_makes_others_wait_then_fail_busy(store: HistoryStore, session: str) -> None:
    db = store.db
    held, released = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        async with db.write("tenant", session):
            held.set()
            await released.wait()

    holder = asyncio.create_task(hold())
    await held.wait()
    started = asyncio.get_running_loop().time()
    with pytest.raises(SessionBusy) as busy:
        await store.append(request(session, [text_item("blocked")]))
    waited = asyncio.get_running_loop().time() - started
    assert 0.25 <= waited < 5  # the configured 300 ms bound, not forever
    assert int(busy.value.metadata["retry_after_ms"]) > 0
    released.set()
    await holder
    assert (await store.append(request(session, [text_item("after")]))).first_seq == 1


@pytest.fixture
async def pg_store(postgres_url: str) -> AsyncIterator[HistoryStore]:
    db = Database(postgres_url, lock_timeout_ms=300)
    yield HistoryStore(db)
    await db.close()


async def test_on_postgres_other_sessions_are_not_blocked_by_a_held_lock(pg_store: HistoryStore) -> None:
    # (SQLite has one writer for the whole file, so there all sessions share it.)
    store = pg_store
    locked, free = f"locked-{uuid.uuid4().hex[:8]}", f"free-{uuid.uuid4().hex[:8]}"
    await store.create_session("tenant", locked, {})
    await store.create_session("tenant", free, {})
    held, released = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        async with store.db.write("tenant", locked):
            held.set()
            await released.wait()

    holder = asyncio.create_task(hold())
    await held.wait()
    assert (await store.append(request(free, [text_item("fine")]))).first_seq == 1
    released.set()
    await holder


async def test_an_unreachable_database_is_storage_unavailable() -> None:
    db = Database("postgresql+asyncpg://nobody@127.0.0.1:1/none")
    try:
        with pytest.raises(StorageUnavailable):
            await db.ping()
    finally:
        await db.close()


async def test_appends_stay_dense_when_the_server_defaults_to_repeatable_read(postgres_server_url: str) -> None:
    """Writers must see the previous lock holder's commit: under a REPEATABLE READ
    default (common on managed Postgres) the snapshot would predate the lock wait."""
    url = backends.create_database(postgres_server_url, "contextd_isolation")
    try:
        backends.admin(
            postgres_server_url,
            f"ALTER DATABASE \"{make_url(url).database}\" SET default_transaction_isolation = 'repeatable read'",
        )
        await migrate.upgrade(url)
        db = Database(url, lock_timeout_ms=5000)
        store = HistoryStore(db)
        await store.create_session("tenant", "s", {})
        results = await asyncio.gather(*(store.append(request("s", [text_item(f"n{n}")])) for n in range(20)))
        assert sorted(r.first_seq for r in results) == list(range(1, 21))
        await db.close()
    finally:
        backends.drop_database(postgres_server_url, url)


async def test_a_batch_may_mention_more_tool_calls_than_a_statement_takes_parameters(
    store: HistoryStore, session: str
) -> None:
    calls = tuple(ToolUseBlock(f"call-{n}", "ls", "{}") for n in range(2500))
    await store.append(request(session, [ItemContent(role=Role.ASSISTANT, content=calls)]))
    answers = [ItemContent(role=Role.TOOL, content=(ToolResultBlock(f"call-{n}", ()),)) for n in range(2500)]
    result = await store.append(request(session, answers))
    assert (result.first_seq, result.last_seq) == (2, 2501)


async def test_nul_characters_in_content_and_metadata_are_stored(store: HistoryStore, session: str) -> None:
    binary = ItemContent(role=Role.USER, content=(TextBlock("ELF\x00\x01\x02 tail"),), metadata={"k": "v\x00w"})
    await store.append(request(session, [binary]))
    _, items = await store.load_history("tenant", session)
    assert items[0].content == binary.content and dict(items[0].metadata) == {"k": "v\x00w"}


async def test_writers_queued_on_a_busy_session_leave_connections_for_others(postgres_url: str) -> None:
    """Waiting writers of one session hold one pooled connection between them, not the pool."""
    holder_db = Database(postgres_url)
    db = Database(postgres_url, pool_size=1, lock_timeout_ms=3000)  # two connections in all
    store = HistoryStore(db)
    busy, other = f"busy-{uuid.uuid4().hex[:8]}", f"other-{uuid.uuid4().hex[:8]}"
    await store.create_session("tenant", busy, {})
    await store.create_session("tenant", other, {})
    held, released = asyncio.Event(), asyncio.Event()

    async def hold() -> None:  # another replica holding the session's lock
        async with holder_db.write("tenant", busy):
            held.set()
            await released.wait()

    holder = asyncio.create_task(hold())
    await held.wait()
    waiting = [asyncio.create_task(store.append(request(busy, [text_item(f"w{n}")]))) for n in range(10)]
    await asyncio.sleep(0.2)
    started = asyncio.get_running_loop().time()
    assert (await store.get_session("tenant", other)).version == 0
    assert (await store.append(request(other, [text_item("free")]))).first_seq == 1
    assert asyncio.get_running_loop().time() - started < 1  # not stuck behind the queue
    released.set()
    await holder
    results = await asyncio.gather(*waiting)
    assert sorted(r.first_seq for r in results) == list(range(1, 11))
    await db.close()
    await holder_db.close()


@pytest.mark.parametrize("search_with", ["full_text", "substring", "regex"])
async def test_a_search_may_be_limited_to_more_seqs_than_a_query_has_parameters(
    store: HistoryStore, session: str, search_with: str
) -> None:
    # A long session's items out of the view may be tens of thousands: more than a statement may
    # bind one by one (32,767 for asyncpg, 32,766 for SQLite).
    await store.append(request(session, [text_item(f"note {n} about the ledger") for n in range(3)]))
    key = await store.session_key("tenant", session)
    where = search.Where(seqs=tuple(range(2, 40_002)))
    async with store.db.read() as conn:
        found = await _search(conn, key, search_with, where)
    assert sorted(f.seq for f in found) == [2, 3]


@pytest.mark.parametrize("search_with", ["full_text", "substring", "regex"])
async def test_tool_and_role_filters_are_one_parameter_however_long(
    store: HistoryStore, session: str, search_with: str
) -> None:
    # Below the service's bound (1,000 tools), in the store itself: 40,000 names.
    call = ItemContent(role=Role.ASSISTANT, content=(ToolUseBlock("c1", "ls", "{}"),))
    output = ItemContent(role=Role.TOOL, content=(ToolResultBlock("c1", (TextBlock("ledger rows: 3"),)),))
    note = ItemContent(role=Role.USER, content=(TextBlock("the ledger"),))
    await store.append(request(session, [call, output, note]))
    key = await store.session_key("tenant", session)
    wheres = {
        (2,): search.Where(tools=(*(f"tool-{n}" for n in range(40_000)), "ls")),
        (3,): search.Where(roles=("user",) * 40_000),
    }
    async with store.db.read() as conn:
        for expected, where in wheres.items():
            assert tuple(f.seq for f in await _search(conn, key, search_with, where)) == expected


async def _search(conn: Any, key: int, mode: str, where: search.Where) -> list[search.Found]:
    """The items of session `key` with "ledger" in them, by `mode`."""
    if mode == "regex":
        return await search.regex(conn, key, re.compile("ledger"), where, 10, 0)
    if mode == "substring":
        return await search.substring(conn, key, "ledger", where, 10, 0)
    return await search.full_text(conn, key, "ledger", where, 10, 0)


# Every table an append writes, with the columns that must come out the same whichever way it
# was written (not the session's key, the times or the events' transaction ids and ids).
_WRITTEN = {
    "items": "seq, role, content::text, name, source_uri, source_version, source_observed_at, tool_effect, "
    "tool_effect_source_arg, tool_use_id, tool_name, is_error, content_hash, token_count, author, metadata::text",
    "item_texts": "seq, text",
    "item_text_chunks": "number, seq, text, tsv::text",
    "tool_uses": "tool_use_id, seq, name",
    "appends": "idempotency_key, request_hash, first_seq, last_seq",
}


async def _written(store: HistoryStore, session_id: str) -> dict[str, list[Any]]:
    from sqlalchemy import text

    key = await store.session_key("tenant", session_id)
    out: dict[str, list[Any]] = {}
    async with store.db.read() as conn:
        for table, columns in _WRITTEN.items():
            query = f"SELECT {columns} FROM {table} WHERE session_key = :key ORDER BY 1, 2"
            out[table] = [tuple(r) for r in await conn.execute(text(query), {"key": key})]
        query = "SELECT kind, body::text FROM events WHERE session_id = :session_id ORDER BY id"
        out["events"] = [tuple(r) for r in await conn.execute(text(query), {"session_id": session_id})]
        query = "SELECT version, token_count, stored_bytes FROM sessions WHERE key = :key"
        out["sessions"] = [tuple(r) for r in await conn.execute(text(query), {"key": key})]
    return out


async def test_on_postgres_an_append_in_one_statement_writes_what_a_statement_a_table_writes(
    pg_store: HistoryStore,
) -> None:
    observed = datetime(2026, 11, 1, 12, 30, tzinfo=UTC)
    long_output = "\n".join(f"line {n}: KEY_{n} ünïcode \x00 tail" for n in range(3000))  # several chunks
    batches = [
        [text_item("Be terse.", Role.SYSTEM), text_item("fix the bug")],
        [
            ItemContent(
                role=Role.ASSISTANT,
                content=(ToolUseBlock("c1", "bash", '{"cmd": "pytest"}'), ToolUseBlock("c2", "read", "{}")),
                metadata={"turn": "1", "nul": "a\x00b"},
            )
        ],
        [
            ItemContent(role=Role.TOOL, content=(ToolResultBlock("c1", (TextBlock(long_output),), is_error=True),)),
            ItemContent(
                role=Role.TOOL,
                content=(ToolResultBlock("c2", (TextBlock("print(1)"),), name="read"),),
                source=Source("file:///x.py", "v2", observed),
                tool_effect=ToolEffect(ToolEffectKind.READ, "path"),
                name="reader",
            ),
        ],
        [text_item(long_output[:5000], Role.USER)],
    ]
    sessions = []
    for at_once in (True, False):
        pg_store.writes_at_once = at_once
        session_id = f"s-{uuid.uuid4().hex[:10]}"
        await pg_store.create_session("tenant", session_id, {})
        for n, batch in enumerate(batches):
            appended = request(session_id, batch, key=f"k{n}" if n % 2 else "")
            appended = dataclasses.replace(appended, author="agent", stored_bytes=10 * n)
            await pg_store.append(appended)
        sessions.append(await _written(pg_store, session_id))
    at_once, per_table = sessions
    assert len(at_once["item_text_chunks"]) > len(batches)
    assert at_once == per_table
