"""Administration of a store's database, for tools such as the ``agentcontext`` command line.

Package-internal: the command line and the viewer use these; applications use
`SqlContextStore` (which migrates and checks its schema by itself).

- Schema revisions and migrations in one locked write transaction: `make_config`,
  `head_revision`, `current_revision`, `run_in_write_transaction`, `upgrade_in_transaction`,
  `downgrade_in_transaction`.
- The driver's worker threads (aiosqlite), so a program can let them finish before its event
  loop closes: `driver_threads`, `settle_driver_threads`.
- Checking a chat export before it is written: `check_export`; a copy of an export under
  another chat id, by the id rule `SqlContextStore.copy_chat` follows: `copy_export`; new
  ids: `new_id`; the file of a database URL: `database_file`.
- Encrypting an existing plain database in place, resumable: `encrypt_in_place`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.engine import make_url

from agentcontext.store._db.errors import driver_threads, settle_driver_threads
from agentcontext.store._db.migrate import (
    current_revision,
    downgrade_in_transaction,
    head_revision,
    make_config,
    run_in_write_transaction,
    upgrade_in_transaction,
)
from agentcontext.store._dialects import database_file as _database_file
from agentcontext.store._ops import encrypt as _encrypt
from agentcontext.store._ops.copy import copy_export
from agentcontext.store._ops.transfer import check_export
from agentcontext.store._rows.checks import new_id

if TYPE_CHECKING:
    from agentcontext.store.sql import SqlContextStore

EncryptReport = _encrypt.EncryptReport

__all__ = [
    "EncryptReport",
    "check_export",
    "copy_export",
    "database_file",
    "current_revision",
    "downgrade_in_transaction",
    "driver_threads",
    "encrypt_in_place",
    "head_revision",
    "make_config",
    "new_id",
    "run_in_write_transaction",
    "settle_driver_threads",
    "upgrade_in_transaction",
]


def database_file(url: str) -> Path | None:
    """The local file a database URL names (an SQLite file), or None (a server, memory)."""
    found = _database_file(make_url(url))
    return None if found is None else Path(found)


async def encrypt_in_place(
    store: SqlContextStore, progress: Callable[[int, int], object] | None = None
) -> EncryptReport:
    """Seal every chat and message of ``store``'s database that is still plain (the store
    must have a key provider): chat by chat, each in its own transaction; a run cut short is
    finished by running it again. ``progress(done, total)`` after each chat."""
    from agentcontext.errors import InvalidInputError

    if not store.db.dialect.sealer.encrypted:
        raise InvalidInputError(
            "encrypt_in_place needs a store opened with encryption=<a key provider>"
        )
    return await _encrypt.encrypt_in_place(store.db, store.db.dialect, progress)
