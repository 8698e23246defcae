"""Searching a session's item texts: full text, exact substring, regular expression; every
item whole, however long.

Full text is the database's own, over each item's text in overlapping chunks
(`item_text_chunks`, migration 0005): a Postgres tsvector holds at most 1 MB and
`ts_headline` over a long output is slow, so neither ever sees more than a chunk
(`CHUNK_CHARS` characters). Every whitespace-separated piece of the query must be in
the item (its words together, in one chunk: chunks overlap by more than a query
holds, so a piece across a chunk edge is whole in one of them); no operators, on
either backend. Postgres ranks with `ts_rank` over the stored `simple` tsvector,
SQLite orders by FTS5's BM25 (its score is not returned: it weighs words by every
tenant's texts); an item is as good as its best chunk, comes back once, with that
chunk's snippet. Substring search is the database's too (`LIKE` on Postgres, `instr`
on SQLite, over `item_texts`, each item's whole text). Regular expressions are RE2's,
matched here on worker threads, on both backends alike, over the whole texts the filters
leave: those holding every literal the pattern requires (regex_literals), when it requires
any; else, for a case-insensitive pattern, those holding its literals up to ASCII case
(`ILIKE` on Postgres where the database lowers ASCII letters as ASCII does, SQLite's
`LIKE`, which folds ASCII alone); else every one (a session's worth, bounded). A pattern
no index narrows reads no text from the database when the caller holds the session's texts
(`regex(texts=...)`): the database says which items the filters leave, the texts are matched
where they are already held.

Both find their texts through a trigram index where the database has one (migration
0007): pg_trgm's GIN index, which Postgres uses for `LIKE`; on SQLite an FTS5 table of
each text's trigrams, which narrows the texts `instr` then reads. Without one, the same
conditions read every text of the session: the same answers, slower.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

SNIPPET_CHARS = 240
CHUNK_CHARS = 8_000
"""Most characters in one indexed chunk: its tsvector stays far under Postgres' 1 MB
(at most 10 bytes a character, lexeme, position and entry together), and a snippet
reads one chunk, never a whole long output."""
OVERLAP_CHARS = 1_000
"""Characters a chunk shares with the next: at least a whole query (recovery's
MAX_QUERY_CHARS), so any piece of one is whole in some chunk."""
WORD_SLACK_CHARS = 200
"""How far a chunk edge moves back to fall between words (a longer run of word characters,
base64 say, is cut)."""
FTS_ROWID_SPAN = 4294967296
"""SQLite: a chunk's full-text rowid is its session key times this plus its number; an
item's trigram rowid, its session key times this plus its seq."""
MOST_TRIGRAMS = 24
"""SQLite: most trigrams one search asks the trigram table for (a long needle has hundreds)."""
_LAST_BREAK = re.compile(r"\W(?=\w*\Z)")


def text_chunks(whole: str) -> list[str]:
    """`whole` as the chunks full text indexes (see `chunk_bounds`); none for an empty text."""
    return [whole[start:end] for start, end in chunk_bounds(whole)]


def chunk_bounds(whole: str) -> list[tuple[int, int]]:
    """Where each chunk of `whole` starts and ends, in characters: each at most CHUNK_CHARS
    long and sharing at least OVERLAP_CHARS with the next, its edges just after a character
    that is not part of a word where one is within WORD_SLACK_CHARS (a fragment of a word
    indexed as a word would be found by what the text does not say)."""
    bounds = []
    start = 0
    while len(whole) - start > CHUNK_CHARS:
        end = _after_break(whole, start + CHUNK_CHARS - WORD_SLACK_CHARS, start + CHUNK_CHARS)
        bounds.append((start, end))
        start = _after_break(whole, end - OVERLAP_CHARS - WORD_SLACK_CHARS, end - OVERLAP_CHARS)
    if start < len(whole):
        bounds.append((start, len(whole)))
    return bounds


def _after_break(whole: str, low: int, high: int) -> int:
    """Just after the last non-word character in `whole[low:high]`; `high` when there is none."""
    found = _LAST_BREAK.search(whole, low, high)
    return found.end() if found else high


