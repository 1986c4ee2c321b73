"""Everything that differs between SQLite and PostgreSQL, in one place.

- engine set-up (SQLite pragmas and write-lock-up-front transactions; PostgreSQL pre-ping),
- the upsert construct,
- full-text search (FTS5 vs tsvector ranking and snippets),
- the metadata filter of ``list_chats`` (``json_each`` vs ``@>``),
- the migration lock (the write lock vs an advisory lock),
- recognising driver errors (unique violations, lost connections).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Integer,
    Select,
    String,
    Table,
    and_,
    bindparam,
    column,
    event,
    exists,
    func,
    literal_column,
    select,
    table,
    text,
    type_coerce,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool

from agentcontext._validate import dumps, loads
from agentcontext.errors import InvalidInputError
from agentcontext.store import _schema as s

WRITE_OPTION = "agentcontext_write"
"""Execution option marking a connection whose next transaction writes (SQLite: BEGIN IMMEDIATE)."""

_MIGRATION_LOCK_KEY = 0x61676E7463747800 >> 8  # "agntctx", fits a signed bigint


@dataclass(frozen=True)
class Dialect:
    """The dialect-specific half of the store."""

    name: str

    @property
    def is_sqlite(self) -> bool:
        return self.name == "sqlite"

    @property
    def native_snippets(self) -> bool:
        """Whether :meth:`search` selects finished snippets (else the text to cut them from)."""
        return self.is_sqlite

    # --- statements ------------------------------------------------------------------------

    def insert(self, table: Table) -> Any:
        """An INSERT supporting ``on_conflict_do_update`` / ``on_conflict_do_nothing``."""
        return sqlite.insert(table) if self.is_sqlite else postgresql.insert(table)

    def insert_blobs(self, table: Table) -> Any:
        """Insert-if-absent for content-addressed blobs.

        PostgreSQL touches an existing row (``DO UPDATE``) so it stays locked until the
        writer's transaction ends: a concurrent garbage collection (``FOR UPDATE SKIP
        LOCKED``) cannot delete it in between. SQLite writers are serialised anyway, and
        rewriting a row there would copy its whole content, so it does nothing.
        """
        insert = self.insert(table)
        if self.is_sqlite:
            return insert.on_conflict_do_nothing(index_elements=[table.c.hash])
        return insert.on_conflict_do_update(
            index_elements=[table.c.hash], set_={"size": insert.excluded.size}
        )

    def metadata_filter(self, column: Any, wanted: Mapping[str, str | int | bool]) -> Any:
        """A WHERE clause matching chats whose top-level metadata has every key/value given.

        Values match by JSON type and value (``True`` does not match ``1``). Keys and values are
        bound parameters.
        """
        if not self.is_sqlite:
            return type_coerce(column, postgresql.JSONB()).contains(dict(wanted))
        clauses = []
        for key, value in wanted.items():
            each = func.json_each(column).table_valued("key", "value", "type")
            if isinstance(value, bool):
                cond = each.c.type == ("true" if value else "false")
            elif isinstance(value, int):
                cond = and_(each.c.type == "integer", each.c.value == value)
            else:
                cond = and_(each.c.type == "text", each.c.value == value)
            clauses.append(
                exists(
                    select(literal_column("1"))
                    .select_from(each)
                    .where(and_(each.c.key == key, cond))
                )
            )
        return and_(*clauses)

    def roles_filter(self, column_: ColumnElement[Any]) -> ColumnElement[bool]:
        """``column_`` is one of the roles bound as ``:roles`` (see :meth:`roles_value`).

        One bound value, not one per role, so a statement compiles once whatever the number
        of roles: a JSON array read by ``json_each`` on SQLite, an array on PostgreSQL.
        """
        if self.is_sqlite:
            each = func.json_each(bindparam("roles")).table_valued("value")
            return column_.in_(select(each.c.value))
        return column_ == func.any(bindparam("roles", type_=postgresql.ARRAY(String())))

    def roles_value(self, roles: Sequence[str]) -> Any:
        """The bound value of ``:roles`` for :meth:`roles_filter`."""
        return dumps(list(roles)) if self.is_sqlite else list(roles)

    def search_value(self, terms: Sequence[str]) -> str:
        """The bound value of ``:search_query`` for plain words (every one must occur)."""
        if self.is_sqlite:
            # Each word quoted: FTS5 operators, columns and prefixes become plain text.
            return " ".join('"' + term.replace('"', '""') + '"' for term in terms)
        return " ".join(terms)  # plainto_tsquery ignores every operator

    def search(self, scope: ColumnElement[bool]) -> Select[Any]:
        """A ranked full-text query over ``messages`` restricted by ``scope``.

        Parameters: ``search_query`` (see :meth:`search_value`) and ``search_limit``. Selects
        the message columns, ``rank`` (higher is better on both backends) and the snippet:
        SQLite's FTS5 makes it in C (16 tokens around the hits, hits in ``<mark>``); on
        PostgreSQL the column is the indexed text and
        :func:`agentcontext.store._text.snippet` cuts the same shape from it
        (``ts_headline`` is no faster and centres its fragments poorly).
        """
        m = s.messages
        cols = [m.c.id, m.c.chat_id, m.c.parent_id, m.c.name, m.c.type, m.c.data, m.c.created_at]
        query_text: Any = bindparam("search_query")
        limit = bindparam("search_limit", type_=Integer())
        if self.is_sqlite:
            fts = table("messages_fts", column("rowid"))
            fts_ref: ColumnElement[Any] = literal_column("messages_fts")
            rank = (-func.bm25(fts_ref)).label("rank")
            snippet = func.snippet(fts_ref, 0, "<mark>", "</mark>", "…", 16)
            return (
                select(*cols, rank, snippet)
                .select_from(m.join(fts, m.c.seq == fts.c.rowid))
                .where(fts_ref.op("MATCH")(query_text), scope)
                .order_by(rank.desc(), m.c.seq.desc())
                .limit(limit)
            )
        query = func.plainto_tsquery(literal_column("'simple'"), query_text)
        vector = func.to_tsvector(literal_column("'simple'"), m.c.search_text)
        rank = func.ts_rank(vector, query).label("rank")
        return (
            select(*cols, rank, m.c.search_text)
            .where(vector.op("@@")(query), scope)
            .order_by(rank.desc(), m.c.seq.desc())
            .limit(limit)
        )

    # --- locks ------------------------------------------------------------------------------

    def take_migration_lock(self, connection: Connection) -> None:
        """Serialise concurrent migrations (called inside the migration's transaction).

        SQLite already holds the write lock (the transaction began IMMEDIATE); PostgreSQL takes
        a transaction-scoped advisory lock, released at commit.
        """
        if not self.is_sqlite:
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY}
            )

    # --- errors -----------------------------------------------------------------------------

    def is_unique_violation(self, exc: BaseException) -> bool:
        """True for a unique-constraint violation reported by the driver."""
        orig = getattr(exc, "orig", exc)
        if self.is_sqlite:
            return "UNIQUE constraint failed" in str(orig)
        return _sqlstate(orig) == "23505"

    def is_foreign_key_violation(self, exc: BaseException) -> bool:
        """True for a foreign-key violation reported by the driver."""
        orig = getattr(exc, "orig", exc)
        if self.is_sqlite:
            return "FOREIGN KEY constraint failed" in str(orig)
        return _sqlstate(orig) == "23503"


def _sqlstate(orig: BaseException) -> str | None:
    for attr in ("sqlstate", "pgcode"):
        value = getattr(orig, attr, None)
        if isinstance(value, str):
            return value
    cause = getattr(orig, "__cause__", None)
    if cause is not None and cause is not orig:
        value = getattr(cause, "sqlstate", None)
        if isinstance(value, str):
            return value
    return None


def is_connection_error(exc: BaseException) -> bool:
    """True when the database could not be reached or the connection was lost."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (OSError, ConnectionError, TimeoutError)):
            return True
        name = type(current).__name__
        if name in {
            "ConnectionDoesNotExistError",
            "CannotConnectNowError",
            "ConnectionFailureError",
            "InterfaceError",
            "TooManyConnectionsError",
            "AdminShutdownError",
            "InternalClientError",
        }:
            return True
        message = str(current)
        if "unable to open database file" in message or "connection was closed" in message:
            return True
        nxt = getattr(current, "orig", None) or current.__cause__ or current.__context__
        current = nxt if isinstance(nxt, BaseException) else None
    return False


def dialect_for(engine: AsyncEngine) -> Dialect:
    """The :class:`Dialect` of an engine; only SQLite and PostgreSQL are supported."""
    name = engine.dialect.name
    if name not in ("sqlite", "postgresql"):
        raise InvalidInputError(
            f"agentcontext supports SQLite and PostgreSQL, not {name!r}; use a "
            "sqlite+aiosqlite:// or postgresql+asyncpg:// URL"
        )
    return Dialect(name)


def is_memory_sqlite(url: URL) -> bool:
    """True for an in-memory SQLite URL."""
    database = url.database or ""
    return url.get_backend_name() == "sqlite" and (
        database in ("", ":memory:") or "mode=memory" in str(url.query)
    )


def create_engine(url: str | URL, **options: Any) -> AsyncEngine:
    """Create an async engine configured for agentcontext.

    SQLite (aiosqlite): WAL journal, ``foreign_keys=ON``, a busy timeout
    (``sqlite_busy_timeout`` seconds, default 30), ``synchronous=NORMAL`` (``sqlite_synchronous=
    "full"`` syncs every commit to disk before it returns), and transactions that
    begin ``IMMEDIATE`` when they will write, so a read-then-write transaction never fails with
    "database is locked". In-memory databases share one connection.

    PostgreSQL (asyncpg): ``pool_pre_ping=True`` and a connect timeout
    (``postgres_connect_timeout`` seconds, default 10). Behind PgBouncer in transaction
    pooling mode pass ``pgbouncer=True`` (or put ``?pgbouncer=true`` in the URL): prepared
    statements are then neither cached nor named by sequence, so no statement ever depends on
    a server connection PgBouncer may have handed to another client.
    """
    parsed = make_url(url) if isinstance(url, str) else url
    backend = parsed.get_backend_name()
    options = dict(options)
    options.setdefault("json_serializer", dumps)
    options.setdefault("json_deserializer", loads)
    if backend == "sqlite":
        if parsed.get_driver_name() != "aiosqlite":
            raise InvalidInputError(
                "use the aiosqlite driver for SQLite: sqlite+aiosqlite://... "
                f"(got {parsed.drivername})"
            )
        busy_timeout = float(options.pop("sqlite_busy_timeout", 30.0))
        synchronous = sqlite_synchronous(options.pop("sqlite_synchronous", "normal"))
        connect_args = dict(options.pop("connect_args", {}))
        connect_args.setdefault("timeout", busy_timeout)
        memory = is_memory_sqlite(parsed)
        if memory:
            options.setdefault("poolclass", StaticPool)
            connect_args.setdefault("check_same_thread", False)
        engine = create_async_engine(parsed, connect_args=connect_args, **options)
        install_sqlite_hooks(engine, synchronous)
        return engine
    if backend == "postgresql":
        if parsed.get_driver_name() != "asyncpg":
            raise InvalidInputError(
                f"use the asyncpg driver for PostgreSQL: postgresql+asyncpg://... "
                f"(got {parsed.drivername})"
            )
        connect_timeout = float(options.pop("postgres_connect_timeout", 10.0))
        connect_args = dict(options.pop("connect_args", {}))
        connect_args.setdefault("timeout", connect_timeout)
        pgbouncer = _wants_pgbouncer(parsed, options)
        options.pop("pgbouncer", None)
        parsed = parsed.difference_update_query(["pgbouncer"])
        if pgbouncer:
            connect_args.setdefault("statement_cache_size", 0)
            connect_args.setdefault("prepared_statement_cache_size", 0)
            connect_args.setdefault("prepared_statement_name_func", _unique_statement_name)
        options.setdefault("pool_pre_ping", True)
        return create_async_engine(parsed, connect_args=connect_args, **options)
    raise InvalidInputError(
        f"agentcontext supports SQLite and PostgreSQL, not {backend!r}; use a "
        "sqlite+aiosqlite:// or postgresql+asyncpg:// URL"
    )


def _wants_pgbouncer(url: URL, options: Mapping[str, Any]) -> bool:
    flag = url.query.get("pgbouncer")
    return bool(options.get("pgbouncer", False)) or (
        isinstance(flag, str) and flag.lower() in ("1", "true", "yes", "on")
    )


def postgres_driver_args(url: str | URL, options: Mapping[str, Any]) -> dict[str, Any]:
    """Extra ``asyncpg.connect`` arguments matching :func:`create_engine`'s for PostgreSQL:
    the caller's ``connect_args`` (ssl, server settings, ...) without the ones only SQLAlchemy
    understands, the connect timeout, and no statement cache behind PgBouncer."""
    parsed = make_url(url) if isinstance(url, str) else url
    args: dict[str, Any] = {
        key: value
        for key, value in dict(options.get("connect_args") or {}).items()
        if key not in _SQLALCHEMY_ONLY_CONNECT_ARGS
    }
    args["timeout"] = float(options.get("postgres_connect_timeout", args.get("timeout", 10.0)))
    if _wants_pgbouncer(parsed, options):
        args["statement_cache_size"] = 0
    return args


_SQLALCHEMY_ONLY_CONNECT_ARGS = frozenset(
    {"prepared_statement_cache_size", "prepared_statement_name_func", "async_fallback"}
)


def _unique_statement_name() -> str:
    # asyncpg numbers statements per client connection; behind PgBouncer two clients would
    # collide on one server connection. A random name cannot.
    return f"__agentcontext_{uuid.uuid4().hex}__"


SQLITE_SYNCHRONOUS = {
    "NORMAL": "PRAGMA synchronous = NORMAL",
    "FULL": "PRAGMA synchronous = FULL",
}
"""The ``sqlite_synchronous`` settings and their statements (a fixed set, never formatted)."""


def sqlite_synchronous(value: object) -> str:
    """Check the ``sqlite_synchronous`` option and return its PRAGMA value."""
    if not isinstance(value, str) or value.lower() not in ("normal", "full"):
        raise InvalidInputError(
            f"sqlite_synchronous must be 'normal' (the default: a killed process loses "
            f"nothing, a power cut may lose the last commits) or 'full' (every commit is on "
            f"disk before it returns), got {value!r}"
        )
    return value.upper()


def install_sqlite_hooks(engine: AsyncEngine, synchronous: str = "NORMAL") -> None:
    """Install the SQLite connection pragmas and the BEGIN / BEGIN IMMEDIATE hook (once)."""
    sync_engine = engine.sync_engine
    if sync_engine.__dict__.get("_agentcontext_hooks"):
        return
    sync_engine.__dict__["_agentcontext_hooks"] = True
    memory = is_memory_sqlite(engine.url)

    @event.listens_for(sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take over transaction control from the driver (see the "begin" hook below). The busy
        # timeout is the driver's connect(timeout=...).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            if not memory:
                cursor.execute("PRAGMA journal_mode = WAL")
                cursor.execute(SQLITE_SYNCHRONOUS[synchronous])
            cursor.execute("PRAGMA foreign_keys = ON")
        finally:
            cursor.close()

    @event.listens_for(sync_engine, "begin")
    def _on_begin(connection: Connection) -> None:
        write = connection.get_execution_options().get(WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


__all__ = [
    "WRITE_OPTION",
    "Dialect",
    "create_engine",
    "dialect_for",
    "is_connection_error",
    "SQLITE_SYNCHRONOUS",
    "install_sqlite_hooks",
    "sqlite_synchronous",
    "is_memory_sqlite",
]
