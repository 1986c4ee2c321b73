"""Search terms scoped to the chat and the user: a search reads its scope's index entries only.

Until this revision the search index held each message's tokens as they are (SQLite's FTS5
table) or their 32-bit hashes (PostgreSQL's GIN-indexed ``messages.search_hashes``), for the
whole database: a search in one chat walked the entries of every chat holding the word and
kept the chat's. From here each token is indexed twice, under its chat's mask and under its
user's (``agentcontext.store._rows.terms``), so the entries a search reads are those of the
chat (or of the user's chats) it names, however large the database.

- SQLite: the FTS5 table is emptied and filled again with the terms (hex words), in batches;
  the append view and its trigger are made again with an ``owner`` column: an append whose
  terms were made for another user than the chat's (a chat deleted and created again) is
  refused.
- PostgreSQL: ``search_hashes`` is computed again for every message (signed ``int4`` folds of
  the terms), in batches; the column and its GIN index stay.

Every message is rewritten once on PostgreSQL: a ``VACUUM messages`` afterwards gives the
space of the old row versions back. The downgrade puts back the tokens and hashes of
revision 0009, and its trigger.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import sqlalchemy as sa
from alembic import op

from agentcontext._validate import loads
from agentcontext.store._db.migrate import applies
from agentcontext.store._dialects.postgresql import terms_text
from agentcontext.store._dialects.sqlite import APPEND_TRIGGER, APPEND_VIEW, fts_terms
from agentcontext.store._rows.terms import message_terms
from agentcontext.store._rows.text import index_tokens
from agentcontext.store._rows.tokenizer import token_hashes

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BATCH = 1000

SET_HASHES = """
UPDATE messages AS m SET search_hashes = CAST(h.hashes AS INT4[])
FROM unnest(CAST(:seqs AS BIGINT[]), CAST(:hashes AS TEXT[])) AS h(seq, hashes)
WHERE m.seq = h.seq
"""

# Revision 0009's append view and trigger (made by 0003), for the downgrade.
OLD_VIEW = (
    "CREATE VIEW message_appends AS SELECT '' AS branch_id, 0 AS first, '' AS touched_at, "
    "id, chat_id, parent_id, name, type, data, created_at, '' AS tokens "
    "FROM messages WHERE 0"
)
OLD_TRIGGER = """
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


def _rows(connection: sa.Connection) -> Iterator[list[tuple[int, str, str, list[str]]]]:
    """(seq, chat id, owner, search tokens) of every message, in batches (keyset paging)."""
    messages, chats = sa.table("messages"), sa.table("chats")
    seq, data = sa.column("seq"), sa.column("data")
    chat_id, user_id, chat_key = sa.column("chat_id"), sa.column("user_id"), sa.column("id")
    messages.append_column(seq)
    messages.append_column(data)
    messages.append_column(chat_id)
    chats.append_column(chat_key)
    chats.append_column(user_id)
    last = -1
    while True:
        batch = connection.execute(
            sa.select(
                messages.c.seq,
                sa.cast(messages.c.data, sa.Text),
                messages.c.chat_id,
                chats.c.user_id,
            )
            .select_from(messages.join(chats, chats.c.id == messages.c.chat_id))
            .where(messages.c.seq > last)
            .order_by(messages.c.seq)
            .limit(BATCH)
        ).all()
        if not batch:
            return
        yield [
            (int(s), c, u, index_tokens(None if d is None else loads(d))) for s, d, c, u in batch
        ]
        last = batch[-1][0]


def _sqlite_fill(connection: sa.Connection, render: str) -> None:
    connection.exec_driver_sql("INSERT INTO messages_fts (messages_fts) VALUES ('delete-all')")
    for batch in _rows(connection):
        if render == "terms":
            values = [(s, fts_terms(message_terms(t, c, u))) for s, c, u, t in batch if t]
        else:
            values = [(s, " ".join(t)) for s, _, _, t in batch if t]
        if values:
            connection.exec_driver_sql(
                "INSERT INTO messages_fts (rowid, tokens) VALUES (?, ?)", values
            )


def _postgres_fill(connection: sa.Connection, render: str) -> None:
    for batch in _rows(connection):
        if render == "terms":
            hashes = [terms_text(message_terms(t, c, u)) for _, c, u, t in batch]
        else:
            hashes = [
                "{" + repr(found)[1:-1] + "}" if (found := token_hashes(t)) else None
                for _, _, _, t in batch
            ]
        connection.execute(
            sa.text(SET_HASHES), {"seqs": [s for s, _, _, _ in batch], "hashes": hashes}
        )


def upgrade() -> None:
    if not applies(revision):
        return
    connection = op.get_bind()
    if connection.dialect.name == "sqlite":
        op.execute("DROP TRIGGER IF EXISTS message_appends_insert")
        op.execute("DROP VIEW IF EXISTS message_appends")
        op.execute(APPEND_VIEW)
        op.execute(APPEND_TRIGGER)
        _sqlite_fill(connection, "terms")
    elif connection.dialect.name == "postgresql":
        _postgres_fill(connection, "terms")


def downgrade() -> None:
    if not applies(revision):
        return
    connection = op.get_bind()
    if connection.dialect.name == "sqlite":
        op.execute("DROP TRIGGER IF EXISTS message_appends_insert")
        op.execute("DROP VIEW IF EXISTS message_appends")
        op.execute(OLD_VIEW)
        op.execute(OLD_TRIGGER)
        _sqlite_fill(connection, "tokens")
    elif connection.dialect.name == "postgresql":
        _postgres_fill(connection, "tokens")
