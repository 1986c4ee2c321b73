"""The typed options of ``SqlContextStore`` and the engine they make."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine

from agentcontext import _validate as v
from agentcontext._validate import dumps, loads
from agentcontext.errors import (
    ContextError,
    InvalidInputError,
    InvalidTypeError,
    MissingExtraError,
)
from agentcontext.store import _dialects
from agentcontext.store._db import compiled as _compiled
from agentcontext.store._db.database import Database
from agentcontext.store._db.replicas import Replica, Replicas, check_replicas
from agentcontext.store._dialects import Dialect
from agentcontext.store._memory import DEFAULT_CACHE_BYTES
from agentcontext.store._rows.sealing import KeyedSealer

__all__ = ["StoreOptions", "check_schema_name", "make_engine", "open_database"]


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
    """Seconds an SQLite write waits for another process's write to finish (a store made from
    a URL tries again at least every 2 ms meanwhile)."""
    sqlite_synchronous: str = "normal"
    """``"normal"`` (a killed process loses nothing, a power cut may lose the last commits) or
    ``"full"`` (every commit is on disk before it returns)."""
    schema: str | None = None
    """PostgreSQL only: the schema that holds every table, index and the Alembic version table
    of this store (created when missing under ``migrate="auto"``); stores on different schemas
    of one database never see each other's data. One tenant per schema."""
    read_replicas: tuple[Any, ...] = ()
    """PostgreSQL's streaming standbys or MariaDB's replicas (URLs, or AsyncEngines you own;
    MariaDB's primary needs its binary log on) that serve reads
    once they have replayed this store's writes to the chat read; writes, compare-and-swap
    and ``using()`` / ``begin()`` always run on the primary. Engines for URLs are made with
    the same options as the primary's and disposed by ``close()``."""
    replica_wait: float = 0.1
    """With ``read_replicas``: seconds a read waits for a replica to replay this store's writes
    before the primary serves it (0: never wait)."""
    lock_timeout: float = 30.0
    """Seconds a write waits for a chat held by an uncommitted transaction of this process
    (``store.using()`` / ``store.begin()``) before it fails with `ChatBusyError`."""
    cache_bytes: int = DEFAULT_CACHE_BYTES
    """Bytes (estimated) of decoded messages the store keeps for its engines: a fresh engine
    of a chat reads and decodes only what changed since another engine of this store last
    held it. ``0`` keeps none. Default 64 MiB."""
    encryption: Any = None
    """A `KeyProvider` (e.g. `LocalKeyProvider`): message contents, chat titles and chat
    metadata are stored encrypted under a data key per user that the provider holds outside
    the database; search still works; ``erase_user`` destroys the user's key. See the
    encryption page of the docs."""
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

    @property
    def changed_options(self) -> frozenset[str]:
        """`changed` as a set (what the dialects read)."""
        return frozenset(self.changed())

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
        if "cache_bytes" in given:
            v.check_int(given["cache_bytes"], "cache_bytes", minimum=0)
            _check_bounded_bytes(given["cache_bytes"])
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
        if given.get("encryption") is not None:
            _check_provider(given["encryption"])
        if "read_replicas" in given:
            given = {**given, "read_replicas": check_replicas(given["read_replicas"])}
        if "replica_wait" in given:
            _check_seconds(given["replica_wait"], "replica_wait", zero=True)
        if given.get("schema") is not None:
            check_schema_name(given["schema"])
        for name in ("pgbouncer", "echo"):
            if name in given:
                v.check_bool(given[name], name)
        for name in ("connect_timeout", "sqlite_busy_timeout", "lock_timeout"):
            if name in given and given[name] is None:
                raise InvalidTypeError(f"{name} must be a number of seconds, got None")
        for dialect in _dialects.dialect_classes():
            dialect.check_options(given)
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


def _check_bounded_bytes(value: int) -> None:
    if value > 2**50:
        raise InvalidInputError(f"cache_bytes is {value}; give at most 2**50 bytes (or 0)")


def _check_provider(provider: object) -> None:
    missing = [
        name
        for name in ("get_data_key", "create_data_key", "destroy_data_key")
        if not callable(getattr(provider, name, None))
    ]
    if missing:
        raise InvalidTypeError(
            "encryption must be a key provider (agentcontext.encryption.KeyProvider, e.g. "
            f"LocalKeyProvider), got {v.type_name(provider)} without {', '.join(missing)}"
        )
    try:
        import cryptography  # noqa: F401
    except ImportError:  # pragma: no cover - the extra is installed in the tests
        raise MissingExtraError(
            "encryption needs the cryptography package: pip install 'agentcontext[encryption]'"
        ) from None


def _check_seconds(value: object, name: str, *, zero: bool = False) -> None:
    if value is None and not zero:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidTypeError(f"{name} must be a number of seconds, got {v.type_name(value)}")
    if zero:
        if not math.isfinite(value) or not 0 <= value <= 60:
            raise InvalidInputError(f"{name} must be between 0 and 60 seconds, got {value!r}")
        return
    if not math.isfinite(value) or value <= 0 or value > 86_400 * 365:
        raise InvalidInputError(f"{name} must be a positive number of seconds, got {value!r}")