@dataclass(frozen=True, slots=True)
class Where:
    """Which items a search looks at (all of them when nothing is set)."""

    min_seq: int = 0
    max_seq: int = 0
    roles: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    seqs: tuple[int, ...] | None = None
    """Only these (the items out of the view)."""
    excluded: tuple[int, ...] = ()
    """Never these (the items the client retracted)."""


class HeldTexts(Protocol):
    """A session's texts as `rows.searchable` gives them, UTF-8 encoded, by seq - 1."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Found:
    seq: int
    score: float
    """Higher is better (full text); 0 for substring and regex matches, which come in seq order."""
    snippet: str


def _filters(where: Where, dialect: str) -> tuple[str, dict[str, object]]:
    """SQL over the alias `t` (a row with `session_key` and `seq`) and its parameters. Lists
    are bound as one parameter each, however long (a statement binds at most ~32k one by one)."""
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
            inner.append(_among("i.role", "roles", "text", dialect))
            params["roles"] = _listed(where.roles, dialect)
        if where.tools:
            inner.append(_among("i.tool_name", "tools", "text", dialect))
            params["tools"] = _listed(where.tools, dialect)
        sql.append(f"EXISTS (SELECT 1 FROM items i WHERE {' AND '.join(inner)})")
    if where.seqs is not None:
        sql.append(_among("t.seq", "seqs", "bigint", dialect))
        params["seqs"] = _listed(where.seqs, dialect)
    if where.excluded:
        sql.append("NOT " + _among("t.seq", "excluded", "bigint", dialect))
        params["excluded"] = _listed(where.excluded, dialect)
    return "".join(f" AND {s}" for s in sql), params


def _among(column: str, name: str, sql_type: str, dialect: str) -> str:
    if dialect == "postgresql":
        return f"{column} = ANY(CAST(:{name} AS {sql_type}[]))"
    return f"{column} IN (SELECT value FROM json_each(:{name}))"


def _listed(values: tuple[Any, ...], dialect: str) -> object:
    return list(values) if dialect == "postgresql" else json.dumps(values)


async def full_text(conn: AsyncConnection, key: int, query: str, where: Where, limit: int, offset: int) -> list[Found]:
    """Items holding every piece of `query`, best first, one `Found` each (its best chunk's
    snippet); `limit` and `offset` count items."""
    if conn.dialect.name == "postgresql":
        return await _full_text_postgres(conn, key, query, where, limit, offset)
    return await _full_text_sqlite(conn, key, query, where, limit, offset)


async def _planned_for_each(conn: AsyncConnection) -> None:
    """Postgres: the transaction's statements are planned for the values they are given (a
    needle most texts hold, or none; thousands of seqs out of the view), never once for any
    values, which serves neither."""
    await conn.execute(text("SET LOCAL plan_cache_mode = force_custom_plan"))


async def _full_text_postgres(
    conn: AsyncConnection, key: int, query: str, where: Where, limit: int, offset: int
) -> list[Found]:
    await _planned_for_each(conn)
    extra, params = _filters(where, "postgresql")
    pieces = list(dict.fromkeys(query.split()))
    params |= {"key": key, "limit": limit, "offset": offset, "pieces": pieces}
    # Each piece's words, as plainto_tsquery reads them (a piece of punctuation alone has none
    # and asks nothing); `anyq` holds any of them, for the chunks worth looking at and their rank.
    # A tsquery's text form reads back as the same query, so joining them with | is exact.
    every_piece = """
        , held AS (
            SELECT m.seq FROM matched m JOIN pieces p ON m.tsv @@ p.q
            GROUP BY m.seq HAVING count(DISTINCT p.n) = (SELECT count(*) FROM pieces)
        )"""
    statement = f"""
        WITH pieces AS (
            SELECT u.n, plainto_tsquery('simple'::regconfig, u.piece) AS q
            FROM unnest(CAST(:pieces AS text[])) WITH ORDINALITY AS u(piece, n)
            WHERE numnode(plainto_tsquery('simple'::regconfig, u.piece)) > 0
        ),
        anyq AS (SELECT CAST(string_agg('(' || CAST(q AS text) || ')', ' | ') AS tsquery) AS q FROM pieces),
        matched AS (
            SELECT t.seq, t.number, t.tsv FROM item_text_chunks t, anyq
            WHERE t.session_key = :key AND t.tsv @@ anyq.q{extra}
        ){every_piece if len(pieces) > 1 else ""},
        best AS (
            SELECT DISTINCT ON (m.seq) m.seq, m.number, ts_rank(m.tsv, anyq.q) AS score
            FROM matched m, anyq
            {"WHERE m.seq IN (SELECT seq FROM held)" if len(pieces) > 1 else ""}
            ORDER BY m.seq, score DESC, m.number
        ),
        page AS (SELECT seq, number, score FROM best ORDER BY score DESC, seq LIMIT :limit OFFSET :offset)
        SELECT p.seq, p.score, ts_headline('simple'::regconfig, c.text, anyq.q,
               'MaxFragments=1, MaxWords=24, MinWords=8, StartSel=«, StopSel=»') AS snippet
        FROM page p JOIN item_text_chunks c ON c.session_key = :key AND c.number = p.number, anyq
        ORDER BY p.score DESC, p.seq
    """
    rows = await conn.execute(text(statement), params)
    return [Found(int(r.seq), float(r.score), _short(r.snippet)) for r in rows]


async def _full_text_sqlite(
    conn: AsyncConnection, key: int, query: str, where: Where, limit: int, offset: int
) -> list[Found]:
    phrases = list(dict.fromkeys(fts5_phrases(query)))
    if not phrases:
        return []
    extra, params = _filters(where, "sqlite")
    low = key * FTS_ROWID_SPAN
    params |= {
        "key": key,
        "low": low,
        "high": low + FTS_ROWID_SPAN - 1,
        "phrases": json.dumps(phrases),
        "count": len(phrases),
        "any": " OR ".join(phrases),
        "limit": limit,
        "offset": offset,
    }
    # With more than one phrase, the items holding each (in any of their chunks); then every
    # chunk of theirs holding any, ranked, the best one per item.
    every_phrase = """
        held AS (
            SELECT t.seq FROM phrases p JOIN item_text_chunks_fts f ON f.item_text_chunks_fts MATCH p.phrase
            JOIN item_text_chunks t ON t.session_key = :key AND t.number = f.rowid - :low
            WHERE f.rowid BETWEEN :low AND :high
            GROUP BY t.seq HAVING count(DISTINCT p.n) = :count
        ),"""
    statement = f"""
        WITH phrases(n, phrase) AS (SELECT key, value FROM json_each(:phrases)),
        {every_phrase if len(phrases) > 1 else ""}
        ranked AS (
            SELECT t.seq, item_text_chunks_fts.rowid AS fts_rowid, bm25(item_text_chunks_fts) AS rank
            FROM item_text_chunks_fts JOIN item_text_chunks t
                ON t.session_key = :key AND t.number = item_text_chunks_fts.rowid - :low
            WHERE item_text_chunks_fts MATCH :any AND item_text_chunks_fts.rowid BETWEEN :low AND :high{extra}
                {"AND t.seq IN (SELECT seq FROM held)" if len(phrases) > 1 else ""}
        ),
        best AS (
            SELECT seq, fts_rowid, rank, row_number() OVER (PARTITION BY seq ORDER BY rank, fts_rowid) AS place
            FROM ranked
        )
        SELECT seq, fts_rowid FROM best WHERE place = 1 ORDER BY rank, seq LIMIT :limit OFFSET :offset
    """
    page = (await conn.execute(text(statement), params)).all()
    if not page:
        return []
    # Snippets of the page's chunks alone (FTS5 makes them from the chunk's own copy).
    snippets = await conn.execute(
        text(
            "SELECT rowid, snippet(item_text_chunks_fts, 0, '«', '»', '…', 24) AS snippet FROM item_text_chunks_fts "
            "WHERE item_text_chunks_fts MATCH :any AND rowid IN (SELECT value FROM json_each(:rowids))"
        ),
        {"any": params["any"], "rowids": json.dumps([r.fts_rowid for r in page])},
    )
    by_rowid = {int(r.rowid): str(r.snippet) for r in snippets}
    # BM25 weighs words by the whole table (every tenant's texts): only the order is
    # told, never the value (1/(1 + place in the results)).
    return [
        Found(int(r.seq), 1 / (1 + offset + n), _short(by_rowid.get(int(r.fts_rowid), ""))) for n, r in enumerate(page)
    ]


def fts5_phrases(query: str) -> list[str]:
    """The pieces of a query as FTS5 phrases, one per whitespace-separated piece (`ch_7Hq2LwQz`
    or a UUID is its words in a row): its own syntax (AND, NEAR, *, :) is not exposed, so any
    text searches for itself, as Postgres' `plainto_tsquery` reads it."""
    words = (" ".join(re.findall(r"\w+", piece)) for piece in query.split())
    return [f'"{w}"' for w in words if w]


