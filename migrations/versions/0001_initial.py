"""The conversation graph: chats, messages, branches, checkpoints and the full-text index.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from agentcontext.store._db.migrate import applies

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the column types as they were at this revision.
JSON_DOC = (
    sa.JSON()
    .with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
    .with_variant(sa.Text(), "sqlite")
)
TIMESTAMP = sa.DateTime(timezone=True).with_variant(sa.String(32), "sqlite")
SEQ = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

SQLITE_FTS = [
    "CREATE VIRTUAL TABLE messages_fts USING fts5("
    "search_text, content='messages', content_rowid='seq', "
    "tokenize='unicode61 remove_diacritics 0')",
    "CREATE TRIGGER messages_fts_ai AFTER INSERT ON messages BEGIN "
    "INSERT INTO messages_fts(rowid, search_text) VALUES (new.seq, new.search_text); END",
    "CREATE TRIGGER messages_fts_ad AFTER DELETE ON messages BEGIN "
    "INSERT INTO messages_fts(messages_fts, rowid, search_text) "
    "VALUES ('delete', old.seq, old.search_text); END",
    "CREATE TRIGGER messages_fts_au AFTER UPDATE OF search_text ON messages BEGIN "
    "INSERT INTO messages_fts(messages_fts, rowid, search_text) "
    "VALUES ('delete', old.seq, old.search_text); "
    "INSERT INTO messages_fts(rowid, search_text) VALUES (new.seq, new.search_text); END",
]
SQLITE_FTS_DROP = [
    "DROP TRIGGER IF EXISTS messages_fts_au",
    "DROP TRIGGER IF EXISTS messages_fts_ad",
    "DROP TRIGGER IF EXISTS messages_fts_ai",
    "DROP TABLE IF EXISTS messages_fts",
]


def upgrade() -> None:
    if not applies(revision):
        return
    dialect = op.get_bind().dialect.name
    op.create_table(
        "chats",
        sa.Column("id", sa.String(length=255), nullable=False),
        sa.Column("user_id", sa.String(length=255), nullable=False),
        sa.Column("title", sa.Text(), nullable=True),
        sa.Column("metadata", JSON_DOC, nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        sa.Column("version", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("message_count", sa.BigInteger(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_chats")),
    )
    op.create_index("ix_chats_updated_at_id", "chats", ["updated_at", "id"])
    op.create_index("ix_chats_user_id_updated_at_id", "chats", ["user_id", "updated_at", "id"])
    op.create_table(
        "messages",
        sa.Column("seq", SEQ, autoincrement=True, nullable=False),
        sa.Column("id", sa.String(length=255), nullable=False),
        sa.Column("chat_id", sa.String(length=255), nullable=False),
        sa.Column("parent_id", sa.String(length=255), nullable=True),
        sa.Column("depth", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("type", sa.String(length=64), nullable=False),
        sa.Column("data", JSON_DOC, nullable=True),
        sa.Column("search_text", sa.Text(), server_default="", nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["chat_id"], ["chats.id"], name=op.f("fk_messages_chat_id_chats"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["parent_id"], ["messages.id"], name=op.f("fk_messages_parent_id_messages")
        ),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_messages")),
        sa.UniqueConstraint("id", name=op.f("uq_messages_id")),
    )
    op.create_index("ix_messages_chat_id_parent_id", "messages", ["chat_id", "parent_id"])
    op.create_index("ix_messages_parent_id", "messages", ["parent_id"])
    op.create_index("ix_messages_chat_id_version", "messages", ["chat_id", "version"])
    op.create_table(
        "branches",
        sa.Column("id", sa.String(length=255), nullable=False),
        sa.Column("chat_id", sa.String(length=255), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("head_message_id", sa.String(length=255), nullable=True),
        sa.Column("is_active", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["chat_id"], ["chats.id"], name=op.f("fk_branches_chat_id_chats"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["head_message_id"],
            ["messages.id"],
            name=op.f("fk_branches_head_message_id_messages"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_branches")),
        sa.UniqueConstraint("chat_id", "name", name=op.f("uq_branches_chat_id_name")),
    )
    op.create_index("ix_branches_head_message_id", "branches", ["head_message_id"])
    op.create_index(
        "uq_branches_chat_id_active",
        "branches",
        ["chat_id"],
        unique=True,
        sqlite_where=sa.text("is_active"),
        postgresql_where=sa.text("is_active"),
    )
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.String(length=255), nullable=False),
        sa.Column("chat_id", sa.String(length=255), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("message_id", sa.String(length=255), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["chat_id"], ["chats.id"], name=op.f("fk_checkpoints_chat_id_chats"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["message_id"], ["messages.id"], name=op.f("fk_checkpoints_message_id_messages")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_checkpoints")),
        sa.UniqueConstraint("chat_id", "name", name=op.f("uq_checkpoints_chat_id_name")),
    )
    op.create_index("ix_checkpoints_message_id", "checkpoints", ["message_id"])

    # Full-text search over message text.
    if dialect == "postgresql":
        op.create_index(
            "ix_messages_search_text_tsv",
            "messages",
            [sa.literal_column("to_tsvector('simple', search_text)")],
            postgresql_using="gin",
        )
    elif dialect == "sqlite":
        for statement in SQLITE_FTS:
            op.execute(statement)


def downgrade() -> None:
    if not applies(revision):
        return
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.drop_index("ix_messages_search_text_tsv", table_name="messages")
    elif dialect == "sqlite":
        for statement in SQLITE_FTS_DROP:
            op.execute(statement)
    op.drop_table("checkpoints")
    op.drop_table("branches")
    op.drop_table("messages")
    op.drop_table("chats")
