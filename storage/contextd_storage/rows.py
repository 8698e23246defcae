"""Sessions and items to table rows and back: what an append writes (its items, their texts, their
full-text chunks, their tool calls) and the objects read back from the rows."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ParamSpec, TypeVar

import orjson
from sqlalchemy import bindparam, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from contextd.engine.codec import blocks_from_json, blocks_to_json
from contextd.engine.model import Item, ItemContent, Role, Session, Source, ToolEffect, ToolEffectKind
from contextd.engine.originals import original_text
from contextd_storage import schema, search


@dataclass(frozen=True, slots=True)
class PreparedItem:
    """An item ready to write: its hash and token count computed outside the lock."""

    content: ItemContent
    content_hash: str
    token_count: int


@dataclass(frozen=True, slots=True)
class AppendRequest:
    tenant: str
    session_id: str
    items: Sequence[PreparedItem]
    request_hash: str
    """Identifies the batch, so a reused idempotency key can be told from a retry."""
    idempotency_key: str = ""
    expected_version: int | None = None
    author: str = ""
    stored_bytes: int = 0
    """Bytes of the items' text and data (validation.item_bytes), added to the session's count."""


async def chunk_rows(conn: AsyncConnection, key: int, chunked: list[tuple[int, str]]) -> list[dict[str, Any]]:
    """The full-text chunks (seq, text) of the items appended, numbered on from the session's
    last chunk (read under the session's lock, so no other append numbers them too)."""
    number = (await conn.execute(_LAST_CHUNK, {"key": key})).scalar_one()
    return [
        {"session_key": key, "number": n, "seq": seq, "text": chunk}
        for n, (seq, chunk) in enumerate(chunked, start=number + 1)
    ]


_LAST_CHUNK = select(func.coalesce(func.max(schema.item_text_chunks.c.number), 0)).where(
    schema.item_text_chunks.c.session_key == bindparam("key")
)


AppendRows = tuple[list[dict[str, Any]], list[dict[str, Any]], list[tuple[int, str]], list[dict[str, Any]]]


def append_rows(
    key: int, first: int, contents: Sequence[ItemContent], request: AppendRequest, now: datetime
) -> AppendRows:
    """What an append writes but the numbering of its chunks: the items' rows, their texts' rows,
    their full-text chunks (seq, text) and their tool calls' rows."""
    items = [
        item_row(key, first + n, content, prepared, request.author, now)
        for n, (content, prepared) in enumerate(zip(contents, request.items, strict=True))
    ]
    texts = [searchable(content) for content in contents]
    seqs = range(first, first + len(items))
    uses = [
        {"session_key": key, "tool_use_id": b.id, "seq": seq, "name": b.name}
        for seq, content in zip(seqs, contents, strict=True)
        for b in content.tool_uses
    ]
    return (
        items,
        [{"session_key": key, "seq": seq, "text": t} for seq, t in zip(seqs, texts, strict=True)],
        [(seq, chunk) for seq, whole in zip(seqs, texts, strict=True) for chunk in search.text_chunks(whole)],
        uses,
    )


def searchable(content: ItemContent) -> str:
    """The text search reads: the original's, NULs replaced (a Postgres text cannot hold them;
    the original itself is kept whole in the item)."""
    return original_text(content).replace("\x00", "\ufffd")


def session_of(row: Any) -> Session:
    return Session(
        id=row["id"],
        tenant=row["tenant"],
        version=row["version"],
        token_count=row["token_count"],
        created_at=utc(row["created_at"]),
        updated_at=utc(row["updated_at"]),
        metadata=dict(row["metadata"]),
        policy=row["policy"],
        policy_version=row["policy_version"],
    )


def item_row(
    key: int, seq: int, content: ItemContent, prepared: PreparedItem, author: str, now: datetime
) -> dict[str, Any]:
    source, effect, result = content.source, content.tool_effect, content.tool_result
    return {
        "session_key": key,
        "seq": seq,
        "role": content.role.value,
        "content": blocks_to_json(content.content),
        "name": content.name,
        "source_uri": source.uri if source else None,
        "source_version": source.version if source else None,
        "source_observed_at": source.observed_at if source else None,
        "tool_effect": effect.kind.value if effect else None,
        "tool_effect_source_arg": effect.source_arg if effect else None,
        "tool_use_id": result.tool_use_id if result else None,
        "tool_name": result.name if result else None,
        "is_error": result.is_error if result else False,
        "content_hash": prepared.content_hash,
        "token_count": prepared.token_count,
        "author": author,
        "metadata": dict(content.metadata) or None,
        "created_at": now,
    }


JSON_AS_TEXT = frozenset({"content", "metadata"})
"""The items' columns of JSON that `items_of` reads as the text stored (decoded by it, not the driver)."""


def items_of(rows: Iterable[Any]) -> list[Item]:
    """The items of rows read with their JSON columns as text (`JSON_AS_TEXT`): a database
    result's rows once it has read them all (as SQLAlchemy's asyncio results have)."""
    return [item_of(row) for row in rows]


def item_of(row: Any) -> Item:
    observed = row["source_observed_at"]
    metadata = row["metadata"]
    return Item(
        seq=row["seq"],
        role=Role(row["role"]),
        content=blocks_from_json(decoded(row["content"])),
        source=Source(row["source_uri"], row["source_version"] or "", utc(observed) if observed else None)
        if row["source_uri"] is not None
        else None,
        tool_effect=ToolEffect(ToolEffectKind(row["tool_effect"]), row["tool_effect_source_arg"] or "")
        if row["tool_effect"]
        else None,
        name=row["name"],
        metadata=dict((decoded(metadata) if metadata is not None else None) or {}),
        content_hash=row["content_hash"],
        token_count=row["token_count"],
        author=row["author"],
        created_at=utc(row["created_at"]),
    )


def decoded(text: str) -> Any:
    """An item's JSON column, as `json.loads` reads it. Those columns hold strings, booleans and
    nulls only (`codec.blocks_to_json`; metadata maps strings to strings), which orjson reads as
    `json` does, about three times as fast: a long session's first read on a replica is megabytes
    of them. (It reads an integer of more than 64 bits as a float, but none is written here.)
    A text orjson refuses and `json` reads (a lone surrogate escape), `json` reads."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def utc(value: datetime) -> datetime:
    # SQLite hands back naive datetimes; everything stored is UTC.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


P = ParamSpec("P")
R = TypeVar("R")

BULK_ITEMS = 32
"""Above this many items an append builds what it writes on a worker thread: about 0.05 ms an
item of Python, which for a batch of 800 held the event loop (every other call of the replica)
for some 40 ms."""


async def off_loop(large: bool, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """`fn(*args, **kwargs)`: on a worker thread when the work is `large` (a bulk batch, a long
    document), so that it does not hold the event loop, and every other call of the replica, for
    its duration; in place when it is small, which costs less than the hop."""
    if large:
        return await asyncio.to_thread(fn, *args, **kwargs)
    return fn(*args, **kwargs)
