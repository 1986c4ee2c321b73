"""SQLite: the search index written in pages of 1 000 bytes instead of 4 050.

FTS5 keeps its index as segments that later writes merge (automerge). The merging is paid by
the writes themselves, in quanta: each time the pages a database's writes add cross a multiple
of 64, the transaction that crossed it merges 64 pages per level of the index before it
commits. At a million messages (about ten levels) that was tens of milliseconds, sometimes
hundreds, inside one save in 64 and inside the batches of a retention run, where every writer
of the database (other processes too) waited for it. The quantum is counted in pages, so
smaller pages make each payment smaller and more frequent, for the same merging in all.
Measured at a million messages while a prune ran (docs/benchmarks.md): the saves of another
process that took over 100 ms fell from 26-34 to 2-5 in about 4 500, their 99th percentile
from 91-96 to 56-59 ms.

FTS5 stores the page size in the index's own configuration (``messages_fts_config``), so
setting it is one statement, safe to run again. Pages already written keep their size until a
merge rewrites them. Downgrade sets FTS5's default back. Elsewhere this revision does nothing.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 4050


def _set_page_size(size: int) -> None:
    if op.get_context().dialect.name != "sqlite":
        return
    statement = "INSERT INTO messages_fts (messages_fts, rank) VALUES ('pgsz', :size)"
    op.execute(sa.text(statement).bindparams(size=size))


def upgrade() -> None:
    _set_page_size(PAGE_SIZE)


def downgrade() -> None:
    _set_page_size(DEFAULT_PAGE_SIZE)
