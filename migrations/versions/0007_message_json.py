"""Messages keep their JSON as written (PostgreSQL ``json``, not ``jsonb``).

A message is written once and read whole, never queried inside: ``jsonb`` paid for a binary
form the store never uses, and turning it back into text on every read was a third of the
time of loading a long chain (10 000 messages: 46 ms of server time against 30 ms). ``json``
keeps the text the library wrote, still checked as JSON on the way in. SQLite keeps its text
column; chats' metadata stays ``jsonb`` (filters query inside it).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op
from sqlalchemy.dialects import postgresql

from agentcontext.store._db.migrate import applies

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if not applies(revision):
        return
    if op.get_bind().dialect.name != "postgresql":
        return
    op.alter_column(
        "messages",
        "data",
        type_=postgresql.JSON(),
        existing_type=postgresql.JSONB(),
        existing_nullable=True,
        postgresql_using="data::json",
    )


def downgrade() -> None:
    if not applies(revision):
        return
    if op.get_bind().dialect.name != "postgresql":
        return
    op.alter_column(
        "messages",
        "data",
        type_=postgresql.JSONB(),
        existing_type=postgresql.JSON(),
        existing_nullable=True,
        postgresql_using="data::jsonb",
    )
