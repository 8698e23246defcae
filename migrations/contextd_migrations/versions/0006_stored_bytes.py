"""Stored bytes: each session counts the bytes of its items, so a tenant's stored bytes
(the sum over its sessions) can be held to a quota (service/contextd/admission.py).

An append adds its items' bytes of text and data (service/contextd/engine/validation.py,
`item_bytes`). Sessions that exist already are counted here by the length of
their items' stored content, a close upper bound of the same (it adds the
JSON's own punctuation).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("sessions", sa.Column("stored_bytes", sa.BigInteger, nullable=False, server_default="0"))
    length = "octet_length(i.content::text)" if op.get_context().dialect.name == "postgresql" else "length(i.content)"
    op.execute(
        f"UPDATE sessions SET stored_bytes = "
        f"(SELECT coalesce(sum({length}), 0) FROM items i WHERE i.session_key = sessions.key)"
    )


def downgrade() -> None:
    # Not a batch operation: on SQLite that would copy `sessions`, which the history
    # tables' triggers name. SQLite drops a column itself since 3.35.
    op.execute("ALTER TABLE sessions DROP COLUMN stored_bytes")
