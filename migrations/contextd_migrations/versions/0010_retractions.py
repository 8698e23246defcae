"""Retractions: a mutation row says whether it is a client's retraction, and whether a
redaction (storage/contextd_storage/views.py, `retractions`), so reads can withhold a
redacted item without decoding every edit.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ADD COLUMN on both backends: a batch (table copy) on SQLite would drop the
    # append-only triggers revision 0002 put on the table.
    op.add_column("mutations", sa.Column("retraction", sa.String(16), nullable=True))


def downgrade() -> None:
    if op.get_context().dialect.name == "sqlite":
        op.execute("ALTER TABLE mutations DROP COLUMN retraction")  # SQLite 3.35+, in place
    else:
        op.drop_column("mutations", "retraction")