async def substring(conn: AsyncConnection, key: int, needle: str, where: Where, limit: int, offset: int) -> list[Found]:
    """Items whose text holds `needle`, in seq order, each with the text around its first place."""
    postgres = conn.dialect.name == "postgresql"
    extra, params = _filters(where, conn.dialect.name)
    params |= {"key": key, "needle": needle, "span": len(needle) + 160}
    held = _holding([needle], postgres, params)
    position = "strpos(t.text, :needle)" if postgres else "instr(t.text, :needle)"
    around = f"substr(t.text, {'greatest' if postgres else 'max'}(1, {position} - 80), :span) AS around"
    found: list[Found] = []
    for rows, rest in await _in_order(conn, key, where, [needle], params):
        page = await conn.execute(
            text(f"SELECT t.seq, {around} FROM {rows} WHERE {held}{extra}{rest} LIMIT :limit"),
            params | {"limit": offset + limit - len(found)},
        )
        found.extend(Found(int(r.seq), 0.0, _mark(r.around, needle)) for r in page)
        if len(found) >= offset + limit:
            break
    return found[offset : offset + limit]


async def regex(
    conn: AsyncConnection,
    key: int,
    pattern: Any,
    where: Where,
    limit: int,
    offset: int,
    literals: Sequence[str] = (),
    caseless: Sequence[str] = (),
    texts: HeldTexts | None = None,
) -> list[Found]:
    """`pattern`: a compiled expression with `search` (RE2's: linear time). `literals`: strings
    every match of it holds (regex_literals.required_literals): only the texts holding them
    all are read. `caseless`: strings every match holds up to ASCII case, lowered (the same,
    `caseless=True`), asked for when no literal is one an index finds texts by. `texts`: the
    session's texts in seq order (`rows.searchable`'s, UTF-8 encoded), where the caller holds
    them: a pattern no index narrows is matched over those, not over texts read again."""
    postgres = conn.dialect.name == "postgresql"
    extra, params = _filters(where, conn.dialect.name)
    params["key"] = key
    literals = _indexable(literals, postgres)
    folded = not literals and bool(caseless := _indexable(caseless, postgres)) and await _folds_ascii(conn)
    if folded:
        literals = list(caseless)
    page = _Page(limit, offset)
    if not literals and texts is not None:
        # Every text the filters leave is read: 13 MB for a session of 10,000 tool outputs,
        # which took longer to read over again than to match. The database says which.
        seqs: Sequence[int] = range(1, len(texts) + 1)
        if extra:
            left = text(f"SELECT t.seq FROM item_texts t WHERE t.session_key = :key{extra}")
            seqs = sorted(int(seq) for (seq,) in await conn.execute(left, params))
        for k in range(0, len(seqs), HELD_BATCH):  # on a worker thread, as below
            if page.add(await asyncio.to_thread(_held_matches, pattern, seqs[k : k + HELD_BATCH], texts)):
                break
        return page.found
    held = _holding(literals, postgres, params, folded) or "1 = 1"
    for rows, rest in await _in_order(conn, key, where, literals, params, folded):
        stream = await conn.stream(text(f"SELECT t.seq, t.text FROM {rows} WHERE {held}{extra}{rest}"), params)
        async for batch in stream.partitions(REGEX_BATCH):
            # Matching is linear but a session's texts can run to hundreds of megabytes: on a
            # worker thread, a batch at a time, so the event loop goes on serving meanwhile.
            if page.add(await asyncio.to_thread(_matches, pattern, batch)):
                await stream.close()
                return page.found
        await stream.close()
    return page.found


