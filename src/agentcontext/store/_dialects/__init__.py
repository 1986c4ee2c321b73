"""Everything that differs between the databases the store runs on, in one strategy object per
dialect: `SqliteDialect` (``sqlite``) and `PostgresDialect` (``postgresql``), both
implementing `Dialect` (``base``).

No module outside this package asks which database it runs on: it asks its `Dialect`. A new
database is one new module here and one entry in `_DIALECTS`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from agentcontext.errors import InvalidInputError
from agentcontext.store._dialects.base import (
    BEGIN_OPTION,
    AppendRefused,
    Dialect,
    EngineOptions,
    MessageRow,
    Mode,
    UnitLocks,
)
from agentcontext.store._dialects.mysql import MySQLDialect
from agentcontext.store._dialects.postgresql import PostgresDialect
from agentcontext.store._dialects.sqlite import SqliteDialect

__all__ = [
    "BEGIN_OPTION",
    "AppendRefused",
    "MessageRow",
    "Dialect",
    "EngineOptions",
    "Mode",
    "MySQLDialect",
    "PostgresDialect",
    "SqliteDialect",
    "UnitLocks",
    "class_for_url",
    "database_file",
    "dialect_class",
    "dialect_classes",
    "dialect_for",
    "for_engine",
    "for_url",
]

_CLASSES: tuple[type[Dialect], ...] = (SqliteDialect, PostgresDialect, MySQLDialect)
_DIALECTS: dict[str, type[Dialect]] = {
    name: cls for cls in _CLASSES for name in (cls.name, *cls.aliases)
}


def dialect_classes() -> list[type[Dialect]]:
    """Every dialect the store supports."""
    return list(_CLASSES)


def dialect_class(name: str) -> type[Dialect]:
    """The `Dialect` class of a SQLAlchemy dialect name, or `InvalidInputError`."""
    found = _DIALECTS.get(name)
    if found is None:
        titles = ", ".join(d.title for d in _CLASSES)
        examples = " or ".join(f"{d.name}+{d.driver}://" for d in _CLASSES)
        raise InvalidInputError(
            f"agentcontext supports {titles}, not {name!r}; use a {examples} URL"
        )
    return found


def class_for_url(url: URL) -> type[Dialect]:
    """The `Dialect` class of the database a URL names, or `InvalidInputError`."""
    return dialect_class(url.get_backend_name())


def for_url(url: URL, options: EngineOptions) -> Dialect:
    """The dialect of a store made from ``url`` (its driver and its options checked)."""
    cls = dialect_class(url.get_backend_name())
    if url.get_driver_name() not in (cls.drivers or (cls.driver,)):
        named = " or ".join(cls.drivers or (cls.driver,))
        raise InvalidInputError(
            f"use the {named} driver for {url.get_backend_name()}: "
            f"{url.get_backend_name()}+{cls.driver}://... (got {url.drivername})"
        )
    _refuse_foreign(cls, options)
    if options.schema is not None:
        cls.check_schema(options.schema)
    return cls.from_url(url, options)


def _refuse_foreign(cls: type[Dialect], options: EngineOptions) -> None:
    changed = options.changed_options
    for other in _CLASSES:
        foreign = sorted((other.options - cls.options) & changed)
        if other is not cls and foreign:
            raise cls.refuse(foreign, other)


def database_file(url: URL) -> str | None:
    """The local file a database URL names (an SQLite file), or None (a server, memory)."""
    found = _DIALECTS.get(url.get_backend_name())
    return None if found is None else found.local_file(url)


def for_engine(engine: AsyncEngine, options: EngineOptions) -> Dialect:
    """The dialect of a store on a caller's engine (the engine is made ready for it)."""
    cls = dialect_class(engine.dialect.name)
    _refuse_foreign(cls, options)
    if options.schema is not None:
        cls.check_schema(options.schema)
    return cls.from_engine(engine, options)


@dataclass(frozen=True)
class _Defaults:
    """Every engine option at its default, but ``pgbouncer``."""

    pgbouncer: bool = False
    connect_timeout: float = 10.0
    command_timeout: float | None = None
    sqlite_busy_timeout: float = 30.0
    sqlite_synchronous: str = "normal"
    schema: str | None = None
    changed_options: frozenset[str] = frozenset()


def dialect_for(name: str, *, pgbouncer: bool = False, schema: str | None = None) -> Dialect:
    """The `Dialect` for a SQLAlchemy dialect name with default options (migrations, tools)."""
    options = _Defaults(pgbouncer=pgbouncer, schema=schema)
    return dialect_class(name).from_url(URL.create(name), options)
