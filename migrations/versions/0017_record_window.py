"""Resolve records keep the report of their window: ``replay`` gives back what
``resolve(record=True, window=...)`` returned, ``omitted`` and ``estimate`` included.

``resolve_records.window_omitted`` (the ids the window left out, a JSON array) and
``resolve_records.window_estimate`` (the tokens counted), both empty for a record made without a
window, and for every record made before this revision (they replay as they did).

DDL is not transactional on MariaDB and MySQL: a column is added only if it is missing, and
dropped only if it is there, so a run cut short is finished by running it again.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from agentcontext.store._db.migrate import applies

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MYSQL = ("mysql", "mariadb")
_COLUMNS = {
    "window_omitted": sa.Text().with_variant(mysql.LONGTEXT(), *MYSQL),
    "window_estimate": sa.Integer(),
}
_DROP_ON_SQLITE = {name: f"ALTER TABLE resolve_records DROP COLUMN {name}" for name in _COLUMNS}


def _existing() -> set[str]:
    """The columns of ``resolve_records`` already there (a step cut short on a database whose
    DDL is not transactional is run again from the start)."""
    if op.get_context().as_sql:  # offline (``alembic upgrade --sql``): nothing to inspect
        return set()
    inspector = sa.inspect(op.get_bind())
    schema = op.get_context().version_table_schema
    return {column["name"] for column in inspector.get_columns("resolve_records", schema)}


def upgrade() -> None:
    if not applies(revision):
        return
    there = _existing()
    schema = op.get_context().version_table_schema  # (the store's schema, or database)
    for name, type_ in _COLUMNS.items():
        if name not in there:
            op.add_column("resolve_records", sa.Column(name, type_, nullable=True), schema=schema)


def downgrade() -> None:
    if not applies(revision):
        return
    offline = op.get_context().as_sql
    there = _existing()
    for name in reversed(list(_COLUMNS)):
        if not offline and name not in there:
            continue
        if op.get_bind().dialect.name == "sqlite":
            # Natively (SQLite 3.35+), as revision 0009 does.
            op.execute(_DROP_ON_SQLITE[name])
        else:
            op.drop_column("resolve_records", name, schema=op.get_context().version_table_schema)
