"""One tokenizer for search on both backends, and single-statement appends.

- Search tokens are made in Python (``agentcontext.store._rows.tokenizer``) for every backend:
  SQLite keeps them in a contentless FTS5 table, PostgreSQL a bloom signature per message
  (``messages.search_sig``). The stored copy of the searchable text (``search_text``) and
  its indexes go.
- SQLite gets the view ``message_appends``, whose ``INSTEAD OF INSERT`` trigger appends a
  message and moves the branch head (compare-and-swap) in one statement.
- Chain loads read a chat by ``(chat_id, depth)``; the ``(chat_id, parent_id)`` index goes.
- Branches keep the depth of their head (``head_depth``), moved with the head.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from agentcontext._validate import loads
from agentcontext.store._db.migrate import applies
from agentcontext.store._rows.signatures import signature as _signature
from agentcontext.store._rows.text import search_text
from agentcontext.store._rows.tokenizer import tokens

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BATCH = 1000

SQLITE_FTS = (
    "CREATE VIRTUAL TABLE messages_fts USING fts5("
    "tokens, content='', tokenize='ascii', detail='none')"
)

SQLITE_APPEND_VIEW = (
    "CREATE VIEW message_appends AS SELECT '' AS branch_id, 0 AS first, '' AS touched_at, "
    "id, chat_id, parent_id, name, type, data, created_at, '' AS tokens "
    "FROM messages WHERE 0"
)

# One row of an append: refuse unless the branch exists and its head is the row's parent
# (compare-and-swap), bump the chat (its version once per save: "first"), insert the message
# with its depth, index its tokens, move the head to it. Any failure aborts the whole
# statement, so a multi-row append applies wholly or not at all.
SQLITE_APPEND_TRIGGER = """
CREATE TRIGGER message_appends_insert INSTEAD OF INSERT ON message_appends BEGIN
    SELECT RAISE(ABORT, 'agentcontext: no such branch')
    WHERE NOT EXISTS (SELECT 1 FROM branches WHERE id = NEW.branch_id AND chat_id = NEW.chat_id);
    SELECT RAISE(ABORT, 'agentcontext: head moved')
    WHERE (SELECT head_message_id FROM branches WHERE id = NEW.branch_id) IS NOT NEW.parent_id;
    UPDATE chats SET updated_at = NEW.touched_at, version = version + NEW.first,
                     message_count = message_count + 1
    WHERE id = NEW.chat_id;
    INSERT INTO messages (id, chat_id, parent_id, depth, name, type, data, created_at, version)
    VALUES (NEW.id, NEW.chat_id, NEW.parent_id,
            (SELECT head_depth + 1 FROM branches WHERE id = NEW.branch_id),
            NEW.name, NEW.type, NEW.data, NEW.created_at,
            (SELECT version FROM chats WHERE id = NEW.chat_id));
    INSERT INTO messages_fts (rowid, tokens)
    SELECT last_insert_rowid(), NEW.tokens WHERE NEW.tokens <> '';
    UPDATE branches SET head_message_id = NEW.id, head_depth = head_depth + 1
    WHERE id = NEW.branch_id;
