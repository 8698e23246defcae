"""The relational schema, one for Postgres and SQLite.

The history tables (items, tool_uses, appends) are append-only; the
migration installs triggers that refuse UPDATE and DELETE on them. The one
exception is deleting a whole session: the session row is first marked
`deleting`, and only rows of a session so marked may be deleted.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
)

from contextd.engine.validation import MAX_NAME_LENGTH

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# SQLite only auto-increments a column declared exactly INTEGER PRIMARY KEY.
AutoKey = BigInteger().with_variant(Integer(), "sqlite")
# Postgres `json`, not `jsonb`: tool output may hold NUL characters, which
# jsonb cannot store; nothing queries inside these documents.
Json = JSON()
UtcTime = DateTime(timezone=True)

APPEND_ONLY_TABLES = (
    "items",
    "tool_uses",
    "appends",
    "certificates",
    "mutations",
    "item_texts",
    "item_text_chunks",
)

sessions = Table(
    "sessions",
    metadata,
    Column("key", AutoKey, primary_key=True, autoincrement=True),
    Column("tenant", String(128), nullable=False),
    Column("id", String(128), nullable=False),
    Column("version", BigInteger, nullable=False),
    Column("token_count", BigInteger, nullable=False),
    # Bytes of its items' text and data (validation.item_bytes), summed per tenant for its quota.
    Column("stored_bytes", BigInteger, nullable=False, server_default="0"),
    Column("metadata", Json, nullable=False),
    Column("policy", Text, nullable=False),
    Column("policy_version", String(64), nullable=False),
    Column("deleting", Boolean, nullable=False, server_default=false()),
    Column("created_at", UtcTime, nullable=False),
    Column("updated_at", UtcTime, nullable=False),
    UniqueConstraint("tenant", "id"),
    # Keys only grow, even after deletes, so page tokens (the last key seen) stay valid.
    sqlite_autoincrement=True,
)

items = Table(
    "items",
    metadata,
    Column("session_key", BigInteger, ForeignKey("sessions.key"), primary_key=True),
    Column("seq", BigInteger, primary_key=True),
    Column("role", String(16), nullable=False),
    Column("content", Json, nullable=False),
    Column("name", String(MAX_NAME_LENGTH), nullable=False),
    Column("source_uri", Text),
    Column("source_version", Text),
    Column("source_observed_at", UtcTime),
    Column("tool_effect", String(16)),
    Column("tool_effect_source_arg", String(MAX_NAME_LENGTH)),
    # Tool items only: the call answered and the tool that answered it.
    Column("tool_use_id", String(MAX_NAME_LENGTH)),
    Column("tool_name", String(MAX_NAME_LENGTH)),
    Column("is_error", Boolean, nullable=False),
    Column("content_hash", String(64), nullable=False),
    Column("token_count", Integer, nullable=False),
    Column("author", String(MAX_NAME_LENGTH), nullable=False),
    # NULL when empty, as for most items: one JSON value less to decode per item.
    Column("metadata", Json),
    Column("created_at", UtcTime, nullable=False),
    # A call has at most one result (NULLs, on non-tool items, never collide).
    Index("uq_items_session_key_tool_use_id", "session_key", "tool_use_id", unique=True),
)

# Each item's whole text (what Retrieve returns), for substring and regex search. Indexed
# by trigrams outside this declaration where the database can (migration 0007): a pg_trgm
# GIN index on Postgres, an FTS5 table on SQLite.
item_texts = Table(
    "item_texts",
    metadata,
    Column("session_key", BigInteger, ForeignKey("sessions.key"), primary_key=True),
    Column("seq", BigInteger, primary_key=True),
    Column("text", Text, nullable=False),
)

# The same texts in overlapping chunks (contextd_storage.search.text_chunks), for full-text
# search: `number` counts a session's chunks (in seq order), so on SQLite a session's
# chunks are one range of full-text rowids. Indexed outside this declaration (migration
# 0005): a stored tsvector column `tsv` with a GIN index on Postgres, an FTS5 table on
# SQLite; `include_object` keeps schema comparisons off them.
item_text_chunks = Table(
    "item_text_chunks",
    metadata,
    Column("session_key", BigInteger, ForeignKey("sessions.key"), primary_key=True),
    Column("number", BigInteger, primary_key=True),
    Column("seq", BigInteger, nullable=False),
    Column("text", Text, nullable=False),
)

FULL_TEXT_OBJECTS = frozenset(
    {
        "ix_item_text_chunks_fts",
        "item_text_chunks_fts",
        "item_text_chunks_fts_data",
        "item_text_chunks_fts_idx",
        "item_text_chunks_fts_docsize",
        "item_text_chunks_fts_config",
        "item_text_chunks_fts_content",
        "ix_item_texts_trigrams",
        "item_texts_trigrams",
        "item_texts_trigrams_data",
        "item_texts_trigrams_idx",
        "item_texts_trigrams_config",
    }
)


def include_object(obj: object, name: str | None, type_: str, reflected: bool, compare_to: object) -> bool:
    """For schema comparisons (alembic): the full-text and trigram index objects are the
    migrations' alone."""
    return name not in FULL_TEXT_OBJECTS and not (type_ == "column" and name == "tsv")


