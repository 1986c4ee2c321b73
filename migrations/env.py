"""Alembic environment for agentcontext.

Two ways in:

- ``await store.initialize()`` runs the migrations inside the store's event loop: it opens an
  async connection, begins a write transaction, takes the migration lock and hands the
  connection to Alembic through ``config.attributes["connection"]`` (connection sharing).
- ``alembic upgrade head`` from the command line: the database URL comes from ``-x url=...``,
  else the ``AGENTCONTEXT_URL`` environment variable, else ``sqlalchemy.url`` in alembic.ini.
  The same async engine set-up, transaction and lock are used. ``-x schema=acme`` migrates a
  tenant's PostgreSQL schema (created when missing).
"""

from __future__ import annotations

import asyncio
import os

from alembic import context
from sqlalchemy import Connection, make_url

from agentcontext.store._db import migrate as _migrate
from agentcontext.store._db.schema import VERSION_TABLE, Base

config = context.config
target_metadata = Base.metadata

# From the ``alembic`` command line, log as alembic.ini says (each migration it runs is
# printed); inside a store's initialize() the application's own logging is left alone.
if config.config_file_name is not None and "connection" not in config.attributes:
    from logging.config import fileConfig

    fileConfig(config.config_file_name, disable_existing_loggers=False)


def _url() -> str:
    url = (
        context.get_x_argument(as_dictionary=True).get("url")
        or os.environ.get("AGENTCONTEXT_URL")
        or config.get_main_option("sqlalchemy.url")
    )
    if not url:
        raise SystemExit(
            "No database URL: pass -x url=sqlite+aiosqlite:///path.db or set AGENTCONTEXT_URL"
        )
    return url


def _schema() -> str | None:
    """The tenant schema: ``-x schema=acme`` on the command line, or the store's."""
    given = context.get_x_argument(as_dictionary=True).get("schema")
    if given:
        from agentcontext.store._db.options import check_schema_name

        return check_schema_name(given)
    found = config.attributes.get("schema")
    return found if isinstance(found, str) else None


def run_migrations_offline() -> None:
    """Emit SQL to stdout (``alembic upgrade head --sql``)."""
    url = _url()
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        version_table=VERSION_TABLE,
        version_table_schema=_schema(),
        dialect_opts={"paramstyle": "named"},
        **_migrate.comparison_options(make_url(url).get_dialect().name),
    )
    with context.begin_transaction():
        context.run_migrations()


def do_run_migrations(connection: Connection) -> None:
    """Run the migrations on a connection that is already inside a write transaction."""
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        version_table_schema=_schema(),
        compare_type=True,
        **_migrate.comparison_options(connection.dialect.name),
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        do_run_migrations(connection)
        return
    asyncio.run(_migrate.run_with_new_engine(_url(), do_run_migrations, _schema()))


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
