"""Checkpoints remember the branch they were made on.

``restore()`` names the new branch after the checkpoint's branch (``topic-v2`` for a checkpoint
made on ``topic``), not after the branch the engine happens to be on. Checkpoints made before
this revision have none, and are named after the engine's branch as before.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from agentcontext.store._db.migrate import applies

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if not applies(revision):
        return
    with op.batch_alter_table("checkpoints") as batch:
        batch.add_column(sa.Column("branch_id", sa.String(255), nullable=True))


def downgrade() -> None:
    if not applies(revision):
        return
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_column("branch_id")
