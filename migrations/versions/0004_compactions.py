"""Compactions: summaries stored beside a branch, found by depth.

`ContextEngine.compact` stores a summary as a message of type ``compaction`` whose parent is
the last message it folds. A partial index over those rows lets a chain load find the
compaction that applies to its head without reading the folded messages.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from agentcontext.store._db.migrate import applies

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if not applies(revision):
        return
    op.create_index(
        "ix_messages_compactions",
        "messages",
        ["chat_id", "depth"],
        sqlite_where=sa.text("type = 'compaction'"),
        postgresql_where=sa.text("type = 'compaction'"),
    )


def downgrade() -> None:
    if not applies(revision):
        return
    op.drop_index("ix_messages_compactions", table_name="messages")