def make_engine(url: URL, options: StoreOptions) -> tuple[AsyncEngine, Dialect]:
    """The store's engine for ``url`` and its dialect (see `Dialect.make_engine`).

    No ping on checkout (a connection found dead is replaced and the unit run again when that
    is safe), JSON read and written by the library's own functions, SQL compiled once per
    process for every engine of the same kind (`_compiled`).
    """
    dialect = _dialects.for_url(url, options)
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
    try:
        engine = dialect.make_engine(url, options, kwargs)
    except ContextError:
        raise
    except (TypeError, ValueError, ArgumentError) as exc:
        # SQLAlchemy's dialect reads the URL's query parameters as the driver's settings
        # (``?timeout=abc`` on SQLite) and checks the engine's keyword arguments.
        raise InvalidInputError(
            f"cannot make an engine for {url.render_as_string(hide_password=True)}: "
            f"{str(exc).rstrip('. ')}. "
            "Check the URL's query parameters (?name=value) and the store's engine_options"
        ) from None
    _compiled.share(engine, dict(options.engine_options or {}))
    return engine, dialect


MigrateMode = Literal["auto"] | bool
"""``"auto"`` (upgrade the schema on first use) or ``False`` (only check it)."""


def open_database(
    url_or_engine: object, options: StoreOptions, prepare: Callable[[Database], Any]
) -> Database:
    """The `Database` of a new store: its engine (made from a URL, or the caller's, made
    ready for the store), its dialect, and ``prepare``, run on its first use (the schema
    check or migration)."""
    if isinstance(url_or_engine, AsyncEngine):
        mine = {
            "pgbouncer", "lock_timeout", "read_replicas", "replica_wait", "cache_bytes",
            "encryption",
        }  # fmt: skip
        refused = sorted(set(options.changed()) - mine)
        if refused:
            raise InvalidInputError(
                f"option(s) {', '.join(refused)} cannot be applied to an engine you "
                "created; pass them to create_async_engine instead"
            )
        engine, owns = url_or_engine, False
        dialect = _dialects.for_engine(engine, options)
    elif isinstance(url_or_engine, (str, URL)):
        try:
            url = make_url(url_or_engine) if isinstance(url_or_engine, str) else url_or_engine
        except ArgumentError as exc:
            raise InvalidInputError(
                f"cannot parse database URL: {exc}; expected e.g. "
                "sqlite+aiosqlite:///chat.db or postgresql+asyncpg://user@host/db"
            ) from None
        (engine, dialect), owns = make_engine(url, options), True
    else:
        raise InvalidTypeError(
            "SqlContextStore needs a database URL or an AsyncEngine, "
            f"got {v.type_name(url_or_engine)}"
        )
    if options.encryption is not None:
        sealer = KeyedSealer(options.encryption, binary_json=dialect.binary_sealed_json)
        dialect = dialect.sealed_by(sealer)
    return Database(
        engine,
        dialect,
        owns_engine=owns,
        prepare=prepare,
        lock_timeout=float(options.lock_timeout),
        replicas=_replicas(options, dialect),
    )


def _replicas(options: StoreOptions, dialect: Dialect) -> Replicas | None:
    """The store's read replicas: engines made like the primary's for URLs, yours as given."""
    if not options.read_replicas:
        return None
    replicas: list[Replica] = []
    for item in options.read_replicas:
        if isinstance(item, AsyncEngine):
            if item.dialect.name != dialect.name:
                raise InvalidInputError(
                    f"read_replicas: an engine of a {item.dialect.name} database cannot be a "
                    f"replica of a {dialect.title} database"
                )
            replicas.append(Replica(item, owned=False))
            continue
        try:
            url = make_url(item)
        except ArgumentError as exc:
            raise InvalidInputError(f"cannot parse the read replica URL: {exc}") from None
        kind = _dialects.class_for_url(url)
        if kind.name != dialect.name:  # (before its options are checked as its own store's)
            raise InvalidInputError(
                f"read_replicas: a {kind.title} database cannot be a replica of a "
                f"{dialect.title} database"
            )
        engine, _ = make_engine(url, options)
        replicas.append(Replica(engine, owned=True))
    return Replicas(replicas, dialect, float(options.replica_wait))


_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def check_schema_name(value: object) -> str:
    """A schema name the store can use unquoted and quoted alike: lowercase letters, digits
    and underscores, not starting with a digit, at most 63 characters (the names a server
    reserves for itself are refused by its dialect, `Dialect.check_schema`)."""
    if not isinstance(value, str):
        raise InvalidTypeError(f"schema must be a str, got {v.type_name(value)}")
    if not _SCHEMA_NAME.fullmatch(value):
        raise InvalidInputError(
            f"schema {value!r} is not a usable schema name: use lowercase letters, digits and "
            "underscores (at most 63, not starting with a digit or 'pg_'), e.g. 'tenant_acme'"
        )
    return value
