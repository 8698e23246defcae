"""The L0 history store: sessions and their append-only items.

Appends run in one transaction under the session lock: look up the
idempotency key, check the expected version, link tool results to their
calls, allocate dense sequence numbers from the session's version, insert,
and bump the version. Either all of it commits or none of it does.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Select, Text, bindparam, cast, exists, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from contextd.engine.errors import (
    IdempotencyKeyReused,
    InvalidArgument,
    SessionExists,
    SessionNotFound,
    VersionConflict,
)
from contextd.engine.model import (
    AppendResult,
    Item,
    ItemContent,
    ItemReceipt,
    Session,
    ToolUseBlock,
)
from contextd.engine.prefix import Prefix
from contextd.engine.validation import ToolCall, link_tool_results
from contextd.telemetry import annotate, traced
from contextd_storage import append_statement, events, page_tokens, schema
from contextd_storage.database import Database
from contextd_storage.events import NewEvent
from contextd_storage.rows import (
    BULK_ITEMS,
    JSON_AS_TEXT,
    AppendRequest,
    AppendRows,
    PreparedItem,
    append_rows,
    chunk_rows,
    items_of,
    off_loop,
    session_of,
)

_IN_CHUNK = 1000

# Rows a session owns besides its items, deleted with it.
_SESSION_CHILDREN = (
    schema.item_texts,
    schema.item_text_chunks,
    schema.tool_uses,
    schema.appends,
    schema.view_states,
    schema.view_state_changes,
    schema.pins,
    schema.prune_proposals,
    schema.certificates,
    schema.mutations,
    schema.calls,
)


def _now() -> datetime:
    return datetime.now(UTC)


class HistoryStore:
    def __init__(self, db: Database, cache: ItemCache | None = None) -> None:
        self.db = db
        self.cache = cache or ItemCache()
        """The decoded histories this store holds between calls."""
        self.writes_at_once = not db.is_sqlite
        """An append's writes in one statement (`append_statement`: Postgres only)."""

    # ------------------------------------------------------------ sessions

    @traced("storage.create_session")
    async def create_session(
        self, tenant: str, session_id: str, metadata: dict[str, str], policy: str = "", policy_version: str = ""
    ) -> Session:
        annotate(session_id=session_id, tenant=tenant)
        now = _now()
        row = {
            "tenant": tenant,
            "id": session_id,
            "version": 0,
            "token_count": 0,
            "metadata": metadata,
            "policy": policy,
            "policy_version": policy_version,
            "created_at": now,
            "updated_at": now,
        }
        try:
            async with self.db.write() as conn:
                await conn.execute(insert(schema.sessions).values(row))
                await events.record(
                    conn, NewEvent(tenant, session_id, "session_created", {"policy_version": policy_version})
                )
        except IntegrityError:
            raise SessionExists(session_id) from None
        return session_of(row)

    @traced("storage.set_policy")
    async def set_policy(self, tenant: str, session_id: str, document: str, version: str) -> Session:
        annotate(session_id=session_id, tenant=tenant, policy_version=version)
        s = schema.sessions
        async with self.db.write(tenant, session_id) as conn:
            key = (await _session_row(conn, tenant, session_id))["key"]
            await conn.execute(
                update(s).where(s.c.key == key).values(policy=document, policy_version=version, updated_at=_now())
            )
            await events.record(conn, NewEvent(tenant, session_id, "policy_updated", {"policy_version": version}))
            return session_of(await _session_row(conn, tenant, session_id))

    @traced("storage.get_session")
    async def session_key(self, tenant: str, session_id: str) -> int:
        """The session's key: never handed out again, even after the session is deleted."""
        async with self.db.read_one() as conn:
            key = (await conn.execute(_SESSION_KEY, {"tenant": tenant, "session_id": session_id})).scalar_one_or_none()
        if key is None:
            raise SessionNotFound(session_id)
        return int(key)

    async def sessions_named(self, keys: Sequence[int]) -> list[tuple[int, str, str]]:
        """Each of the sessions of `keys` still live, as (key, tenant, id), in the order given."""
        s = schema.sessions
        named: dict[int, tuple[int, str, str]] = {}
        async with self.db.read() as conn:
            for start in range(0, len(keys), 500):  # (SQLite took at most 999 parameters before 3.32)
                chosen = select(s.c.key, s.c.tenant, s.c.id).where(
                    s.c.key.in_(keys[start : start + 500]), ~s.c.deleting
                )
                for row in await conn.execute(chosen):
                    named[row.key] = (row.key, row.tenant, row.id)
        return [named[key] for key in keys if key in named]

    async def get_session(self, tenant: str, session_id: str) -> Session:
        annotate(session_id=session_id, tenant=tenant)
        async with self.db.read_one() as conn:
            return session_of(await _session_row(conn, tenant, session_id))

    @traced("storage.list_sessions")
    async def list_sessions(self, tenant: str, page_size: int, page_token: str) -> tuple[list[Session], str]:
        annotate(tenant=tenant, page_size=page_size)
        after = page_tokens.decode("after", page_token)
        query = (
            select(schema.sessions)
            .where(schema.sessions.c.tenant == tenant, schema.sessions.c.key > after)
            .order_by(schema.sessions.c.key)
            .limit(page_size + 1)
        )
        async with self.db.read_one() as conn:
            rows = (await conn.execute(query)).mappings().all()
        page = rows[:page_size]
        next_token = page_tokens.encode("after", page[-1]["key"]) if len(rows) > page_size else ""
        return [session_of(r) for r in page], next_token

    @traced("storage.delete_session")
    async def delete_session(self, tenant: str, session_id: str) -> int:
        """Delete a session and its history; returns the number of items deleted."""
        annotate(session_id=session_id, tenant=tenant)
        s = schema.sessions
        async with self.db.write(tenant, session_id) as conn:
            key = (await _session_row(conn, tenant, session_id))["key"]
            # The append-only triggers let history rows go only once their
            # session is marked as being deleted.
            await conn.execute(update(s).where(s.c.key == key).values(deleting=True))
            deleted = (await conn.execute(schema.items.delete().where(schema.items.c.session_key == key))).rowcount
            for table in _SESSION_CHILDREN:
                await conn.execute(table.delete().where(table.c.session_key == key))
            await conn.execute(s.delete().where(s.c.key == key))
            await events.record(conn, NewEvent(tenant, session_id, "session_deleted", {"items_deleted": int(deleted)}))
        self.cache.discard(key)
        annotate(items=int(deleted))
        return int(deleted)

    async def tenant_stored_bytes(self, tenant: str) -> int:
        """Bytes of items the tenant's sessions hold (their `stored_bytes`, summed)."""
        s = schema.sessions
        async with self.db.read_one() as conn:
            total = await conn.scalar(select(func.coalesce(func.sum(s.c.stored_bytes), 0)).where(s.c.tenant == tenant))
        return int(total or 0)

    # -------------------------------------------------------------- items

    @traced("storage.append")
    async def append(self, request: AppendRequest) -> AppendResult:
        annotate(
            session_id=request.session_id,
            tenant=request.tenant,
            items=len(request.items),
            tokens=sum(p.token_count for p in request.items),
        )
        async with self.db.write(request.tenant, request.session_id) as conn:
            # The session row and any earlier append with this key, in one query.
            session = await _session_row(conn, request.tenant, request.session_id, request.idempotency_key)
            if session.get("request_hash") is not None:
                return await self._replay(conn, session, request)
            if request.expected_version is not None and request.expected_version != session["version"]:
                raise VersionConflict(request.session_id, request.expected_version, session["version"])
            contents = await self._linked(conn, session["key"], request.items)
            return await self._insert(conn, session, request, contents)

    async def _replay(self, conn: AsyncConnection, earlier: Any, request: AppendRequest) -> AppendResult:
        """The stored result of the earlier append with the request's key (checked to be the same batch)."""
        if earlier["request_hash"] != request.request_hash:
            raise IdempotencyKeyReused(request.session_id, request.idempotency_key)
        i = schema.items
        receipts = (
            await conn.execute(
                select(i.c.seq, i.c.content_hash, i.c.token_count)
                .where(i.c.session_key == earlier["key"], i.c.seq.between(earlier["first_seq"], earlier["last_seq"]))
                .order_by(i.c.seq)
            )
        ).all()
        return AppendResult(
            first_seq=earlier["first_seq"],
            last_seq=earlier["last_seq"],
            version=earlier["last_seq"],
            receipts=tuple(ItemReceipt(r.seq, r.content_hash, r.token_count) for r in receipts),
            replayed=True,
        )

    async def _linked(self, conn: AsyncConnection, key: int, items: Sequence[PreparedItem]) -> list[ItemContent]:
        """The batch with tool results linked to their calls; InvalidArgument if any link is wrong."""
        contents = [p.content for p in items]
        ids = {b.id for c in contents for b in c.content if isinstance(b, ToolUseBlock)}
        ids |= {c.tool_result.tool_use_id for c in contents if c.tool_result is not None}
        known: dict[str, ToolCall] = {}
        ordered = sorted(ids)
        # In chunks: drivers cap the parameters of one statement (asyncpg at 32,767).
        for start in range(0, len(ordered), _IN_CHUNK):
            chunk = ordered[start : start + _IN_CHUNK]
            calls = await conn.execute(_CALLS, {"key": key, "ids": chunk})
            known |= {r.tool_use_id: ToolCall(r.name, r.answered) for r in calls}
        linked, violations = await off_loop(len(contents) > BULK_ITEMS, link_tool_results, contents, known)
        if violations:
            raise InvalidArgument(violations)
        return linked

    async def _insert(
        self, conn: AsyncConnection, session: Any, request: AppendRequest, contents: list[ItemContent]
    ) -> AppendResult:
        key, first = session["key"], session["version"] + 1
        now = _now()
        rows, texts, chunked, uses = await off_loop(
            len(contents) > BULK_ITEMS, append_rows, key, first, contents, request, now
        )
        last = first + len(rows) - 1
        tokens = sum(r["token_count"] for r in rows)
        appended = {
            "first_seq": first,
            "last_seq": last,
            "author": request.author,
            "tokens": tokens,
            "bytes": request.stored_bytes,
        }
        grown = {"session": key, "last": last, "tokens": tokens, "bytes": request.stored_bytes, "now": now}
        write = append_statement.write if self.writes_at_once else _write_per_table
        await write(conn, request, (rows, texts, chunked, uses), appended, grown)
        return AppendResult(
            first_seq=first,
            last_seq=last,
            version=last,
            receipts=tuple(ItemReceipt(r["seq"], r["content_hash"], r["token_count"]) for r in rows),
        )

    async def load_history(self, tenant: str, session_id: str) -> tuple[Session, Prefix[Item]]:
        """The session and all its items up to its current version, in seq order (`history_in`)."""
        async with self.db.read() as conn:
            _, session, items = await self.history_in(conn, tenant, session_id)
        return session, items

    async def session_row(self, conn: AsyncConnection, tenant: str, session_id: str) -> Any:
        """The session's row, read in the caller's transaction (SessionNotFound when there is none)."""
        return await _session_row(conn, tenant, session_id)

    @traced("storage.load_history")
    async def history_in(
        self, conn: AsyncConnection, tenant: str, session_id: str
    ) -> tuple[Any, Session, Prefix[Item]]:
        """Like `load_history`, inside the caller's transaction; also the session row. The items
        are a prefix of the cache's own list of the session's items, which it only ever extends
        (engine/prefix.py): the history as of the version read, made without a copy, and
        unchanged by what the cache reads after."""
        row = await _session_row(conn, tenant, session_id)
        key, version = row["key"], row["version"]
        cached = self.cache.get(key, [])
        if len(cached) < version:
            # Items are immutable and seqs dense, so only the new ones are read;
            # bounding by the version read above gives a consistent snapshot.
            after = len(cached)
            rows = await conn.execute(_ITEMS, {"key": key, "after": after, "through": version})
            # Decoded off the event loop (every other call of the replica): a long session's
            # first read on a replica is hundreds of milliseconds of rows, JSON and objects.
            decoded = await off_loop(version - after > BULK_ITEMS, items_of, rows.mappings())
            # Another call may have read some of them into the same list meanwhile.
            added = decoded[len(cached) - after :]
            cached.extend(added)
            # (Let go of meanwhile, to stay in the cache's bytes, the list is held again whole.)
            self.cache.put(key, cached, added if self.cache.holds(key, cached) else None)
        items = Prefix(cached, min(version, len(cached)))
        annotate(session_id=session_id, tenant=tenant, items=len(items), tokens=row["token_count"])
        return row, session_of(row), items


