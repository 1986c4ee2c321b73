"""Running the Alembic migrations: from the store (inside its event loop) or the command line.

The script directory ships inside the wheel (``agentcontext/migrations``); in a source checkout
it is the top-level ``migrations/`` directory. Alembic is imported only when a migration runs:
a store opening an up-to-date database reads the revision with one plain query.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import Connection, column, make_url, select, table
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import NullPool

from agentcontext import _validate as v
from agentcontext.errors import (
    ContextError,
    InvalidInputError,
    InvalidTypeError,
    SchemaOutdatedError,
    StoreError,
)
from agentcontext.store._db.schema import VERSION_TABLE, Base
from agentcontext.store._dialects import BEGIN_OPTION, dialect_for

if TYPE_CHECKING:
    from alembic.config import Config

    from agentcontext.store._db.database import Database

HEAD_REVISION = "0017"
"""The newest revision of the packaged migrations (a test checks it against Alembic's)."""

MigrateMode = Literal["auto"] | bool


def script_location() -> Path:
    """The Alembic script directory: packaged in the wheel, or ``migrations/`` in a checkout."""
    here = Path(__file__).resolve()
    for candidate in (here.parents[2] / "migrations", here.parents[4] / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise StoreError(  # pragma: no cover - a broken installation
        f"agentcontext's migrations are missing from this installation (looked for "
        f"{here.parents[2] / 'migrations'}); reinstall the package: pip install "
        "--force-reinstall agentcontext"
    )


def make_config(url: str | None = None) -> Config:
    """An Alembic config for the packaged migrations (no alembic.ini needed)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(script_location()))
    if url:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


@functools.cache
def head_revision() -> str:
    """The newest revision of the packaged migrations, as Alembic computes it."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(make_config()).get_current_head()
    assert head is not None
    return head


def applies(revision: str) -> bool:
    """Inside a migration: whether ``revision`` runs on this database. A database whose schema
    starts at a later revision (one supported since: MariaDB/MySQL start at revision 0011, the
    schema as it was then, made at once) skips the revisions before
    (`Dialect.first_revision`)."""
    from alembic import op

    return revision >= dialect_for(op.get_context().dialect.name).first_revision


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Only agentcontext's own tables take part in autogenerate comparisons (the FTS5 shadow
    tables, the version table and any table of the application sharing the database are left
    alone)."""
    if type_ == "table":
        return name in Base.metadata.tables
    return True


def comparison_options(dialect_name: str) -> dict[str, Any]:
    """Alembic's options that keep an autogenerate comparison (``alembic check``) to what the
    models describe on this database: `include_name`, and an ``include_object`` that leaves
    out what the migrations make otherwise than the models say
    (`Dialect.migration_only`: PostgreSQL's GIN index, MariaDB's search table...)."""
    skipped = dialect_for(dialect_name).migration_only

    def include_object(
        item: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
    ) -> bool:
        return name not in skipped

    return {"include_name": include_name, "include_object": include_object}


def current_revision(connection: Connection, schema: str | None = None) -> str | None:
    """The revision the database (or its ``schema``) is at, or None for an empty one."""
    from alembic.runtime.migration import MigrationContext

    opts = {"version_table": VERSION_TABLE, "version_table_schema": schema}
    return MigrationContext.configure(connection, opts=opts).get_current_revision()


def _read_revision(connection: Connection, schema: str | None = None) -> str | None:
    """The revision with one query (no Alembic); None without a version table."""
    try:
        rows: list[Any] = list(
            connection.execute(
                select(column("version_num")).select_from(table(VERSION_TABLE, schema=schema))
            )
        )
    except DBAPIError:
        return None
    return rows[0][0] if len(rows) == 1 else None


def enter_schema(connection: Connection, schema: str | None, *, create: bool) -> None:
    """Inside a migration's transaction: the store's tables go in ``schema`` (a checked name;
    created first with ``create``), as its dialect says."""
    dialect = dialect_for(connection.dialect.name)
    if schema is not None:
        dialect.enter_schema(connection, schema, create=create)
    if create:
        dialect.prepare_migrations(connection, schema)


@contextmanager
def migration_lock(connection: Connection) -> Iterator[None]:
    """The migration lock, held until the block ends (or its transaction does)."""
    dialect = dialect_for(connection.dialect.name)
    dialect.take_migration_lock(connection)
    try:
        yield
    finally:
        dialect.release_migration_lock(connection)


def upgrade_in_transaction(
    connection: Connection, revision: str = "head", schema: str | None = None
) -> None:
    """Upgrade on a connection inside a write transaction, holding the migration lock (in
    ``schema``, created if missing)."""
    from alembic import command

    with migration_lock(connection):
        enter_schema(connection, schema, create=True)
        config = make_config()
        config.attributes["connection"] = connection
        config.attributes["schema"] = schema
        command.upgrade(config, revision)


def downgrade_in_transaction(
    connection: Connection, revision: str, schema: str | None = None
) -> None:
    """Downgrade on a connection inside a write transaction, holding the migration lock."""
    from alembic import command

    with migration_lock(connection):
        enter_schema(connection, schema, create=False)
        config = make_config()
        config.attributes["connection"] = connection
        config.attributes["schema"] = schema
        command.downgrade(config, revision)


async def run_in_write_transaction(engine: AsyncEngine, fn: Callable[[Connection], Any]) -> Any:
    """Run ``fn(sync_connection)`` in one write transaction (SQLite: BEGIN IMMEDIATE), one
    such call at a time in the process: Alembic keeps the migration it runs in module
    globals (``alembic.context``, ``alembic.op``), so two migrations whose statements
    interleave (stores of two SQLite files, or of two servers, opened at once, in one event
    loop or in threads with loops of their own) would each run their steps in the other's
    database, or hang on a connection of another loop.

    The tasks of one event loop queue on a lock of that loop; the one at the head of the
    queue then takes the process's lock, without blocking its loop while another thread's
    migration holds it (it tries again every few milliseconds, and can be cancelled)."""
    loop = asyncio.get_running_loop()
    turn = _TURNS.get(loop)
    if turn is None:
        turn = _TURNS.setdefault(loop, asyncio.Lock())
    async with turn:
        migrating, pause = _MIGRATING, 0.001
        while not migrating.acquire(blocking=False):
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.02)
        try:
            async with engine.connect() as conn:
                await conn.execution_options(**{BEGIN_OPTION: "immediate"})
                async with conn.begin():
                    return await conn.run_sync(fn)
        finally:
            migrating.release()


_TURNS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)
"""The queue of `run_in_write_transaction` in each event loop."""

_MIGRATING = threading.Lock()
"""Held by the one `run_in_write_transaction` running in the process."""


def _fork_unlocked() -> None:
    # A process forked while a thread of its parent migrated has no such thread: its lock
    # would stay held for ever.
    global _MIGRATING
    _MIGRATING = threading.Lock()


os.register_at_fork(after_in_child=_fork_unlocked)


async def run_with_new_engine(
    url: str, fn: Callable[[Connection], Any], schema: str | None = None
) -> Any:
    """For ``alembic`` on the command line: a throw-away engine, one locked write transaction
    (in ``schema``, created if missing)."""
    from agentcontext.store._db.options import StoreOptions, make_engine

    engine, dialect = make_engine(
        make_url(url), StoreOptions(engine_options={"poolclass": NullPool})
    )
    if schema is not None:
        dialect.check_schema(schema)

    def locked(connection: Connection) -> Any:
        with migration_lock(connection):
            enter_schema(connection, schema, create=True)
            return fn(connection)

    try:
        return await run_in_write_transaction(engine, locked)
    finally:
        await engine.dispose()


def outdated_message(url: str, current: str | None, head: str, schema: str | None = None) -> str:
    """What `SchemaOutdatedError` says, with the command to run."""
    state = "has no agentcontext schema" if current is None else f"is at revision {current}"
    where = f"the database at {url}" + ("" if schema is None else f" (schema {schema!r})")
    option = "" if schema is None else f" --schema {schema}"
    return (
        f"{where} {state}; this version of agentcontext needs "
        f"revision {head}. Upgrade it with: agentcontext migrate upgrade --url '{url}'{option} "
        "(or use SqlContextStore(..., migrate='auto'))"
    )


async def prepare_schema(db: Database, mode: MigrateMode) -> None:
    """Check the schema and, with ``migrate="auto"``, upgrade it to the newest revision.

    Safe when several processes start at once: the upgrade runs in one write transaction under
    the migration lock, and each process checks the revision again inside it.
    """
    schema = db.dialect.schema
    try:
        async with db.engine.connect() as conn:
            await conn.execution_options(**{BEGIN_OPTION: "none"})
            current = await conn.run_sync(_read_revision, schema)
    except ContextError:
        raise
    except Exception as exc:
        raise await db.failed(exc) from exc
    if current == HEAD_REVISION:
        return
    if mode is False:
        raise SchemaOutdatedError(outdated_message(db.url, current, HEAD_REVISION, schema))
    try:
        await run_in_write_transaction(
            db.engine, functools.partial(upgrade_in_transaction, schema=schema)
        )
    except ContextError:
        raise
    except Exception as exc:
        if "Can't locate revision" in str(exc) or "No such revision" in str(exc):
            raise SchemaOutdatedError(
                f"the database at {db.url} is at revision {current!r}, which this version "
                "of agentcontext does not know: it was migrated by a newer version. "
                "Upgrade agentcontext."
            ) from None
        raise await db.failed(exc) from exc


def check_mode(migrate: object) -> MigrateMode:
    """``migrate=`` of a store, checked."""
    if not isinstance(migrate, (str, bool)):
        raise InvalidTypeError(f"migrate must be 'auto' or False, got {v.type_name(migrate)}")
    if migrate not in ("auto", True, False):
        raise InvalidInputError(f"migrate must be 'auto' or False, got {migrate!r}")
    return migrate  # type: ignore[return-value]
