"""Session events: the log WatchSession reads (storage/contextd_storage/events.py).

`events` holds one row per change to a session, written in the change's transaction and
ordered by (txid, id); `events_pruned` holds one row, the cursor through which events
past the retention window were deleted.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    sqlite = op.get_context().dialect.name == "sqlite"
    op.create_table(
        "events",
        sa.Column("id", sa.Integer if sqlite else sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("txid", sa.BigInteger, nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("body", sa.JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_events"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_events_txid_id", "events", ["txid", "id"])
    op.create_index("ix_events_tenant_session_id_txid_id", "events", ["tenant", "session_id", "txid", "id"])
    op.create_table(
        "events_pruned",
        sa.Column("id", sa.Integer, nullable=False),
        sa.Column("txid", sa.BigInteger, nullable=False),
        sa.Column("event_id", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_events_pruned"),
    )
    op.execute("INSERT INTO events_pruned (id, txid, event_id) VALUES (1, 0, 0)")


def downgrade() -> None:
    op.drop_table("events_pruned")
    op.drop_index("ix_events_tenant_session_id_txid_id", "events")
    op.drop_index("ix_events_txid_id", "events")
    op.drop_table("events")
