"""PostgreSQL search through a GIN index of token hashes.

The bloom signature of each message (``messages.search_sig``, ``bit varying``) gives way to
``messages.search_hashes``: an ``int4[]`` of the 32-bit hashes of the message's distinct search
tokens, ascending (NULL when it has none), under the GIN index ``ix_messages_search_hashes``.
A search asks for the messages whose array contains every hash of the query (``@>``), which
the index answers without reading the chat's other messages; Python then checks each
candidate's tokens, as before.

The hash is part of the on-disk format: the CRC-32 (zlib's) of the token's UTF-8 bytes minus
2**31, a signed ``int4`` (``agentcontext.store._rows.tokenizer.token_hash``).

The upgrade computes the hashes of every existing message (in batches, by ``seq``), builds the
index and drops ``search_sig``. Every row is rewritten once: a ``VACUUM messages`` afterwards
gives the space of the old row versions back to the table. The downgrade recomputes the
signatures, so a downgraded database searches as before.

SQLite keeps its FTS5 table as it was; the always-NULL placeholder column is renamed, so one
model fits both backends.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from agentcontext._validate import loads
from agentcontext.store._db.migrate import applies
from agentcontext.store._db.schema import SEARCH_HASHES_INDEX
from agentcontext.store._rows.signatures import signature
from agentcontext.store._rows.text import index_tokens
from agentcontext.store._rows.tokenizer import token_hashes

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BATCH = 1000

PENDING_LIST_KB = 512
"""New entries of the GIN index wait in its pending list (cheap inserts) until it holds this
much, then move into the index in one sorted pass. Every search reads the whole pending list:
512 kB (PostgreSQL's default is 4 MB) keeps that short, and the pages it takes few
(they stay with the index once used); ``fastupdate = off`` made saves about twice as slow."""

# One statement per batch; each row's hashes as the text of an int4[] (as a save passes them).
SET_HASHES = """
UPDATE messages AS m SET search_hashes = CAST(h.hashes AS INT4[])
FROM unnest(CAST(:seqs AS BIGINT[]), CAST(:hashes AS TEXT[])) AS h(seq, hashes)
WHERE m.seq = h.seq
"""

SET_SIGNATURE = (
    "UPDATE messages SET search_sig = CAST(CAST(:sig AS TEXT) AS BIT VARYING) WHERE seq = :seq"
)


def hashes_text(tokens: list[str]) -> str | None:
    """The token hashes of this revision (CRC-32 of each token, a signed ``int4``) as the
    text of an ``int4[]`` (None for no token)."""
    hashes = token_hashes(tokens)
    return "{" + repr(hashes)[1:-1] + "}" if hashes else None


def _rows(connection: sa.Connection) -> Iterator[list[tuple[int, list[str]]]]:
    """(seq, search tokens) of every message, in batches (keyset paging on ``seq``)."""
    seq, data = sa.column("seq"), sa.column("data")
    last = -1
    while True:
        batch = connection.execute(
            sa.select(seq, sa.cast(data, sa.Text))
            .select_from(sa.table("messages"))
            .where(seq > last)
            .order_by(seq)
            .limit(BATCH)
        ).all()
        if not batch:
            return
        yield [(int(s), index_tokens(None if d is None else loads(d))) for s, d in batch]
        last = batch[-1][0]


def upgrade() -> None:
    if not applies(revision):
        return
    connection = op.get_bind()
    if connection.dialect.name == "sqlite":
        op.execute("ALTER TABLE messages RENAME COLUMN search_sig TO search_hashes")
        return
    op.add_column(
        "messages", sa.Column("search_hashes", postgresql.ARRAY(sa.Integer()), nullable=True)
    )
    for batch in _rows(connection):
        connection.execute(
            sa.text(SET_HASHES),
            {
                "seqs": [seq for seq, _ in batch],
                "hashes": [hashes_text(tokens) for _, tokens in batch],
            },
        )
    op.create_index(
        SEARCH_HASHES_INDEX,
        "messages",
        ["search_hashes"],
        postgresql_using="gin",
        postgresql_with={"gin_pending_list_limit": PENDING_LIST_KB},
    )
    op.drop_column("messages", "search_sig")


def downgrade() -> None:
    if not applies(revision):
        return
    connection = op.get_bind()
    if connection.dialect.name == "sqlite":
        op.execute("ALTER TABLE messages RENAME COLUMN search_hashes TO search_sig")
        return
    op.add_column("messages", sa.Column("search_sig", postgresql.BIT(varying=True), nullable=True))
    for batch in _rows(connection):
        connection.execute(
            sa.text(SET_SIGNATURE),
            [{"seq": seq, "sig": signature(tokens)} for seq, tokens in batch],
        )
    op.drop_index(SEARCH_HASHES_INDEX, table_name="messages")
    op.drop_column("messages", "search_hashes")
