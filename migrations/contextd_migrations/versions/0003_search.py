"""Search: each item's text, indexed for full-text search.

`item_texts` holds the text of every item (what Retrieve returns), written
in the same transaction as the item and append-only like it. On Postgres a
stored generated column holds its `simple` tsvector (identifiers kept as
they are: no stemming, no stop words), GIN-indexed, so ranking reads it
rather than parsing the text again; on SQLite an FTS5 table of the same
first characters, fed by a trigger. Existing items are filled in.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

from contextd.engine.codec import blocks_from_json
from contextd.engine.model import ItemContent, Role
from contextd.engine.originals import original_text

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

INDEXED_CHARS = 100_000
FTS_ROWID = "{row}.session_key * 4294967296 + {row}.seq"
"""SQLite's full-text rowid of an item (storage/contextd_storage/search.py reads it back the same way)."""
TSVECTOR = f"to_tsvector('simple'::regconfig, left(text, {INDEXED_CHARS}))"
"""The stored vector's expression: a tsvector holds at most 1 MB, and 100,000 characters stay
under it whatever they are (a lexeme of 4-byte characters, its position and its entry: at most
10 bytes a character). Past it, full text does not see an item (substring and regex do)."""


def upgrade() -> None:
    op.create_table(
        "item_texts",
        sa.Column("session_key", sa.BigInteger, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("session_key", "seq", name="pk_item_texts"),
        sa.ForeignKeyConstraint(["session_key"], ["sessions.key"], name="fk_item_texts_session_key_sessions"),
    )
    postgres = op.get_context().dialect.name == "postgresql"
    if postgres:
        op.execute(f"ALTER TABLE item_texts ADD COLUMN tsv tsvector GENERATED ALWAYS AS ({TSVECTOR}) STORED")
        op.execute("CREATE INDEX ix_item_texts_fts ON item_texts USING gin (tsv)")
        op.execute(
            "CREATE TRIGGER item_texts_append_only BEFORE UPDATE OR DELETE ON item_texts "
            "FOR EACH ROW EXECUTE FUNCTION contextd_refuse_history_change()"
        )
        op.execute(
            "CREATE TRIGGER item_texts_no_truncate BEFORE TRUNCATE ON item_texts "
            "FOR EACH STATEMENT EXECUTE FUNCTION contextd_refuse_truncate()"
        )
    else:
        # Its own copy of the first characters (as many as Postgres indexes), so ranking
        # and snippets read those, not a whole long output.
        op.execute("CREATE VIRTUAL TABLE item_texts_fts USING fts5(text)")
        # Its rowid is the item's (session key, seq) in one number, not item_texts' own rowid
        # (which VACUUM may renumber): a session's entries are one rowid range.
        op.execute(
            "CREATE TRIGGER item_texts_fts_insert AFTER INSERT ON item_texts BEGIN "
            f"INSERT INTO item_texts_fts(rowid, text) VALUES ({FTS_ROWID.format(row='new')}, "
            f"substr(new.text, 1, {INDEXED_CHARS})); END"
        )
        op.execute(
            "CREATE TRIGGER item_texts_fts_delete AFTER DELETE ON item_texts "
            f"BEGIN DELETE FROM item_texts_fts WHERE rowid = {FTS_ROWID.format(row='old')}; END"
        )
        op.execute(
            "CREATE TRIGGER item_texts_no_update BEFORE UPDATE ON item_texts "
            "BEGIN SELECT RAISE(ABORT, 'contextd: item_texts is append-only; UPDATE refused'); END"
        )
        op.execute(
            "CREATE TRIGGER item_texts_no_delete BEFORE DELETE ON item_texts "
            "WHEN NOT EXISTS (SELECT 1 FROM sessions WHERE key = OLD.session_key AND deleting) "
            "BEGIN SELECT RAISE(ABORT, 'contextd: item_texts is append-only; DELETE refused'); END"
        )
    _fill()


def _fill() -> None:
    """The texts of the items already stored."""
    conn = op.get_bind()
    items = sa.table("items", sa.column("session_key"), sa.column("seq"), sa.column("role"), sa.column("content"))
    texts = sa.table("item_texts", sa.column("session_key"), sa.column("seq"), sa.column("text"))
    # Streamed (a server-side cursor for this one statement): the history may be large.
    rows = conn.execute(
        sa.select(items.c.session_key, items.c.seq, items.c.role, items.c.content).execution_options(
            stream_results=True, yield_per=1000
        )
    )
    batch = []
    for key, seq, role, content in rows:
        blocks = blocks_from_json(json.loads(content) if isinstance(content, str) else content)
        text = original_text(ItemContent(role=Role(role), content=blocks)).replace("\x00", "\ufffd")
        batch.append({"session_key": key, "seq": seq, "text": text})
        if len(batch) >= 1000:
            conn.execute(sa.insert(texts), batch)
            batch = []
    if batch:
        conn.execute(sa.insert(texts), batch)


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute("DROP TRIGGER item_texts_append_only ON item_texts")
        op.execute("DROP TRIGGER item_texts_no_truncate ON item_texts")
        op.execute("DROP INDEX ix_item_texts_fts")
    else:
        for trigger in (
            "item_texts_fts_insert",
            "item_texts_fts_delete",
            "item_texts_no_update",
            "item_texts_no_delete",
        ):
            op.execute(f"DROP TRIGGER {trigger}")
        op.execute("DROP TABLE item_texts_fts")
    op.drop_table("item_texts")
