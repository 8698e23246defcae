"""View engine: view states, pins, prune proposals, certificates and mutations.

Certificates and mutations are append-only like the history: the same
trigger refuses UPDATE and DELETE (and, on Postgres, TRUNCATE) unless the
whole session is being deleted.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

APPEND_ONLY = ("certificates", "mutations")

utc = sa.DateTime(timezone=True)
key_type = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "view_states",
        sa.Column("session_key", sa.BigInteger, nullable=False),
        sa.Column("view_version", sa.BigInteger, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("updated_at", utc, nullable=False),
        sa.PrimaryKeyConstraint("session_key", name="pk_view_states"),
        sa.ForeignKeyConstraint(["session_key"], ["sessions.key"], name="fk_view_states_session_key_sessions"),
    )
    op.create_table(
        "pins",
        sa.Column("session_key", sa.BigInteger, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("created_at", utc, nullable=False),
        sa.PrimaryKeyConstraint("session_key", "seq", name="pk_pins"),
        sa.ForeignKeyConstraint(["session_key"], ["sessions.key"], name="fk_pins_session_key_sessions"),
    )
    op.create_table(
        "prune_proposals",
        sa.Column("id", key_type, primary_key=True, autoincrement=True),
        sa.Column("session_key", sa.BigInteger, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("created_at", utc, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_prune_proposals"),
        sa.ForeignKeyConstraint(["session_key"], ["sessions.key"], name="fk_prune_proposals_session_key_sessions"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_prune_proposals_session_key", "prune_proposals", ["session_key"])
    op.create_table(
        "certificates",
        sa.Column("session_key", sa.BigInteger, nullable=False),
        sa.Column("number", sa.BigInteger, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("decision", sa.String(16), nullable=False),
        sa.Column("level", sa.Integer, nullable=False),
        sa.Column("rule", sa.String(256), nullable=False),
        sa.Column("reason", sa.String(256), nullable=False),
        sa.Column("evidence", sa.Text, nullable=False),
        sa.Column("rationale", sa.Text, nullable=False),
        sa.Column("handle", sa.String(32), nullable=False),
        sa.Column("protection", sa.Text, nullable=False),
        sa.Column("tokens_removed", sa.BigInteger, nullable=False),
        sa.Column("placeholder_tokens", sa.BigInteger, nullable=False),
        sa.Column("first_divergence_tokens", sa.BigInteger, nullable=False),
        sa.Column("mutation_radius_tokens", sa.BigInteger, nullable=False),
        sa.Column("cost_effect", sa.Float, nullable=False),
        sa.Column("control", sa.String(16), nullable=False),
        sa.Column("view_format", sa.String(32), nullable=False),
        sa.Column("view_version", sa.BigInteger, nullable=False),
        sa.Column("policy_version", sa.String(64), nullable=False),
        sa.Column("previous_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("created_at", utc, nullable=False),
        sa.PrimaryKeyConstraint("session_key", "number", name="pk_certificates"),
        sa.ForeignKeyConstraint(["session_key"], ["sessions.key"], name="fk_certificates_session_key_sessions"),
    )
    op.create_index("ix_certificates_session_key_seq", "certificates", ["session_key", "seq"])
    op.create_table(
        "mutations",
        sa.Column("session_key", sa.BigInteger, nullable=False),
        sa.Column("number", sa.BigInteger, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("edit", sa.JSON(), nullable=False),
        sa.Column("created_at", utc, nullable=False),
        sa.PrimaryKeyConstraint("session_key", "number", name="pk_mutations"),
        sa.ForeignKeyConstraint(["session_key"], ["sessions.key"], name="fk_mutations_session_key_sessions"),
    )
    postgres = op.get_context().dialect.name == "postgresql"
    for table in APPEND_ONLY:
        if postgres:
            # The functions come from revision 0001.
            op.execute(
                f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION contextd_refuse_history_change()"
            )
            op.execute(
                f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
                "FOR EACH STATEMENT EXECUTE FUNCTION contextd_refuse_truncate()"
            )
        else:
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
    op.drop_table("mutations")
    op.drop_index("ix_certificates_session_key_seq", table_name="certificates")
    op.drop_table("certificates")
    op.drop_index("ix_prune_proposals_session_key", table_name="prune_proposals")
    op.drop_table("prune_proposals")
    op.drop_table("pins")
    op.drop_table("view_states")
