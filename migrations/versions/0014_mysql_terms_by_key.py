"""MariaDB and MySQL: the search table keyed by ``(term, seq)`` alone; each message's row keeps
its terms.

Until this revision ``message_terms`` was two B-trees: its primary key ``(seq, term)``, by
which a message's entries were deleted without knowing them, and an index ``(term, seq)``, by
which a search reads them. Every save wrote each of its ~120 entries to both. From here the
table is its primary key ``(term, seq)`` alone, and a message's row keeps the same keys in
``messages.search_hashes`` (8 bytes each, big-endian signed, ascending:
``agentcontext.store._dialects.mysql.pack_terms``), by which `MySQLDialect.delete_messages`
deletes its entries, whatever became of the key that made them (an erased user's). Measured
on MariaDB 10.11 with 16 writers: the server's time per turn fell by about a third.

DDL is not transactional on these servers: each step is made only if it is missing, so a run
cut short is finished by running it again.

- Upgrade: ``search_hashes`` becomes a ``LONGBLOB`` (a ``BLOB`` holds 8 191 terms); each
  message that has entries gets them packed there (one statement, on the server); then the
  table's keys change in one ``ALTER TABLE``.
- Downgrade: the keys back to ``(seq, term)`` and the index ``(term, seq)``; ``search_hashes``
  emptied and a ``BLOB`` again.

Elsewhere this revision does nothing.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from agentcontext.store._db.migrate import applies

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MYSQL = ("mysql", "mariadb")
INDEX = "ix_message_terms_term_seq"

# Each message's entries, packed as `pack_terms` packs them: HEX of a BIGINT is its 64-bit
# two's complement, so the 16 digits of each term, in ascending order, are its 8 bytes.
FILL = """
UPDATE {messages} AS m JOIN (
    SELECT seq, UNHEX(GROUP_CONCAT(LPAD(HEX(term), 16, '0') ORDER BY term SEPARATOR '')) AS packed
    FROM {terms} GROUP BY seq
) AS x ON x.seq = m.seq
SET m.search_hashes = x.packed
WHERE m.search_hashes IS NULL
"""


def _mysql() -> bool:
    return applies(revision) and op.get_context().dialect.name in MYSQL


def _state() -> tuple[list[str], set[str], bool] | None:
    """The side table's primary key columns, its indexes, and whether ``search_hashes`` is a
    ``LONGBLOB`` (None when generating SQL offline)."""
    if op.get_context().as_sql:
        return None
    inspector = sa.inspect(op.get_bind())
    schema = op.get_context().version_table_schema
    key = list(inspector.get_pk_constraint("message_terms", schema)["constrained_columns"])
    indexes = {str(index["name"]) for index in inspector.get_indexes("message_terms", schema)}
    [column] = [
        c for c in inspector.get_columns("messages", schema) if c["name"] == "search_hashes"
    ]
    return key, indexes, isinstance(column["type"], mysql.LONGBLOB)


def _qualified(name: str) -> str:
    schema = op.get_context().version_table_schema
    quote = op.get_bind().dialect.identifier_preparer.quote if not op.get_context().as_sql else str
    return f"{quote(schema)}.{quote(name)}" if schema else quote(name)


def upgrade() -> None:
    if not _mysql():
        return
    state = _state()
    key, indexes, long_blob = state if state is not None else (["seq", "term"], {INDEX}, False)
    if not long_blob:
        op.alter_column(
            "messages", "search_hashes", type_=mysql.LONGBLOB(), existing_type=sa.LargeBinary(),
            existing_nullable=True, schema=op.get_context().version_table_schema,
        )  # fmt: skip
    if key == ["term", "seq"]:
        return
    op.execute(f"SET SESSION group_concat_max_len = {1 << 30}")
    op.execute(FILL.format(messages=_qualified("messages"), terms=_qualified("message_terms")))
    steps = ["DROP PRIMARY KEY", "ADD PRIMARY KEY (term, seq)"]
    if INDEX in indexes:
        steps.append(f"DROP INDEX {INDEX}")
    op.execute(f"ALTER TABLE {_qualified('message_terms')} {', '.join(steps)}")


def downgrade() -> None:
    if not _mysql():
        return
    state = _state()
    key, indexes, long_blob = state if state is not None else (["term", "seq"], set(), True)
    if key != ["seq", "term"]:
        steps = ["DROP PRIMARY KEY", "ADD PRIMARY KEY (seq, term)"]
        if INDEX not in indexes:
            steps.append(f"ADD INDEX {INDEX} (term, seq)")
        op.execute(f"ALTER TABLE {_qualified('message_terms')} {', '.join(steps)}")
    if long_blob:
        op.execute(f"UPDATE {_qualified('messages')} SET search_hashes = NULL")  # noqa: S608
        op.alter_column(
            "messages", "search_hashes", type_=sa.LargeBinary(), existing_type=mysql.LONGBLOB(),
            existing_nullable=True, schema=op.get_context().version_table_schema,
        )  # fmt: skip
