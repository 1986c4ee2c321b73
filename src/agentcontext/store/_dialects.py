"""Everything that differs between SQLite and PostgreSQL, in one strategy object per dialect.

- making the engine (SQLite pragmas and transaction control; PostgreSQL connect options,
  PgBouncer) and setting a connection up for a unit of work,
- the upsert construct, the single-statement append of a save, the search candidates and
  how the search index is kept (an FTS5 table on SQLite, a signature column on PostgreSQL),
- the metadata filter of ``list_chats``, the roles filter, row locks, the migration lock,
- timestamps in raw rows, and recognising driver errors.

The rest of the store is written once, against `Dialect`.
"""

from __future__ import annotations

import abc
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal

from sqlalchemy import (
    Column,
    ColumnElement,
    Connection,
    DateTime,
    Integer,
    MetaData,
    Select,
    String,
    Table,
    Text,
    and_,
    bindparam,
    case,
    cast,
    column,
    event,
    exists,
    func,
    insert,
    literal_column,
    select,
    table,
    text,
    type_coerce,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool

from agentcontext._validate import dumps, loads
from agentcontext.errors import InvalidInputError, InvalidTypeError
from agentcontext.store import _tokenizer
from agentcontext.store._rows import damaged_json, damaged_time
from agentcontext.store._schema import chats as C
from agentcontext.store._schema import messages as M

__all__ = [
    "BEGIN_OPTION",
    "AppendRow",
    "Dialect",
    "Mode",
    "PostgresDialect",
    "SqliteDialect",
    "dialect_for",
    "is_memory_sqlite",
]

Mode = Literal["read", "snapshot", "write", "atomic"]
"""How a unit of work runs: ``read`` (no transaction: each statement sees the latest commits),
``snapshot`` (reads that see one consistent state), ``write`` (one transaction, SQLite's write
lock taken up front) or ``atomic`` (one statement that is atomic on its own)."""

BEGIN_OPTION = "agentcontext_begin"
"""Execution option telling the SQLite begin hook what to emit: ``"immediate"`` (a write
transaction), ``"none"`` (statements autocommit) or absent (a plain deferred ``BEGIN``, which in
WAL mode reads one consistent snapshot)."""

_MIGRATION_LOCK_KEY = 0x61676E7463747800 >> 8  # "agntctx", fits a signed bigint


@dataclass(frozen=True, slots=True)
class AppendRow:
    """One new message of an append, ready for the statement."""

    id: str
    chat_id: str
    parent_id: str | None
    name: str
    type: str
    data: str | None
    """The JSON text of the message data."""
    tokens: list[str]
    """Its searchable tokens."""
    created_at: datetime


class Dialect(abc.ABC):
    """The dialect-specific half of the store (stateless; one instance per dialect)."""

    name: ClassVar[str]
    is_sqlite: ClassVar[bool]
    atomic_needs_commit = False
    """Whether a lone statement runs inside a transaction to commit (behind PgBouncer)."""

    # --- engine -----------------------------------------------------------------------------

    @abc.abstractmethod
    def prepare(self, conn: Connection, mode: Mode) -> None:
        """Set a freshly checked-out connection up for a unit of work."""

    def join_transaction(self, conn: Connection) -> None:  # noqa: B027 - optional
        """Make sure a real transaction is open on a caller's connection (``store.using``)
        before the store writes on it, so the caller's rollback undoes the store's writes."""

    @abc.abstractmethod
    def database_identity(self, conn: Connection) -> tuple[Any, ...]:
        """What tells the database ``conn`` reaches apart from any other database."""

    # --- values ------------------------------------------------------------------------------

    @abc.abstractmethod
    def encode_time(self, moment: datetime) -> Any:
        """A timestamp as a raw statement binds it (what ``UTCDateTime`` would store)."""

    @abc.abstractmethod
    def decode_time(self, value: Any) -> Any:
        """A timestamp of a raw row as an aware UTC datetime (`Damaged` if it is not one)."""

    def decode_json(self, value: Any) -> Any:
        """A JSON column of a raw row (its text) as a value (`Damaged` if it is not JSON)."""
        if value is None or not isinstance(value, (str, bytes)):
            return value
        try:
            return loads(value)
        except (ValueError, TypeError, RecursionError) as exc:
            return damaged_json(value, exc)

    @abc.abstractmethod
    def raw_json(self, column_: Any) -> ColumnElement[Any]:
        """A JSON column as its text, with no per-row decoding by SQLAlchemy."""

    @abc.abstractmethod
    def raw_time(self, column_: Any) -> ColumnElement[Any]:
        """A timestamp column as the driver returns it (see `decode_time`)."""

    # --- statements --------------------------------------------------------------------------

    @abc.abstractmethod
    def insert(self, table: Table) -> Any:
        """An INSERT supporting ``on_conflict_do_update`` / ``on_conflict_do_nothing``."""

    @abc.abstractmethod
    def insert_blobs(self, table: Table) -> Any:
        """Insert-if-absent for content-addressed blobs."""

    @abc.abstractmethod
    def metadata_filter(self, column: Any, wanted: Mapping[str, str | int | bool]) -> Any:
        """A WHERE clause keeping chats whose top-level metadata has every key/value given.

        Values match by JSON type and value (``True`` does not match ``1``); keys and values
        are bound parameters.
        """

    @abc.abstractmethod
    def roles_filter(self, column_: ColumnElement[Any]) -> ColumnElement[bool]:
        """``column_`` is one of the roles bound as ``:roles`` (one bound value, so a statement
        compiles once whatever the number of roles)."""

    @abc.abstractmethod
    def roles_value(self, roles: Sequence[str]) -> Any:
        """The bound value of ``:roles`` for `roles_filter`."""

    def lock_chat(self, conn: Connection, chat_id: str) -> None:  # noqa: B027 - optional
        """Lock the chat's row until the transaction ends (SQLite: the write lock is held)."""

    # --- the append of a save ------------------------------------------------------------------

    append_chunk: ClassVar[int]
    """Most messages one append statement takes; more are written in one transaction."""

    @abc.abstractmethod
    def append(
        self,
        conn: Connection,
        branch_id: str,
        rows: Sequence[AppendRow],
        *,
        first: bool,
        new_head: str,
        touched_at: datetime,
        report_version: bool = True,
    ) -> int | None:
        """Insert ``rows`` after the branch head and move the head to ``new_head``, in one
        statement, if the head is the first row's parent (compare-and-swap). The rows are a
        chain: each one is the parent of the next, and the last one is ``new_head``.

        With ``report_version`` the chat's version after the write is returned when the
        dialect can read it in the same statement (otherwise None).

        ``first`` marks the first statement of a save (it bumps the chat's version). Returns
        the chat's version after the write when the dialect reports it. Raises
        `AppendRefused` when the statement changed nothing.
        """

    # --- search ------------------------------------------------------------------------------

    @abc.abstractmethod
    def search_row_values(self, rows: Sequence[tuple[str, list[str]]]) -> dict[str, Any]:
        """Extra column values (by message id) that keep the search index of new rows."""

    @abc.abstractmethod
    def index_rows(self, conn: Connection, rows: Sequence[tuple[int, list[str]]]) -> None:
        """Index ``(seq, tokens)`` of rows just written (SQLite's FTS5 table)."""

    @abc.abstractmethod
    def unindex_rows(self, conn: Connection, rows: Sequence[tuple[int, list[str]]]) -> None:
        """Remove ``(seq, tokens)`` of rows about to be deleted or rewritten from the index."""

    def search_candidates(self, scope: Literal["chat", "user"], with_roles: bool) -> Select[Any]:
        """Messages of the scope that may hold every query token, newest first.

        Parameters: ``scope_id``, ``search_limit``, ``before_seq`` (only rows inserted before
        it) and what `search_params` gives; ``roles`` with ``with_roles``. Columns: seq, id,
        chat_id, parent_id, name, type, data (JSON text), created_at.
        """
        where = (
            M.c.chat_id == bindparam("scope_id")
            if scope == "chat"
            else M.c.chat_id.in_(select(C.c.id).where(C.c.user_id == bindparam("scope_id")))
        )
        if with_roles:
            where = and_(where, self.roles_filter(M.c.name))
        return self._candidates(where)

    @abc.abstractmethod
    def _candidates(self, scope: ColumnElement[bool]) -> Select[Any]:
        """`search_candidates` restricted by ``scope``."""

    @abc.abstractmethod
    def search_params(self, query: Sequence[str]) -> dict[str, Any]:
        """The bound values of `search_candidates` for these query tokens."""

    exact_candidates: ClassVar[bool]
    """Whether every candidate holds every query token (else each is checked)."""

    # --- locks and errors ----------------------------------------------------------------------

    @abc.abstractmethod
    def take_migration_lock(self, connection: Connection) -> None:
        """Serialise concurrent migrations (inside the migration's transaction)."""

    @abc.abstractmethod
    def is_unique_violation(self, exc: BaseException) -> bool:
        """True for a unique-constraint violation reported by the driver."""

    @abc.abstractmethod
    def is_foreign_key_violation(self, exc: BaseException) -> bool:
        """True for a foreign-key violation reported by the driver."""

    @abc.abstractmethod
    def is_out_of_range(self, exc: BaseException) -> bool:
        """True when the driver refused a number (or a date) it cannot represent."""


class AppendRefused(Exception):
    """Internal: an append statement wrote nothing. ``reason`` says why."""

    def __init__(self, reason: Literal["moved", "exists", "branch"]) -> None:
        super().__init__(reason)
        self.reason = reason


def _orig(exc: BaseException) -> BaseException:
    return getattr(exc, "orig", None) or exc


def _sqlstate(exc: BaseException) -> str | None:
    orig = _orig(exc)
    for candidate in (orig, getattr(orig, "__cause__", None)):
        for attr in ("sqlstate", "pgcode"):
            value = getattr(candidate, attr, None)
            if isinstance(value, str):
                return value
    return None


# --- SQLite --------------------------------------------------------------------------------

SQLITE_SYNCHRONOUS = {
    "NORMAL": "PRAGMA synchronous = NORMAL",
    "FULL": "PRAGMA synchronous = FULL",
}
"""The ``sqlite_synchronous`` settings and their statements (a fixed set, never formatted)."""

_APPENDS = Table(
    "message_appends",
    MetaData(),
    *(
        Column(name, String)
        for name in (
            "branch_id",
            "first",
            "touched_at",
            "id",
            "chat_id",
            "parent_id",
            "name",
            "type",
            "data",
            "created_at",
            "tokens",
        )
    ),
)
"""The SQLite view whose INSTEAD OF trigger appends a message (see migration 0003)."""


_WRITTEN = M.alias("written")
_SQLITE_SA = sqlite.dialect(paramstyle="qmark")
_SQLITE_APPENDS: dict[tuple[int, bool], tuple[str, tuple[str, ...]]] = {}


def _sqlite_append(count: int, returning: bool) -> tuple[str, tuple[str, ...]]:
    """The append of ``count`` rows: one INSERT into the view, with ``returning`` the version
    each message got (the subquery is correlated, so SQLite runs it after each row's trigger;
    reading it costs a round trip to the driver's thread).

    Compiled once per row count here (SQLAlchemy does not cache multi-row INSERTs): its SQL and
    the order of its parameters, run with ``exec_driver_sql``, which SQLAlchemy's events see
    like any statement."""
    found = _SQLITE_APPENDS.get((count, returning))
    if found is None:
        written = (
            select(_WRITTEN.c.version)
            .where(_WRITTEN.c.id == literal_column("message_appends.id"))
            .scalar_subquery()
        )
        rows: list[dict[str, Any]] = [
            {
                "branch_id": bindparam("branch_id"),
                "touched_at": bindparam("touched_at"),
                **{
                    name: bindparam(f"{name}_{index}")
                    for name in (
                        "first",
                        "id",
                        "chat_id",
                        "parent_id",
                        "name",
                        "type",
                        "data",
                        "created_at",
                        "tokens",
                    )
                },
            }
            for index in range(count)
        ]
        statement = insert(_APPENDS).values(rows)
        if returning:
            statement = statement.returning(written)
        compiled = statement.compile(dialect=_SQLITE_SA)
        found = (compiled.string, tuple(compiled.positiontup or ()))
        if len(_SQLITE_APPENDS) < 256:
            _SQLITE_APPENDS[count, returning] = found
    return found


def _candidate_columns(dialect: Dialect) -> list[Any]:
    return [
        M.c.seq,
        M.c.id,
        M.c.chat_id,
        M.c.parent_id,
        M.c.name,
        M.c.type,
        dialect.raw_json(M.c.data),
        dialect.raw_time(M.c.created_at),
    ]


class SqliteDialect(Dialect):
    """SQLite through aiosqlite: WAL, foreign keys, one writer at a time."""

    name = "sqlite"
    is_sqlite = True
    append_chunk = 2000  # 11 values per row, well under SQLite's 32 766 bound values
    exact_candidates = True

    def prepare(self, conn: Connection, mode: Mode) -> None:
        if mode == "write":
            conn.execution_options(**{BEGIN_OPTION: "immediate"})
        elif mode != "snapshot":
            conn.execution_options(**{BEGIN_OPTION: "none"})

    def join_transaction(self, conn: Connection) -> None:
        # The sqlite3 module opens a transaction only before INSERT, UPDATE and DELETE, and
        # an engine without the store's begin hook emits no BEGIN: a store's SAVEPOINT would
        # then open the transaction itself and its RELEASE would commit it. The write lock is
        # taken now, so a read-then-write never fails half-way with "database is locked".
        driver = conn.connection.driver_connection
        if not getattr(driver, "in_transaction", True):
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    def database_identity(self, conn: Connection) -> tuple[Any, ...]:
        for row in conn.exec_driver_sql("PRAGMA database_list").all():
            if row[1] == "main":
                if row[2]:
                    return ("file", os.path.realpath(row[2]))
                break
        # In memory: the database lives and dies with its one driver connection.
        return ("memory", id(conn.connection.driver_connection))

    def encode_time(self, moment: datetime) -> str:
        return moment.astimezone(UTC).isoformat(timespec="microseconds")

    def decode_time(self, value: Any) -> Any:
        try:
            moment = datetime.fromisoformat(value)
        except (TypeError, ValueError):
            return damaged_time(value)  # named with its row when a record is built
        return moment if moment.tzinfo is not None else damaged_time(value)

    def raw_json(self, column_: Any) -> ColumnElement[Any]:
        return type_coerce(column_, Text)

    def raw_time(self, column_: Any) -> ColumnElement[Any]:
        return type_coerce(column_, Text)

    def insert(self, table: Table) -> Any:
        return sqlite.insert(table)

    def insert_blobs(self, table: Table) -> Any:
        # Writers are serialised, and rewriting a row would copy its whole content.
        return sqlite.insert(table).on_conflict_do_nothing(index_elements=[table.c.hash])

    def metadata_filter(self, column: Any, wanted: Mapping[str, str | int | bool]) -> Any:
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
        each = func.json_each(bindparam("roles")).table_valued("value")
        return column_.in_(select(each.c.value))

    def roles_value(self, roles: Sequence[str]) -> Any:
        return dumps(list(roles))

    def append(
        self,
        conn: Connection,
        branch_id: str,
        rows: Sequence[AppendRow],
        *,
        first: bool,
        new_head: str,
        touched_at: datetime,
        report_version: bool = True,
    ) -> int | None:
        touched = self.encode_time(touched_at)
        params: dict[str, Any] = {"branch_id": branch_id, "touched_at": touched}
        for index, row in enumerate(rows):
            params[f"first_{index}"] = 1 if first and index == 0 else 0
            params[f"id_{index}"] = row.id
            params[f"chat_id_{index}"] = row.chat_id
            params[f"parent_id_{index}"] = row.parent_id
            params[f"name_{index}"] = row.name
            params[f"type_{index}"] = row.type
            params[f"data_{index}"] = row.data
            params[f"created_at_{index}"] = self.encode_time(row.created_at)
            params[f"tokens_{index}"] = " ".join(row.tokens)
        sql, names = _sqlite_append(len(rows), report_version)
        try:
            result = conn.exec_driver_sql(sql, tuple(params[name] for name in names))
            versions = result.all() if report_version else None
        except DBAPIError as exc:
            message = str(_orig(exc))
            if "agentcontext: head moved" in message:
                raise AppendRefused("moved") from None
            if "agentcontext: no such branch" in message:
                raise AppendRefused("branch") from None
            if self.is_unique_violation(exc):
                raise AppendRefused("exists") from None
            raise
        return None if versions is None else int(versions[-1][0])

    def search_row_values(self, rows: Sequence[tuple[str, list[str]]]) -> dict[str, Any]:
        return {}

    def index_rows(self, conn: Connection, rows: Sequence[tuple[int, list[str]]]) -> None:
        batch = [(seq, " ".join(tokens)) for seq, tokens in rows if tokens]
        if batch:
            conn.exec_driver_sql("INSERT INTO messages_fts (rowid, tokens) VALUES (?, ?)", batch)

    def unindex_rows(self, conn: Connection, rows: Sequence[tuple[int, list[str]]]) -> None:
        # A contentless FTS5 table forgets a row when given exactly the tokens it indexed.
        batch = [(seq, " ".join(tokens)) for seq, tokens in rows if tokens]
        if batch:
            conn.exec_driver_sql(
                "INSERT INTO messages_fts (messages_fts, rowid, tokens) VALUES ('delete', ?, ?)",
                batch,
            )

    def _candidates(self, scope: ColumnElement[bool]) -> Select[Any]:
        fts = table("messages_fts", column("rowid", Integer))
        match = literal_column("messages_fts").op("MATCH")(bindparam("search_query"))
        return (
            select(*_candidate_columns(self))
            .select_from(fts.join(M, M.c.seq == fts.c.rowid))
            .where(match, fts.c.rowid < bindparam("before_seq"), scope)
            .order_by(fts.c.rowid.desc())
            .limit(bindparam("search_limit"))
        )

    def search_params(self, query: Sequence[str]) -> dict[str, Any]:
        # Each token quoted: FTS5 reads it as one plain token, never as an operator.
        return {"search_query": " ".join(f'"{token}"' for token in query)}

    def take_migration_lock(self, connection: Connection) -> None:
        """SQLite holds the write lock already (the migration's transaction is IMMEDIATE)."""

    def is_unique_violation(self, exc: BaseException) -> bool:
        return "UNIQUE constraint failed" in str(_orig(exc))

    def is_foreign_key_violation(self, exc: BaseException) -> bool:
        return "FOREIGN KEY constraint failed" in str(_orig(exc))

    def is_out_of_range(self, exc: BaseException) -> bool:
        orig = _orig(exc)
        return isinstance(orig, OverflowError) or "too large" in str(orig)


# --- PostgreSQL ------------------------------------------------------------------------------

# One statement, one round trip, atomic on its own. Data dependencies fix the order of its
# parts, and with it the lock order every writer follows (the chat row, then the branch row):
# "touched" locks the chat and bumps its version and message count, "cur" locks the branch,
# "guard" fails the whole statement (division by zero, nothing applied) when the locked head
# is not the expected one, "ins" inserts, "moved" moves the head. A missing or foreign parent
# makes a depth NULL and an existing id breaks the unique index: the statement fails too.
_PG_APPEND = text(
    """
WITH touched AS (
    UPDATE chats SET updated_at = :touched_at, version = version + :bump,
                     message_count = message_count + :count
    WHERE id = :chat_id
    RETURNING version
), cur AS (
    SELECT b.head_message_id, b.head_depth FROM branches AS b, touched
    WHERE b.id = :branch_id AND b.chat_id = :chat_id
    FOR UPDATE OF b
), guard AS (
    SELECT 1 / (CASE WHEN cur.head_message_id IS NOT DISTINCT FROM CAST(:expected AS VARCHAR)
                     THEN 1 ELSE 0 END) AS ok
    FROM cur
), ins AS (
    INSERT INTO messages (id, chat_id, parent_id, depth, name, type, data, search_sig,
                          created_at, version)
    SELECT r.id, :chat_id, r.parent_id, cur.head_depth + r.step, r.name, r.type,
           CAST(r.data AS JSONB), CAST(r.sig AS BIT VARYING), r.created_at, touched.version
    FROM touched, cur, guard,
         unnest(CAST(:ids AS VARCHAR[]), CAST(:parents AS VARCHAR[]), CAST(:names AS VARCHAR[]),
                CAST(:types AS VARCHAR[]), CAST(:datas AS TEXT[]), CAST(:sigs AS TEXT[]),
                CAST(:created AS TIMESTAMPTZ[]))
           WITH ORDINALITY AS r(id, parent_id, name, type, data, sig, created_at, step)
    WHERE guard.ok = 1
    RETURNING 1
), moved AS (
    UPDATE branches SET head_message_id = :new_head, head_depth = cur.head_depth + :count
    FROM cur
    WHERE branches.id = :branch_id AND (SELECT count(*) FROM ins) = :count
    RETURNING 1
)
SELECT (SELECT version FROM touched), (SELECT count(*) FROM moved), (SELECT count(*) FROM cur)
"""
)
"""One statement, one round trip, atomic on its own. Data dependencies fix the order of its
parts, and with it the lock order every writer follows (the chat row, then the branch row):
``touched`` locks the chat and bumps its version and message count, ``cur`` locks the branch
and reads its head and the head's depth, ``guard`` fails the whole statement (division by
zero, nothing applied) when the head is not the expected one, ``ins`` inserts the messages
chained below it, ``moved`` moves the head. An existing id breaks the unique index: the
statement fails too."""


_VARBIT = postgresql.BIT(varying=True)


class PostgresDialect(Dialect):
    """PostgreSQL through asyncpg (directly or behind PgBouncer in transaction mode)."""

    name = "postgresql"
    is_sqlite = False
    append_chunk = 50_000  # arrays: one statement, however many rows
    exact_candidates = False

    def __init__(self, *, pgbouncer: bool = False) -> None:
        self.pgbouncer = pgbouncer
        self.atomic_needs_commit = pgbouncer
        """Behind PgBouncer in transaction pooling mode every statement runs in a transaction:
        outside one, the preparing and the running of a statement may reach different server
        connections."""

    def prepare(self, conn: Connection, mode: Mode) -> None:
        if mode == "snapshot":
            conn.execution_options(isolation_level="REPEATABLE READ")
        elif mode != "write" and not self.pgbouncer:
            # No BEGIN and COMMIT round trips for lone statements.
            conn.execution_options(isolation_level="AUTOCOMMIT")

    def database_identity(self, conn: Connection) -> tuple[Any, ...]:
        # The database's oid and the server's start time tell apart databases of one name on
        # two servers (or ports), and reach the same answer through PgBouncer.
        row = conn.exec_driver_sql(
            "SELECT current_database(), d.oid, pg_postmaster_start_time() "
            "FROM pg_database AS d WHERE d.datname = current_database()"
        ).one()
        return ("postgresql", row[0], int(row[1]), row[2].isoformat())

    def encode_time(self, moment: datetime) -> datetime:
        return moment.astimezone(UTC)

    def decode_time(self, value: Any) -> Any:
        assert isinstance(value, datetime)
        return value if value.tzinfo is UTC else value.astimezone(UTC)

    def raw_json(self, column_: Any) -> ColumnElement[Any]:
        return cast(column_, Text)

    def raw_time(self, column_: Any) -> ColumnElement[Any]:
        return type_coerce(column_, DateTime(timezone=True))

    def insert(self, table: Table) -> Any:
        return postgresql.insert(table)

    def insert_blobs(self, table: Table) -> Any:
        # Touch an existing row (DO UPDATE) so it stays locked until the writer's transaction
        # ends: a concurrent garbage collection (FOR UPDATE SKIP LOCKED) cannot delete it.
        insert = postgresql.insert(table)
        return insert.on_conflict_do_update(
            index_elements=[table.c.hash], set_={"size": insert.excluded.size}
        )

    def metadata_filter(self, column: Any, wanted: Mapping[str, str | int | bool]) -> Any:
        return type_coerce(column, postgresql.JSONB()).contains(dict(wanted))

    def roles_filter(self, column_: ColumnElement[Any]) -> ColumnElement[bool]:
        return column_ == func.any(bindparam("roles", type_=postgresql.ARRAY(String())))

    def roles_value(self, roles: Sequence[str]) -> Any:
        return list(roles)

    def lock_chat(self, conn: Connection, chat_id: str) -> None:
        conn.execute(
            text("SELECT 1 FROM chats WHERE id = :chat_id FOR UPDATE"), {"chat_id": chat_id}
        )

    def append(
        self,
        conn: Connection,
        branch_id: str,
        rows: Sequence[AppendRow],
        *,
        first: bool,
        new_head: str,
        touched_at: datetime,
        report_version: bool = True,
    ) -> int | None:
        params = {
            "touched_at": touched_at,
            "bump": 1 if first else 0,
            "count": len(rows),
            "chat_id": rows[0].chat_id,
            "branch_id": branch_id,
            "expected": rows[0].parent_id,
            "new_head": new_head,
            "ids": [row.id for row in rows],
            "parents": [row.parent_id for row in rows],
            "names": [row.name for row in rows],
            "types": [row.type for row in rows],
            "datas": ["null" if row.data is None else row.data for row in rows],
            "sigs": [_signature(row.tokens) for row in rows],
            "created": [row.created_at for row in rows],
        }
        try:
            version, moved, _ = conn.execute(_PG_APPEND, params).one()
        except DBAPIError as exc:
            if _sqlstate(exc) == "22012":  # the guard: the head was not the expected one
                raise AppendRefused("moved") from None
            if self.is_unique_violation(exc):
                raise AppendRefused("exists") from None
            raise
        if not moved:
            raise AppendRefused("branch")
        return int(version)

    def search_row_values(self, rows: Sequence[tuple[str, list[str]]]) -> dict[str, Any]:
        return {message_id: _signature(tokens) for message_id, tokens in rows}

    def index_rows(self, conn: Connection, rows: Sequence[tuple[int, list[str]]]) -> None:
        """The signature is a column of the row itself."""

    def unindex_rows(self, conn: Connection, rows: Sequence[tuple[int, list[str]]]) -> None:
        """The signature goes with the row."""

    def _candidates(self, scope: ColumnElement[bool]) -> Select[Any]:
        sig = M.c.search_sig
        tests = [
            (
                func.length(sig) == bits,
                sig.op("&")(cast(bindparam(f"mask_{bits}", type_=String()), _VARBIT))
                == cast(bindparam(f"mask_{bits}", type_=String()), _VARBIT),
            )
            for bits in _tokenizer.SIGNATURE_BITS
        ]
        return (
            select(*_candidate_columns(self))
            .where(scope, M.c.seq < bindparam("before_seq"), case(*tests, else_=False))
            .order_by(M.c.seq.desc())
            .limit(bindparam("search_limit"))
        )

    def search_params(self, query: Sequence[str]) -> dict[str, Any]:
        masks = _tokenizer.signature_masks(query)
        return {f"mask_{bits}": value for bits, value in masks.items()}

    def take_migration_lock(self, connection: Connection) -> None:
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY})

    def is_unique_violation(self, exc: BaseException) -> bool:
        return _sqlstate(exc) == "23505"

    def is_foreign_key_violation(self, exc: BaseException) -> bool:
        return _sqlstate(exc) == "23503"

    def is_out_of_range(self, exc: BaseException) -> bool:
        state = _sqlstate(exc)
        orig = _orig(exc)
        return (
            state in {"22003", "22008", "22007"}
            or isinstance(orig, OverflowError)
            or "out of range" in str(orig)
        )


