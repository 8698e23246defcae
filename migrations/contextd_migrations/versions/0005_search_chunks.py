"""Search: full text over each item's whole text, in overlapping chunks.

Migration 0003 indexed each item's first 100,000 characters (a tsvector holds
at most 1 MB), so full-text search missed the tail of a long output. Now
`item_text_chunks` holds every item's text in chunks of at most 8,000
characters, each sharing 1,000 with the next (storage/contextd_storage/search.py,
`text_chunks`), written with the item and append-only like it. On Postgres a
stored generated column holds each chunk's `simple` tsvector, GIN-indexed; on
SQLite an FTS5 table of the chunks, fed by a trigger. Existing items are
chunked here. `item_texts` stays (substring and regex search read it whole)
without its own index: 0003's tsvector column and FTS5 table go.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from contextd_storage.search import FTS_ROWID_SPAN, text_chunks

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

FTS_ROWID = "{row}.session_key * " + str(FTS_ROWID_SPAN) + " + {row}.number"
"""SQLite's full-text rowid of a chunk: a session's chunks are one range of rowids
(storage/contextd_storage/search.py reads it back the same way)."""
OLD_INDEXED_CHARS = 100_000
"""What 0003 indexed of each item, restored by the downgrade."""


def upgrade() -> None:
    op.create_table(
        "item_text_chunks",
        sa.Column("session_key", sa.BigInteger, nullable=False),
        sa.Column("number", sa.BigInteger, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("session_key", "number", name="pk_item_text_chunks"),
        sa.ForeignKeyConstraint(["session_key"], ["sessions.key"], name="fk_item_text_chunks_session_key_sessions"),
    )
    if op.get_context().dialect.name == "postgresql":
        op.execute(
            "ALTER TABLE item_text_chunks ADD COLUMN tsv tsvector "
            "GENERATED ALWAYS AS (to_tsvector('simple'::regconfig, text)) STORED"
        )
        op.execute("CREATE INDEX ix_item_text_chunks_fts ON item_text_chunks USING gin (tsv)")
        op.execute(
            "CREATE TRIGGER item_text_chunks_append_only BEFORE UPDATE OR DELETE ON item_text_chunks "
            "FOR EACH ROW EXECUTE FUNCTION contextd_refuse_history_change()"
        )
        op.execute(
            "CREATE TRIGGER item_text_chunks_no_truncate BEFORE TRUNCATE ON item_text_chunks "
            "FOR EACH STATEMENT EXECUTE FUNCTION contextd_refuse_truncate()"
        )
        # Every insert into item_texts computed this over 100,000 characters: no longer read.
        op.execute("DROP INDEX ix_item_texts_fts")
        op.execute("ALTER TABLE item_texts DROP COLUMN tsv")
    else:
        op.execute("CREATE VIRTUAL TABLE item_text_chunks_fts USING fts5(text)")
        op.execute(
            "CREATE TRIGGER item_text_chunks_fts_insert AFTER INSERT ON item_text_chunks BEGIN "
            f"INSERT INTO item_text_chunks_fts(rowid, text) VALUES ({FTS_ROWID.format(row='new')}, new.text); END"
        )
        op.execute(
            "CREATE TRIGGER item_text_chunks_fts_delete AFTER DELETE ON item_text_chunks "
            f"BEGIN DELETE FROM item_text_chunks_fts WHERE rowid = {FTS_ROWID.format(row='old')}; END"
        )
        op.execute(
            "CREATE TRIGGER item_text_chunks_no_update BEFORE UPDATE ON item_text_chunks "
            "BEGIN SELECT RAISE(ABORT, 'contextd: item_text_chunks is append-only; UPDATE refused'); END"
        )
        op.execute(
            "CREATE TRIGGER item_text_chunks_no_delete BEFORE DELETE ON item_text_chunks "
            "WHEN NOT EXISTS (SELECT 1 FROM sessions WHERE key = OLD.session_key AND deleting) "
            "BEGIN SELECT RAISE(ABORT, 'contextd: item_text_chunks is append-only; DELETE refused'); END"
        )
        for trigger in ("item_texts_fts_insert", "item_texts_fts_delete"):
            op.execute(f"DROP TRIGGER {trigger}")
        op.execute("DROP TABLE item_texts_fts")
    _fill()


def _fill() -> None:
    """The chunks of the items already stored, numbered per session in seq order."""
    conn = op.get_bind()
    texts = sa.table("item_texts", sa.column("session_key"), sa.column("seq"), sa.column("text"))
    chunks = sa.table(
        "item_text_chunks", sa.column("session_key"), sa.column("number"), sa.column("seq"), sa.column("text")
    )
    # Streamed (a server-side cursor for this one statement), a few rows at a time: the history
    # may be large, and one text up to max_item_bytes.
    rows = conn.execute(
        sa.select(texts.c.session_key, texts.c.seq, texts.c.text)
        .order_by(texts.c.session_key, texts.c.seq)
        .execution_options(stream_results=True, yield_per=50)
    )
    batch: list[dict[str, object]] = []
    session, number = None, 0
    for key, seq, whole in rows:
        if key != session:
            session, number = key, 0
        for chunk in text_chunks(whole):
            number += 1
            batch.append({"session_key": key, "number": number, "seq": seq, "text": chunk})
        if len(batch) >= 1000:
            conn.execute(sa.insert(chunks), batch)
            batch = []
    if batch:
        conn.execute(sa.insert(chunks), batch)


def downgrade() -> None:
    """Back to 0003's index of each item's first 100,000 characters, rebuilt from item_texts."""
    if op.get_context().dialect.name == "postgresql":
        op.execute("DROP TRIGGER item_text_chunks_append_only ON item_text_chunks")
        op.execute("DROP TRIGGER item_text_chunks_no_truncate ON item_text_chunks")
        op.execute("DROP INDEX ix_item_text_chunks_fts")
        op.drop_table("item_text_chunks")
        op.execute(
            "ALTER TABLE item_texts ADD COLUMN tsv tsvector GENERATED ALWAYS AS "
            f"(to_tsvector('simple'::regconfig, left(text, {OLD_INDEXED_CHARS}))) STORED"
        )
        op.execute("CREATE INDEX ix_item_texts_fts ON item_texts USING gin (tsv)")
        return
    for trigger in (
        "item_text_chunks_fts_insert",
        "item_text_chunks_fts_delete",
        "item_text_chunks_no_update",
        "item_text_chunks_no_delete",
    ):
        op.execute(f"DROP TRIGGER {trigger}")
    op.execute("DROP TABLE item_text_chunks_fts")
    op.drop_table("item_text_chunks")
    old_rowid = "{row}.session_key * 4294967296 + {row}.seq"
    op.execute("CREATE VIRTUAL TABLE item_texts_fts USING fts5(text)")
    op.execute(
        "CREATE TRIGGER item_texts_fts_insert AFTER INSERT ON item_texts BEGIN "
        f"INSERT INTO item_texts_fts(rowid, text) VALUES ({old_rowid.format(row='new')}, "
        f"substr(new.text, 1, {OLD_INDEXED_CHARS})); END"
    )
    op.execute(
        "CREATE TRIGGER item_texts_fts_delete AFTER DELETE ON item_texts "
        f"BEGIN DELETE FROM item_texts_fts WHERE rowid = {old_rowid.format(row='old')}; END"
    )
    op.execute(
        "INSERT INTO item_texts_fts(rowid, text) "
        f"SELECT {old_rowid.format(row='item_texts')}, substr(text, 1, {OLD_INDEXED_CHARS}) FROM item_texts"
    )
