"""L0 history: sessions, append-only items, tool calls and idempotency records.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

APPEND_ONLY = ("items", "tool_uses", "appends")

json_type = sa.JSON()  # json, not jsonb: content may hold NUL characters
key_type = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
utc = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("key", key_type, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.Column("token_count", sa.BigInteger, nullable=False),
        sa.Column("metadata", json_type, nullable=False),
        sa.Column("policy", sa.Text, nullable=False),
        sa.Column("policy_version", sa.String(64), nullable=False),
        sa.Column("deleting", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("created_at", utc, nullable=False),
        sa.Column("updated_at", utc, nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_sessions"),
        sa.UniqueConstraint("tenant", "id", name="uq_sessions_tenant_id"),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "items",
        sa.Column("session_key", sa.BigInteger, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("content", json_type, nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("source_uri", sa.Text),
        sa.Column("source_version", sa.Text),
        sa.Column("source_observed_at", utc),
        sa.Column("tool_effect", sa.String(16)),
        sa.Column("tool_effect_source_arg", sa.String(256)),
        sa.Column("tool_use_id", sa.String(256)),
        sa.Column("tool_name", sa.String(256)),
        sa.Column("is_error", sa.Boolean, nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("token_count", sa.Integer, nullable=False),
        sa.Column("author", sa.String(256), nullable=False),
        sa.Column("metadata", json_type),
        sa.Column("created_at", utc, nullable=False),
        sa.PrimaryKeyConstraint("session_key", "seq", name="pk_items"),
        sa.ForeignKeyConstraint(["session_key"], ["sessions.key"], name="fk_items_session_key_sessions"),
    )
    op.create_index("uq_items_session_key_tool_use_id", "items", ["session_key", "tool_use_id"], unique=True)
    op.create_table(
        "tool_uses",
        sa.Column("session_key", sa.BigInteger, nullable=False),
        sa.Column("tool_use_id", sa.String(256), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.PrimaryKeyConstraint("session_key", "tool_use_id", name="pk_tool_uses"),
        sa.ForeignKeyConstraint(["session_key"], ["sessions.key"], name="fk_tool_uses_session_key_sessions"),
    )
    op.create_table(
        "appends",
        sa.Column("session_key", sa.BigInteger, nullable=False),
        sa.Column("idempotency_key", sa.String(256), nullable=False),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("first_seq", sa.BigInteger, nullable=False),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
        sa.Column("created_at", utc, nullable=False),
        sa.PrimaryKeyConstraint("session_key", "idempotency_key", name="pk_appends"),
        sa.ForeignKeyConstraint(["session_key"], ["sessions.key"], name="fk_appends_session_key_sessions"),
    )
    if op.get_context().dialect.name == "postgresql":
        _postgres_append_only()
    else:
        _sqlite_append_only()


def _postgres_append_only() -> None:
    # Rows of the history tables may only be deleted as part of deleting a
    # whole session, which first marks the session row `deleting`.
    op.execute(
        """
        CREATE FUNCTION contextd_refuse_history_change() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'DELETE' AND EXISTS (
                SELECT 1 FROM sessions WHERE key = OLD.session_key AND deleting
            ) THEN
                RETURN OLD;
            END IF;
            RAISE EXCEPTION 'contextd: % is append-only; % refused', TG_TABLE_NAME, TG_OP
                USING ERRCODE = 'restrict_violation';
        END $$
        """
    )
    op.execute(
        """
        CREATE FUNCTION contextd_refuse_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'contextd: % is append-only; TRUNCATE refused', TG_TABLE_NAME
                USING ERRCODE = 'restrict_violation';
        END $$
        """
    )
    for table in APPEND_ONLY:
        op.execute(
            f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION contextd_refuse_history_change()"
        )
        op.execute(
            f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION contextd_refuse_truncate()"
        )


def _sqlite_append_only() -> None:
    for table in APPEND_ONLY:
        op.execute(
            f"CREATE TRIGGER {table}_no_update BEFORE UPDATE ON {table} "
            f"BEGIN SELECT RAISE(ABORT, 'contextd: {table} is append-only; UPDATE refused'); END"
        )
        op.execute(
            f"CREATE TRIGGER {table}_no_delete BEFORE DELETE ON {table} "
            "WHEN NOT EXISTS (SELECT 1 FROM sessions WHERE key = OLD.session_key AND deleting) "
            f"BEGIN SELECT RAISE(ABORT, 'contextd: {table} is append-only; DELETE refused'); END"
        )


def downgrade() -> None:
    postgres = op.get_context().dialect.name == "postgresql"
    for table in APPEND_ONLY:
        if postgres:
            op.execute(f"DROP TRIGGER {table}_append_only ON {table}")
            op.execute(f"DROP TRIGGER {table}_no_truncate ON {table}")
        else:
            op.execute(f"DROP TRIGGER {table}_no_update")
            op.execute(f"DROP TRIGGER {table}_no_delete")
    if postgres:
        op.execute("DROP FUNCTION contextd_refuse_history_change()")
        op.execute("DROP FUNCTION contextd_refuse_truncate()")
    op.drop_table("appends")
    op.drop_table("tool_uses")
    op.drop_index("uq_items_session_key_tool_use_id", table_name="items")
    op.drop_table("items")
    op.drop_table("sessions")
