"""The database handle: engine set-up per dialect, transactions, session locks.

Per-session serialization (DESIGN section 7) lives here because it is a
property of the write transaction:

* Postgres: `pg_advisory_xact_lock` on a 64-bit key derived from the tenant
  and session id, taken first thing in the transaction and released by
  COMMIT or ROLLBACK, so it holds across replicas and cannot leak through
  the connection pool. The wait is bounded by `lock_timeout` (set on every
  connection); a timeout raises SessionBusy (retryable). Write transactions
  run at READ COMMITTED, set explicitly: every statement after the lock must
  see what the previous holder committed, which a server-wide default of
  REPEATABLE READ would break. Within one replica, writers of a session
  first queue on an in-process lock, so a busy session holds at most one
  pooled connection while it waits, not the whole pool.
* SQLite (embedded, one process): one in-process writer lock, then BEGIN
  IMMEDIATE, which also keeps a second process on the same file from
  interleaving; commits are fully synchronous, so an acknowledged append
  survives a power cut.

Reads run in a REPEATABLE READ snapshot on Postgres (SQLite's reads are
snapshots already), so a view never mixes two moments of a session.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry

from contextd.engine.errors import DATABASE_BUSY, SessionBusy, StorageUnavailable
from contextd_storage import events

_WRITE_OPTION = "contextd_write"
_LOCK_NOT_AVAILABLE = "55P03"  # Postgres SQLSTATE for lock_timeout expiry
_ADVISORY_LOCK = text("SELECT pg_advisory_xact_lock(:key)")
"""The session lock (built once: parsing the text for every write cost a tenth of a render's reads)."""
_BUSY_RETRY_MS = 200  # a session's lock or this server's pool: a moment
# A restarting Postgres takes seconds: a client that waits a second between tries rides
# it out without adding load while it starts.
_UNAVAILABLE_RETRY_MS = 1000


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
        # that died with the server fails its call with DATABASE_UNAVAILABLE
        # (retryable; SQLAlchemy then replaces the pool's connections).
        options: dict[str, Any] = {}
        if self.dialect == "postgresql":
            options |= {
                "pool_size": pool_size,
                "max_overflow": pool_size,
                "pool_timeout": max(1.0, lock_timeout_ms / 1000),
                "isolation_level": "READ COMMITTED",
                # Bounds the advisory-lock wait (and any other lock wait) for
                # the connection's whole life, saving a statement per append.
                "connect_args": {"server_settings": {"lock_timeout": str(lock_timeout_ms)}},
            }
        self.engine: AsyncEngine = create_async_engine(url, **options)
        if self.dialect == "sqlite":
            _configure_sqlite(self.engine, busy_timeout_ms=lock_timeout_ms)
        self._writer = asyncio.Lock()
        self.on_lock_wait: Callable[[float], None] | None = None
        """Told the seconds each write under a session's lock waited for it (the service's metrics)."""
        self.on_events: Callable[[], None] | None = None
        """Told when a transaction that wrote session events has committed (events.record)."""
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
        """A read-only transaction over one consistent snapshot."""
        with _unavailable_on_connection_failure():
            async with self.engine.connect() as conn:
                if not self.is_sqlite:
                    conn = await conn.execution_options(isolation_level="REPEATABLE READ")
                async with conn.begin():
                    yield conn

    @asynccontextmanager
    async def read_one(self) -> AsyncIterator[AsyncConnection]:
        """A connection for a read of one statement, outside a transaction: one statement reads
        one snapshot by itself, and this spares the two round trips of a transaction (BEGIN and
        COMMIT) on the calls every agent makes most (GetSession)."""
        with _unavailable_on_connection_failure():
            async with self.engine.connect() as conn:
                if not self.is_sqlite:
                    conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
                yield conn

    @asynccontextmanager
    async def write(self, tenant: str = "", session_id: str | None = None) -> AsyncIterator[AsyncConnection]:
        """A write transaction; with `session_id`, holding that session's lock throughout."""
        key = session_lock_key(tenant, session_id) if session_id is not None else None
        with _unavailable_on_connection_failure():
            if self.is_sqlite:
                async with self._sqlite_write(session_id or "") as conn:
                    yield conn
                return
            if key is None:
                async with self.engine.connect() as conn, self._transaction(conn):
                    yield conn
                return
            started = time.monotonic()
            queued = self._queued(key, session_id or "", started)
            async with queued, self.engine.connect() as conn, self._transaction(conn):
                await self._advisory_lock(conn, key, session_id or "", started)
                self._waited(started)
                yield conn

    @asynccontextmanager
    async def _transaction(self, conn: AsyncConnection) -> AsyncIterator[None]:
        """A transaction on `conn`; once it commits, `on_events` hears of any events it wrote."""
        try:
            async with conn.begin():
                yield
        except BaseException:
            events.WRITTEN.discard(id(conn))
            raise
        if id(conn) in events.WRITTEN:
            events.WRITTEN.discard(id(conn))
            if self.on_events is not None:
                self.on_events()

    def _waited(self, started: float) -> None:
        if self.on_lock_wait is not None:
            self.on_lock_wait(time.monotonic() - started)

    @asynccontextmanager
    async def _queued(self, key: int, session_id: str, started: float) -> AsyncIterator[None]:
        """This replica's queue for a session, bounded by the lock timeout."""
        lock = self._session_locks.get(key)
        if lock is None:
            lock = self._session_locks[key] = asyncio.Lock()
        await self._acquire(lock, session_id, started)
        try:
            yield
        finally:
            lock.release()

    async def _acquire(self, lock: asyncio.Lock, session_id: str, started: float) -> None:
        try:
            async with asyncio.timeout(self.lock_timeout_ms / 1000):
                await lock.acquire()
        except TimeoutError:
            raise _busy(session_id, started) from None

    async def _advisory_lock(self, conn: AsyncConnection, key: int, session_id: str, started: float) -> None:
        try:
            await conn.execute(_ADVISORY_LOCK, {"key": key})
        except DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) == _LOCK_NOT_AVAILABLE:
                raise _busy(session_id, started) from None
            raise

    @asynccontextmanager
    async def _sqlite_write(self, session_id: str) -> AsyncIterator[AsyncConnection]:
        # SQLite has a single writer for the whole file, so one lock serves
        # every session; its wait is bounded like the session lock's.
        started = time.monotonic()
        await self._acquire(self._writer, session_id, started)
        self._waited(started)
        try:
            async with self.engine.connect() as conn:
                conn = await conn.execution_options(**{_WRITE_OPTION: True})
                async with self._transaction(conn):
                    yield conn
        finally:
            self._writer.release()


