"""PostgreSQL keeps chats' metadata as written (``json``, not ``jsonb``).

``jsonb`` stores numbers as ``numeric`` and writes them back in its own form: a float such as
``1e308`` or ``1.5e300`` came back as an integer of 309 digits, and ``-0.0`` as ``0.0``, so a
chat's metadata read on PostgreSQL was not what was written, and its export differed from the
same chat's on SQLite and MariaDB. ``json`` keeps the text the library wrote (checked as JSON
on the way in); metadata filters cast it to ``jsonb`` where they look inside (no index reads
it). Values written before this revision keep the form ``jsonb`` gave them.

Elsewhere this revision does nothing.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op
from sqlalchemy.dialects import postgresql

from agentcontext.store._db.migrate import applies

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if not applies(revision) or op.get_bind().dialect.name != "postgresql":
        return
    op.alter_column(
        "chats",
        "metadata",
        type_=postgresql.JSON(),
        existing_type=postgresql.JSONB(),
        existing_nullable=False,
        postgresql_using="metadata::json",
    )


def downgrade() -> None:
    if not applies(revision) or op.get_bind().dialect.name != "postgresql":
        return
    op.alter_column(
        "chats",
        "metadata",
        type_=postgresql.JSONB(),
        existing_type=postgresql.JSON(),
        existing_nullable=False,
        postgresql_using="metadata::jsonb",
    )
