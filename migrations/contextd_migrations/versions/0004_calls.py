"""Calls: per render, the usage the engine predicts for the call made with its view, and the
usage the client reports for it (ReportUsage), side by side.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

utc = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "calls",
        sa.Column("session_key", sa.BigInteger, nullable=False),
        sa.Column("view_version", sa.BigInteger, nullable=False),
        sa.Column("view_format", sa.String(32), nullable=False),
        sa.Column("total_tokens", sa.BigInteger, nullable=False),
        sa.Column("predicted_cache_read", sa.BigInteger, nullable=False),
        sa.Column("predicted_cache_write", sa.BigInteger, nullable=False),
        sa.Column("predicted_uncached", sa.BigInteger, nullable=False),
        sa.Column("created_at", utc, nullable=False),
        sa.Column("provider", sa.String(64)),
        sa.Column("model", sa.String(256)),
        sa.Column("input_tokens", sa.BigInteger),
        sa.Column("output_tokens", sa.BigInteger),
        sa.Column("cache_read_tokens", sa.BigInteger),
        sa.Column("cache_write_tokens", sa.BigInteger),
        sa.Column("reported_at", utc),
        sa.PrimaryKeyConstraint("session_key", "view_version", name="pk_calls"),
        sa.ForeignKeyConstraint(["session_key"], ["sessions.key"], name="fk_calls_session_key_sessions"),
    )


def downgrade() -> None:
    op.drop_table("calls")