tool_uses = Table(
    "tool_uses",
    metadata,
    Column("session_key", BigInteger, ForeignKey("sessions.key"), primary_key=True),
    Column("tool_use_id", String(MAX_NAME_LENGTH), primary_key=True),
    Column("seq", BigInteger, nullable=False),
    Column("name", String(MAX_NAME_LENGTH), nullable=False),
)

appends = Table(
    "appends",
    metadata,
    Column("session_key", BigInteger, ForeignKey("sessions.key"), primary_key=True),
    Column("idempotency_key", String(MAX_NAME_LENGTH), primary_key=True),
    Column("request_hash", String(64), nullable=False),
    Column("first_seq", BigInteger, nullable=False),
    Column("last_seq", BigInteger, nullable=False),
    Column("created_at", UtcTime, nullable=False),
)

# ------------------------------------------------------------- view engine

# What the previous render of a session sent, per format, and the edits in
# force (contextd.engine.state.ViewState as JSON): a full copy now and then,
# as of snapshot_version; view_version is the state's version, past the copy
# by the changes in view_state_changes.
view_states = Table(
    "view_states",
    metadata,
    Column("session_key", BigInteger, ForeignKey("sessions.key"), primary_key=True),
    Column("view_version", BigInteger, nullable=False),
    Column("state", Text, nullable=False),  # as of snapshot_version; view_state_changes since
    Column("updated_at", UtcTime, nullable=False),
    Column("snapshot_version", BigInteger, nullable=False, server_default="0"),
    Column("snapshot_bytes", BigInteger, nullable=False, server_default="0"),
    Column("change_bytes", BigInteger, nullable=False, server_default="0"),  # of the changes since
)

# One row per render since the full copy before the view state's last one: the
# change it made (engine/changes.py). Those after the last copy are applied in
# order to it; the earlier ones catch up a state held from before it
# (contextd_storage/views.py).
view_state_changes = Table(
    "view_state_changes",
    metadata,
    Column("session_key", BigInteger, ForeignKey("sessions.key"), primary_key=True),
    Column("view_version", BigInteger, primary_key=True),
    Column("change", Text, nullable=False),
)

pins = Table(
    "pins",
    metadata,
    Column("session_key", BigInteger, ForeignKey("sessions.key"), primary_key=True),
    Column("seq", BigInteger, primary_key=True),
    Column("created_at", UtcTime, nullable=False),
)

