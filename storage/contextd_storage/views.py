"""The view engine's records: view states, pins, prune proposals, history-mode mutations and
the model calls (the certificate log is certificate_log.py).

Functions that take a connection run inside the caller's transaction (a
render holds the session lock for all of them); the others open their own.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial, reduce

from sqlalchemy import (
    BindParameter,
    Integer,
    Text,
    bindparam,
    case,
    cast,
    delete,
    func,
    insert,
    literal_column,
    null,
    select,
    text,
    union_all,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from contextd.engine.changes import StateChange, advance, change_from_json
from contextd.engine.errors import CallNotFound, UsageAlreadyReported
from contextd.engine.pipeline import AgentProposal
from contextd.engine.retraction import REDACTED, is_retraction
from contextd.engine.state import (
    AppliedEdit,
    ViewState,
    applied_from_json,
    applied_to_json,
    state_from_json,
)
from contextd.engine.timing import Usage
from contextd.engine.types import target_of
from contextd.telemetry import traced
from contextd_storage import events, schema
from contextd_storage.events import NewEvent
from contextd_storage.state_cache import StateCache


def _now() -> datetime:
    return datetime.now(UTC)


# ------------------------------------------------------------------ state


MOST_CHANGES = 256
"""Changes stored after a full copy of a state before the next copy is made."""
MOST_CHANGE_BYTES = 256 * 1024
"""Bytes of changes stored after a full copy before the next, unless the copy is larger."""


@dataclass(frozen=True, slots=True)
class StoredState:
    """A session's view state as read, and how it is stored."""

    state: ViewState
    changes: tuple[StateChange, ...] = ()
    """When the state was made from one this process held (`since`): the changes other
    replicas' renders made to it, oldest first."""
    since: ViewState | None = None
    snapshot_version: int = 0
    """The version of the full copy stored (0: none yet)."""
    change_bytes: int = 0
    """Bytes of the changes stored since that copy."""
    snapshot_bytes: int = 0

    def bytes_after(self, change_json: str, copy_json: str | None) -> int:
        """The bytes stored of the state once the render's change or copy is (`save_state`)."""
        if copy_json is not None:
            return len(copy_json)
        return self.snapshot_bytes + self.change_bytes + len(change_json)

    def copy_due(self, change_bytes: int) -> bool:
        """Whether the next render (its change `change_bytes` long) stores a full copy instead:
        there is none yet, or the changes since the last outgrow it (in number, or in bytes
        past both a floor and the copy's own size)."""
        if not self.snapshot_version:
            return True
        since = self.state.view_version + 1 - self.snapshot_version
        grown = self.change_bytes + change_bytes
        return since > MOST_CHANGES or grown > max(MOST_CHANGE_BYTES, self.snapshot_bytes)


# The statements a render reads with, built once with bound parameters (building a statement
# and its cache key for every call was half of a GetSession's CPU, py-spy; bench/storage_calls.py).
_KEY: BindParameter[int] = bindparam("key")
_STATE_HEAD = select(
    schema.view_states.c.view_version,
    schema.view_states.c.snapshot_version,
    schema.view_states.c.change_bytes,
    schema.view_states.c.snapshot_bytes,
).where(schema.view_states.c.session_key == _KEY)
_STATE = select(schema.view_states.c.state).where(schema.view_states.c.session_key == _KEY)
_STATE_VERSION = select(schema.view_states.c.view_version).where(schema.view_states.c.session_key == _KEY)
_CHANGES = (
    select(schema.view_state_changes.c.change)
    .where(
        schema.view_state_changes.c.session_key == _KEY,
        schema.view_state_changes.c.view_version > bindparam("after"),
        schema.view_state_changes.c.view_version <= bindparam("through"),
    )
    .order_by(schema.view_state_changes.c.view_version)
)
_PINNED = select(schema.pins.c.seq).where(schema.pins.c.session_key == _KEY)
_PROPOSALS = (
    select(schema.prune_proposals.c.id, schema.prune_proposals.c.seq, schema.prune_proposals.c.reason)
    .where(schema.prune_proposals.c.session_key == _KEY)
    .order_by(schema.prune_proposals.c.id)
)
_MUTATIONS = (
    select(schema.mutations.c.edit).where(schema.mutations.c.session_key == _KEY).order_by(schema.mutations.c.number)
)
_HEAD, _PIN, _PROPOSAL, _EDIT = range(4)
_RENDER_READS = union_all(
    select(
        literal_column(str(_HEAD), Integer).label("kind"),
        schema.view_states.c.view_version.label("a"),
        schema.view_states.c.snapshot_version.label("b"),
        schema.view_states.c.change_bytes.label("c"),
        schema.view_states.c.snapshot_bytes.label("d"),
        null().label("text"),
    ).where(schema.view_states.c.session_key == _KEY),
    select(literal_column(str(_PIN), Integer), schema.pins.c.seq, null(), null(), null(), null()).where(
        schema.pins.c.session_key == _KEY
    ),
    select(
        literal_column(str(_PROPOSAL), Integer),
        schema.prune_proposals.c.id,
        schema.prune_proposals.c.seq,
        null(),
        null(),
        schema.prune_proposals.c.reason,
    ).where(schema.prune_proposals.c.session_key == _KEY),
    # The edit as its JSON text: a union's column has one type.
    select(
        literal_column(str(_EDIT), Integer),
        schema.mutations.c.number,
        null(),
        null(),
        null(),
        cast(schema.mutations.c.edit, Text),
    ).where(schema.mutations.c.session_key == _KEY),
).order_by("kind", "a")
"""The state head, the pins, the proposals (by id) and the durable edits (in order) of a session:
`render_reads`, one statement where four made a render's reads before the engine."""
# And those it writes with (an UPDATE's parameters must not take its columns' names).
_STATE_ADVANCED = (
    update(schema.view_states)
    .where(schema.view_states.c.session_key == bindparam("session"))
    .values(
        view_version=bindparam("version"),
        updated_at=bindparam("now"),
        change_bytes=schema.view_states.c.change_bytes + bindparam("grown"),
    )
)


