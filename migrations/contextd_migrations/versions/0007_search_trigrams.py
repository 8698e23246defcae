"""Search: a trigram index over each item's whole text, for substring and regex search.

Both read `item_texts` whole, every text of the session, each call. Now, on
Postgres, a GIN index of pg_trgm's trigrams answers `LIKE` (storage/contextd_storage/search.py
asks for the needle, or each literal a regex requires, that way); on SQLite an
FTS5 table of each text's trigrams (no copy of the text, no positions), fed by
triggers, gives the items holding them. Existing texts are indexed here (the
table of item_texts locked against writes meanwhile, on Postgres).

Where the database cannot have one, the migration goes on without it and says
so, and search reads every text as before (the same answers, slower):
Postgres without the pg_trgm extension available (it ships in contrib), or
with it not installed and a role that may not install it (pg_trgm is a trusted
extension: a role with CREATE on the database may; installed once by an
administrator, it serves every role); SQLite before 3.34, which has no trigram
tokenizer. An administrator can add the index later, by hand (the warning says
how). The downgrade drops the index, never the extension (other things in the
database may use it).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from alembic import op
from sqlalchemy.exc import DBAPIError

from contextd_storage.search import FTS_ROWID_SPAN

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

log = logging.getLogger(__name__)

TRIGRAM_ROWID = "{row}.session_key * " + str(FTS_ROWID_SPAN) + " + {row}.seq"
"""SQLite's trigram rowid of an item (storage/contextd_storage/search.py reads it back the same way)."""
SQLITE_TRIGRAMS = (3, 34, 0)
"""The first SQLite with FTS5's trigram tokenizer."""
WITHOUT = "substring and regex search will read every text of a session"
BY_HAND = (
    "an administrator can add the index later: CREATE EXTENSION pg_trgm; "
    "CREATE INDEX ix_item_texts_trigrams ON item_texts USING gin (text gin_trgm_ops)"
)


def upgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        _upgrade_postgres()
    else:
        _upgrade_sqlite()


def _upgrade_postgres() -> None:
    conn = op.get_bind()
    schema = _trigram_schema(conn)
    if schema is None:
        return
    opclass = f"{_quoted(schema)}.gin_trgm_ops"
    # An earlier migration of this run may have streamed item_texts (0005): its cursor,
    # read to the end, stays open until the transaction ends, and Postgres indexes no
    # table an open cursor of the session reads.
    conn.execute(sa.text("CLOSE ALL"))
    try:
        with conn.begin_nested():
            conn.execute(sa.text(f"CREATE INDEX ix_item_texts_trigrams ON item_texts USING gin (text {opclass})"))
    except DBAPIError as exc:
        log.warning("cannot create the trigram index (%s): %s; %s", _first_line(exc), WITHOUT, BY_HAND)
        return
    # The planner weighs the index against reading a session's rows by what the statistics
    # say of both; autovacuum keeps them current from here on.
    conn.execute(sa.text("ANALYZE item_texts"))


def _trigram_schema(conn: sa.Connection) -> str | None:
    """The schema pg_trgm is installed in, installing it when it is available and this role
    may; None (and a warning) when it cannot be had."""
    installed = sa.text(
        "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'pg_trgm'"
    )
    schema = conn.execute(installed).scalar()
    if schema is not None:
        return str(schema)
    available = "SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_trgm'"
    if not conn.execute(sa.text(available)).scalar():
        log.warning("the pg_trgm extension is not available on this server: %s", WITHOUT)
        return None
    try:
        with conn.begin_nested():  # a refusal rolls back to here, not the whole migration
            conn.execute(sa.text("CREATE EXTENSION IF NOT EXISTS pg_trgm"))
    except DBAPIError as exc:
        log.warning("cannot install the pg_trgm extension (%s): %s; %s", _first_line(exc), WITHOUT, BY_HAND)
        return None
    schema = conn.execute(installed).scalar()
    return None if schema is None else str(schema)


def _upgrade_sqlite() -> None:
    conn = op.get_bind()
    version = tuple(int(part) for part in str(conn.execute(sa.text("SELECT sqlite_version()")).scalar()).split("."))
    if version < SQLITE_TRIGRAMS:
        log.warning("SQLite %s has no trigram tokenizer (3.34 has): %s", ".".join(map(str, version)), WITHOUT)
        return
    # Contentless (the text stays in item_texts alone) and without positions or sizes: the
    # table only says which items hold every trigram asked for; `instr` then reads those.
    op.execute(
        "CREATE VIRTUAL TABLE item_texts_trigrams USING fts5("
        "text, content='', detail=none, columnsize=0, tokenize='trigram case_sensitive 1')"
    )
    op.execute(
        "CREATE TRIGGER item_texts_trigrams_insert AFTER INSERT ON item_texts BEGIN "
        f"INSERT INTO item_texts_trigrams(rowid, text) VALUES ({TRIGRAM_ROWID.format(row='new')}, new.text); END"
    )
    # A contentless table forgets a row given the text it was indexed with.
    op.execute(
        "CREATE TRIGGER item_texts_trigrams_delete AFTER DELETE ON item_texts BEGIN "
        "INSERT INTO item_texts_trigrams(item_texts_trigrams, rowid, text) "
        f"VALUES ('delete', {TRIGRAM_ROWID.format(row='old')}, old.text); END"
    )
    op.execute(
        f"INSERT INTO item_texts_trigrams(rowid, text) SELECT {TRIGRAM_ROWID.format(row='item_texts')}, text "
        "FROM item_texts"
    )


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute("DROP INDEX IF EXISTS ix_item_texts_trigrams")
        return
    op.execute("DROP TRIGGER IF EXISTS item_texts_trigrams_insert")
    op.execute("DROP TRIGGER IF EXISTS item_texts_trigrams_delete")
    op.execute("DROP TABLE IF EXISTS item_texts_trigrams")


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _first_line(exc: DBAPIError) -> str:
    return str(exc.orig).strip().splitlines()[0] if exc.orig is not None else type(exc).__name__
