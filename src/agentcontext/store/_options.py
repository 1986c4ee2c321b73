"""The typed options of ``SqlContextStore`` and the engine they make."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from agentcontext import _validate as v
from agentcontext._validate import dumps, loads
from agentcontext.errors import InvalidInputError, InvalidTypeError
from agentcontext.store._dialects import (
    make_postgres_engine,
    make_sqlite_engine,
    sqlite_synchronous,
)

__all__ = ["StoreOptions", "make_engine", "wants_pgbouncer"]

_TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True, kw_only=True)
class StoreOptions:
    """How a store connects, when it makes its engine from a URL.

    Every option is keyword-only and typed; leaving one out keeps the default below.
    """

    pool_size: int | None = None
    """Connections kept open (PostgreSQL default 5). With ``max_overflow`` it bounds every
    server connection the store opens: there is no other pool."""
    max_overflow: int | None = None
    """Extra connections opened under load and closed after (PostgreSQL default 10)."""
    pool_timeout: float | None = None
    """Seconds a call waits for a free connection before it fails (default 30)."""
    pool_recycle: float | None = None
    """Seconds after which a pooled connection is replaced (default: never)."""
    connect_timeout: float = 10.0
    """Seconds to open a PostgreSQL connection."""
    command_timeout: float | None = None
    """Seconds one PostgreSQL statement may run before the call fails (default: no limit)."""
    pgbouncer: bool = False
    """PostgreSQL behind PgBouncer in transaction pooling mode (or ``?pgbouncer=true`` in the
    URL): every statement runs in a transaction, prepared statements are neither cached nor
    named by sequence."""
    sqlite_busy_timeout: float = 30.0
    """Seconds an SQLite write waits for another process's write to finish."""
    sqlite_synchronous: str = "normal"
    """``"normal"`` (a killed process loses nothing, a power cut may lose the last commits) or
    ``"full"`` (every commit is on disk before it returns)."""
    lock_timeout: float = 30.0
    """Seconds a write waits for a chat held by an uncommitted transaction of this process
    (``store.using()`` / ``store.begin()``) before it fails with `ChatBusyError`."""
    echo: bool = False
    """Log every statement (SQLAlchemy's ``echo``)."""
    connect_args: Mapping[str, Any] | None = None
    """Extra arguments of the driver's ``connect()`` (ssl, server settings, ...)."""
    engine_options: Mapping[str, Any] | None = None
    """Any other ``create_async_engine`` argument, passed as given."""

    @classmethod
    def names(cls) -> list[str]:
        """The option names."""
        return [field.name for field in fields(cls)]

    def changed(self) -> list[str]:
        """The options set to something else than their default."""
        return [f.name for f in fields(self) if getattr(self, f.name) != f.default]

    @classmethod
    def of(cls, given: Mapping[str, Any]) -> StoreOptions:
        """Check options given by name; unknown names and bad values are refused."""
        names = cls.names()
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise InvalidInputError(
                f"unknown store option(s) {', '.join(map(repr, unknown))}; the options are "
                f"{', '.join(names)} (pass anything else for create_async_engine in "
                "engine_options={...})"
            )
        for name in ("pool_size", "max_overflow"):
            v.check_optional_int(given.get(name), name, minimum=0 if name != "pool_size" else 1)
            _check_bounded_int(given.get(name), name)
        for name in (
            "pool_timeout",
            "pool_recycle",
            "connect_timeout",
            "command_timeout",
            "sqlite_busy_timeout",
            "lock_timeout",
        ):
            _check_seconds(given.get(name), name)
        for name in ("pgbouncer", "echo"):
            if name in given:
                v.check_bool(given[name], name)
        for name in ("connect_timeout", "sqlite_busy_timeout", "lock_timeout"):
            if name in given and given[name] is None:
                raise InvalidTypeError(f"{name} must be a number of seconds, got None")
        if "sqlite_synchronous" in given:
            sqlite_synchronous(given["sqlite_synchronous"])
        for name in ("connect_args", "engine_options"):
            value = given.get(name)
            if value is not None and not isinstance(value, Mapping):
                raise InvalidTypeError(f"{name} must be a dict, got {v.type_name(value)}")
            if value is not None and any(not isinstance(key, str) for key in value):
                raise InvalidTypeError(f"{name} must have str keys")
        clashes = sorted(set(given.get("engine_options") or {}) & set(names))
        if clashes:
            raise InvalidInputError(
                f"pass {', '.join(clashes)} as store option(s), not inside engine_options"
            )
        return cls(**given)