END
"""

BACKFILL_HEAD_DEPTH = (
    "UPDATE branches SET head_depth = coalesce("
    "(SELECT depth FROM messages WHERE messages.id = branches.head_message_id), 0)"
)

# The objects of revision 0002 that this revision replaces.
OLD_SQLITE_FTS = [
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
OLD_SQLITE_FTS_DROP = [
    "DROP TRIGGER IF EXISTS messages_fts_au",
    "DROP TRIGGER IF EXISTS messages_fts_ad",
    "DROP TRIGGER IF EXISTS messages_fts_ai",
    "DROP TABLE IF EXISTS messages_fts",
]


def _rows(connection: sa.Connection) -> Iterator[list[Any]]:
    """(seq, data) of every message, in batches (JSON data as text)."""
    seq, data = sa.column("seq"), sa.column("data")
    as_text = data if connection.dialect.name == "sqlite" else sa.cast(data, sa.Text)
    last = -1
    while True:
        batch = connection.execute(
            sa.select(seq, as_text)
            .select_from(sa.table("messages"))
            .where(seq > last)
            .order_by(seq)
            .limit(BATCH)
        ).all()
        if not batch:
            return
        yield [list(row) for row in batch]
        last = batch[-1][0]


def _tokens(data: str | None) -> list[str]:
    return [] if data is None else tokens(search_text(loads(data)))


def upgrade() -> None:
    if not applies(revision):
        return
    connection = op.get_bind()
    if connection.dialect.name == "sqlite":
        for statement in OLD_SQLITE_FTS_DROP:
            op.execute(statement)
        op.drop_index("ix_messages_chat_id_parent_id", table_name="messages")
        op.create_index("ix_messages_chat_id_depth", "messages", ["chat_id", "depth"])
        op.execute("ALTER TABLE branches ADD COLUMN head_depth INTEGER DEFAULT '0' NOT NULL")
        op.execute(BACKFILL_HEAD_DEPTH)
        # In place (SQLite 3.35+): no table rebuild, row ids (the FTS keys) are kept.
        op.execute("ALTER TABLE messages DROP COLUMN search_text")
        op.execute("ALTER TABLE messages ADD COLUMN search_sig BLOB")
        op.execute(SQLITE_FTS)
        for batch in _rows(connection):
            rows = [(seq, " ".join(_tokens(data))) for seq, data in batch]
            indexed = [row for row in rows if row[1]]
            if indexed:
                connection.exec_driver_sql(
                    "INSERT INTO messages_fts (rowid, tokens) VALUES (?, ?)", indexed
                )
        op.execute(SQLITE_APPEND_VIEW)
        op.execute(SQLITE_APPEND_TRIGGER)
        return
    op.drop_index("ix_messages_search_text_tsv", table_name="messages")
    op.drop_index("ix_messages_chat_id_parent_id", table_name="messages")
    op.create_index("ix_messages_chat_id_depth", "messages", ["chat_id", "depth"])
    op.add_column(
        "branches", sa.Column("head_depth", sa.Integer(), server_default="0", nullable=False)
    )
    op.execute(BACKFILL_HEAD_DEPTH)
    op.drop_column("messages", "search_text")
    op.add_column("messages", sa.Column("search_sig", postgresql.BIT(varying=True), nullable=True))
    for batch in _rows(connection):
        connection.execute(
            sa.text(
                "UPDATE messages SET search_sig = CAST(CAST(:sig AS TEXT) AS BIT VARYING) "
                "WHERE seq = :seq"
            ),
            [{"seq": seq, "sig": _signature(_tokens(data))} for seq, data in batch],
        )


def downgrade() -> None:
    if not applies(revision):
        return
    connection = op.get_bind()
    if connection.dialect.name == "sqlite":
        op.execute("DROP TRIGGER IF EXISTS message_appends_insert")
        op.execute("DROP VIEW IF EXISTS message_appends")
        op.execute("DROP TABLE IF EXISTS messages_fts")
        op.execute("ALTER TABLE branches DROP COLUMN head_depth")
        op.execute("ALTER TABLE messages DROP COLUMN search_sig")
        op.execute("ALTER TABLE messages ADD COLUMN search_text TEXT DEFAULT '' NOT NULL")
        _restore_search_text(connection)
        op.drop_index("ix_messages_chat_id_depth", table_name="messages")
        op.create_index("ix_messages_chat_id_parent_id", "messages", ["chat_id", "parent_id"])
        for statement in OLD_SQLITE_FTS:
            op.execute(statement)
        op.execute("INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')")
        return
    op.drop_column("branches", "head_depth")
    op.drop_column("messages", "search_sig")
    op.add_column(
        "messages", sa.Column("search_text", sa.Text(), server_default="", nullable=False)
    )
    _restore_search_text(connection)
    op.drop_index("ix_messages_chat_id_depth", table_name="messages")
    op.create_index("ix_messages_chat_id_parent_id", "messages", ["chat_id", "parent_id"])
    op.create_index(
        "ix_messages_search_text_tsv",
        "messages",
        [sa.literal_column("to_tsvector('simple', search_text)")],
        postgresql_using="gin",
    )


def _restore_search_text(connection: sa.Connection) -> None:
    for batch in _rows(connection):
        connection.execute(
            sa.text("UPDATE messages SET search_text = :text WHERE seq = :seq"),
            [
                {"seq": seq, "text": "" if data is None else search_text(loads(data))}
                for seq, data in batch
            ],
        )