# Prunes the agent asked for, until a render decides them.
prune_proposals = Table(
    "prune_proposals",
    metadata,
    Column("id", AutoKey, primary_key=True, autoincrement=True),
    Column("session_key", BigInteger, ForeignKey("sessions.key"), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("reason", Text, nullable=False),
    Column("created_at", UtcTime, nullable=False),
    Index("ix_prune_proposals_session_key", "session_key"),
    sqlite_autoincrement=True,
)

# One row per decision, append-only and hash-chained per session.
certificates = Table(
    "certificates",
    metadata,
    Column("session_key", BigInteger, ForeignKey("sessions.key"), primary_key=True),
    Column("number", BigInteger, primary_key=True),
    Column("seq", BigInteger, nullable=False),
    Column("decision", String(16), nullable=False),
    Column("level", Integer, nullable=False),
    Column("rule", String(MAX_NAME_LENGTH), nullable=False),
    Column("reason", String(MAX_NAME_LENGTH), nullable=False),
    Column("evidence", Text, nullable=False),
    Column("rationale", Text, nullable=False),
    Column("handle", String(32), nullable=False),
    Column("protection", Text, nullable=False),
    Column("tokens_removed", BigInteger, nullable=False),
    Column("placeholder_tokens", BigInteger, nullable=False),
    Column("first_divergence_tokens", BigInteger, nullable=False),
    Column("mutation_radius_tokens", BigInteger, nullable=False),
    Column("cost_effect", Float, nullable=False),
    Column("control", String(16), nullable=False),
    Column("view_format", String(32), nullable=False),
    Column("view_version", BigInteger, nullable=False),
    Column("policy_version", String(64), nullable=False),
    Column("previous_hash", String(64), nullable=False),
    Column("hash", String(64), nullable=False),
    Column("created_at", UtcTime, nullable=False),
    Index("ix_certificates_session_key_seq", "session_key", "seq"),
)

# History mode: durable edits, appended as events; the item rows they change
# are never touched, so the pre-image stays in the history.
mutations = Table(
    "mutations",
    metadata,
    Column("session_key", BigInteger, ForeignKey("sessions.key"), primary_key=True),
    Column("number", BigInteger, primary_key=True),
    Column("seq", BigInteger, nullable=False),
    Column("edit", Json, nullable=False),
    Column("created_at", UtcTime, nullable=False),
    # A client's retraction: "retracted" or "redacted" (engine/retraction.py); NULL for a rule's edit.
    Column("retraction", String(16)),
)


# One row per render: how the call made with its view was expected to be billed (the
# session's policy's provider), and, once the client reported it (ReportUsage), how it was.
calls = Table(
    "calls",
    metadata,
    Column("session_key", BigInteger, ForeignKey("sessions.key"), primary_key=True),
    Column("view_version", BigInteger, primary_key=True),
    Column("view_format", String(32), nullable=False),
    Column("total_tokens", BigInteger, nullable=False),
    Column("predicted_cache_read", BigInteger, nullable=False),
    Column("predicted_cache_write", BigInteger, nullable=False),
    Column("predicted_uncached", BigInteger, nullable=False),
    Column("created_at", UtcTime, nullable=False),
    Column("provider", String(64)),
    Column("model", String(MAX_NAME_LENGTH)),
    Column("input_tokens", BigInteger),
    Column("output_tokens", BigInteger),
    Column("cache_read_tokens", BigInteger),
    Column("cache_write_tokens", BigInteger),
    Column("reported_at", UtcTime),
)


# What happened to sessions, for WatchSession (contextd_storage/events.py): written in the
# transaction of the change, read by every replica in (txid, id) order, deleted past the
# retention window. Not a child of `sessions`: a deleted session's last event outlives it.
events = Table(
    "events",
    metadata,
    Column("id", AutoKey, primary_key=True, autoincrement=True),
    # The writing transaction's id on Postgres (pg_current_xact_id); 0 on SQLite.
    Column("txid", BigInteger, nullable=False),
    Column("tenant", String(128), nullable=False),
    Column("session_id", String(128), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("body", Json, nullable=False),
    Column("created_at", UtcTime, nullable=False),
    Index("ix_events_txid_id", "txid", "id"),
    Index("ix_events_tenant_session_id_txid_id", "tenant", "session_id", "txid", "id"),
    sqlite_autoincrement=True,
)

# One row: the cursor through which events were pruned (a watcher resuming before it missed some).
events_pruned = Table(
    "events_pruned",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("txid", BigInteger, nullable=False),
    Column("event_id", BigInteger, nullable=False),
)
