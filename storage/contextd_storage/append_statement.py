"""An append's writes as one statement, on Postgres.

An append writes to six tables (its items, their texts, their full-text chunks, their tool
calls, the idempotency record, the session event) and bumps the session's counters. A
statement a table made a one-item append eleven round trips, each 0.2-0.25 ms of the
server's CPU through SQLAlchemy and asyncpg: most of the call's cost. Postgres runs
data-modifying CTEs as one statement, and `unnest` takes each table's rows as one array a
column, so the statement's text is the same whatever the batch holds: built here once from
the schema's columns, prepared once per connection by the driver.

SQLite has no data-modifying CTEs; it keeps a statement a table (`history._write_per_table`). Both
write the same rows (tests/storage/test_history.py compares them on Postgres).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Boolean, DateTime, Integer, String, Table, TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.types import JSON, TypeEngine

from contextd_storage import events, schema
from contextd_storage.events import NewEvent
from contextd_storage.rows import BULK_ITEMS, AppendRequest, AppendRows, off_loop


def _array_type(kind: TypeEngine[Any]) -> str:
    """The Postgres array a column's values travel in. Strings go as text (an explicit cast to
    varchar(n) would cut a long value short where the insert refuses it); JSON as its text."""
    if isinstance(kind, String | JSON):
        return "TEXT[]"
    if isinstance(kind, Boolean):
        return "BOOLEAN[]"
    if isinstance(kind, DateTime):
        return "TIMESTAMPTZ[]"
    if isinstance(kind, Integer):  # BigInteger included
        return "BIGINT[]"
    raise TypeError(f"no array type for {kind!r}")


def _insert_rows(table: Table, columns: Sequence[str], computed: dict[str, str] | None = None) -> str:
    """`INSERT INTO table (...) SELECT ... FROM unnest(:table_column, ...)`: one row an array
    index; `computed` columns take an SQL expression instead (over the unnest's `u.`
    columns and `u.n`, the row's ordinal)."""
    computed = computed or {}
    given = [c for c in columns if c not in computed]
    arrays = ", ".join(f"CAST(:{table.name}_{c} AS {_array_type(table.c[c].type)})" for c in given)
    values = [
        computed.get(c) or (f"CAST(u.{c} AS JSON)" if isinstance(table.c[c].type, JSON) else f"u.{c}") for c in columns
    ]
    return (
        f"INSERT INTO {table.name} ({', '.join(columns)}) SELECT {', '.join(values)} "
        f"FROM unnest({arrays}) WITH ORDINALITY AS u({', '.join(given)}, n)"
    )


ITEM_COLUMNS = tuple(c.name for c in schema.items.columns)
TEXT_COLUMNS = ("session_key", "seq", "text")
USE_COLUMNS = ("session_key", "tool_use_id", "seq", "name")


def _statement() -> TextClause:
    chunks = _insert_rows(
        schema.item_text_chunks,
        ("session_key", "number", "seq", "text"),
        {
            "session_key": "CAST(:key AS BIGINT)",
            # Numbered on from the session's last chunk: the statement reads the table as it
            # was before it, under the session's lock.
            "number": "(SELECT COALESCE(MAX(c.number), 0) FROM item_text_chunks AS c "
            "WHERE c.session_key = CAST(:key AS BIGINT)) + u.n",
        },
    )
    return text(
        f"WITH new_items AS ({_insert_rows(schema.items, ITEM_COLUMNS)}), "
        f"new_texts AS ({_insert_rows(schema.item_texts, TEXT_COLUMNS)}), "
        f"new_chunks AS ({chunks}), "
        f"new_uses AS ({_insert_rows(schema.tool_uses, USE_COLUMNS)}), "
        "new_append AS (INSERT INTO appends "
        "(session_key, idempotency_key, request_hash, first_seq, last_seq, created_at) "
        "SELECT CAST(:key AS BIGINT), CAST(:idempotency_key AS TEXT), CAST(:request_hash AS TEXT), "
        "CAST(:first AS BIGINT), CAST(:last AS BIGINT), CAST(:now AS TIMESTAMPTZ) "
        "WHERE CAST(:idempotency_key AS TEXT) <> ''), "
        f"new_events AS ({events.IN_STATEMENT}) "
        "UPDATE sessions SET version = CAST(:last AS BIGINT), "
        "token_count = token_count + CAST(:tokens AS BIGINT), "
        "stored_bytes = stored_bytes + CAST(:bytes AS BIGINT), updated_at = CAST(:now AS TIMESTAMPTZ) "
        "WHERE key = CAST(:key AS BIGINT)"
    )


STATEMENT = _statement()


def _parameters(table: Table, columns: Sequence[str]) -> tuple[tuple[str, str, bool], ...]:
    """For each column: the statement's parameter, the rows' key, whether it is JSON."""
    return tuple((f"{table.name}_{c}", c, isinstance(table.c[c].type, JSON)) for c in columns)


def _columns(parameters: tuple[tuple[str, str, bool], ...], rows: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    """The rows as one list a column, named as the statement's parameters; JSON as SQLAlchemy's
    JSON type writes it (None as JSON null, `json.dumps`' defaults)."""
    return {
        name: [json.dumps(r[column]) for r in rows] if is_json else [r[column] for r in rows]
        for name, column, is_json in parameters
    }


_ITEMS = _parameters(schema.items, ITEM_COLUMNS)
_TEXTS = _parameters(schema.item_texts, TEXT_COLUMNS)
_USES = _parameters(schema.tool_uses, USE_COLUMNS)


async def write(
    conn: AsyncConnection, request: AppendRequest, rows: AppendRows, appended: dict[str, Any], grown: dict[str, Any]
) -> None:
    """The append's writes: `rows` (`rows.append_rows`), its idempotency record, its event
    (`appended`, unless events are off) and the session's change (`grown`, as
    `history._GROWN` takes it)."""
    # A bulk batch's columns (its items' JSON encoded) off the loop, as its rows were.
    values = await off_loop(len(rows[0]) > BULK_ITEMS, _arrays, rows)
    event = NewEvent(request.tenant, request.session_id, "items_appended", appended)
    await conn.execute(
        STATEMENT,
        {
            **values,
            "key": grown["session"],
            "idempotency_key": request.idempotency_key,
            "request_hash": request.request_hash,
            "first": appended["first_seq"],
            "last": grown["last"],
            "now": grown["now"],
            "tokens": grown["tokens"],
            "bytes": grown["bytes"],
            **events.in_statement(conn, event),
        },
    )


def _arrays(rows: AppendRows) -> dict[str, list[Any]]:
    """The statement's arrays: each table's rows as one list a column (the chunks' numbers are
    the statement's to give)."""
    items, texts, chunked, uses = rows
    return {
        **_columns(_ITEMS, items),
        **_columns(_TEXTS, texts),
        "item_text_chunks_seq": [seq for seq, _ in chunked],
        "item_text_chunks_text": [chunk for _, chunk in chunked],
        **_columns(_USES, uses),
    }
