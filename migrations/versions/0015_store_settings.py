"""A table of what the database must remember about the stores that use it: whether it is
encrypted.

``agentcontext_settings (name, value)``: an encrypted store writes ``sealing`` when it first
opens the database, and a store without a key provider refuses a database that has it, even
one whose sealed rows were all deleted since (before this revision such a store looked at the
newest message only, and wrote text in the clear into an encrypted database that held none).

Every database gets the table (MariaDB and MySQL in ``utf8mb4`` with the binary collation of
their other tables). DDL is not transactional on MariaDB and MySQL: the table is made only if
it is missing, and dropped only if it is there, so a run cut short is finished by running it
again.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.schema import CreateTable, DropTable

from agentcontext.store._db.migrate import applies

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MYSQL = ("mysql", "mariadb")


def _table() -> sa.Table:
    """The table as it is at this revision."""
    context = op.get_context()
    options: dict[str, str] = {}
    key_name: str | None = "pk_agentcontext_settings"
    if context.dialect.name in MYSQL:  # (a primary key has no name of its own there)
        collation = "utf8mb4_nopad_bin" if context.dialect.is_mariadb else "utf8mb4_0900_bin"
        options = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": collation}
        key_name = None
    return sa.Table(
        "agentcontext_settings",
        sa.MetaData(),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("value", sa.String(255), nullable=False),
        sa.PrimaryKeyConstraint("name", name=key_name),
        **options,
    )


def upgrade() -> None:
    if not applies(revision):
        return
    op.execute(CreateTable(_table(), if_not_exists=True))


def downgrade() -> None:
    if not applies(revision):
        return
    op.execute(DropTable(_table(), if_exists=True))
