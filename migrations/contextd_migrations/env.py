"""Alembic environment for contextd: one migration history for Postgres and SQLite.

Run migrations with `contextd migrate` (storage/contextd_storage/migrate.py), which
hands this script an open connection. Running the `alembic` command directly
also works: the database URL then comes from CONTEXTD_DATABASE_URL.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from contextd.config import Settings
from contextd_storage.schema import include_object, metadata


def run_on(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds tables instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        include_object=include_object,
    )
    with context.begin_transaction():
        context.run_migrations()


async def run_with_own_engine() -> None:
    import os

    url = Settings.load(os.environ).database_url
    engine = create_async_engine(url, poolclass=NullPool)
    async with engine.begin() as connection:
        await connection.run_sync(run_on)
    await engine.dispose()


connection = context.config.attributes.get("connection")
if connection is not None:
    run_on(connection)
else:
    asyncio.run(run_with_own_engine())
