"""Substring and regex search through the trigram index give what reading every text gives,
on both backends: the same items, snippets, order and pages, whatever the text (unicode, a
match across the edge of two full-text chunks, a pattern with no literal, case folding)."""

from __future__ import annotations

import hashlib
import random
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from sqlalchemy import text

from contextd.engine.model import ItemContent, Role, TextBlock
from contextd.engine.patterns import compile_linear
from contextd_storage import migrate, search
from contextd_storage.database import Database
from contextd_storage.history import HistoryStore
from contextd_storage.regex_literals import required_literals
from contextd_storage.rows import AppendRequest, PreparedItem
from tests import backends
from tests.storage.test_regex_literals import patterns

EDGE = "a," * 3995 + "quokka,wombat" + ",b" * 3000
"""Its first full-text chunk ends inside "quokka,wombat" (tests/service/api/test_search.py)."""
LONG = "".join(f"row {n:06d} fine\n" for n in range(9000)) + "the end: wombat KEY_42\n"
PLANTED = {
    5: "charge ch_7Hq2LwQz declined: insufficient funds (request req_55Z1)",
    60: "ERROR: quota exceeded for tenant_9; retry in 30s\nError again\nerror once more",
    150: "naïve café — Ünïcödé ſtraße, the Kelvin sign \u212a, 错误代码 E42, 🚀 launch_ok, e\u0301",
    199: "100% done_ok \\ back\\slash, a \"quoted\" word and 'single' ones",
    200: EDGE,
    201: "charge ch_9Zz8YyXx declined: insufficient funds (request req_77A2)",
    320: LONG,
    321: "a NUL \x00 stored as a replacement character",
    430: "KEY_42 kEY_42 key_42 \u212aEY_42",
}
NEEDLES = [
    "declined: insufficient funds",
    "req_55Z1)",
    "quokka,wombat",
    "a,quokka,wombat,b",
    "wombat KEY_42",
    "fine\nrow 000",
    "100%",
    "done_ok",
    "_ok",
    "\\ back\\",
    '"quoted"',
    "café",
    "ſtraße",
    "错误代码",
    "🚀 launch",
    "e\u0301",
    "\ufffd stored",
    "KEY_42",
    "ab",
    "passed",
    "zanzibar",
]
REGEXES = [
    r"ch_[0-9A-Za-z]{8} declined",
    r"req_\d+\)",
    r"quokka,wombat",
    r"a,(quokka),wombat,b+",
    r"row 000001 fine(?s:.*)wombat",
    r"(?i)error",
    r"(?i)key_42",
    r"(?i)\x{212A}EY_42",
    r"(?i)QUOTA exceeded for tenant_\d",
    r"(?i)DECLINED: INSUFFICIENT FUNDS",
    r"(?i)NAÏVE CAFÉ",
    r"(?i)ſTRAßE",
    r"(?i)Done_OK",
    r"\d+% done_ok",
    r"caf(é|e)",
    r"ſtra(ß|ss)e",
    r"错误代码 E\d+",
    r"🚀 \w+",
    r"e\x{301}",
    r"(?m)^Error again$",
    r"[^a-z ]{3,}",
    r"\x00",
    r"note \d+ of",
    r"^(a+)+$",
    r"zanzibar\d",
    "",
]
PAGES = [(11, 0), (3, 1), (2, 4), (50, 0)]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A database of this module's own: the tests take its trigram index away."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('search') / 'search.db'}"
        return
    server: str = request.getfixturevalue("postgres_server_url")
    url = backends.create_database(server, "contextd_search")
    yield url
    backends.drop_database(server, url)


@pytest.fixture(scope="module")
def texts() -> list[str]:
    """450 items: notes, with the planted texts among them (before, at and after the window)."""
    rng = random.Random(7)
    words = ["passed", "note", "index", "render", "queue", "Error", "ok", "ab"]
    filler = [f"note {n} of {' '.join(rng.choice(words) for _ in range(12))}" for n in range(1, 451)]
    return [PLANTED.get(seq, body) for seq, body in enumerate(filler, 1)]


