"""Migrations on both dialects, and the database-level append-only guarantee."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from contextd.engine.model import ItemContent, Role, TextBlock, ToolResultBlock, ToolUseBlock
from contextd.storage import migrate
from contextd.storage.database import Database
from contextd.storage.history import AppendRequest, HistoryStore, PreparedItem
from contextd.storage.schema import APPEND_ONLY_TABLES, FULL_TEXT_OBJECTS, include_object, metadata
from tests import backends

TABLES = {
    "sessions",
    "items",
    "item_texts",
    "tool_uses",
    "appends",
    "view_states",
    "pins",
    "prune_proposals",
    "certificates",
    "mutations",
    "calls",
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