class _Page:
    """Matches in seq order, a page of them: the first `offset` skipped, then `limit` kept."""

    def __init__(self, limit: int, offset: int) -> None:
        self.found: list[Found] = []
        self.limit = limit
        self.skip = offset

    def add(self, matched: Sequence[tuple[int, str, Any]]) -> bool:
        """Take `matched` (seq, text, match) in; whether the page is full."""
        for seq, body, match in matched:
            if self.skip:
                self.skip -= 1
                continue
            start = max(0, match.start() - 80)
            self.found.append(Found(seq, 0.0, _mark(body[start : match.end() + 80], match.group(0))))
            if len(self.found) >= self.limit:
                return True
        return False


WINDOW_ITEMS = 200
"""Substring and regex search read this many of the session's first items (from `min_seq`) in
order before asking the index: a needle most texts hold fills a page there, whereas the index
finds every text that holds it, each read again to be sure, before the first is returned."""


async def _in_order(
    conn: AsyncConnection,
    key: int,
    where: Where,
    literals: Sequence[str],
    params: dict[str, object],
    folded: bool = False,
) -> list[tuple[str, str]]:
    """What substring and regex search read, in seq order, one statement after the other: a
    FROM clause naming the rows `t` and the end of the WHERE clause with the order. With
    literals, a window of the session's first items, then the items after it (on SQLite
    narrowed by the trigram table); without, every item."""
    postgres = conn.dialect.name == "postgresql"
    if postgres:
        await _planned_for_each(conn)
    if not literals:
        return [("item_texts t", " AND t.session_key = :key ORDER BY t.seq")]
    first = max(where.min_seq, 1)
    params |= {"window_from": first, "window_to": min(first + WINDOW_ITEMS - 1, _LAST_SEQ)}
    # On Postgres, OFFSET 0 keeps the planner from reading the window through the trigram index.
    window = (
        "(SELECT session_key, seq, text FROM item_texts WHERE session_key = :key"
        f" AND seq BETWEEN :window_from AND :window_to{' OFFSET 0' if postgres else ''}) t"
    )
    narrowed = "" if postgres else await _narrowed(conn, key, literals, params, folded)
    after = f" AND t.session_key = :key AND t.seq > :window_to{narrowed} ORDER BY t.seq"
    return [(window, " ORDER BY t.seq"), ("item_texts t", after)]


