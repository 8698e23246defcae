"""View state changes: a render stores what it changed in the session's view state, not the
whole state again.

`view_states.state` becomes a full copy made now and then, as of `snapshot_version`;
`view_state_changes` holds one row per render since, each the change that render made
(service/contextd/engine/changes.py). The state of `view_states.view_version` is the copy
with the changes after it applied in order (storage/contextd_storage/views.py). A state
stored before this migration is a copy of its own version.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

from functools import reduce

import sqlalchemy as sa
from alembic import op

from contextd.engine.changes import advance, change_from_json
from contextd.engine.state import state_from_json, state_to_json

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for column in ("snapshot_version", "snapshot_bytes", "change_bytes"):
        op.add_column("view_states", sa.Column(column, sa.BigInteger, nullable=False, server_default="0"))
    length = "octet_length(state)" if op.get_context().dialect.name == "postgresql" else "length(state)"
    op.execute(f"UPDATE view_states SET snapshot_version = view_version, snapshot_bytes = {length}")
    op.create_table(
        "view_state_changes",
        sa.Column("session_key", sa.BigInteger, nullable=False),
        sa.Column("view_version", sa.BigInteger, nullable=False),
        sa.Column("change", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("session_key", "view_version", name="pk_view_state_changes"),
        sa.ForeignKeyConstraint(["session_key"], ["sessions.key"], name="fk_view_state_changes_session_key_sessions"),
    )


def downgrade() -> None:
    # Each state whole again, as of its version: its copy with its changes applied.
    conn = op.get_bind()
    keys = conn.execute(sa.text("SELECT DISTINCT session_key FROM view_state_changes")).scalars().all()
    for key in keys:
        copy = conn.execute(
            sa.text("SELECT state FROM view_states WHERE session_key = :key"), {"key": key}
        ).scalar_one()
        changes = conn.execute(
            sa.text("SELECT change FROM view_state_changes WHERE session_key = :key ORDER BY view_version"),
            {"key": key},
        ).scalars()
        state = reduce(advance, map(change_from_json, changes), state_from_json(copy))
        conn.execute(
            sa.text("UPDATE view_states SET state = :state WHERE session_key = :key"),
            {"state": state_to_json(state), "key": key},
        )
    op.drop_table("view_state_changes")
    # Not batch operations: on SQLite those would copy the table. SQLite drops a column
    # itself since 3.35.
    for column in ("change_bytes", "snapshot_bytes", "snapshot_version"):
        op.execute(f"ALTER TABLE view_states DROP COLUMN {column}")