class ItemCache:
    """Decoded items of recently used sessions, bounded by the bytes they take (estimated from
    their tokens: `item_bytes`), the least recently used session's going first.

    Safe across replicas: items never change, and a session key is never
    reused (deleted sessions' keys are not handed out again).
    """

    def __init__(self, max_bytes: int = 256 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, tuple[list[Item], int]] = OrderedDict()
        self._held = 0

    @property
    def held_bytes(self) -> int:
        return self._held

    def get(self, key: int, default: list[Item]) -> list[Item]:
        found = self._entries.get(key)
        if found is None:
            return default
        self._entries.move_to_end(key)
        return found[0]

    def holds(self, key: int, items: list[Item]) -> bool:
        """Whether the session's history held is the list `items`."""
        found = self._entries.get(key)
        return found is not None and found[0] is items

    def put(self, key: int, items: list[Item], added: Sequence[Item] | None = None) -> None:
        """Hold `items`, the session's history: those held before with `added` (all of them
        when None) after them."""
        held = self._entries.pop(key, None)
        weight = (held[1] if held is not None and added is not None else 0) + sum(
            map(item_bytes, items if added is None else added)
        )
        self._held += weight - (held[1] if held is not None else 0)
        self._entries[key] = (items, weight)
        while self._held > self.max_bytes and len(self._entries) > 1:
            _, (_, evicted) = self._entries.popitem(last=False)
            self._held -= evicted

    def discard(self, key: int) -> None:
        evicted = self._entries.pop(key, None)
        if evicted is not None:
            self._held -= evicted[1]