def _indexable(literals: Sequence[str], postgres: bool) -> list[str]:
    """The literals a trigram index finds texts by: on Postgres those with a word of three
    ASCII letters or digits (pg_trgm's trigrams are of words), on SQLite those of three
    characters; the others would only make each text be read once more."""
    return [w for w in literals if (_WORD.search(w) if postgres else len(w) >= 3)]


_WORD = re.compile(r"[A-Za-z0-9]{3}")
_LAST_SEQ = 2**63 - 1
"""Seqs are stored as int64."""


def _holding(literals: Sequence[str], postgres: bool, params: dict[str, object], folded: bool = False) -> str:
    """SQL over the alias `t` (an item_texts row): its text holds every one of `literals`
    (`folded`: up to ASCII case). On Postgres as `LIKE` or `ILIKE`, which a pg_trgm index
    answers (the same test as `strpos`); on SQLite as `instr`, or `LIKE`, which folds ASCII
    letters only (as long as nothing turns its `case_sensitive_like` on, which nothing here
    does)."""
    sql = []
    for n, literal in enumerate(literals):
        name = f"literal_{n}"
        if postgres or folded:
            like = "ILIKE" if postgres and folded else "LIKE"
            sql.append(f"t.text {like} :{name} ESCAPE '\\'")
            params[name] = "%" + re.sub(r"([\\%_])", r"\\\1", literal) + "%"
        else:
            sql.append(f"instr(t.text, :{name}) > 0")
            params[name] = literal
    return " AND ".join(sql)


_ASCII_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_FOLDS_ASCII: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
"""`_folds_ascii`'s answer per database (its engine's dialect): a locale is the database's for good."""


