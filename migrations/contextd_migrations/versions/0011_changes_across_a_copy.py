"""View state changes kept across a full copy: a render that stores a copy keeps the changes since
the copy before it, and stores its own (storage/contextd_storage/views.py), so that a state held
from before the copy (a replica's, a carry kept in Redis) is caught up by changes.

Nothing changes as this upgrades: the rule applies as renders store copies. A downgrade deletes
each session's changes up to its copy, which the code before this revision takes to be none
(its 0008 downgrade folds every change left into the copy).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    op.execute(
        "DELETE FROM view_state_changes WHERE view_version <= ("
        "SELECT snapshot_version FROM view_states WHERE view_states.session_key = view_state_changes.session_key)"
    )