async def load_state(conn: AsyncConnection, key: int, cache: StateCache | None = None) -> ViewState:
    return (await read_state(conn, key, cache)).state


@traced("storage.read_view_state")
async def read_state(conn: AsyncConnection, key: int, cache: StateCache | None = None) -> StoredState:
    """The session's view state: the one `cache` holds when it is current; made from it by
    the changes since when it is not (another replica rendered); else the full copy with the
    changes after it."""
    head = (await conn.execute(_STATE_HEAD, {"key": key})).one_or_none()
    return await _state_at(conn, key, None if head is None else tuple(int(x) for x in head), cache)


@dataclass(frozen=True, slots=True)
class RenderReads:
    """What a render reads of a session besides its items."""

    stored: StoredState
    pins: frozenset[int]
    proposals: list[AgentProposal]
    durable: tuple[AppliedEdit, ...]


@traced("storage.render_reads")
async def render_reads(conn: AsyncConnection, key: int, cache: StateCache | None = None) -> RenderReads:
    """The view state (as `read_state`), the pins, the agent's proposals and the durable edits,
    in one statement (`_RENDER_READS`) but when the state must be read whole or caught up."""
    head: tuple[int, ...] | None = None
    pins: list[int] = []
    proposed: list[AgentProposal] = []
    durable: list[AppliedEdit] = []
    for kind, a, b, c, d, words in await conn.execute(_RENDER_READS, {"key": key}):
        if kind == _HEAD:
            head = (int(a), int(b), int(c), int(d))
        elif kind == _PIN:
            pins.append(int(a))
        elif kind == _PROPOSAL:
            proposed.append(AgentProposal(int(a), int(b), words))
        else:
            durable.append(applied_from_json(json.loads(words)))
    stored = await _state_at(conn, key, head, cache)
    return RenderReads(stored, frozenset(pins), proposed, tuple(durable))


async def _state_at(
    conn: AsyncConnection, key: int, head: tuple[int, ...] | None, cache: StateCache | None
) -> StoredState:
    """The stored state whose head row (view_version, snapshot_version, change_bytes,
    snapshot_bytes) is `head` (None: never rendered)."""
    if head is None:
        return StoredState(ViewState())
    version, snapshot, change_bytes, snapshot_bytes = head
    stored = partial(StoredState, snapshot_version=snapshot, change_bytes=change_bytes, snapshot_bytes=snapshot_bytes)
    held = cache.latest(key) if cache is not None else None
    if held is not None and held.view_version == version:
        return stored(held)
    if held is not None and held.view_version < version:  # (from before the last copy too: save_state)
        changes = await _every_change(conn, key, held.view_version, version)
        if changes is not None:
            return stored(reduce(advance, changes, held), changes, held)
    text = (await conn.execute(_STATE, {"key": key})).scalar_one()
    return stored(reduce(advance, await _changes(conn, key, snapshot, version), state_from_json(text)))


async def _changes(conn: AsyncConnection, key: int, after: int, through: int) -> tuple[StateChange, ...]:
    rows = await conn.execute(_CHANGES, {"key": key, "after": after, "through": through})
    return tuple(change_from_json(text) for text in rows.scalars())


