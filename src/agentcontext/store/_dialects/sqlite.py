"""SQLite through aiosqlite: the embedded default.

WAL mode and foreign keys on every connection, the driver's own transaction handling off (the
begin hook emits ``BEGIN IMMEDIATE`` for a write transaction, so a read-then-write never fails
half-way with "database is locked"), one writer at a time (writes queue in the process), a
contentless FTS5 table fed with each message's search terms (its tokens under its chat's and its
user's masks, as hex words), and a view whose INSTEAD OF trigger (migration 0010) makes the
append of a save one statement.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Column,
    ColumnElement,
    Connection,
    Integer,
    LargeBinary,
    MetaData,
    Select,
    String,
    Table,
    Text,
    and_,
    bindparam,
    cast,
    column,
    event,
    exists,
    func,
    insert,
    literal_column,
    select,
    table,
    type_coerce,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool

from agentcontext._validate import dumps
from agentcontext.errors import (
    ChatBusyError,
    ContextError,
    InvalidInputError,
    InvalidTypeError,
    StoreError,
    StoreUnavailableError,
)
from agentcontext.store._db.schema import chats as C
from agentcontext.store._db.schema import messages as M
from agentcontext.store._dialects.base import (
    BEGIN_OPTION,
    AppendRefused,
    Dialect,
    EngineOptions,
    MessageRow,
    Mode,
    UnitLocks,
    candidate_columns,
    orig,
)
from agentcontext.store._dialects.base import (
    message_upsert as _message_upsert,
)
from agentcontext.store._rows.codec import stored_terms, terms_to_unindex
from agentcontext.store._rows.decode import damaged_time
from agentcontext.store._rows.terms import ScopedTerms

__all__ = [
    "APPEND_TRIGGER",
    "fts_terms",
    "APPEND_VIEW",
    "SqliteDialect",
    "install_hooks",
    "is_memory",
    "synchronous_pragma",
]

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
            "owner",
        )
    ),
)
"""The SQLite view whose INSTEAD OF trigger appends a message (see migration 0003)."""


APPEND_VIEW = (
    "CREATE VIEW message_appends AS SELECT '' AS branch_id, 0 AS first, '' AS touched_at, "
    "id, chat_id, parent_id, name, type, data, created_at, '' AS tokens, '' AS owner "
    "FROM messages WHERE 0"
)
"""The view of `APPEND_TRIGGER`: the columns of an append, no rows."""

APPEND_TRIGGER = """
CREATE TRIGGER message_appends_insert INSTEAD OF INSERT ON message_appends BEGIN
    SELECT RAISE(ABORT, 'agentcontext: no such branch')
    WHERE NOT EXISTS (SELECT 1 FROM branches WHERE id = NEW.branch_id AND chat_id = NEW.chat_id);
    SELECT RAISE(ABORT, 'agentcontext: head moved')
    WHERE (SELECT head_message_id FROM branches WHERE id = NEW.branch_id) IS NOT NEW.parent_id;
    SELECT RAISE(ABORT, 'agentcontext: owner moved')
    WHERE (SELECT user_id FROM chats WHERE id = NEW.chat_id) IS NOT NEW.owner;
    UPDATE chats SET updated_at = NEW.touched_at, version = version + NEW.first,
                     message_count = message_count + 1
    WHERE id = NEW.chat_id;
    INSERT INTO messages (id, chat_id, parent_id, depth, name, type, data, created_at, version)
    VALUES (NEW.id, NEW.chat_id, NEW.parent_id,
            (SELECT head_depth + 1 FROM branches WHERE id = NEW.branch_id),
            NEW.name, NEW.type, NEW.data, NEW.created_at,
            (SELECT version FROM chats WHERE id = NEW.chat_id));
    INSERT INTO messages_fts (rowid, tokens)
    SELECT last_insert_rowid(), NEW.tokens WHERE NEW.tokens <> '';
    UPDATE branches SET head_message_id = NEW.id, head_depth = head_depth + 1
    WHERE id = NEW.branch_id;
