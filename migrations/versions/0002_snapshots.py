"""Context snapshots, resolve records and the content-addressed blobs they point at.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from agentcontext.store._db.migrate import applies

# Frozen copy of the timestamp type at this revision (see 0001).
TIMESTAMP = sa.DateTime(timezone=True).with_variant(sa.String(32), "sqlite")

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if not applies(revision):
        return
    op.create_table(
        "blobs",
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("media_type", sa.String(length=255), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("hash", name=op.f("pk_blobs")),
    )
    op.create_table(
        "resolve_records",
        sa.Column("id", sa.String(length=255), nullable=False),
        sa.Column("chat_id", sa.String(length=255), nullable=False),
        sa.Column("branch_id", sa.String(length=255), nullable=True),
        sa.Column("branch_name", sa.String(length=255), nullable=True),
        sa.Column("head_message_id", sa.String(length=255), nullable=True),
        sa.Column("renderer", sa.String(length=255), nullable=False),
        sa.Column("prompt_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["chat_id"],
            ["chats.id"],
            name=op.f("fk_resolve_records_chat_id_chats"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["head_message_id"],
            ["messages.id"],
            name=op.f("fk_resolve_records_head_message_id_messages"),
        ),
        sa.ForeignKeyConstraint(
            ["prompt_hash"], ["blobs.hash"], name=op.f("fk_resolve_records_prompt_hash_blobs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_resolve_records")),
    )
    op.create_index(
        "ix_resolve_records_chat_id_created_at",
        "resolve_records",
        ["chat_id", "created_at"],
        unique=False,
    )
    op.create_index(
        "ix_resolve_records_head_message_id", "resolve_records", ["head_message_id"], unique=False
    )
    op.create_index(
        "ix_resolve_records_prompt_hash", "resolve_records", ["prompt_hash"], unique=False
    )
    op.create_table(
        "snapshots",
        sa.Column("id", sa.String(length=255), nullable=False),
        sa.Column("chat_id", sa.String(length=255), nullable=False),
        sa.Column("message_id", sa.String(length=255), nullable=True),
        sa.Column("selection", sa.String(length=16), nullable=False),
        sa.Column("summary", sa.Text(), nullable=True),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["chat_id"], ["chats.id"], name=op.f("fk_snapshots_chat_id_chats"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["message_id"], ["messages.id"], name=op.f("fk_snapshots_message_id_messages")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_snapshots")),
    )
    op.create_index(
        "ix_snapshots_chat_id_created_at", "snapshots", ["chat_id", "created_at"], unique=False
    )
    op.create_index("ix_snapshots_message_id", "snapshots", ["message_id"], unique=False)
    op.create_table(
        "record_messages",
        sa.Column("record_id", sa.String(length=255), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("message_id", sa.String(length=255), nullable=False),
        sa.Column("blob_hash", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(
            ["blob_hash"], ["blobs.hash"], name=op.f("fk_record_messages_blob_hash_blobs")
        ),
        sa.ForeignKeyConstraint(
            ["record_id"],
            ["resolve_records.id"],
            name=op.f("fk_record_messages_record_id_resolve_records"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("record_id", "position", name=op.f("pk_record_messages")),
    )
    op.create_index("ix_record_messages_blob_hash", "record_messages", ["blob_hash"], unique=False)
    op.create_table(
        "snapshot_items",
        sa.Column("snapshot_id", sa.String(length=255), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("blob_hash", sa.String(length=64), nullable=False),
        sa.Column("preview", sa.Text(), nullable=True),
        sa.Column("media_type", sa.String(length=255), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("selection", sa.String(length=16), nullable=True),
        sa.ForeignKeyConstraint(
            ["blob_hash"], ["blobs.hash"], name=op.f("fk_snapshot_items_blob_hash_blobs")
        ),
        sa.ForeignKeyConstraint(
            ["snapshot_id"],
            ["snapshots.id"],
            name=op.f("fk_snapshot_items_snapshot_id_snapshots"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("snapshot_id", "position", name=op.f("pk_snapshot_items")),
    )
    op.create_index("ix_snapshot_items_blob_hash", "snapshot_items", ["blob_hash"], unique=False)


def downgrade() -> None:
    if not applies(revision):
        return
    op.drop_index("ix_snapshot_items_blob_hash", table_name="snapshot_items")
    op.drop_table("snapshot_items")
    op.drop_index("ix_record_messages_blob_hash", table_name="record_messages")
    op.drop_table("record_messages")
    op.drop_index("ix_snapshots_message_id", table_name="snapshots")
    op.drop_index("ix_snapshots_chat_id_created_at", table_name="snapshots")
    op.drop_table("snapshots")
    op.drop_index("ix_resolve_records_prompt_hash", table_name="resolve_records")
    op.drop_index("ix_resolve_records_head_message_id", table_name="resolve_records")
    op.drop_index("ix_resolve_records_chat_id_created_at", table_name="resolve_records")
    op.drop_table("resolve_records")
    op.drop_table("blobs")