async def _every_change(conn: AsyncConnection, key: int, after: int, through: int) -> tuple[StateChange, ...] | None:
    """The changes after version `after` through `through` when every one of them is stored (told by
    their count, one row per version, before any is decoded); else None."""
    texts = (await conn.execute(_CHANGES, {"key": key, "after": after, "through": through})).scalars().all()
    return tuple(change_from_json(text) for text in texts) if len(texts) == through - after else None


async def state_version(conn: AsyncConnection, key: int) -> int:
    """The version of the session's stored view state; 0 before its first render."""
    version = (await conn.execute(_STATE_VERSION, {"key": key})).scalar_one_or_none()
    return int(version or 0)


@traced("storage.save_view_state")
async def save_state(
    conn: AsyncConnection, key: int, before: StoredState, change_json: str, copy_json: str | None = None
) -> None:
    """Store the state a render made from `before` (as read in the same transaction): its change
    (`change_json`, changes.py), or `copy_json`, the whole new state, when a copy is due
    (`before.copy_due`)."""
    v, c = schema.view_states, schema.view_state_changes
    version = before.state.view_version + 1
    now = _now()
    if copy_json is not None:
        # The changes since the copy before stay (and this one is stored too): a process holding a
        # state from after that copy (a replica's own, or a carry kept in Redis) catches it up by
        # them rather than reading this copy and deriving the session again (`_state_at`).
        await conn.execute(delete(c).where(c.c.session_key == key, c.c.view_version <= before.snapshot_version))
        await conn.execute(insert(c), {"session_key": key, "view_version": version, "change": change_json})
        values = {
            "view_version": version,
            "state": copy_json,
            "updated_at": now,
            "snapshot_version": version,
            "change_bytes": 0,
            "snapshot_bytes": len(copy_json),
        }
        changed = await conn.execute(update(v).where(v.c.session_key == key).values(**values))
        if changed.rowcount == 0:
            await conn.execute(insert(v).values(session_key=key, **values))
        return
    await conn.execute(insert(c), {"session_key": key, "view_version": version, "change": change_json})
    await conn.execute(_STATE_ADVANCED, {"session": key, "version": version, "now": now, "grown": len(change_json)})


async def save_copy(conn: AsyncConnection, key: int, copy_json: str, version: int, after: int) -> bool:
    """Store `copy_json`, the whole state at `version`, as the session's full copy, made after the
    render that stored that state as a change (its `copy_due`) while the copy stored was the one
    at `after`: unless another has been stored since (another replica's render found the copy
    due too; a second copy so soon would take away the changes a state held from before the
    first catches up by). Renders stored since keep their changes, which catch the copy up (and
    count as the changes since it); those up to the copy before it go, as `save_state` lets them
    go. Whether it was stored."""
    v, c = schema.view_states, schema.view_state_changes
    head = (await conn.execute(select(v.c.view_version, v.c.snapshot_version).where(v.c.session_key == key))).first()
    if head is None or head.snapshot_version != after or not after < version <= head.view_version:
        return False
    await conn.execute(delete(c).where(c.c.session_key == key, c.c.view_version <= head.snapshot_version))
    since = select(func.coalesce(func.sum(func.length(c.c.change)), 0)).where(
        c.c.session_key == key, c.c.view_version > version
    )
    values = {
        "state": copy_json,
        "updated_at": _now(),
        "snapshot_version": version,
        "change_bytes": int((await conn.execute(since)).scalar_one()),
        "snapshot_bytes": len(copy_json),
    }
    await conn.execute(update(v).where(v.c.session_key == key).values(**values))
    return True


@dataclass(frozen=True, slots=True)
class CallRecord:
    """A render's model call, as `record_call` stores it."""

    view_version: int
    view_format: str
    total: int
    predicted: Usage