async def _folds_ascii(conn: AsyncConnection) -> bool:
    """Whether a case-insensitive comparison of the database's folds each ASCII letter to its
    ASCII lower case, as the literals up to ASCII case assume. SQLite's `LIKE` does. Postgres'
    `ILIKE` and pg_trgm lower by the database's locale: under a Turkish one `I` lowers to a
    dotless `ı`, and there the literals would miss texts, so a regex reads every text. Asked
    of a database once."""
    if conn.dialect.name != "postgresql":
        return True
    found = _FOLDS_ASCII.get(conn.dialect)
    if found is None:
        lowered = text("SELECT lower(CAST(:letters AS text)) = :lowered")
        params = {"letters": _ASCII_LETTERS, "lowered": _ASCII_LETTERS.lower()}
        found = _FOLDS_ASCII[conn.dialect] = bool((await conn.execute(lowered, params)).scalar_one())
    return found


async def _narrowed(
    conn: AsyncConnection, key: int, literals: Sequence[str], params: dict[str, object], folded: bool = False
) -> str:
    """SQLite: SQL over the alias `t` keeping the items whose trigrams include those of
    `literals` (`folded`: in some ASCII case) ("" on Postgres, whose planner reads its index
    itself; "" without the table, or without a literal of three characters)."""
    trigrams = list(dict.fromkeys(w[i : i + 3] for w in literals for i in range(len(w) - 2)))
    if conn.dialect.name == "postgresql" or not trigrams:
        return ""
    exists = "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'item_texts_trigrams'"
    if not (await conn.execute(text(exists))).scalar_one():
        return ""
    # The table is case-sensitive: a trigram up to case is any of its (at most 8) casings,
    # so fewer trigrams are asked for.
    most = MOST_TRIGRAMS // 4 if folded else MOST_TRIGRAMS
    if len(trigrams) > most:  # any of them narrows soundly; spread over the literals
        trigrams = [trigrams[n * len(trigrams) // most] for n in range(most)]
    low = key * FTS_ROWID_SPAN
    # Each trigram one FTS5 string ("" doubles a quote): the table keeps no positions, so
    # the query asks for every trigram, anywhere in the text.
    quoted = (_casings(t) if folded else ['"' + t.replace('"', '""') + '"'] for t in trigrams)
    params |= {
        "trigrams": " AND ".join(q[0] if len(q) == 1 else "(" + " OR ".join(q) + ")" for q in quoted),
        "trigrams_low": low,
        "trigrams_high": low + FTS_ROWID_SPAN - 1,
    }
    return (
        " AND t.seq IN (SELECT rowid - :trigrams_low FROM item_texts_trigrams"
        " WHERE item_texts_trigrams MATCH :trigrams AND rowid BETWEEN :trigrams_low AND :trigrams_high)"
    )


def _casings(trigram: str) -> list[str]:
    """Every ASCII casing of `trigram`, each an FTS5 string."""
    cases = ((c.lower(), c.upper()) if c.isascii() and c.isalpha() else (c,) for c in trigram)
    return ['"' + "".join(p).replace('"', '""') + '"' for p in dict.fromkeys(itertools.product(*cases))]


REGEX_BATCH = 64
"""Rows matched per trip to a worker thread (each at most an item's text: a bounded batch)."""


def _matches(pattern: Any, rows: Sequence[Any]) -> list[tuple[int, str, Any]]:
    found = []
    for row in rows:
        match = pattern.search(row.text)
        if match is not None:
            found.append((int(row.seq), row.text, match))
    return found


HELD_BATCH = 1_000
"""Held texts matched per trip to a worker thread."""


def _held_matches(pattern: Any, seqs: Sequence[int], texts: HeldTexts) -> list[tuple[int, str, Any]]:
    """Matched as UTF-8, as RE2 matches a str (it encodes it first): the text is decoded, and
    matched again for the match's place in it, only where there is one."""
    found = []
    for seq in seqs:
        encoded = texts[seq - 1]
        if pattern.search(encoded) is not None:
            body = encoded.decode()
            match = pattern.search(body)
            if match is not None:
                found.append((seq, body, match))
    return found


def _mark(around: str, found: str) -> str:
    return _short(around.replace(found, f"«{found}»", 1) if found else around)


def _short(snippet: str) -> str:
    flat = " ".join(snippet.split())
    return flat if len(flat) <= SNIPPET_CHARS else flat[: SNIPPET_CHARS - 1] + "…"