def _busy(session_id: str, started: float) -> SessionBusy:
    return SessionBusy(session_id, int((time.monotonic() - started) * 1000), _BUSY_RETRY_MS)


def _configure_sqlite(engine: AsyncEngine, busy_timeout_ms: int) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: ConnectionPoolEntry) -> None:
        # Take BEGIN away from the driver (see the `begin` hook below), then
        # set the pragmas every connection needs.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        pragmas = ("journal_mode=WAL", f"busy_timeout={busy_timeout_ms}", "foreign_keys=ON", "synchronous=FULL")
        for pragma in pragmas:
            cursor.execute(f"PRAGMA {pragma}")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        # Writers take the database write lock up front instead of upgrading
        # a read lock mid-transaction, which SQLite may refuse.
        immediate = conn.get_execution_options().get(_WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


@contextmanager
def _unavailable_on_connection_failure() -> Iterator[None]:
    """Turn every way the database can be unavailable into StorageUnavailable (retryable).

    Anything else (a bug, a schema that is not migrated) stays what it is
    and surfaces as an internal error with a reference in the log.
    """
    try:
        yield
    except PoolTimeout as exc:
        raise StorageUnavailable(
            "every database connection of this server is busy; retry", _BUSY_RETRY_MS, DATABASE_BUSY
        ) from exc
    except DBAPIError as exc:
        sqlstate = getattr(exc.orig, "sqlstate", None) or ""
        if exc.connection_invalidated or _sqlite_locked(exc) or _unavailable_state(sqlstate):
            raise StorageUnavailable(
                f"the database is unavailable ({_what(exc.orig, sqlstate)}); retry", _UNAVAILABLE_RETRY_MS
            ) from exc
        raise
    except OSError as exc:  # refused, unreachable, timed out while connecting
        raise StorageUnavailable(
            f"the database is unavailable ({type(exc).__name__}); retry", _UNAVAILABLE_RETRY_MS
        ) from exc


# Postgres conditions that end when the server (or a failover) is back, whatever the call:
# class 08 (connection exceptions), 57P01-57P03 (shutting down by an administrator or after
# a crash; cannot connect now: starting up, shutting down, in recovery), 53300 (too many
# connections) and 25006 (a read-only transaction: connected to a standby mid-failover).
_UNAVAILABLE_STATES = frozenset({"57P01", "57P02", "57P03", "53300", "25006"})


def _unavailable_state(sqlstate: str) -> bool:
    return sqlstate.startswith("08") or sqlstate in _UNAVAILABLE_STATES


def _what(orig: BaseException | None, sqlstate: str) -> str:
    # SQLAlchemy's asyncpg adapter wraps the driver's exception, whose name says more.
    name = type(orig.__cause__ or orig).__name__ if orig is not None else "unknown"
    return f"{name}, SQLSTATE {sqlstate}" if sqlstate else name


def _sqlite_locked(exc: DBAPIError) -> bool:
    # Another process holds the file's write lock past busy_timeout.
    return isinstance(exc, OperationalError) and "database is locked" in str(exc.orig)