async def save_render(
    conn: AsyncConnection,
    key: int,
    before: StoredState,
    change_json: str,
    copy_json: str | None,
    call: CallRecord | None,
    new_events: Sequence[NewEvent],
    *,
    at_once: bool | None = None,
) -> None:
    """A render's records: its state (as `save_state`), its call (`record_call`; None: no
    model call) and its events. On Postgres, when no copy is due (most renders), in one
    statement (`_RENDER_WRITES`: four round trips before); `at_once` overrides the choice
    (tests compare the two)."""
    if at_once is None:
        at_once = conn.dialect.name == "postgresql" and copy_json is None
    if not at_once:
        await save_state(conn, key, before, change_json, copy_json)
        if call is not None:
            await record_call(conn, key, call.view_version, call.view_format, call.total, call.predicted)
        await events.record(conn, *new_events)
        return
    predicted = call.predicted if call is not None else Usage(0, 0, 0)
    await conn.execute(
        _RENDER_WRITES,
        {
            "key": key,
            "version": before.state.view_version + 1,
            "change": change_json,
            "grown": len(change_json),
            "now": _now(),
            "record_call": call is not None,
            "call_version": call.view_version if call is not None else 0,
            "view_format": call.view_format if call is not None else "",
            "total": call.total if call is not None else 0,
            "cache_read": predicted.cache_read,
            "cache_write": predicted.cache_write,
            "uncached": predicted.uncached,
            **events.in_statement(conn, *new_events),
        },
    )


_RENDER_WRITES = text(
    "WITH new_change AS (INSERT INTO view_state_changes (session_key, view_version, change) "
    "VALUES (CAST(:key AS BIGINT), CAST(:version AS BIGINT), CAST(:change AS TEXT))), "
    "new_call AS (INSERT INTO calls (session_key, view_version, view_format, total_tokens, predicted_cache_read, "
    "predicted_cache_write, predicted_uncached, created_at) "
    "SELECT CAST(:key AS BIGINT), CAST(:call_version AS BIGINT), CAST(:view_format AS TEXT), "
    "CAST(:total AS BIGINT), "
    "CAST(:cache_read AS BIGINT), CAST(:cache_write AS BIGINT), CAST(:uncached AS BIGINT), "
    "CAST(:now AS TIMESTAMPTZ) WHERE CAST(:record_call AS BOOLEAN)), "
    f"new_events AS ({events.IN_STATEMENT}) "
    "UPDATE view_states SET view_version = CAST(:version AS BIGINT), updated_at = CAST(:now AS TIMESTAMPTZ), "
    "change_bytes = change_bytes + CAST(:grown AS BIGINT) WHERE session_key = CAST(:key AS BIGINT)"
)
"""A render's change to its view state, its call and its events, on Postgres (data-modifying
CTEs, as `append_statement`)."""


# ------------------------------------------------------------------- pins


async def pinned(conn: AsyncConnection, key: int) -> frozenset[int]:
    return frozenset((await conn.execute(_PINNED, {"key": key})).scalars())


async def pin(conn: AsyncConnection, key: int, seqs: Sequence[int]) -> None:
    p = schema.pins
    have = await pinned(conn, key)
    new = sorted(set(seqs) - have)
    if new:
        await conn.execute(insert(p), [{"session_key": key, "seq": s, "created_at": _now()} for s in new])


async def unpin(conn: AsyncConnection, key: int, seqs: Sequence[int]) -> None:
    p = schema.pins
    await conn.execute(delete(p).where(p.c.session_key == key, p.c.seq.in_(sorted(set(seqs)))))


# -------------------------------------------------------------- proposals


async def propose(conn: AsyncConnection, key: int, seqs: Sequence[int], reason: str) -> None:
    if not seqs:
        return
    await conn.execute(
        insert(schema.prune_proposals),
        [{"session_key": key, "seq": s, "reason": reason, "created_at": _now()} for s in seqs],
    )


async def proposals(conn: AsyncConnection, key: int) -> list[AgentProposal]:
    rows = await conn.execute(_PROPOSALS, {"key": key})
    return [AgentProposal(r.id, r.seq, r.reason) for r in rows]


async def forget_proposals(conn: AsyncConnection, ids: Sequence[int]) -> None:
    if ids:
        p = schema.prune_proposals
        await conn.execute(delete(p).where(p.c.id.in_(sorted(ids))))


# -------------------------------------------------------------- mutations


async def append_mutations(conn: AsyncConnection, key: int, edits: Sequence[AppliedEdit]) -> int:
    """Append `edits` to the session's durable edits (numbered on from its last); returns how
    many it has then, or 0 when `edits` is empty (nothing read)."""
    if not edits:
        return 0
    m = schema.mutations
    last = (await conn.execute(select(func.max(m.c.number)).where(m.c.session_key == key))).scalar_one() or 0
    now = _now()
    await conn.execute(
        insert(m),
        [
            {
                "session_key": key,
                "number": last + n,
                "seq": target_of(e.edit) or 0,
                "edit": applied_to_json(e),
                "created_at": now,
                "retraction": e.reason if is_retraction(e) else None,
            }
            for n, e in enumerate(edits, start=1)
        ],
    )
    return int(last) + len(edits)


