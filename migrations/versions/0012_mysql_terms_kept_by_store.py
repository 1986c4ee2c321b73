"""MariaDB and MySQL: the search index kept by the store alone, without a foreign key.

Until this revision each row of ``message_terms`` checked its message through a foreign key
that also deleted it with its message. The check is made for every search term of every
message a save writes (about a hundred rows for a message of 400 characters): measured on
MariaDB 10.11, it was a third of the server's time for a one-message save (the compound
statement 2.3 → 1.6 ms, its commit 0.64 → 0.45 ms).

From here the store deletes a message's entries itself, in the statement before the one that
deletes the message (`MySQLDialect.delete_messages`, the one way messages are deleted).

- Upgrade: the foreign key is dropped if it is there (safe to run again: DDL is not
  transactional on these servers).
- Downgrade: entries whose message is gone (left by rows deleted outside the store) are
  deleted, then the foreign key is added back if it is missing.

Elsewhere this revision does nothing.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from agentcontext.store._db.migrate import applies

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MYSQL = ("mysql", "mariadb")
FOREIGN_KEY = "fk_message_terms_seq_messages"


def _mysql() -> bool:
    return applies(revision) and op.get_context().dialect.name in MYSQL


def _has_foreign_key() -> bool | None:
    """Whether ``message_terms`` has the foreign key (None when generating SQL offline)."""
    if op.get_context().as_sql:
        return None
    inspector = sa.inspect(op.get_bind())
    schema = op.get_context().version_table_schema
    found = inspector.get_foreign_keys("message_terms", schema)
    return any(key["name"] == FOREIGN_KEY for key in found)


def upgrade() -> None:
    if not _mysql():
        return
    if _has_foreign_key() is not False:
        op.drop_constraint(FOREIGN_KEY, "message_terms", type_="foreignkey")


def downgrade() -> None:
    if not _mysql():
        return
    if _has_foreign_key():
        return
    # (Core statements: their table names are translated to the store's schema.)
    meta = sa.MetaData()
    terms = sa.Table("message_terms", meta, sa.Column("seq", sa.BigInteger))
    messages = sa.Table("messages", meta, sa.Column("seq", sa.BigInteger))
    kept = sa.select(sa.literal(1)).where(messages.c.seq == terms.c.seq).exists()
    op.execute(sa.delete(terms).where(~kept))
    op.create_foreign_key(
        FOREIGN_KEY, "message_terms", "messages", ["seq"], ["seq"], ondelete="CASCADE"
    )
