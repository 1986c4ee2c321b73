"""Running the Alembic migrations: from the store (inside its event loop) or the command line.

The script directory ships inside the wheel (``agentcontext/migrations``); in a source checkout
it is the top-level ``migrations/`` directory.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, make_url
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import NullPool

from agentcontext.store._dialect import WRITE_OPTION, Dialect, create_engine, dialect_for
from agentcontext.store._schema import VERSION_TABLE, Base


def script_location() -> Path:
    """The Alembic script directory: packaged in the wheel, or ``migrations/`` in a checkout."""
    here = Path(__file__).resolve()
    for candidate in (here.parent.parent / "migrations", here.parents[3] / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise RuntimeError(  # pragma: no cover - a broken installation
        "agentcontext's migrations are missing from this installation; reinstall the package"
    )


def make_config(url: str | None = None) -> Config:
    """An Alembic config for the packaged migrations (no alembic.ini needed)."""
    config = Config()
    config.set_main_option("script_location", str(script_location()))
    if url:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


@functools.cache
def head_revision() -> str:
    """The newest revision of the packaged migrations."""
    head = ScriptDirectory.from_config(make_config()).get_current_head()
    assert head is not None
    return head


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Only agentcontext's own tables take part in autogenerate comparisons.

    The FTS5 shadow tables, the version table and any table of the application sharing the
    database are left alone.
    """
    if type_ == "table":
        return name in Base.metadata.tables
    return True


def current_revision(connection: Connection) -> str | None:
    """The revision the database is at, or None for an empty database."""
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


def upgrade_in_transaction(connection: Connection, revision: str = "head") -> None:
    """Upgrade on a connection inside a write transaction, holding the migration lock."""
    Dialect(connection.dialect.name).take_migration_lock(connection)
    config = make_config()
    config.attributes["connection"] = connection
    command.upgrade(config, revision)


def downgrade_in_transaction(connection: Connection, revision: str) -> None:
    """Downgrade on a connection inside a write transaction, holding the migration lock."""
    Dialect(connection.dialect.name).take_migration_lock(connection)
    config = make_config()
    config.attributes["connection"] = connection
    command.downgrade(config, revision)


async def run_in_write_transaction(engine: AsyncEngine, fn: Callable[[Connection], Any]) -> Any:
    """Run ``fn(sync_connection)`` in one write transaction (SQLite: BEGIN IMMEDIATE)."""
    async with engine.connect() as conn:
        await conn.execution_options(**{WRITE_OPTION: True})
        async with conn.begin():
            return await conn.run_sync(fn)


async def run_with_new_engine(url: str, fn: Callable[[Connection], Any]) -> Any:
    """For ``alembic`` on the command line: a throw-away engine, one locked write transaction."""
    engine = create_engine(make_url(url), poolclass=NullPool)
    dialect = dialect_for(engine)

    def locked(connection: Connection) -> Any:
        dialect.take_migration_lock(connection)
        return fn(connection)

    try:
        return await run_in_write_transaction(engine, locked)
    finally:
        await engine.dispose()
