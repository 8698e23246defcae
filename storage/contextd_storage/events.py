"""The session event log behind WatchSession (DESIGN section 8).

A change to a session writes its event in the transaction that makes the
change (`record`), so every change that commits has its event and no other
change has one: a watcher can miss nothing and is told nothing that did not
happen. Readers on any replica take the events from this table; nothing in
one replica's memory is needed to see another's.

Order and cursors. An event's place is (txid, id): `id` comes from a
sequence and, on Postgres, `txid` is the writing transaction's id
(`pg_current_xact_id`). Ids alone are not the order in which events become
visible: a transaction that took id 7 may commit after one that took id 8,
and a reader that had moved past 8 would never see 7. So a reader takes only
events whose transaction is older than every transaction still running
(`pg_snapshot_xmin` of its snapshot): those are final, and every event
written later sorts after them, because a later transaction has a larger
txid. The cost is that delivery waits for the oldest running write
transaction on the Postgres server (contextd's last milliseconds; a long one
elsewhere on the same server delays events, it never loses one). On SQLite
one writer commits at a time, in id order, and `txid` is 0.

Events are kept for a retention window (`prune`); the cursor through which
they were pruned is kept beside them, so a watcher resuming from before it
is told its events are gone rather than handed a silent gap.
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, func, insert, literal_column, select, text, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from contextd_storage import schema

WRITTEN: set[int] = set()
"""The ids of the connections whose open transaction `record` wrote events in: Database tells
its `on_events` once such a transaction commits, and forgets the id either way. (Not the
connection's `info`: reading that after the connection failed makes SQLAlchemy reconnect.)"""

_OFF: weakref.WeakSet[Engine] = weakref.WeakSet()
"""Engines whose transactions record no events (`turn_off`)."""

_MAX = 2**63 - 1
_CURSOR = re.compile(r"(0|[1-9][0-9]{0,18})-(0|[1-9][0-9]{0,18})")


@dataclass(frozen=True, order=True, slots=True)
class Cursor:
    """A place in the order of events: after every event at or before it."""

    txid: int
    id: int

    def encode(self) -> str:
        return f"{self.txid}-{self.id}"

    @staticmethod
    def decode(value: str) -> Cursor:
        """The cursor `value` spells; ValueError when it spells none."""
        match = _CURSOR.fullmatch(value)
        if match is None or max(int(match[1]), int(match[2])) > _MAX:
            raise ValueError(f"{value[:40]!r} is not an event cursor (two numbers joined by '-')")
        return Cursor(int(match[1]), int(match[2]))


OLDEST = Cursor(0, 0)
"""Before every event: from the oldest retained."""


@dataclass(frozen=True, slots=True)
class Event:
    cursor: Cursor
    tenant: str
    session_id: str
    kind: str
    body: Mapping[str, Any]
    time: datetime


@dataclass(frozen=True, slots=True)
class NewEvent:
    tenant: str
    session_id: str
    kind: str
    body: Mapping[str, Any]


def turn_off(engine: AsyncEngine) -> None:
    """Record no events through `engine` (a deployment that never watches saves the rows)."""
    _OFF.add(engine.sync_engine)


def recording(conn: AsyncConnection) -> bool:
    """Whether transactions on `conn` record events (`turn_off`)."""
    return conn.sync_engine not in _OFF


async def record(conn: AsyncConnection, *events: NewEvent) -> None:
    """Write events in the caller's transaction (they commit, or vanish, with its change)."""
    if not events or not recording(conn):
        return
    now = datetime.now(UTC)
    rows = [
        {"tenant": e.tenant, "session_id": e.session_id, "kind": e.kind, "body": e.body, "created_at": now}
        for e in events
    ]
    await conn.execute(_INSERT[conn.dialect.name == "postgresql"], rows)
    WRITTEN.add(id(conn))


IN_STATEMENT = (
    "INSERT INTO events (txid, tenant, session_id, kind, body, created_at) "
    "SELECT CAST(CAST(pg_current_xact_id() AS TEXT) AS BIGINT), u.tenant, u.session_id, u.kind, "
    "CAST(u.body AS JSON), CAST(:event_time AS TIMESTAMPTZ) "
    "FROM unnest(CAST(:event_tenants AS TEXT[]), CAST(:event_session_ids AS TEXT[]), "
    "CAST(:event_kinds AS TEXT[]), CAST(:event_bodies AS TEXT[])) "
    "WITH ORDINALITY AS u(tenant, session_id, kind, body, n) ORDER BY u.n"
)
"""`record`'s insert as a data-modifying CTE of a larger Postgres statement (one round trip
for a change and its events); its parameters are `in_statement`'s."""


def in_statement(conn: AsyncConnection, *events: NewEvent) -> dict[str, Any]:
    """`IN_STATEMENT`'s parameters (no rows when `conn` records no events). The statement must
    run in the transaction on `conn`: its events are marked as written there."""
    if not recording(conn):
        events = ()
    if events:
        WRITTEN.add(id(conn))  # forgotten if the transaction fails (Database._transaction)
    return {
        "event_time": datetime.now(UTC),
        "event_tenants": [e.tenant for e in events],
        "event_session_ids": [e.session_id for e in events],
        "event_kinds": [e.kind for e in events],
        "event_bodies": [json.dumps(e.body) for e in events],
    }


# One statement per dialect, built once (SQLAlchemy caches its compiled form): the
# transaction's id is Postgres's to give.
_INSERT = {
    True: insert(schema.events).values(txid=literal_column("pg_current_xact_id()::text::bigint")),
    False: insert(schema.events).values(txid=0),
}


async def horizon(conn: AsyncConnection) -> Cursor:
    """Every event at or before this cursor is final in the caller's snapshot (which must be
    the snapshot of the reads that follow: a REPEATABLE READ transaction on Postgres)."""
    if conn.dialect.name == "postgresql":
        xmin = await conn.scalar(text("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint"))
        return Cursor(int(xmin) - 1, _MAX)
    last = await conn.scalar(select(func.max(schema.events.c.id)))
    return Cursor(0, int(last or 0))


async def read(
    conn: AsyncConnection,
    after: Cursor,
    *,
    through: Cursor | None = None,
    tenant: str | None = None,
    session_id: str | None = None,
    limit: int = 1000,
) -> tuple[list[Event], Cursor]:
    """Final events after `after` (and at or before `through`), in order, at most `limit`,
    of one tenant or session when given; and where a reader stands after them (the next
    read starts there)."""
    e = schema.events
    bound = await horizon(conn)
    if through is not None:
        bound = min(bound, through)
    if bound <= after:
        return [], after
    place = tuple_(e.c.txid, e.c.id)
    query = select(e).where(place > tuple_(after.txid, after.id), place <= tuple_(bound.txid, bound.id))
    if tenant is not None:
        query = query.where(e.c.tenant == tenant)
    if session_id:
        query = query.where(e.c.session_id == session_id)
    rows = (await conn.execute(query.order_by(e.c.txid, e.c.id).limit(limit))).mappings().all()
    events = [_event(r) for r in rows]
    return events, (events[-1].cursor if len(events) == limit else bound)


async def pruned_through(conn: AsyncConnection) -> Cursor:
    """Events at or before this cursor may be gone (OLDEST: none was pruned)."""
    row = (await conn.execute(select(schema.events_pruned))).mappings().first()
    return Cursor(int(row["txid"]), int(row["event_id"])) if row is not None else OLDEST


async def prune(conn: AsyncConnection, before: datetime, batch: int = 5000) -> int:
    """Delete the events written before `before`, oldest ids first, a batch at a time; returns
    how many. Ids follow time closely, so the walk stops at the first id not old enough."""
    e, p = schema.events, schema.events_pruned
    deleted = 0
    while True:
        ids = (await conn.execute(select(e.c.id, e.c.created_at).order_by(e.c.id).limit(batch))).all()
        old = 0
        while old < len(ids) and _utc(ids[old].created_at) < before:
            old += 1
        if old == 0:
            return deleted
        # What was deleted, as deleted (a row committed since the SELECT is young, and stays).
        gone = (
            await conn.execute(
                e.delete().where(e.c.id <= ids[old - 1].id, e.c.created_at < before).returning(e.c.txid, e.c.id)
            )
        ).all()
        if gone:
            last = max(Cursor(int(r.txid), int(r.id)) for r in gone)
            # The mark only moves on (replicas prune concurrently).
            await conn.execute(
                update(p)
                .where(tuple_(p.c.txid, p.c.event_id) < tuple_(last.txid, last.id))
                .values(txid=last.txid, event_id=last.id)
            )
        deleted += len(gone)
        if old < len(ids) or len(ids) < batch:
            return deleted


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _event(row: Any) -> Event:
    return Event(
        Cursor(int(row["txid"]), int(row["id"])),
        row["tenant"],
        row["session_id"],
        row["kind"],
        row["body"],
        _utc(row["created_at"]),
    )
