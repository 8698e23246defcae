"""Searching a session's item texts: full text, exact substring, regular expression.

Full text is the database's own: every word of the query must be there
(no operators, on either backend); Postgres ranks with `ts_rank` over the
stored `simple` tsvector (migration 0003), SQLite orders by FTS5's BM25
(its score is not returned: it weighs words by every tenant's texts); both
give a snippet around the match. Substring search is the database's too
(`strpos`, `instr`). Regular expressions are Python's, on both backends
alike, over the texts the filters leave (a session's worth, bounded).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.ext.asyncio import AsyncConnection

SNIPPET_CHARS = 240


@dataclass(frozen=True, slots=True)
class Where:
    """Which items a search looks at (all of them when nothing is set)."""

    min_seq: int = 0
    max_seq: int = 0
    roles: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    seqs: tuple[int, ...] | None = None
    """Only these (the items out of the view)."""


@dataclass(frozen=True, slots=True)
class Found:
    seq: int
    score: float
    """Higher is better (full text); 0 for substring and regex matches, which come in seq order."""
    snippet: str


def _filters(where: Where, dialect: str) -> tuple[str, dict[str, object]]:
    sql: list[str] = []
    params: dict[str, object] = {}
    if where.min_seq:
        sql.append("t.seq >= :min_seq")
        params["min_seq"] = where.min_seq
    if where.max_seq:
        sql.append("t.seq <= :max_seq")
        params["max_seq"] = where.max_seq
    if where.roles or where.tools:
        inner = ["i.session_key = t.session_key", "i.seq = t.seq"]
        if where.roles:
            inner.append("i.role IN :roles")
            params["roles"] = list(where.roles)
        if where.tools:
            inner.append("i.tool_name IN :tools")
            params["tools"] = list(where.tools)
        sql.append(f"EXISTS (SELECT 1 FROM items i WHERE {' AND '.join(inner)})")
    if where.seqs is not None:
        # One parameter, however many seqs (a statement binds at most ~32k one by one).
        if dialect == "postgresql":
            sql.append("t.seq = ANY(CAST(:seqs AS bigint[]))")
            params["seqs"] = list(where.seqs)
        else:
            sql.append("t.seq IN (SELECT value FROM json_each(:seqs))")
            params["seqs"] = json.dumps(where.seqs)
    return "".join(f" AND {s}" for s in sql), params


def _bound(statement: str, params: dict[str, object]) -> object:
    query = text(statement)
    for name in ("roles", "tools"):
        if name in params:
            query = query.bindparams(bindparam(name, expanding=True))
    return query


async def full_text(conn: AsyncConnection, key: int, query: str, where: Where, limit: int, offset: int) -> list[Found]:
    extra, params = _filters(where, conn.dialect.name)
    params |= {"key": key, "limit": limit, "offset": offset}
    if conn.dialect.name == "postgresql":
        params["query"] = query
        statement = f"""
            WITH q AS (SELECT plainto_tsquery('simple'::regconfig, :query) AS q),
            hits AS (
                SELECT t.seq, ts_rank(t.tsv, q.q) AS score
                FROM item_texts t, q
                WHERE t.session_key = :key AND t.tsv @@ q.q{extra}
                ORDER BY score DESC, t.seq LIMIT :limit OFFSET :offset
            )
            SELECT h.seq, h.score, ts_headline('simple'::regconfig, left(t.text, 100000), q.q,
                   'MaxFragments=1, MaxWords=24, MinWords=8, StartSel=«, StopSel=»') AS snippet
            FROM hits h JOIN item_texts t ON t.session_key = :key AND t.seq = h.seq, q
            ORDER BY h.score DESC, h.seq
        """
    else:
        params["query"] = fts5_query(query)
        if not params["query"]:
            return []
        statement = f"""
            SELECT t.seq, bm25(item_texts_fts) AS rank,
                   snippet(item_texts_fts, 0, '«', '»', '…', 24) AS snippet
            FROM item_texts_fts JOIN item_texts t
                ON t.session_key = :key AND t.seq = item_texts_fts.rowid - :key * 4294967296
            WHERE item_texts_fts MATCH :query
                AND item_texts_fts.rowid BETWEEN :key * 4294967296 AND :key * 4294967296 + 4294967295{extra}
            ORDER BY rank, t.seq LIMIT :limit OFFSET :offset
        """
        rows = await conn.execute(_bound(statement, params), params)  # type: ignore[call-overload]
        # BM25 weighs words by the whole table (every tenant's texts): only the order is
        # told, never the value (1/(1 + place in the results)).
        return [Found(int(r.seq), 1 / (1 + offset + n), _short(r.snippet)) for n, r in enumerate(rows)]
    rows = await conn.execute(_bound(statement, params), params)  # type: ignore[call-overload]
    return [Found(int(r.seq), float(r.score), _short(r.snippet)) for r in rows]


def fts5_query(query: str) -> str:
    """The words of a query as FTS5 phrases, all required: its own syntax (AND, NEAR, *, :)
    is not exposed, so any text searches for itself (as Postgres' `plainto_tsquery` reads
    it; an identifier's parts must also be in a row here)."""
    # One phrase per whitespace-separated piece: `ch_7Hq2LwQz` or a UUID is its words in a row.
    phrases = [" ".join(re.findall(r"\w+", piece)) for piece in query.split()]
    return " ".join(f'"{p}"' for p in phrases if p)


async def substring(conn: AsyncConnection, key: int, needle: str, where: Where, limit: int, offset: int) -> list[Found]:
    extra, params = _filters(where, conn.dialect.name)
    position = "strpos(t.text, :needle)" if conn.dialect.name == "postgresql" else "instr(t.text, :needle)"
    window = "greatest(1, {p} - 80)" if conn.dialect.name == "postgresql" else "max(1, {p} - 80)"
    params |= {"key": key, "needle": needle, "limit": limit, "offset": offset, "span": len(needle) + 160}
    statement = f"""
        SELECT t.seq, substr(t.text, {window.format(p=position)}, :span) AS around
        FROM item_texts t
        WHERE t.session_key = :key AND {position} > 0{extra}
        ORDER BY t.seq LIMIT :limit OFFSET :offset
    """
    rows = await conn.execute(_bound(statement, params), params)  # type: ignore[call-overload]
    return [Found(int(r.seq), 0.0, _mark(r.around, needle)) for r in rows]


async def regex(conn: AsyncConnection, key: int, pattern: Any, where: Where, limit: int, offset: int) -> list[Found]:
    """`pattern`: a compiled expression with `search` (RE2's: linear time)."""
    extra, params = _filters(where, conn.dialect.name)
    params["key"] = key
    statement = f"SELECT t.seq, t.text FROM item_texts t WHERE t.session_key = :key{extra} ORDER BY t.seq"
    rows = await conn.stream(_bound(statement, params), params)  # type: ignore[call-overload]
    out: list[Found] = []
    skipped = 0
    async for row in rows:
        match = pattern.search(row.text)
        if match is None:
            continue
        if skipped < offset:
            skipped += 1
            continue
        start = max(0, match.start() - 80)
        around = row.text[start : match.end() + 80]
        out.append(Found(int(row.seq), 0.0, _mark(around, match.group(0))))
        if len(out) >= limit:
            break
    await rows.close()
    return out


def _mark(around: str, found: str) -> str:
    return _short(around.replace(found, f"«{found}»", 1) if found else around)


def _short(snippet: str) -> str:
    flat = " ".join(snippet.split())
    return flat if len(flat) <= SNIPPET_CHARS else flat[: SNIPPET_CHARS - 1] + "…"
