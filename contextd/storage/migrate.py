"""Schema migrations (Alembic, scripts in the repository's migrations/).

On Postgres a session-level advisory lock on a dedicated connection makes
replicas that start together migrate one at a time; the others find the
schema current and do nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"
_MIGRATION_LOCK = 0x636F6E7465787464  # "contextd" as a 64-bit advisory-lock key


def alembic_config() -> Config:
    if not (MIGRATIONS / "env.py").exists():
        raise RuntimeError(f"migration scripts not found at {MIGRATIONS}: run contextd from its repository checkout")
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


async def upgrade(url: str, revision: str = "head") -> None:
    await _run(url, lambda conn: command.upgrade(_bound(conn), revision))


async def downgrade(url: str, revision: str = "base") -> None:
    await _run(url, lambda conn: command.downgrade(_bound(conn), revision))


async def current_revision(url: str) -> str | None:
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(lambda c: MigrationContext.configure(c).get_current_revision())
    finally:
        await engine.dispose()


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def _bound(connection: Connection) -> Config:
    config = alembic_config()
    config.attributes["connection"] = connection
    return config


async def _run(url: str, action: Callable[[Connection], None]) -> None:
    engine = create_async_engine(url, poolclass=NullPool)
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
