"""Schema migrations (Alembic; the scripts are the contextd_migrations package, migrations/).

On Postgres a session-level advisory lock on a dedicated connection makes
replicas that start together migrate one at a time; the others find the
schema current and do nothing.

Alembic is imported only to run a migration (a third of a second of CPU): the
database's revision is one query of its version table, and the head is read
from the scripts' `revision` and `down_revision` lines, so a server starting
on a current schema never loads it (tests/service/test_startup.py holds this head to
Alembic's own).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

import contextd_migrations

if TYPE_CHECKING:
    from alembic.config import Config
    from sqlalchemy.engine import Connection

MIGRATIONS = Path(contextd_migrations.__file__).resolve().parent
_MIGRATION_LOCK = 0x636F6E7465787464  # "contextd" as a 64-bit advisory-lock key
# `revision = "0006"`, `down_revision: str | None = "0005"  # a comment` (an annotation is allowed)
_REVISION_LINE = re.compile(r"^(revision|down_revision)\s*(?::[^=\n]*)?=\s*(.+?)\s*(?:#.*)?$", re.MULTILINE)
_VERSION_TABLE_EXISTS = {
    "postgresql": "SELECT to_regclass('alembic_version') IS NOT NULL",  # on the search path, as Alembic looks
    "sqlite": "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'alembic_version'",
}


def alembic_config() -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


async def upgrade(url: str, revision: str = "head") -> None:
    from alembic import command

    await _run(url, lambda conn: command.upgrade(_bound(conn), revision))


async def downgrade(url: str, revision: str = "base") -> None:
    from alembic import command

    await _run(url, lambda conn: command.downgrade(_bound(conn), revision))


async def current_revision(url: str) -> str | None:
    """The database's schema revision; None when it has none (never migrated, or downgraded to base)."""
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            return await _revision_of(conn)
    finally:
        await engine.dispose()


async def _revision_of(conn: AsyncConnection) -> str | None:
    if not (await conn.execute(text(_VERSION_TABLE_EXISTS[conn.dialect.name]))).scalar():
        return None
    versions = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalars().all()
    if len(versions) > 1:  # contextd's history has no branches; Alembic refuses this too
        raise RuntimeError(f"the database's alembic_version holds {len(versions)} revisions, not one")
    return versions[0] if versions else None


def head_revision() -> str:
    """The newest revision of the scripts in versions/: the one no script names as its down_revision."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for script in (MIGRATIONS / "versions").glob("*.py"):
        fields = {match[1]: match[2] for match in _REVISION_LINE.finditer(script.read_text())}
        if "revision" not in fields:
            continue  # not a revision script (Alembic skips it too)
        revisions.add(ast.literal_eval(fields["revision"]))
        down = ast.literal_eval(fields.get("down_revision", "None"))
        parents.update([down] if isinstance(down, str) else down or ())  # a merge names a tuple
    heads = revisions - parents
    if len(heads) != 1:
        raise RuntimeError(f"the migration scripts at {MIGRATIONS} have {len(heads)} heads, not one")
    return heads.pop()


def _bound(connection: Connection) -> Config:
    config = alembic_config()
    config.attributes["connection"] = connection
    return config


async def _run(url: str, action: Callable[[Connection], None]) -> None:
    engine = create_async_engine(url, poolclass=NullPool)
    if engine.dialect.name == "sqlite":
        _ddl_in_transactions(engine)
    try:
        async with engine.connect() as conn:
            postgres = conn.dialect.name == "postgresql"
            if postgres:
                await conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _MIGRATION_LOCK})
                await conn.commit()
            try:
                await conn.run_sync(action)
                await conn.commit()
            except BaseException:
                await conn.rollback()
                raise
            finally:
                if postgres:
                    await conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": _MIGRATION_LOCK})
                    await conn.commit()
    finally:
        await engine.dispose()


def _ddl_in_transactions(engine: AsyncEngine) -> None:
    """SQLite runs DDL in transactions, but Python's sqlite3 driver opens one only before a data
    change, so each CREATE or ALTER of a migration was its own, committed at once: a start killed
    while it migrated a new database left tables no revision records ("table item_texts already
    exists" at the next start). The driver's BEGIN is taken away and one is issued for each of
    the transactions Alembic opens (one per revision on SQLite), as the server's own connections
    do (database.py), without their pragmas (foreign keys on would cascade through the tables a
    batch migration copies)."""

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN")