END
"""
"""The view and the INSTEAD OF trigger that make the append of a save one statement on SQLite
(created by migration 0010, after 0003; ``tests/store/test_write_parity.py`` checks that a migrated
database holds exactly this text, and that the trigger writes the same rows as the Python
path of ``_messages.write`` and PostgreSQL's statement). Changing them takes a migration."""

_WRITTEN = M.alias("written")
_SQLITE_SA = sqlite.dialect(paramstyle="qmark")
_SQLITE_APPENDS: dict[tuple[int, bool], str] = {}
_SQLITE_APPENDS_PARTS: dict[bool, tuple[str, str]] = {}
"""`_append_parts`, with and without ``RETURNING``, once each."""


_ROW_PARAMETERS = (
    "branch_id", "first", "touched_at", "id", "chat_id", "parent_id", "name", "type", "data",
    "created_at", "tokens", "owner",
)  # fmt: skip
"""The parameters of each row of `_sqlite_append`, in the order of its SQL."""

_APPEND_ROW = "(" + ", ".join("?" * len(_ROW_PARAMETERS)) + ")"
"""One row of the append's VALUES: a placeholder for each of `_ROW_PARAMETERS`."""


def _append_parts(returning: bool) -> tuple[str, str]:
    """The append of one row as SQLAlchemy compiles it, split around its VALUES row: the
    text before the row and the text after it (``RETURNING``, with ``returning`` the version
    each message got: the subquery is correlated, so SQLite runs it after each row's trigger;
    reading it costs a round trip to the driver's thread). Its parameters are checked to come
    in the order of `_ROW_PARAMETERS`."""
    written = (
        select(_WRITTEN.c.version)
        .where(_WRITTEN.c.id == literal_column("message_appends.id"))
        .scalar_subquery()
    )
    statement = insert(_APPENDS).values({name: bindparam(name) for name in _ROW_PARAMETERS})
    if returning:
        statement = statement.returning(written)
    compiled = statement.compile(dialect=_SQLITE_SA)
    if tuple(compiled.positiontup or ()) != _ROW_PARAMETERS:
        raise AssertionError(f"unexpected order of the append's parameters: {compiled.positiontup}")
    before, row, after = compiled.string.partition(" VALUES " + _APPEND_ROW)
    if not row or _APPEND_ROW in after:
        raise AssertionError(f"unexpected form of the append: {compiled.string}")
    return before + " VALUES ", after


def _sqlite_append(count: int, returning: bool) -> str:
    """The append of ``count`` rows: one INSERT into the view, its parameters those of
    `_ROW_PARAMETERS` row after row; run with ``exec_driver_sql``, which SQLAlchemy's events
    see like any statement.

    The one-row statement is SQLAlchemy's (`_append_parts`); its row is repeated here, as
    SQLAlchemy's own "insertmanyvalues" batches do, and the text kept per row count: compiling
    a multi-row INSERT through SQLAlchemy took 15 ms for 100 rows and 0.3 s for 2 000, and
    SQLAlchemy does not cache multi-row INSERTs."""
    found = _SQLITE_APPENDS.get((count, returning))
    if found is None:
        before, after = _SQLITE_APPENDS_PARTS.get(returning) or _append_parts(returning)
        _SQLITE_APPENDS_PARTS[returning] = (before, after)
        found = "".join((before, ", ".join([_APPEND_ROW] * count), after))
        if len(_SQLITE_APPENDS) < 256:
            _SQLITE_APPENDS[count, returning] = found
    return found


class SqliteDialect(Dialect):
    """SQLite through aiosqlite: WAL, foreign keys, one writer at a time."""

    name = "sqlite"
    title = "SQLite"
    driver = "aiosqlite"
    options = frozenset({"sqlite_busy_timeout", "sqlite_synchronous"})
    append_chunk = 2000  # 11 values per row, well under SQLite's 32 766 bound values
    exact_candidates = False  # terms are hashes: a candidate's tokens are checked
    loop_bound_connections = False
    binary_sealed_json = True  # a BLOB in the JSON column: no hex, half the bytes

    # --- engine -----------------------------------------------------------------------------

    @classmethod
    def refuse(cls, names: list[str], other: type[Dialect]) -> InvalidInputError:
        if "schema" in names:
            return InvalidInputError(
                "schema= keeps a tenant's tables in a PostgreSQL schema; SQLite has none: give "
                "each tenant a database file of its own (sqlite+aiosqlite:///tenants/acme.db)"
            )
        if "read_replicas" in names or "replica_wait" in names:
            return InvalidInputError(
                "read_replicas= sends reads to PostgreSQL standbys; an SQLite database is one "
                "file with no replicas: drop read_replicas=, or use PostgreSQL "
                "(postgresql+asyncpg://...) with streaming standbys"
            )
        return super().refuse(names, other)

    @classmethod
    def check_options(cls, given: Mapping[str, Any]) -> None:
        if "sqlite_synchronous" in given:
            synchronous_pragma(given["sqlite_synchronous"])

    @classmethod
    def from_url(cls, url: URL, options: EngineOptions) -> SqliteDialect:
        return _SQLITE

    @classmethod
    def from_engine(cls, engine: AsyncEngine, options: EngineOptions) -> SqliteDialect:
        install_hooks(engine)
        return _SQLITE

    def make_engine(self, url: URL, options: EngineOptions, kwargs: dict[str, Any]) -> AsyncEngine:
        connect_args = dict(kwargs.pop("connect_args", None) or {})
        connect_args.setdefault("timeout", float(options.sqlite_busy_timeout))
        if is_memory(url):
            kwargs.setdefault("poolclass", StaticPool)
            connect_args.setdefault("check_same_thread", False)
        if url.get_driver_name() == "aiosqlite" and "module" not in kwargs:
            from agentcontext.store._dialects.sqlite_driver import DBAPI

            if DBAPI is not None:  # one hand-off to the driver's thread per statement
                kwargs["module"] = DBAPI
        engine = create_async_engine(url, connect_args=connect_args, **kwargs)
        install_hooks(engine, synchronous_pragma(options.sqlite_synchronous))
        return engine

    def unit_locks(self, url: URL) -> UnitLocks:
        # One writer per file: writes queue in the process rather than in the busy handler;
        # in memory, every unit shares the one connection.
        return "all" if is_memory(url) else "writes"

    @classmethod
    def local_file(cls, url: URL) -> str | None:
        database = url.database or ""
        return None if is_memory(url) or database.startswith("file:") else database

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
        return cast(column_, LargeBinary)

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
        rows: Sequence[MessageRow],
        *,
        first: bool,
        new_head: str,
        touched_at: datetime,
        owner: str,
        report_version: bool = True,
    ) -> int | None:
        touched = self.encode_time(touched_at)
        encode_time = self.encode_time
        sql = _sqlite_append(len(rows), report_version)
        params: list[Any] = []  # in the order of `_ROW_PARAMETERS`, row after row
        for index, row in enumerate(rows):
            params += (
                branch_id, 1 if first and index == 0 else 0, touched, row.id, row.chat_id,
                row.parent_id, row.name, row.type, row.data, encode_time(row.created_at),
                fts_terms(row.terms), owner,
            )  # fmt: skip
        try:
            result = conn.exec_driver_sql(sql, tuple(params))
            versions = result.all() if report_version else None
        except DBAPIError as exc:
            message = str(orig(exc))
            if "agentcontext: head moved" in message:
                raise AppendRefused("moved") from None
            if "agentcontext: no such branch" in message:
                raise AppendRefused("branch") from None
            if "agentcontext: owner moved" in message:
                raise AppendRefused("owner") from None
            if self.is_unique_violation(exc):
                raise AppendRefused("exists") from None
            raise
        return None if versions is None else int(versions[-1][0])

    def message_upsert(self) -> Any:
        return _message_upsert(self.insert(M), bindparam("data_json", type_=Text))

    def search_row_values(self, terms: ScopedTerms) -> dict[str, Any]:
        return {}  # the FTS5 table is kept by index_rows / unindex_rows

    def index_rows(self, conn: Connection, rows: Sequence[tuple[int, ScopedTerms]]) -> None:
        batch = [(seq, fts_terms(terms)) for seq, terms in rows if terms.hashes]
        if batch:
            conn.exec_driver_sql("INSERT INTO messages_fts (rowid, tokens) VALUES (?, ?)", batch)

    def unindex_rows(self, conn: Connection, rows: Sequence[tuple[int, ScopedTerms]]) -> None:
        # A contentless FTS5 table forgets a row when given exactly the terms it indexed.
        _unindex_texts(conn, [(seq, fts_terms(terms)) for seq, terms in rows if terms.hashes])

    def tidy_search_index(self, conn: Connection, deleted: int) -> None:
        # A contentless FTS5 table keeps a deleted row's entries as tombstones until its
        # segments merge. A 'merge' of N pages (a few KiB each) does at most that much work of
        # the merging that writes do anyway (automerge), so the space comes back as the index
        # is written to, a little at a time, at a cost bounded by what was deleted: a deleted
        # message's terms are a few hundred bytes. (A negative N, a merge of every segment,
        # would cost what the whole index holds.)
        if deleted > 0:
            pages = max(4, deleted // 16)
            conn.exec_driver_sql(
                "INSERT INTO messages_fts (messages_fts, rank) VALUES ('merge', ?)", (pages,)
            )

    # One writer at a time, other processes included. A writer kept waiting tries again every
    # 0.5-2 ms (`sqlite_driver`; an engine a caller built polls at SQLite's busy handler's
    # steps, 1, 3, 8, 18, 33, 53, 78, 103 ms after it starts waiting): short batches and a
    # pause between them let it in.
    retention_seconds = 0.02

    def retention_pause(self, took: float) -> float:
        return min(0.05, max(0.03, took))

    # A batch writes hundreds of pages to the WAL. Past 1 000 pages the connection that commits
    # next copies them into the database (and syncs it) before its call returns: often a
    # writer of another chat. The retention run does it itself instead, between its batches.
    checkpoints_after_batches = True

    def checkpoint_log(self, conn: Connection) -> None:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")

    def _candidates(self, scope: ColumnElement[bool], shape: int) -> Select[Any]:
        fts = table("messages_fts", column("rowid", Integer))
        match = literal_column("messages_fts").op("MATCH")(bindparam("search_query"))
        return (
            select(*candidate_columns(self))
            .select_from(fts.join(M, M.c.seq == fts.c.rowid))
            .where(match, fts.c.rowid < bindparam("before_seq"), scope)
            .order_by(fts.c.rowid.desc())
            .limit(bindparam("search_limit"))
        )

    def search_params(self, mask: int, hashes: list[int]) -> dict[str, Any]:
        # Each term quoted (hex digits): FTS5 reads it as one plain token, never an operator.
        prefix = _prefix(mask)
        return {"search_query": " ".join(f'"{prefix}{h}"' for h in _hexes_of(hashes))}

    def take_migration_lock(self, connection: Connection) -> None:
        """SQLite holds the write lock already (the migration's transaction is IMMEDIATE)."""

    def is_unique_violation(self, exc: BaseException) -> bool:
        return "UNIQUE constraint failed" in str(orig(exc))

    def is_foreign_key_violation(self, exc: BaseException) -> bool:
        return "FOREIGN KEY constraint failed" in str(orig(exc))

    def is_out_of_range(self, exc: BaseException) -> bool:
        found = orig(exc)
        return isinstance(found, OverflowError) or "too large" in str(found)

    def translate(
        self, exc: BaseException, reason: str, url: URL, busy: bool
    ) -> ContextError | None:
        shown = url.render_as_string(hide_password=True)
        if "unable to open database file" in reason:
            return StoreUnavailableError(
                f"cannot open the SQLite database at {shown}: {reason}. Check that its "
                "directory exists and is writable"
            )
        if "file is not a database" in reason or "malformed" in reason:
            return StoreError(
                f"{shown} is not a valid SQLite database ({reason}); point the store at "
                "a new file or restore this one from a backup"
            )
        if "database is locked" in reason:
            if busy:
                return ChatBusyError(
                    f"the SQLite database at {shown} is locked by an open transaction of "
                    "this process (store.using() or store.begin()) that did not end within "
                    "the busy timeout (sqlite_busy_timeout); nothing was written. End that "
                    "transaction first"
                )
            error = StoreUnavailableError(
                f"the SQLite database at {shown} stayed locked by another process for "
                "longer than the busy timeout (sqlite_busy_timeout); nothing was written. "
                "Retry, or let that process finish its write"
            )
            error.contended = True  # (a save does not wait the whole timeout again)
            return error
        return None

    def unindex_ahead(self, conn: Connection, chat_ids: Sequence[str]) -> Mapping[int, Any]:
        # A message's FTS5 term text, with the raw data and owner it came from: the write
        # transaction takes it as it is for each row that still has both.
        ahead: dict[int, tuple[Any, str, str]] = {}
        for seq, raw, user_id, message_id, chat_id in _chat_rows(conn, chat_ids):
            try:
                terms = stored_terms(self, raw, chat_id, message_id, user_id)
            except ContextError:
                continue  # (a damaged row: the write transaction reports it)
            ahead[int(seq)] = (raw, user_id, fts_terms(terms))
        return ahead

    def unindex_chats(
        self, conn: Connection, chat_ids: Sequence[str], ahead: Mapping[int, Any] | None = None
    ) -> None:
        known = ahead or {}
        batch: list[tuple[int, str]] = []
        for seq, raw, user_id, message_id, chat_id in _chat_rows(conn, chat_ids):
            found = known.get(seq)
            if found is not None and found[1] == user_id and found[0] == raw:
                text = found[2]
            else:
                terms = terms_to_unindex(self, raw, chat_id, message_id, user_id)
                text = "" if terms is None else fts_terms(terms)
            if text:
                batch.append((int(seq), text))
            if len(batch) >= _UNINDEX_CHUNK:
                _unindex_texts(conn, batch)
                batch = []
        _unindex_texts(conn, batch)


_UNINDEX_CHUNK = 2000


def _chat_rows(conn: Connection, chat_ids: Sequence[str]) -> Iterator[Any]:
    """``(seq, raw data, owner, message id, chat id)`` of every message of some chats, read
    2 000 at a time: their ``seq`` first (from an index), then their rows by ``seq``."""
    for start in range(0, len(chat_ids), _UNINDEX_CHUNK):
        chunk = list(chat_ids[start : start + _UNINDEX_CHUNK])
        seqs = sorted(conn.scalars(select(M.c.seq).where(M.c.chat_id.in_(chunk))))
        for first in range(0, len(seqs), _UNINDEX_CHUNK):
            yield from conn.execute(
                select(M.c.seq, cast(M.c.data, LargeBinary), C.c.user_id, M.c.id, M.c.chat_id)
                .join_from(M, C, C.c.id == M.c.chat_id)
                .where(M.c.seq.in_(seqs[first : first + _UNINDEX_CHUNK]))
                .order_by(M.c.seq)
            ).all()


def _unindex_texts(conn: Connection, batch: Sequence[tuple[int, str]]) -> None:
    """Take rows out of the contentless FTS5 table, given exactly the terms it indexed."""
    if batch:
        conn.exec_driver_sql(
            "INSERT INTO messages_fts (messages_fts, rowid, tokens) VALUES ('delete', ?, ?)",
            batch,
        )


_SQLITE = SqliteDialect()


_hexes: dict[int, str] = {}
"""The 12 hex digits of each token hash seen lately (words recur). Replaced by a new one
(not cleared) past `_HEXES_AT_MOST`, so a call under way in another thread keeps a consistent
one."""
_HEXES_AT_MOST = 1 << 17


def _hexes_of(hashes: list[int]) -> list[str]:
    """The 12 hex digits of each token hash in an FTS5 term, in the order given."""
    global _hexes
    known = _hexes
    new = set(hashes).difference(known)
    if new:
        if len(known) + len(new) > _HEXES_AT_MOST:
            known = _hexes = {}
            new = set(hashes)
        for value in new:
            known[value] = f"{value:016x}"[:12]
    return list(map(known.__getitem__, hashes))


def _prefix(mask: int) -> str:
    """The 8 hex digits of a scope's mask that start each of its FTS5 terms."""
    return f"{mask:016x}"[:8]


def fts_terms(terms: ScopedTerms) -> str:
    """A message's terms as the FTS5 table indexes them: for each token, its hash's hex
    digits after its chat's mask's, then after its user's (20 hex digits, one FTS5 token
    each; the terms of a scope share their first eight, which the index stores once). Part
    of the on-disk format: a contentless table forgets a row given exactly this text."""
    if not terms.hashes:
        return ""
    hexes = _hexes_of(terms.hashes)
    chat, user = _prefix(terms.chat), _prefix(terms.user)
    # Each scope's terms in one join: its prefix is in the separator.
    return f"{chat}{(' ' + chat).join(hexes)} {user}{(' ' + user).join(hexes)}"


def is_memory(url: URL) -> bool:
    """True for an in-memory SQLite URL."""
    database = url.database or ""
    return url.get_backend_name() == "sqlite" and (
        database in ("", ":memory:") or "mode=memory" in str(url.query)
    )


def _outside_transaction(dbapi_connection: Any) -> bool:
    """Whether SQLite has no transaction open on the connection (then a rollback is none)."""
    driver = getattr(dbapi_connection, "_connection", dbapi_connection)  # under the adapter
    return getattr(driver, "in_transaction", True) is False


def install_hooks(engine: AsyncEngine, synchronous: str = "NORMAL") -> None:
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
    memory = is_memory(engine.url)
    dialect = sync_engine.dialect
    if hasattr(dialect, "skip_autocommit_rollback"):  # SQLAlchemy 2.0.43 and later
        # A unit that opened no transaction (a read, a one-statement write) is not rolled
        # back when its connection goes back to the pool: SQLite would do nothing, but the
        # call would cost a round trip to the driver's thread.
        dialect.skip_autocommit_rollback = True
        dialect.detect_autocommit_setting = _outside_transaction  # type: ignore[method-assign,assignment]

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


def synchronous_pragma(value: object) -> str:
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