def item_bytes(item: Item) -> int:
    """About what a decoded item takes in memory: its text (about four characters a token) and
    the objects around it."""
    return 500 + 4 * item.token_count


def _session_queries() -> tuple[Select[Any], Select[Any], Select[Any]]:
    """The session lookups every call makes, built once with bound parameters (tenant,
    session_id, idempotency_key): building a statement and its cache key was half of a
    GetSession's CPU (py-spy); a statement built once keeps its cache key."""
    s, a = schema.sessions, schema.appends
    named = (s.c.tenant == bindparam("tenant")) & (s.c.id == bindparam("session_id"))
    row = select(s).where(named)
    earlier = (a.c.session_key == s.c.key) & (a.c.idempotency_key == bindparam("idempotency_key"))
    with_append = row.add_columns(a.c.request_hash, a.c.first_seq, a.c.last_seq).select_from(s.outerjoin(a, earlier))
    return row, with_append, select(s.c.key).where(named, ~s.c.deleting)


_SESSION_ROW, _SESSION_ROW_WITH_APPEND, _SESSION_KEY = _session_queries()
_ITEMS = (
    select(*(cast(c, Text).label(c.name) if c.name in JSON_AS_TEXT else c for c in schema.items.columns))
    .where(
        schema.items.c.session_key == bindparam("key"),
        schema.items.c.seq > bindparam("after"),
        schema.items.c.seq <= bindparam("through"),
    )
    .order_by(schema.items.c.seq)
)
"""A session's items after one seq through another, their JSON columns as the text stored (the
driver would decode them as it reads the rows, on the event loop: `items_of` does, off it)."""
_CALLS = select(
    schema.tool_uses.c.tool_use_id,
    schema.tool_uses.c.name,
    exists()
    .where(
        schema.items.c.session_key == schema.tool_uses.c.session_key,
        schema.items.c.tool_use_id == schema.tool_uses.c.tool_use_id,
    )
    .label("answered"),
).where(
    schema.tool_uses.c.session_key == bindparam("key"),
    schema.tool_uses.c.tool_use_id.in_(bindparam("ids", expanding=True)),
)
"""Of some tool calls' ids, those the session holds, with their tools' names and whether the
session holds their results."""
_GROWN = (
    update(schema.sessions)
    .where(schema.sessions.c.key == bindparam("session"))
    .values(
        version=bindparam("last"),
        token_count=schema.sessions.c.token_count + bindparam("tokens"),
        stored_bytes=schema.sessions.c.stored_bytes + bindparam("bytes"),
        updated_at=bindparam("now"),
    )
)
"""An append's change to its session's row: its version, tokens and bytes."""


