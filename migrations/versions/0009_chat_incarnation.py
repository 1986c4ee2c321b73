"""Chats carry an incarnation: a random number drawn each time a chat row is inserted.

A chat deleted and created again under the same id (a restore with ``import_chat``, a new
first save, ``copy_chat`` into the id) starts its change version at 1 again and may keep its
creation time and branch ids (an import keeps them). What a process remembers of a chat (the
decoded chains of ``cache_bytes``, the viewer's outlines) and what a long-lived engine holds
are therefore tied to ``(chat id, incarnation)``: a chat inserted again is another chat to
them, never served from what the deleted one held.

Chats that exist before this revision keep ``0``; every insert after it draws a new value.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from agentcontext.store._db.migrate import applies

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _has_column() -> bool:
    """Whether ``chats.incarnation`` exists already (a step cut short on a database whose DDL
    is not transactional is run again from the start)."""
    if op.get_context().as_sql:  # offline (``alembic upgrade --sql``): nothing to inspect
        return False
    inspector = sa.inspect(op.get_bind())
    schema = op.get_context().version_table_schema
    return any(column["name"] == "incarnation" for column in inspector.get_columns("chats", schema))


def upgrade() -> None:
    if not applies(revision):
        return
    if not _has_column():
        op.add_column(
            "chats", sa.Column("incarnation", sa.BigInteger(), server_default="0", nullable=False)
        )


def downgrade() -> None:
    if not applies(revision):
        return
    if not op.get_context().as_sql and not _has_column():
        return
    if op.get_bind().dialect.name == "sqlite":
        # Natively (SQLite 3.35+): a batch copy of the table would break the append trigger.
        op.execute("ALTER TABLE chats DROP COLUMN incarnation")
    else:
        op.drop_column("chats", "incarnation")
