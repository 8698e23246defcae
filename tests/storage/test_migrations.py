"""Migrations on both dialects, and the database-level append-only guarantee."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from contextd.engine.model import ItemContent, Role, TextBlock, ToolResultBlock, ToolUseBlock
from contextd.engine.state import state_from_json
from contextd.engine.tokens import TiktokenCounter
from contextd.engine.transforms import TransformRegistry
from contextd.engine.view import ViewFormat, ViewRequest
from contextd.view_service import ViewService
from contextd_storage import events, migrate, search, views
from contextd_storage.database import Database
from contextd_storage.history import HistoryStore
from contextd_storage.rows import AppendRequest, PreparedItem
from contextd_storage.schema import APPEND_ONLY_TABLES, FULL_TEXT_OBJECTS, include_object, metadata
from tests import backends

TABLES = {
    "sessions",
    "items",
    "item_texts",
    "item_text_chunks",
    "tool_uses",
    "appends",
    "view_states",
    "view_state_changes",
    "pins",
    "prune_proposals",
    "certificates",
    "mutations",
    "calls",
    "events",
    "events_pruned",
}


@pytest.fixture(params=["sqlite", "postgres"])
def empty_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database with nothing in it, on each backend."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}"
        return
    server: str = request.getfixturevalue("postgres_server_url")
    url = backends.create_database(server, "contextd_migration")
    yield url
    backends.drop_database(server, url)


async def _tables(url: str) -> set[str]:
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            names = set(await conn.run_sync(lambda c: inspect(c).get_table_names()))
            return names - {"alembic_version"} - FULL_TEXT_OBJECTS
    finally:
        await engine.dispose()


async def test_upgrade_from_empty_downgrade_to_empty_and_upgrade_again(empty_database: str) -> None:
    url = empty_database
    assert await migrate.current_revision(url) is None
    assert await _tables(url) == set()

    await migrate.upgrade(url)
    assert await migrate.current_revision(url) == migrate.head_revision()
    assert await _tables(url) == TABLES

    await migrate.downgrade(url, "base")
    assert await migrate.current_revision(url) is None
    assert await _tables(url) == set()

    await migrate.upgrade(url)
    assert await migrate.current_revision(url) == migrate.head_revision()
    assert await _tables(url) == TABLES


async def test_migrated_schema_matches_the_models(empty_database: str) -> None:
    """What `alembic check` verifies: the migrations build exactly the schema the code declares."""
    await migrate.upgrade(empty_database)
    engine = create_async_engine(empty_database, poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            diff = await conn.run_sync(
                lambda c: compare_metadata(
                    MigrationContext.configure(c, opts={"compare_type": True, "include_object": include_object}),
                    metadata,
                )
            )
    finally:
        await engine.dispose()
    assert diff == []


async def _store_with_history(url: str) -> tuple[Database, HistoryStore]:
    """A migrated store holding one session with a row in every history table."""
    await migrate.upgrade(url)
    db = Database(url)
    store = HistoryStore(db)
    await store.create_session("t", "s", {})
    call = ItemContent(role=Role.ASSISTANT, content=(ToolUseBlock("c1", "ls", "{}"),))
    result = ItemContent(role=Role.TOOL, content=(ToolResultBlock("c1", (TextBlock("a.py"),)),))
    prepared = [PreparedItem(call, "a" * 64, 2), PreparedItem(result, "b" * 64, 2)]
    await store.append(AppendRequest("t", "s", prepared, request_hash="r", idempotency_key="k"))
    return db, store


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE items SET token_count = 99",
        "DELETE FROM items",
        "UPDATE appends SET last_seq = 7",
        "DELETE FROM appends",
        "DELETE FROM tool_uses",
        "UPDATE tool_uses SET name = 'rm'",
        "UPDATE item_text_chunks SET text = 'forged'",
        "DELETE FROM item_text_chunks",
    ],
)
async def test_database_refuses_to_change_history(empty_database: str, statement: str) -> None:
    db, _ = await _store_with_history(empty_database)
    try:
        with pytest.raises(DBAPIError, match="append-only"):
            async with db.engine.begin() as conn:
                await conn.execute(text(statement))
        async with db.read() as conn:
            assert (await conn.execute(text("SELECT count(*) FROM items"))).scalar_one() == 2
            assert (await conn.execute(text("SELECT sum(token_count) FROM items"))).scalar_one() == 4
    finally:
        await db.close()


async def test_truncate_is_refused_on_postgres(postgres_server_url: str) -> None:
    url = backends.create_database(postgres_server_url, "contextd_truncate")
    try:
        db, _ = await _store_with_history(url)
        for table in APPEND_ONLY_TABLES:
            with pytest.raises(DBAPIError, match="TRUNCATE refused"):
                async with db.engine.begin() as conn:
                    await conn.execute(text(f"TRUNCATE {table} CASCADE"))
        await db.close()
    finally:
        backends.drop_database(postgres_server_url, url)


async def test_deleting_a_session_is_the_one_way_to_remove_history(empty_database: str) -> None:
    db, store = await _store_with_history(empty_database)
    try:
        assert await store.delete_session("t", "s") == 2
        async with db.read() as conn:
            assert (await conn.execute(text("SELECT count(*) FROM items"))).scalar_one() == 0
            assert (await conn.execute(text("SELECT count(*) FROM sessions"))).scalar_one() == 0
    finally:
        await db.close()


async def test_0005_chunks_the_texts_already_stored_and_its_downgrade_restores_0003s_index(
    empty_database: str,
) -> None:
    url = empty_database
    tail = "".join(f"row {n:06d} fine\n" for n in range(9000)) + "last row: wombat\n"  # 153,000 characters
    texts = ["short note on quokkas", tail]
    await migrate.upgrade(url)
    db = Database(url)
    try:
        store = HistoryStore(db)
        await store.create_session("t", "s", {})
        items = [ItemContent(role=Role.USER, content=(TextBlock(t),)) for t in texts]
        prepared = [PreparedItem(item, f"{n}" * 64, 1) for n, item in enumerate(items)]
        await store.append(AppendRequest("t", "s", prepared, request_hash="r"))
        key = await store.session_key("t", "s")
    finally:
        await db.close()

    await migrate.downgrade(url, "0004")
    assert "item_text_chunks" not in await _tables(url)
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                matching = "SELECT count(*) FROM item_texts WHERE tsv @@ plainto_tsquery('simple', :word)"
            else:
                matching = "SELECT count(*) FROM item_texts_fts WHERE item_texts_fts MATCH :word"
            # 0003's index again: the first 100,000 characters of each item, rebuilt from item_texts.
            assert (await conn.execute(text(matching), {"word": "quokkas"})).scalar_one() == 1
            assert (await conn.execute(text(matching), {"word": "000001"})).scalar_one() == 1
            assert (await conn.execute(text(matching), {"word": "wombat"})).scalar_one() == 0
    finally:
        await engine.dispose()

    await migrate.upgrade(url)
    db = Database(url)
    try:
        async with db.read() as conn:
            rows = (await conn.execute(text("SELECT number, seq, text FROM item_text_chunks ORDER BY number"))).all()
            expected = [(seq, chunk) for seq, t in enumerate(texts, 1) for chunk in search.text_chunks(t)]
            assert [(r.seq, r.text) for r in rows] == expected and [r.number for r in rows] == list(
                range(1, len(expected) + 1)
            )
            found = await search.full_text(conn, key, "wombat", search.Where(), 10, 0)
            assert [f.seq for f in found] == [2] and "«wombat»" in found[0].snippet
        # Appends number on from the chunks filled in.
        more = ItemContent(role=Role.USER, content=(TextBlock("and a wombat again"),))
        await HistoryStore(db).append(AppendRequest("t", "s", [PreparedItem(more, "c" * 64, 1)], request_hash="m"))
        async with db.read() as conn:
            last = (await conn.execute(text("SELECT max(number) FROM item_text_chunks"))).scalar_one()
            assert last == len(expected) + 1
            found = await search.full_text(conn, key, "wombat", search.Where(), 10, 0)
            assert sorted(f.seq for f in found) == [2, 3]
    finally:
        await db.close()


async def test_0006_counts_the_bytes_sessions_already_store(empty_database: str) -> None:
    url = empty_database
    await migrate.upgrade(url)
    db = Database(url)
    try:
        store = HistoryStore(db)
        for session_id, body in (("small", "x" * 10), ("large", "y" * 50_000)):
            await store.create_session("t", session_id, {})
            item = ItemContent(role=Role.USER, content=(TextBlock(body),))
            await store.append(AppendRequest("t", session_id, [PreparedItem(item, "a" * 64, 1)], request_hash="r"))
        await store.create_session("t", "empty", {})
    finally:
        await db.close()
    # Sessions from before 0006 have no count: the upgrade makes it.
    await migrate.downgrade(url, "0005")
    await migrate.upgrade(url)
    db = Database(url)
    try:
        async with db.read() as conn:
            rows = dict((await conn.execute(text("SELECT id, stored_bytes FROM sessions"))).all())
        # The stored content's length: the text and the JSON around it.
        assert rows["empty"] == 0 and 10 < rows["small"] < 100 and 50_000 < rows["large"] < 50_100
        store = HistoryStore(db)
        item = ItemContent(role=Role.USER, content=(TextBlock("z" * 300),))
        await store.append(AppendRequest("t", "empty", [PreparedItem(item, "b" * 64, 1)], "r", stored_bytes=300))
        assert await store.tenant_stored_bytes("t") == rows["small"] + rows["large"] + 300
        assert await store.tenant_stored_bytes("another") == 0
    finally:
        await db.close()


async def _trigram_objects(url: str) -> set[str]:
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                query = "SELECT indexname FROM pg_indexes WHERE indexname LIKE '%trigram%'"
            else:
                query = "SELECT name FROM sqlite_master WHERE name LIKE '%trigram%'"
            return set((await conn.execute(text(query))).scalars())
    finally:
        await engine.dispose()


async def test_0007_indexes_the_texts_already_stored_and_its_downgrade_drops_the_index(
    empty_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = empty_database
    await migrate.upgrade(url, "0006")
    db = Database(url)
    try:
        store = HistoryStore(db)
        store.writes_at_once = False  # as the code of revision 0006 wrote: a statement a table,
        with monkeypatch.context() as then:
            then.setattr(events, "record", _no_events)  # and no events (they came in 0009)
            await store.create_session("t", "s", {})
            items = [ItemContent(role=Role.USER, content=(TextBlock(t),)) for t in ("a quokka", "the wombat KEY_42")]
            prepared = [PreparedItem(item, f"{n}" * 64, 1) for n, item in enumerate(items)]
            await store.append(AppendRequest("t", "s", prepared, request_hash="r"))
        key = await store.session_key("t", "s")
    finally:
        await db.close()
    assert await _trigram_objects(url) == set()

    await migrate.upgrade(url)
    objects = await _trigram_objects(url)
    assert "ix_item_texts_trigrams" in objects or "item_texts_trigrams" in objects
    db = Database(url)
    try:
        async with db.read() as conn:
            if conn.dialect.name == "sqlite":  # the texts already stored are in the table
                indexed = "SELECT rowid FROM item_texts_trigrams WHERE item_texts_trigrams MATCH '\"_42\"'"
                assert (await conn.execute(text(indexed))).scalars().all() == [key * search.FTS_ROWID_SPAN + 2]
            found = await search.substring(conn, key, "wombat KEY", search.Where(), 10, 0)
            assert [f.seq for f in found] == [2]
    finally:
        await db.close()

    await migrate.downgrade(url, "0006")
    assert await _trigram_objects(url) == set()
    await migrate.upgrade(url)
    assert await _trigram_objects(url) == objects


async def _no_events(*_: object) -> None:
    return None


async def test_0007_without_the_right_to_install_pg_trgm_migrates_without_the_index(
    postgres_server_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A role that owns its schema but may not create extensions (no CREATE on the database)."""
    url = backends.create_database(postgres_server_url, "contextd_no_trgm")
    role = f"contextd_{uuid.uuid4().hex[:10]}"
    database = make_url(url).database
    backends.admin(
        url,
        f'CREATE ROLE "{role}" LOGIN',
        f'REVOKE CREATE ON DATABASE "{database}" FROM PUBLIC',
        f'GRANT CONNECT ON DATABASE "{database}" TO "{role}"',
        f'GRANT USAGE, CREATE ON SCHEMA public TO "{role}"',
    )
    as_role = make_url(url).set(username=role).render_as_string(hide_password=False)
    try:
        with caplog.at_level("WARNING"):
            await migrate.upgrade(as_role)
        assert await migrate.current_revision(as_role) == migrate.head_revision()
        assert "cannot install the pg_trgm extension" in caplog.text and "CREATE INDEX" in caplog.text
        assert await _trigram_objects(as_role) == set()
        db = Database(as_role)
        try:
            store = HistoryStore(db)
            await store.create_session("t", "s", {})
            item = ItemContent(role=Role.USER, content=(TextBlock("the wombat KEY_42"),))
            await store.append(AppendRequest("t", "s", [PreparedItem(item, "a" * 64, 1)], request_hash="r"))
            key = await store.session_key("t", "s")
            async with db.read() as conn:  # search reads every text instead
                assert [f.seq for f in await search.substring(conn, key, "KEY_42", search.Where(), 10, 0)] == [1]
        finally:
            await db.close()
        await migrate.downgrade(as_role, "0006")
    finally:
        backends.drop_database(postgres_server_url, url)
        backends.admin(postgres_server_url, f'DROP ROLE IF EXISTS "{role}"')


