"""MariaDB and MySQL: the schema of revision 0010, made at once.

A MariaDB/MySQL database starts here (`Dialect.first_revision`): revisions 0001-0010 are
skipped on it, and this one makes every table as the other databases have them after 0010,
with what these servers need instead of what they lack:

- every table ``utf8mb4`` in a binary collation that does not pad (``utf8mb4_nopad_bin`` on
  MariaDB, ``utf8mb4_0900_bin`` on MySQL): ids compare byte for byte, whatever the
  database's or the server's default collation;
- one active branch per chat: a unique index on a generated column that holds the chat id of
  the active branch and NULL for the others (these servers have no partial index);
- compaction summaries found by ``(chat_id, type, depth)`` (no partial index either);
- the search index ``message_terms (seq, term)``, a row per search term of a message, kept by
  the store (``agentcontext.store._dialects.mysql``) and deleted with its message by a
  cascading foreign key;
- DDL is not transactional here: every step (a table, then its indexes, then the foreign
  keys, each found by its indexes) is made only if it is missing, so a run cut short is
  finished by running it again.

The tables are frozen here as they were at this revision (later revisions change them with
their own steps). Elsewhere this revision does nothing.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql
from sqlalchemy.schema import AddConstraint, CreateIndex, CreateTable, DropTable

from agentcontext.store._db.migrate import applies

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MYSQL = ("mysql", "mariadb")
ID = sa.String(255)
HASH = sa.String(64)
TIME = mysql.DATETIME(fsp=6)


def _tables(collation: str) -> list[sa.Table]:
    """The tables as they are at this revision, in an order where a table comes after those
    it refers to. Their foreign keys are added after their indexes, which serve them."""
    meta = sa.MetaData()
    options = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": collation}

    def table(name: str, *items: sa.SchemaItem) -> sa.Table:
        return sa.Table(name, meta, *items, **options)

    def fk(column: str, target: str, name: str, cascade: bool = False) -> sa.ForeignKeyConstraint:
        return sa.ForeignKeyConstraint(
            [column], [target], name=name, ondelete="CASCADE" if cascade else None
        )

    return [
        table(
            "blobs",
            sa.Column("hash", HASH, primary_key=True),
            sa.Column("size", sa.BigInteger, nullable=False),
            sa.Column("media_type", ID, nullable=False),
            sa.Column("content", mysql.LONGBLOB, nullable=False),
            sa.Column("created_at", TIME, nullable=False),
        ),
        table(
            "chats",
            sa.Column("id", ID, primary_key=True),
            sa.Column("user_id", ID, nullable=False),
            sa.Column("title", mysql.LONGTEXT),
            sa.Column("metadata", mysql.LONGTEXT, nullable=False),
            sa.Column("created_at", TIME, nullable=False),
            sa.Column("updated_at", TIME, nullable=False),
            sa.Column("version", sa.BigInteger, nullable=False, server_default="0"),
            sa.Column("message_count", sa.BigInteger, nullable=False, server_default="0"),
            sa.Column("purged_at", TIME),
            sa.Column("incarnation", sa.BigInteger, nullable=False, server_default="0"),
            sa.Index("ix_chats_updated_at_id", "updated_at", "id"),
            sa.Index("ix_chats_user_id_updated_at_id", "user_id", "updated_at", "id"),
        ),
        table(
            "messages",
            sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=True),
            sa.Column("id", ID, nullable=False),
            sa.Column("chat_id", ID, nullable=False),
            sa.Column("parent_id", ID),
            sa.Column("depth", sa.Integer, nullable=False),
            sa.Column("name", ID, nullable=False),
            sa.Column("type", sa.String(64), nullable=False),
            sa.Column("data", mysql.LONGTEXT),
            sa.Column("search_hashes", sa.LargeBinary),
            sa.Column("created_at", TIME, nullable=False),
            sa.Column("version", sa.BigInteger, nullable=False),
            sa.UniqueConstraint("id", name="uq_messages_id"),
            sa.Index("ix_messages_chat_id_depth", "chat_id", "depth"),
            sa.Index("ix_messages_chat_id_version", "chat_id", "version"),
            sa.Index("ix_messages_parent_id", "parent_id"),
            sa.Index("ix_messages_compactions", "chat_id", "type", "depth"),
            fk("chat_id", "chats.id", "fk_messages_chat_id_chats", cascade=True),
            fk("parent_id", "messages.id", "fk_messages_parent_id_messages"),
        ),
        table(
            "message_terms",
            sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("term", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Index("ix_message_terms_term_seq", "term", "seq"),
            fk("seq", "messages.seq", "fk_message_terms_seq_messages", cascade=True),
        ),
        table(
            "branches",
            sa.Column("id", ID, primary_key=True),
            sa.Column("chat_id", ID, nullable=False),
            sa.Column("name", ID, nullable=False),
            sa.Column("head_message_id", ID),
            sa.Column("head_depth", sa.Integer, nullable=False, server_default="0"),
            sa.Column(
                "is_active",
                sa.Boolean(create_constraint=False),
                nullable=False,
                server_default=sa.false(),
            ),
            sa.Column("created_at", TIME, nullable=False),
            # The chat of the active branch, NULL for the others: unique, so one per chat.
            sa.Column(
                "active_chat_id", ID, sa.Computed("IF(is_active, chat_id, NULL)", persisted=False)
            ),
            sa.UniqueConstraint("chat_id", "name", name="uq_branches_chat_id_name"),
            sa.UniqueConstraint("active_chat_id", name="uq_branches_chat_id_active"),
            sa.Index("ix_branches_head_message_id", "head_message_id"),
            fk("chat_id", "chats.id", "fk_branches_chat_id_chats", cascade=True),
            fk("head_message_id", "messages.id", "fk_branches_head_message_id_messages"),
        ),
        table(
            "checkpoints",
            sa.Column("id", ID, primary_key=True),
            sa.Column("chat_id", ID, nullable=False),
            sa.Column("name", ID, nullable=False),
            sa.Column("message_id", ID, nullable=False),
            sa.Column("created_at", TIME, nullable=False),
            sa.Column("branch_id", ID),
            sa.UniqueConstraint("chat_id", "name", name="uq_checkpoints_chat_id_name"),
            sa.Index("ix_checkpoints_message_id", "message_id"),
            fk("chat_id", "chats.id", "fk_checkpoints_chat_id_chats", cascade=True),
            fk("message_id", "messages.id", "fk_checkpoints_message_id_messages"),
        ),
        table(
            "resolve_records",
            sa.Column("id", ID, primary_key=True),
            sa.Column("chat_id", ID, nullable=False),
            sa.Column("branch_id", ID),
            sa.Column("branch_name", ID),
            sa.Column("head_message_id", ID),
            sa.Column("renderer", ID, nullable=False),
            sa.Column("prompt_hash", HASH, nullable=False),
            sa.Column("created_at", TIME, nullable=False),
            sa.Index("ix_resolve_records_chat_id_created_at", "chat_id", "created_at"),
            sa.Index("ix_resolve_records_prompt_hash", "prompt_hash"),
            sa.Index("ix_resolve_records_head_message_id", "head_message_id"),
            fk("chat_id", "chats.id", "fk_resolve_records_chat_id_chats", cascade=True),
            fk("head_message_id", "messages.id", "fk_resolve_records_head_message_id_messages"),
            fk("prompt_hash", "blobs.hash", "fk_resolve_records_prompt_hash_blobs"),
        ),
        table(
            "snapshots",
            sa.Column("id", ID, primary_key=True),
            sa.Column("chat_id", ID, nullable=False),
            sa.Column("message_id", ID),
            sa.Column("selection", sa.String(16), nullable=False),
            sa.Column("summary", mysql.LONGTEXT),
            sa.Column("created_at", TIME, nullable=False),
            sa.Index("ix_snapshots_chat_id_created_at", "chat_id", "created_at"),
            sa.Index("ix_snapshots_message_id", "message_id"),
            fk("chat_id", "chats.id", "fk_snapshots_chat_id_chats", cascade=True),
            fk("message_id", "messages.id", "fk_snapshots_message_id_messages"),
        ),
        table(
            "record_messages",
            sa.Column("record_id", ID, primary_key=True),
            sa.Column("position", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("message_id", ID, nullable=False),
            sa.Column("blob_hash", HASH, nullable=False),
            sa.Index("ix_record_messages_blob_hash", "blob_hash"),
            fk(
                "record_id",
                "resolve_records.id",
                "fk_record_messages_record_id_resolve_records",
                cascade=True,
            ),
            fk("blob_hash", "blobs.hash", "fk_record_messages_blob_hash_blobs"),
        ),
        table(
            "snapshot_items",
            sa.Column("snapshot_id", ID, primary_key=True),
            sa.Column("position", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("kind", sa.String(16), nullable=False),
            sa.Column("path", mysql.LONGTEXT, nullable=False),
            sa.Column("blob_hash", HASH, nullable=False),
            sa.Column("preview", mysql.LONGTEXT),
            sa.Column("media_type", ID, nullable=False),
            sa.Column("size", sa.BigInteger, nullable=False),
            sa.Column("selection", sa.String(16)),
            sa.Index("ix_snapshot_items_blob_hash", "blob_hash"),
            fk(
                "snapshot_id",
                "snapshots.id",
                "fk_snapshot_items_snapshot_id_snapshots",
                cascade=True,
            ),
            fk("blob_hash", "blobs.hash", "fk_snapshot_items_blob_hash_blobs"),
        ),
    ]


def _mysql() -> bool:
    return applies(revision) and op.get_context().dialect.name in MYSQL


def _collation() -> str:
    return "utf8mb4_nopad_bin" if op.get_context().dialect.is_mariadb else "utf8mb4_0900_bin"


def upgrade() -> None:
    if not _mysql():
        return
    offline = op.get_context().as_sql
    schema = op.get_context().version_table_schema  # (names are translated to it)
    inspector = None if offline else sa.inspect(op.get_bind())
    tables = _tables(_collation())
    for table in tables:
        op.execute(CreateTable(table, if_not_exists=True, include_foreign_key_constraints=[]))
    for table in tables:
        have = set() if inspector is None else _index_names(inspector, table.name, schema)
        for index in sorted(table.indexes, key=lambda index: str(index.name)):
            if index.name not in have:
                op.execute(CreateIndex(index))
    for table in tables:
        have = (
            set()
            if inspector is None
            else {found["name"] for found in inspector.get_foreign_keys(table.name, schema)}
        )
        for constraint in table.foreign_key_constraints:
            if constraint.name not in have:
                op.execute(AddConstraint(constraint))


def _index_names(inspector: sa.Inspector, table: str, schema: str | None) -> set[str]:
    inspector.clear_cache()
    return {str(found["name"]) for found in inspector.get_indexes(table, schema)}


def downgrade() -> None:
    if not _mysql():
        return
    for table in reversed(_tables(_collation())):
        op.execute(DropTable(table, if_exists=True))