def _check_bounded_int(value: object, name: str) -> None:
    if isinstance(value, int) and value > 10_000:
        raise InvalidInputError(f"{name} is {value}; at most 10000 connections can be asked for")


def _check_seconds(value: object, name: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidTypeError(f"{name} must be a number of seconds, got {v.type_name(value)}")
    if not math.isfinite(value) or value <= 0 or value > 86_400 * 365:
        raise InvalidInputError(f"{name} must be a positive number of seconds, got {value!r}")


def wants_pgbouncer(url: URL, options: StoreOptions) -> bool:
    """Whether the store runs behind PgBouncer: the option, or ``?pgbouncer=true``."""
    flag = url.query.get("pgbouncer")
    return bool(options.pgbouncer) or (isinstance(flag, str) and flag.lower() in _TRUE)


def make_engine(url: URL, options: StoreOptions) -> AsyncEngine:
    """The store's engine for ``url``: SQLite (aiosqlite) or PostgreSQL (asyncpg).

    No ping on checkout (a connection found dead is replaced and the unit run again when that
    is safe), JSON read and written by the library's own functions.
    """
    kwargs: dict[str, Any] = dict(options.engine_options or {})
    kwargs.setdefault("json_serializer", dumps)
    kwargs.setdefault("json_deserializer", loads)
    if options.echo:
        kwargs["echo"] = True
    for name in ("pool_size", "max_overflow", "pool_timeout", "pool_recycle"):
        value = getattr(options, name)
        if value is not None:
            kwargs[name] = value
    if options.connect_args:
        kwargs["connect_args"] = dict(options.connect_args)
    backend = url.get_backend_name()
    if backend == "sqlite":
        if url.get_driver_name() != "aiosqlite":
            raise InvalidInputError(
                "use the aiosqlite driver for SQLite: sqlite+aiosqlite://... "
                f"(got {url.drivername})"
            )
        changed = options.changed()
        postgres_only = [
            name for name in ("connect_timeout", "command_timeout", "pgbouncer") if name in changed
        ]
        if postgres_only:
            verb = "applies" if len(postgres_only) == 1 else "apply"
            raise InvalidInputError(
                f"{', '.join(postgres_only)} {verb} to PostgreSQL only, not to an SQLite "
                "database: leave it out for SQLite"
            )
        return make_sqlite_engine(
            url,
            busy_timeout=float(options.sqlite_busy_timeout),
            synchronous=sqlite_synchronous(options.sqlite_synchronous),
            kwargs=kwargs,
        )
    if backend == "postgresql":
        if url.get_driver_name() != "asyncpg":
            raise InvalidInputError(
                "use the asyncpg driver for PostgreSQL: postgresql+asyncpg://... "
                f"(got {url.drivername})"
            )
        changed = options.changed()
        sqlite_only = [
            name for name in ("sqlite_busy_timeout", "sqlite_synchronous") if name in changed
        ]
        if sqlite_only:
            verb = "applies" if len(sqlite_only) == 1 else "apply"
            raise InvalidInputError(
                f"{', '.join(sqlite_only)} {verb} to SQLite only, not to a PostgreSQL "
                "database: leave it out for PostgreSQL"
            )
        pgbouncer = wants_pgbouncer(url, options)
        if options.command_timeout is not None:
            connect_args = dict(kwargs.get("connect_args") or {})
            connect_args.setdefault("command_timeout", options.command_timeout)
            kwargs["connect_args"] = connect_args
        return make_postgres_engine(
            url.difference_update_query(["pgbouncer"]),
            connect_timeout=float(options.connect_timeout),
            pgbouncer=pgbouncer,
            kwargs=kwargs,
        )
    raise InvalidInputError(
        f"agentcontext supports SQLite and PostgreSQL, not {backend!r}; use a "
        "sqlite+aiosqlite:// or postgresql+asyncpg:// URL"
    )
