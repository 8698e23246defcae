"""The database handle: engine set-up per dialect, transactions, session locks.

Per-session serialization (DESIGN section 7) lives here because it is a
property of the write transaction:

* Postgres: `pg_advisory_xact_lock` on a 64-bit key derived from the tenant
  and session id, taken first thing in the transaction and released by
  COMMIT or ROLLBACK, so it holds across replicas and cannot leak through
  the connection pool. The wait is bounded by `lock_timeout`; a timeout
  raises SessionBusy (retryable). Transactions run at READ COMMITTED, so
  every statement after the lock sees what the previous holder committed.
* SQLite (embedded, one process): an in-process lock per session and one
  writer lock, then BEGIN IMMEDIATE, which also keeps a second process on
  the same file from interleaving.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry

from contextd.engine.errors import SessionBusy, StorageUnavailable

_WRITE_OPTION = "contextd_write"
_LOCK_NOT_AVAILABLE = "55P03"  # Postgres SQLSTATE for lock_timeout expiry
_RETRY_AFTER_MS = 200


def session_lock_key(tenant: str, session_id: str) -> int:
    """A signed 64-bit advisory-lock key for one session of one tenant."""
    digest = hashlib.sha256(f"{tenant}\x00{session_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class Database:
    def __init__(self, url: str, *, pool_size: int = 10, lock_timeout_ms: int = 5000) -> None:
        self.url = url
        self.lock_timeout_ms = lock_timeout_ms
        self.dialect = "sqlite" if url.startswith("sqlite") else "postgresql"
        # No pre-ping: it costs a round trip on every checkout. A connection
        # that died with the server fails its call with STORAGE_UNAVAILABLE
        # (retryable; SQLAlchemy then replaces the pool's connections).
        options: dict[str, Any] = {}
        if self.dialect == "postgresql":
            options |= {
                "pool_size": pool_size,
                "max_overflow": pool_size,
                "pool_timeout": 30,
                # Bounds the advisory-lock wait (and any other lock wait) for
                # the connection's whole life, saving a statement per append.
                "connect_args": {"server_settings": {"lock_timeout": str(lock_timeout_ms)}},
            }
        self.engine: AsyncEngine = create_async_engine(url, **options)
        if self.dialect == "sqlite":
            _configure_sqlite(self.engine)
        self._writer = asyncio.Lock()
        self._session_locks: weakref.WeakValueDictionary[int, asyncio.Lock] = weakref.WeakValueDictionary()

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    async def close(self) -> None:
        await self.engine.dispose()

    async def ping(self) -> None:
        async with self.read() as conn:
            await conn.execute(text("SELECT 1"))

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        """A read-only transaction."""
        with _unavailable_on_connection_error():
            async with self.engine.connect() as conn, conn.begin():
                yield conn

    @asynccontextmanager
    async def write(self, tenant: str = "", session_id: str | None = None) -> AsyncIterator[AsyncConnection]:
        """A write transaction; with `session_id`, holding that session's lock throughout."""
        key = session_lock_key(tenant, session_id) if session_id is not None else None
        with _unavailable_on_connection_error():
            if self.is_sqlite:
                async with self._sqlite_write(key, session_id or "") as conn:
                    yield conn
            else:
                async with self.engine.connect() as conn, conn.begin():
                    if key is not None:
                        await self._advisory_lock(conn, key, session_id or "")
                    yield conn

    async def _advisory_lock(self, conn: AsyncConnection, key: int, session_id: str) -> None:
        started = time.monotonic()
        try:
            await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})
        except DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) == _LOCK_NOT_AVAILABLE:
                waited = int((time.monotonic() - started) * 1000)
                raise SessionBusy(session_id, waited, _RETRY_AFTER_MS) from None
            raise

    @asynccontextmanager
    async def _sqlite_write(self, key: int | None, session_id: str) -> AsyncIterator[AsyncConnection]:
        started = time.monotonic()
        timeout = self.lock_timeout_ms / 1000
        session_lock = self._session_lock(key) if key is not None else None
        try:
            async with asyncio.timeout(timeout):
                if session_lock is not None:
                    await session_lock.acquire()
                try:
                    await self._writer.acquire()
                except BaseException:
                    if session_lock is not None:
                        session_lock.release()
                    raise
        except TimeoutError:
            raise SessionBusy(session_id, int((time.monotonic() - started) * 1000), _RETRY_AFTER_MS) from None
        try:
            async with self.engine.connect() as conn:
                conn = await conn.execution_options(**{_WRITE_OPTION: True})
                async with conn.begin():
                    yield conn
        finally:
            self._writer.release()
            if session_lock is not None:
                session_lock.release()

    def _session_lock(self, key: int) -> asyncio.Lock:
        lock = self._session_locks.get(key)
        if lock is None:
            lock = asyncio.Lock()
            self._session_locks[key] = lock
        return lock


def _configure_sqlite(engine: AsyncEngine) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: ConnectionPoolEntry) -> None:
        # Take BEGIN away from the driver (see the `begin` hook below), then
        # set the pragmas every connection needs.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        for pragma in ("journal_mode=WAL", "busy_timeout=5000", "foreign_keys=ON", "synchronous=NORMAL"):
            cursor.execute(f"PRAGMA {pragma}")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        # Writers take the database write lock up front instead of upgrading
        # a read lock mid-transaction, which SQLite may refuse.
        immediate = conn.get_execution_options().get(_WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


class _unavailable_on_connection_error:
    """Turn a lost or refused database connection into StorageUnavailable."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _tb: object) -> None:
        if isinstance(exc, OperationalError | InterfaceError) or (
            isinstance(exc, DBAPIError) and exc.connection_invalidated
        ):
            raise StorageUnavailable(f"the database is unavailable: {type(exc.orig).__name__}") from exc
        if isinstance(exc, OSError):
            raise StorageUnavailable(f"the database is unavailable: {exc}") from exc