@pytest.fixture(scope="module")
async def stored(database: str, texts: list[str]) -> AsyncIterator[tuple[Database, int]]:
    await migrate.upgrade(database)
    db = Database(database)
    store = HistoryStore(db)
    await store.create_session("t", "s", {})
    items = [ItemContent(role=Role.USER, content=(TextBlock(t),)) for t in texts]
    prepared = [PreparedItem(i, hashlib.sha256(t.encode()).hexdigest(), 1) for i, t in zip(items, texts, strict=True)]
    for start in range(0, len(prepared), 100):
        batch = prepared[start : start + 100]
        await store.append(AppendRequest("t", "s", batch, request_hash=str(start)))
    yield db, await store.session_key("t", "s")
    await db.close()


def stored_text(body: str) -> str:
    return body.replace("\x00", "\ufffd")


def held_texts(texts: list[str]) -> list[bytes]:
    return [stored_text(t).encode() for t in texts]


WHERES = [search.Where(), search.Where(min_seq=150), search.Where(seqs=(*range(1, 451, 3), 5, 200, 320))]


async def answers(
    db: Database, key: int, literals: bool = True, held: list[str] | None = None
) -> dict[tuple[str, int, int, int], list[search.Found]]:
    """Every needle and pattern, in every filter and page; `held`: the texts, as the caller of
    a regex search holds them (the session's items)."""
    given = None if held is None else held_texts(held)
    out = {}
    async with db.read() as conn:
        for w, where in enumerate(WHERES):
            for limit, offset in PAGES:
                for needle in NEEDLES:
                    out[needle, w, limit, offset] = await search.substring(conn, key, needle, where, limit, offset)
                for pattern in REGEXES:
                    found = await search.regex(
                        conn,
                        key,
                        compile_linear(pattern),
                        where,
                        limit,
                        offset,
                        required_literals(pattern) if literals else (),
                        required_literals(pattern, caseless=True) if literals else (),
                        given,
                    )
                    out["regex " + pattern, w, limit, offset] = found
    return out


def expected_seqs(texts: list[str], kind: str, where: search.Where, limit: int, offset: int) -> list[int]:
    """What reading every text finds, in Python."""
    if kind.startswith("regex "):
        compiled = compile_linear(kind.removeprefix("regex "))
        holds = [compiled.search(stored_text(t)) is not None for t in texts]
    else:
        holds = [kind in stored_text(t) for t in texts]
    seqs = [seq for seq, held in enumerate(holds, 1) if held and seq >= where.min_seq]
    seqs = [s for s in seqs if where.seqs is None or s in where.seqs]
    return seqs[offset : offset + limit]