async def _session_row(conn: AsyncConnection, tenant: str, session_id: str, idempotency_key: str = "") -> Any:
    """The live session row; with a key, joined to the append recorded under it (if any)."""
    named = {"tenant": tenant, "session_id": session_id}
    if idempotency_key:
        result = await conn.execute(_SESSION_ROW_WITH_APPEND, {**named, "idempotency_key": idempotency_key})
    else:
        result = await conn.execute(_SESSION_ROW, named)
    row = result.mappings().first()
    if row is None:
        raise SessionNotFound(session_id)
    return row


async def _write_per_table(
    conn: AsyncConnection, request: AppendRequest, rows: AppendRows, appended: dict[str, Any], grown: dict[str, Any]
) -> None:
    """An append's writes a statement a table (SQLite; on Postgres `append_statement.write`
    does the same in one)."""
    items, texts, chunked, uses = rows
    key, now = grown["session"], grown["now"]
    await conn.execute(insert(schema.items), items)
    await conn.execute(insert(schema.item_texts), texts)
    chunks = await chunk_rows(conn, key, chunked)
    if chunks:
        await conn.execute(insert(schema.item_text_chunks), chunks)
    if uses:
        await conn.execute(insert(schema.tool_uses), uses)
    if request.idempotency_key:
        recorded = {"idempotency_key": request.idempotency_key, "request_hash": request.request_hash}
        first, last = appended["first_seq"], appended["last_seq"]
        await conn.execute(
            insert(schema.appends),
            {"session_key": key, **recorded, "first_seq": first, "last_seq": last, "created_at": now},
        )
    await events.record(conn, NewEvent(request.tenant, request.session_id, "items_appended", appended))
    await conn.execute(_GROWN, grown)