def _signature(tokens: list[str]) -> str | None:
    distinct = list(dict.fromkeys(tokens))
    return _tokenizer.signature(distinct) if distinct else None


# --- choosing and making ---------------------------------------------------------------------

_SQLITE = SqliteDialect()
_POSTGRES = PostgresDialect()
_POSTGRES_PGBOUNCER = PostgresDialect(pgbouncer=True)


def dialect_for(name: str, *, pgbouncer: bool = False) -> Dialect:
    """The `Dialect` of a SQLAlchemy dialect name."""
    if name == "sqlite":
        return _SQLITE
    if name == "postgresql":
        return _POSTGRES_PGBOUNCER if pgbouncer else _POSTGRES
    raise InvalidInputError(
        f"agentcontext supports SQLite and PostgreSQL, not {name!r}; use a "
        "sqlite+aiosqlite:// or postgresql+asyncpg:// URL"
    )


def is_memory_sqlite(url: URL) -> bool:
    """True for an in-memory SQLite URL."""
    database = url.database or ""
    return url.get_backend_name() == "sqlite" and (
        database in ("", ":memory:") or "mode=memory" in str(url.query)
    )


def install_sqlite_hooks(engine: AsyncEngine, synchronous: str = "NORMAL") -> None:
    """Install the SQLite connection pragmas and the begin hook on an engine (once).

    The driver's own transaction handling is switched off: statements autocommit unless the
    begin hook (SQLAlchemy's ``begin`` event) emits ``BEGIN``, and it emits ``BEGIN
    IMMEDIATE`` for a write transaction, so a read-then-write transaction never fails with
    "database is locked", and nothing for reads and single-statement writes.
    """
    sync_engine = engine.sync_engine
    if sync_engine.__dict__.get("_agentcontext_hooks"):
        return
    sync_engine.__dict__["_agentcontext_hooks"] = True
    memory = is_memory_sqlite(engine.url)

    @event.listens_for(sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
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
        begin = connection.get_execution_options().get(BEGIN_OPTION)
        if begin == "immediate":
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        elif begin != "none":
            connection.exec_driver_sql("BEGIN")


def sqlite_synchronous(value: object) -> str:
    """Check the ``sqlite_synchronous`` option and return its PRAGMA value."""
    if not isinstance(value, str):
        raise InvalidTypeError(
            f"sqlite_synchronous must be 'normal' or 'full', got {type(value).__name__}"
        )
    if value.lower() not in ("normal", "full"):
        raise InvalidInputError(
            f"sqlite_synchronous must be 'normal' (the default: a killed process loses "
            f"nothing, a power cut may lose the last commits) or 'full' (every commit is on "
            f"disk before it returns), got {value!r}"
        )
    return value.upper()


def unique_statement_name() -> str:
    """A prepared-statement name no other client can hold (behind PgBouncer)."""
    # asyncpg numbers statements per client connection; behind PgBouncer two clients would
    # collide on one server connection. A random name cannot.
    return f"__agentcontext_{uuid.uuid4().hex}__"


def make_sqlite_engine(
    url: URL, *, busy_timeout: float, synchronous: str, kwargs: dict[str, Any]
) -> AsyncEngine:
    """An aiosqlite engine with the pragmas and transaction control of the store."""
    connect_args = dict(kwargs.pop("connect_args", None) or {})
    connect_args.setdefault("timeout", busy_timeout)
    if is_memory_sqlite(url):
        kwargs.setdefault("poolclass", StaticPool)
        connect_args.setdefault("check_same_thread", False)
    engine = create_async_engine(url, connect_args=connect_args, **kwargs)
    install_sqlite_hooks(engine, synchronous)
    return engine


def make_postgres_engine(
    url: URL, *, connect_timeout: float, pgbouncer: bool, kwargs: dict[str, Any]
) -> AsyncEngine:
    """An asyncpg engine; behind PgBouncer no statement depends on one server connection."""
    connect_args = dict(kwargs.pop("connect_args", None) or {})
    connect_args.setdefault("timeout", connect_timeout)
    if pgbouncer:
        connect_args.setdefault("statement_cache_size", 0)
        connect_args.setdefault("prepared_statement_cache_size", 0)
        connect_args.setdefault("prepared_statement_name_func", unique_statement_name)
    return create_async_engine(url, connect_args=connect_args, **kwargs)