async def test_the_trigram_index_is_there_and_answers_what_reading_every_text_answers(
    stored: tuple[Database, int], texts: list[str], database: str
) -> None:
    db, key = stored
    async with db.read() as conn:
        if conn.dialect.name == "postgresql":
            found = "SELECT count(*) FROM pg_indexes WHERE indexname = 'ix_item_texts_trigrams'"
        else:
            found = 'SELECT count(*) FROM item_texts_trigrams WHERE item_texts_trigrams MATCH \'"KEY" AND "_42"\''
        assert (await conn.execute(text(found))).scalar_one() >= 1

    indexed = await answers(db, key)
    for (kind, w, limit, offset), found in indexed.items():
        assert [f.seq for f in found] == expected_seqs(texts, kind, WHERES[w], limit, offset), (kind, w, limit)
    assert [f.seq for f in indexed["quokka,wombat", 0, 11, 0]] == [200]  # across a chunk edge
    assert [f.seq for f in indexed["regex row 000001 fine(?s:.*)wombat", 0, 11, 0]] == [320]
    assert [f.seq for f in indexed["regex (?i)key_42", 0, 11, 0]] == [320, 430]
    assert "«\ufffd stored»" in indexed["\ufffd stored", 0, 11, 0][0].snippet

    # Patterns read without their literals (every text, as before the index) answer the same,
    # read from the database or matched over the texts the caller holds.
    assert await answers(db, key, literals=False) == indexed
    assert await answers(db, key, literals=False, held=texts) == indexed
    assert await answers(db, key, held=texts) == indexed

    # And without the index (a database that cannot have one): the same again.
    async with db.engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            await conn.execute(text("DROP INDEX ix_item_texts_trigrams"))
        else:  # as a SQLite without the trigram tokenizer is migrated: no table, no triggers
            for trigger in ("item_texts_trigrams_insert", "item_texts_trigrams_delete"):
                await conn.execute(text(f"DROP TRIGGER {trigger}"))
            await conn.execute(text("DROP TABLE item_texts_trigrams"))
    try:
        assert await answers(db, key) == indexed
    finally:
        await migrate.downgrade(database, "0006")
        await migrate.upgrade(database)
    assert await answers(db, key) == indexed


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(patterns())
async def test_any_pattern_finds_the_same_with_its_literals_as_without(
    stored: tuple[Database, int], texts: list[str], pattern: str
) -> None:
    try:
        compiled = compile_linear(pattern)
    except ValueError:
        return
    db, key = stored
    async with db.read() as conn:
        narrowed = await search.regex(conn, key, compiled, search.Where(), 11, 0, required_literals(pattern))
        caseless = await search.regex(
            conn, key, compiled, search.Where(), 11, 0, (), required_literals(pattern, caseless=True)
        )
        every = await search.regex(conn, key, compiled, search.Where(), 11, 0)
        held = await search.regex(conn, key, compiled, search.Where(), 11, 0, texts=held_texts(texts))
    assert narrowed == every == caseless == held


async def test_a_case_insensitive_pattern_reads_only_the_texts_holding_its_letters_up_to_case(
    stored: tuple[Database, int], texts: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`(?i)` leaves no literal RE2 matches as itself but punctuation; up to ASCII case its
    letters are literal (but k and s), and only the texts holding them are read."""
    read: list[int] = []
    matches = search._matches

    def counted(pattern: Any, rows: Any) -> Any:
        read.extend(seq for seq, _ in rows)
        return matches(pattern, rows)

    monkeypatch.setattr(search, "_matches", counted)
    db, key = stored
    pattern = "(?i)DECLINED: INSUFFICIENT FUNDS"
    async with db.read() as conn:
        found = await search.regex(
            conn, key, compile_linear(pattern), search.Where(), 11, 0, required_literals(pattern)
        )
        assert len(read) == len(texts)  # its one literal, ": ", is no index's
        read.clear()
        folded = await search.regex(
            conn,
            key,
            compile_linear(pattern),
            search.Where(),
            11,
            0,
            required_literals(pattern),
            required_literals(pattern, caseless=True),
        )
    assert [f.seq for f in folded] == [f.seq for f in found] == [5, 201]
    assert sorted(read) == [5, 201]


async def test_deleting_a_session_takes_its_texts_out_of_the_trigram_table(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'delete.db'}"
    await migrate.upgrade(url)
    db = Database(url)
    try:
        store = HistoryStore(db)
        await store.create_session("t", "gone", {})
        item = ItemContent(role=Role.USER, content=(TextBlock("wombat quokka"),))
        await store.append(AppendRequest("t", "gone", [PreparedItem(item, "a" * 64, 1)], request_hash="r"))
        matching = "SELECT count(*) FROM item_texts_trigrams WHERE item_texts_trigrams MATCH '\"wom\"'"
        async with db.read() as conn:
            assert (await conn.execute(text(matching))).scalar_one() == 1
        await store.delete_session("t", "gone")
        async with db.read() as conn:
            assert (await conn.execute(text(matching))).scalar_one() == 0
    finally:
        await db.close()


async def test_a_window_from_the_last_seq_stays_a_seq(stored: tuple[Database, int]) -> None:
    db, key = stored
    last = search.Where(min_seq=2**63 - 1)
    async with db.read() as conn:
        assert await search.substring(conn, key, "KEY_42", last, 10, 0) == []
        assert await search.regex(conn, key, compile_linear("KEY_42"), last, 10, 0, ("KEY_42",)) == []
