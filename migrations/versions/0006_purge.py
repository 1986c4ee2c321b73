"""Chats remember when their unreachable history was purged.

``purge()`` deletes the messages no branch, checkpoint or compaction tail reaches; the chat's
``purged_at`` then names the purge when a caller asks for one of those ids (a rewind into
purged history says so instead of only "not found"). Chats never purged hold NULL.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from agentcontext.store._db.migrate import applies

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if not applies(revision):
        return
    timestamp = sa.DateTime(timezone=True).with_variant(sa.String(32), "sqlite")
    op.add_column("chats", sa.Column("purged_at", timestamp, nullable=True))


def downgrade() -> None:
    if not applies(revision):
        return
    if op.get_bind().dialect.name == "sqlite":
        # Natively (SQLite 3.35+): a batch copy of the table would break the append trigger.
        op.execute("ALTER TABLE chats DROP COLUMN purged_at")
    else:
        op.drop_column("chats", "purged_at")