async def test_0008_keeps_a_whole_state_and_its_downgrade_folds_the_changes_since_into_it(empty_database: str) -> None:
    url = empty_database
    await migrate.upgrade(url)
    db = Database(url)
    try:
        store = HistoryStore(db)
        service = ViewService(store, TiktokenCounter(), TransformRegistry.default())
        await store.create_session("t", "s", {})
        for n in range(4):  # a render after each append: the first stores a copy, the others changes
            output = ToolResultBlock(f"c{n}", (TextBlock(f"row {n}\n" * 80),), name="bash")
            call = ItemContent(role=Role.ASSISTANT, content=(ToolUseBlock(f"c{n}", "bash", '{"command": "ls"}'),))
            batch = [
                PreparedItem(call, f"{n}a".ljust(64, "0"), 1),
                PreparedItem(ItemContent(role=Role.TOOL, content=(output,)), f"{n}b".ljust(64, "0"), 80),
            ]
            await store.append(AppendRequest("t", "s", batch, request_hash=f"r{n}"))
            await service.render("t", "s", ViewRequest(ViewFormat.OPENAI_CHAT))
        async with db.read() as conn:
            key = await store.session_key("t", "s")
            stored = await views.read_state(conn, key)
            changes = (await conn.execute(text("SELECT count(*) FROM view_state_changes"))).scalar_one()
        assert stored.state.view_version == 4 and stored.snapshot_version == 1 and changes == 4  # the copy's own too
    finally:
        await db.close()
    await migrate.downgrade(url, "0007")  # one whole state per session again, as of its version
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            whole = (await conn.execute(text("SELECT state FROM view_states"))).scalar_one()
    finally:
        await engine.dispose()
    assert state_from_json(whole) == stored.state
    await migrate.upgrade(url)  # and that state is the copy of its own version
    db = Database(url)
    try:
        async with db.read() as conn:
            again = await views.read_state(conn, key)
        assert again.state == stored.state and again.snapshot_version == 4 and again.change_bytes == 0
    finally:
        await db.close()


async def test_on_sqlite_a_revision_that_fails_midway_leaves_the_database_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each revision, tables and triggers alike, is one transaction: a start killed while it
    migrates (here, the first revision failing at its first trigger, its tables made) leaves the
    schema as it was, for the next start to migrate again."""
    from alembic.operations import Operations

    url = f"sqlite+aiosqlite:///{tmp_path / 'midway.db'}"
    execute = Operations.execute

    def failing(self: Operations, sql: Any, *args: Any, **kwargs: Any) -> None:
        if "CREATE TRIGGER" in str(sql):
            raise RuntimeError("stopped midway")
        execute(self, sql, *args, **kwargs)

    monkeypatch.setattr(Operations, "execute", failing)
    with pytest.raises(RuntimeError, match="midway"):
        await migrate.upgrade(url)
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            made = (await conn.execute(text("SELECT name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"))).all()
    finally:
        await engine.dispose()
    assert made == []  # (the first revision's tables, and the version table, were made, then undone)
    monkeypatch.setattr(Operations, "execute", execute)
    await migrate.upgrade(url)
    assert await migrate.current_revision(url) == migrate.head_revision()