async def retractions(conn: AsyncConnection, key: int, seqs: Sequence[int] | None = None) -> dict[int, str]:
    """seq -> "retracted" or "redacted" for the session's retracted items (of `seqs`, when
    given); a redaction outranks a retraction of the same item."""
    m = schema.mutations
    query = select(m.c.seq, m.c.retraction).where(m.c.session_key == key, m.c.retraction.is_not(None))
    if seqs is not None:
        query = query.where(m.c.seq.in_(sorted(set(seqs))))
    found: dict[int, str] = {}
    for seq, kind in (await conn.execute(query)).all():
        if found.get(int(seq)) != REDACTED:
            found[int(seq)] = kind
    return found


async def mutation_targets(conn: AsyncConnection, key: int) -> frozenset[int]:
    """The items the session's durable edits reduce (each row's `seq`, stored with the edit),
    without decoding the edits."""
    m = schema.mutations
    rows = await conn.execute(select(m.c.seq).where(m.c.session_key == key, m.c.seq > 0).distinct())
    return frozenset(int(seq) for seq in rows.scalars())


async def load_mutations(conn: AsyncConnection, key: int) -> tuple[AppliedEdit, ...]:
    rows = await conn.execute(_MUTATIONS, {"key": key})
    return tuple(applied_from_json(r.edit) for r in rows)


# ------------------------------------------------------------------ calls


@dataclass(frozen=True, slots=True)
class ReportedUsage:
    """A call's usage as its provider billed it (ReportUsage)."""

    provider: str
    model: str
    input_tokens: int
    """Input billed at the input price: neither read from the cache nor written to it."""
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int


@dataclass(frozen=True, slots=True)
class UsageSummary:
    """A session's calls: how many renders, how many of their calls were reported, and over
    those, the usage predicted beside the usage reported."""

    renders: int
    reported: int
    predicted: Usage
    reported_usage: Usage
    """cache read, cache write, input billed at the input price."""
    output_tokens: int


async def record_call(
    conn: AsyncConnection, key: int, view_version: int, view_format: str, total: int, predicted: Usage
) -> None:
    call = {"session_key": key, "view_version": view_version, "view_format": view_format, "total_tokens": total}
    predictions = {
        "predicted_cache_read": predicted.cache_read,
        "predicted_cache_write": predicted.cache_write,
        "predicted_uncached": predicted.uncached,
    }
    await conn.execute(insert(schema.calls), {**call, **predictions, "created_at": _now()})


async def report_usage(
    conn: AsyncConnection, key: int, session_id: str, view_version: int, usage: ReportedUsage
) -> bool:
    """Store the usage of the call made with render `view_version`; False when that same usage
    was stored already (a retry). Raises CallNotFound for a render the session has not made, and
    UsageAlreadyReported when other usage was stored for it."""
    c = schema.calls
    row = (
        (await conn.execute(select(c).where(c.c.session_key == key, c.c.view_version == view_version)))
        .mappings()
        .first()
    )
    if row is None:
        raise CallNotFound(session_id, view_version)
    figures = {
        "provider": usage.provider,
        "model": usage.model,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cache_read_tokens": usage.cache_read_tokens,
        "cache_write_tokens": usage.cache_write_tokens,
    }
    if row["reported_at"] is not None:
        if all(row[name] == value for name, value in figures.items()):
            return False
        raise UsageAlreadyReported(session_id, view_version)
    where = (c.c.session_key == key) & (c.c.view_version == view_version)
    await conn.execute(update(c).where(where).values(**figures, reported_at=_now()))
    return True


async def usage_summary(conn: AsyncConnection, key: int) -> UsageSummary:
    """The session's renders and reported calls, with both sides summed over the reported ones."""
    c = schema.calls
    reported = c.c.reported_at.is_not(None)
    row = (
        await conn.execute(
            select(
                func.count(),
                func.count(c.c.reported_at),
                *(  # (no FILTER clause: SQLite has it only since 3.30)
                    func.coalesce(func.sum(case((reported, column), else_=0)), 0)
                    for column in (
                        c.c.predicted_cache_read,
                        c.c.predicted_cache_write,
                        c.c.predicted_uncached,
                        c.c.cache_read_tokens,
                        c.c.cache_write_tokens,
                        c.c.input_tokens,
                        c.c.output_tokens,
                    )
                ),
            ).where(c.c.session_key == key)
        )
    ).one()
    renders, count, p_read, p_write, p_uncached, r_read, r_write, r_input, output = (int(v) for v in row)
    return UsageSummary(renders, count, Usage(p_read, p_write, p_uncached), Usage(r_read, r_write, r_input), output)
