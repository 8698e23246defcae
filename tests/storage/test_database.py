"""Every way the database can be unavailable is StorageUnavailable (retryable, with a
delay), and a transaction cut short writes nothing. The outage of a whole Postgres
server (stopped, started) is in tests/integration/test_faults.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import DBAPIError

from contextd.engine.errors import StorageUnavailable
from contextd_storage.database import Database, _unavailable_on_connection_failure
from contextd_storage.history import HistoryStore
from tests import backends
from tests.storage.test_history import request, text_item


class _DriverError(Exception):
    """A driver exception as the asyncpg adapter raises them: with a SQLSTATE."""

    def __init__(self, sqlstate: str) -> None:
        super().__init__(f"driver error {sqlstate}")
        self.sqlstate = sqlstate


@pytest.mark.parametrize(
    "sqlstate",
    [
        "08000",  # connection exception
        "08003",  # connection does not exist
        "08006",  # connection failure
        "57P01",  # terminating connection due to administrator command
        "57P02",  # crash shutdown
        "57P03",  # cannot connect now: starting up, shutting down, in recovery
        "53300",  # too many connections
        "25006",  # read-only transaction: a standby mid-failover
    ],
)
def test_each_unavailable_state_is_retryable_with_a_delay(sqlstate: str) -> None:
    with pytest.raises(StorageUnavailable) as raised, _unavailable_on_connection_failure():
        raise DBAPIError("SELECT 1", None, _DriverError(sqlstate))
    assert raised.value.reason == "DATABASE_UNAVAILABLE"
    assert raised.value.retry_after_ms >= 500
    assert raised.value.metadata["retry_after_ms"] == str(raised.value.retry_after_ms)
    assert sqlstate in raised.value.message


@pytest.mark.parametrize("sqlstate", ["42P01", "23505", "22P02", ""])
def test_other_database_errors_stay_what_they_are(sqlstate: str) -> None:
    """An undefined table or a broken constraint is a bug, not an outage: never retried."""
    with pytest.raises(DBAPIError), _unavailable_on_connection_failure():
        raise DBAPIError("SELECT 1", None, _DriverError(sqlstate))


async def test_a_refused_connection_is_unavailable() -> None:
    db = Database("postgresql+asyncpg://nobody@127.0.0.1:1/none")
    try:
        with pytest.raises(StorageUnavailable) as raised:
            await db.ping()
        assert raised.value.reason == "DATABASE_UNAVAILABLE"
    finally:
        await db.close()


@pytest.fixture
def limited_role(postgres_url: str) -> Iterator[tuple[str, str]]:
    with backends.postgres_role(postgres_url) as role:
        yield role


async def test_a_terminated_backend_fails_the_write_and_writes_nothing(
    postgres_url: str, limited_role: tuple[str, str]
) -> None:
    url, role = limited_role
    db = Database(url, pool_size=1)
    store = HistoryStore(db)
    try:
        sid = f"s-{uuid.uuid4().hex[:8]}"
        await store.create_session("tenant", sid, {})
        with pytest.raises(StorageUnavailable) as raised:
            async with db.write("tenant", sid) as conn:
                await conn.execute(text("UPDATE sessions SET version = version + 100 WHERE id = :i"), {"i": sid})
                # An operator (or a failover) ends the connection before COMMIT: 57P01.
                backends.end_connections(postgres_url, role)
                await conn.execute(text("SELECT 1"))
        assert raised.value.reason == "DATABASE_UNAVAILABLE"
        # The pool replaces the dead connection; the half-done transaction left nothing.
        assert (await store.get_session("tenant", sid)).version == 0
        assert (await store.append(request(sid, [text_item("after")]))).first_seq == 1
    finally:
        await db.close()


async def test_too_many_connections_is_unavailable(postgres_url: str, limited_role: tuple[str, str]) -> None:
    url, role = limited_role
    backends.admin(postgres_url, f'ALTER ROLE "{role}" CONNECTION LIMIT 0')
    db = Database(url)
    try:
        with pytest.raises(StorageUnavailable) as raised:
            await db.ping()
        assert (raised.value.reason, "53300" in raised.value.message) == ("DATABASE_UNAVAILABLE", True)
    finally:
        await db.close()


async def test_a_read_of_one_statement_is_one_round_trip(postgres_url: str) -> None:
    """GetSession (the call agents make most) sends its one statement and nothing around it: no
    BEGIN and COMMIT, two round trips more to a database across the network. (The driver's log
    holds the statements it sends as text, these among them; prepared ones go unlogged.)"""
    db = Database(postgres_url)
    sent: list[str] = []

    @event.listens_for(db.engine.sync_engine, "connect")
    def log_queries(connection: Any, _: Any) -> None:
        connection.driver_connection.add_query_logger(lambda logged: sent.append(logged.query.split()[0]))

    store = HistoryStore(db)
    try:
        sid = f"s-{uuid.uuid4().hex[:8]}"
        await store.create_session("tenant", sid, {})
        await store.append(request(sid, [text_item("hello")]))
        sent.clear()
        assert (await store.get_session("tenant", sid)).version == 1
        assert sent == []
        async with db.read() as conn:  # a read of several statements is one snapshot: a transaction
            await conn.execute(text("SELECT 1"))
        assert sent == ["BEGIN", "COMMIT;"]
    finally:
        await db.close()
