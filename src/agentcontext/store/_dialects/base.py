"""The dialect strategy: what every dialect of the store provides, and the shapes it shares.

A `Dialect` holds everything that differs between databases, so the rest of the store is
written once: how its engine is made and set up (options, pragmas, transaction control),
how a connection is prepared for a unit of work and joins a caller's transaction, the upsert
and the single-statement append of a save, how the search index is kept and queried, row and
migration locks, timestamps and JSON in raw rows, and what the driver's errors mean. Each
dialect is one module of this package (``sqlite``, ``postgresql``); adding a database is one
new module and one line in ``__init__``.
"""

from __future__ import annotations

import abc
import copy
import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal, Protocol, Self

from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    Table,
    and_,
    bindparam,
    delete,
    inspect,
    select,
    update,
)
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from agentcontext._drivers import is_connection_error
from agentcontext._validate import loads
from agentcontext.errors import ContextError, EncryptionError, InvalidInputError
from agentcontext.store._db import tokens
from agentcontext.store._db.schema import SEALING, SEALING_COMPLETE
from agentcontext.store._db.schema import chats as C
from agentcontext.store._db.schema import messages as M
from agentcontext.store._db.schema import store_settings as S
from agentcontext.store._rows.codec import MessageRow
from agentcontext.store._rows.decode import damaged_json
from agentcontext.store._rows.sealing import PLAIN, SEALED_FORMAT, Sealer, is_sealed
from agentcontext.store._rows.terms import ScopedTerms

__all__ = [
    "BEGIN_OPTION",
    "AppendRefused",
    "MessageRow",
    "Dialect",
    "EngineOptions",
    "Mode",
    "UnitLocks",
    "candidate_columns",
    "message_upsert",
    "orig",
    "sqlstate",
]

_log = logging.getLogger("agentcontext.store")

Mode = Literal["read", "snapshot", "write", "atomic"]
"""How a unit of work runs: ``read`` (no transaction: each statement sees the latest commits),
``snapshot`` (reads that see one consistent state), ``write`` (one transaction, SQLite's write
lock taken up front) or ``atomic`` (one statement that is atomic on its own)."""

BEGIN_OPTION = "agentcontext_begin"
"""Execution option telling the SQLite begin hook what to emit: ``"immediate"`` (a write
transaction), ``"none"`` (statements autocommit) or absent (a plain deferred ``BEGIN``, which in
WAL mode reads one consistent snapshot)."""


class EngineOptions(Protocol):
    """The options a dialect reads to make its engine (`EngineOptions` has them)."""

    @property
    def changed_options(self) -> frozenset[str]:
        """The options set to something else than their default."""
        ...

    @property
    def connect_timeout(self) -> float: ...
    @property
    def command_timeout(self) -> float | None: ...
    @property
    def pgbouncer(self) -> bool: ...
    @property
    def sqlite_busy_timeout(self) -> float: ...
    @property
    def sqlite_synchronous(self) -> str: ...
    @property
    def schema(self) -> str | None: ...


UnitLocks = Literal["none", "writes", "all"]
"""Which units of work of one store take turns in the process: ``none`` (the server orders
them), ``writes`` (a database file with one writer: writes queue in the process instead of
in the busy handler) or ``all`` (one shared connection: every unit waits its turn)."""


class Dialect(abc.ABC):
    """The dialect-specific half of the store (one immutable instance per dialect setting)."""

    name: ClassVar[str]
    """SQLAlchemy's name of the dialect (``"sqlite"``, ``"postgresql"``)."""
    aliases: ClassVar[tuple[str, ...]] = ()
    """Other SQLAlchemy names of the same dialect (``"mariadb"`` for ``"mysql"``)."""
    title: ClassVar[str]
    """Its name in messages (``"SQLite"``)."""
    not_a_replica: ClassVar[str] = "is not a standby in recovery"
    """Why a read replica that answers no replay position is skipped (in its warning)."""
    driver: ClassVar[str]
    """The async driver the store uses with it (by default)."""
    drivers: ClassVar[tuple[str, ...]] = ()
    """Every async driver a URL may name (empty: only `driver`)."""
    options: ClassVar[frozenset[str]]
    """The store options that apply to this dialect only (others' are refused)."""
    schema: str | None = None
    """The schema the store's tables live in (None: the database's default)."""
    sealer: Sealer = PLAIN
    """What seals users' text at rest (`_rows.sealing`): the codec hands it every value it
    writes or reads. A store with a key provider has a dialect of its own (`sealed_by`)."""
    atomic_needs_commit = False
    """Whether a lone statement runs inside a transaction to commit (behind PgBouncer)."""
    first_revision: ClassVar[str] = "0001"
    """The first migration that runs on this database: the ones before describe schemas it
    never had (MariaDB/MySQL start at the schema of revision 0011)."""
    migration_only: ClassVar[frozenset[str]] = frozenset()
    """Names of what the migrations make on this database otherwise than the models say, or
    besides them (an index the models cannot express here): left out of an autogenerate
    comparison (``alembic check``)."""
    entries_go_with_rows: ClassVar[bool] = False
    """Whether deleting a message row takes its search entries with it (they live in the row,
    or a cascading foreign key deletes them): else `unindex_rows` is given them first."""
    atomic_append: ClassVar[bool] = True
    """Whether `append` is one statement, atomic on its own (else it runs in a transaction)."""
    loop_bound_connections: ClassVar[bool] = True
    """Whether a connection belongs to the event loop that opened it, so that another loop
    cannot close it (asyncpg's); aiosqlite's run on a thread of their own and close from any."""

    def sealed_by(self, sealer: Sealer) -> Self:
        """This dialect for a store whose rows ``sealer`` seals (a copy: dialect objects of
        the same settings are shared by stores)."""
        clone = copy.copy(self)
        clone.sealer = sealer
        return clone

    # --- engine -----------------------------------------------------------------------------

    @classmethod  # noqa: B027 - optional: nothing to check by default
    def check_options(cls, given: Mapping[str, Any]) -> None:
        """Check the values of this dialect's own options (`options`) beyond their types."""

    @classmethod  # noqa: B027 - optional: no reserved names by default
    def check_schema(cls, schema: str) -> None:
        """Refuse (`InvalidInputError`) a ``schema=`` the server reserves for itself."""

    @classmethod
    def refuse(cls, names: list[str], other: type[Dialect]) -> InvalidInputError:
        """The error for options of ``other`` given to a store of this dialect."""
        verb = "applies" if len(names) == 1 else "apply"
        return InvalidInputError(
            f"{', '.join(names)} {verb} to {other.title} only, not to a {cls.title} database"
        )

    @classmethod
    @abc.abstractmethod
    def from_url(cls, url: URL, options: EngineOptions) -> Dialect:
        """The dialect for a store made from ``url`` with ``options``."""

    @classmethod
    @abc.abstractmethod
    def from_engine(cls, engine: AsyncEngine, options: EngineOptions) -> Dialect:
        """The dialect for a store on a caller's engine (made ready for the store: hooks)."""

    @abc.abstractmethod
    def make_engine(self, url: URL, options: EngineOptions, kwargs: dict[str, Any]) -> AsyncEngine:
        """The store's engine for ``url``; ``kwargs`` are ``create_async_engine`` arguments."""

    def unit_locks(self, url: URL) -> UnitLocks:
        """Which of one store's units take turns in the process (see `UnitLocks`)."""
        return "none"

    @classmethod
    def local_file(cls, url: URL) -> str | None:
        """The file the database lives in, for a database that is a local file."""
        return None

    @abc.abstractmethod
    def prepare(self, conn: Connection, mode: Mode) -> None:
        """Set a freshly checked-out connection up for a unit of work."""

    def on_open(self, conn: Connection) -> None:  # noqa: B027 - optional
        """Once, when a store first uses the database: check the server's settings (log what
        should change; refuse only what cannot work)."""

    def check_sealing(self, conn: Connection) -> bool:
        """Once, when a store first uses the database: a store without a key provider refuses
        (`EncryptionError`) a database an encrypted store has opened (its ``sealing``
        setting) or whose newest message is sealed (one sealed before the setting existed),
        before it writes any text there in the clear. An encrypted store learns whether every
        value is sealed (``sealing_complete``: a value in the clear is then corrupt). Returns
        whether the database still has to be marked as encrypted (`mark_sealed`)."""
        settings = self._settings(conn)
        if self.sealer.encrypted:
            self.sealer.whole = SEALING_COMPLETE in settings
            return SEALING not in settings
        if SEALING in settings:
            raise EncryptionError(
                "the database is encrypted (an encrypted store has opened it) and this store "
                "has no key provider: open it with SqlContextStore(url, encryption=<the key "
                "provider the data was written with>) (on the command line: --keyring K "
                "--key-env NAME)"
            )
        newest = conn.execute(
            select(M.c.chat_id, M.c.id, self.raw_json(M.c.data)).order_by(M.c.seq.desc()).limit(1)
        ).first()
        if newest is not None:
            self.sealer.open_json(newest[2], M.name, newest[0], newest[1])
        return False

    def _settings(self, conn: Connection) -> dict[str, str]:
        """The database's settings (`check_sealing`). A role that may not read their table (a
        read-only role granted its tables before revision 0015 made it) gets none, and a
        warning naming the grant: the database is then known by its newest message."""
        try:
            return {str(k): str(v) for k, v in conn.execute(select(S.c.name, S.c.value)).all()}
        except DBAPIError as exc:
            if is_connection_error(exc):
                raise
            conn.rollback()  # (PostgreSQL: the failed statement ended the transaction)
            _log.warning(
                "cannot read the table %s (%s): grant this role SELECT on it, so that the "
                "store knows whether the database is encrypted",
                S.name,
                str(exc.orig).splitlines()[0] if exc.orig is not None else exc,
            )
            return {}

    def mark_sealed(self, conn: Connection, *, complete: bool | None = None) -> None:
        """Record in the database that it is encrypted (`check_sealing`), and with
        ``complete`` that every value of it is sealed (None: when it holds no chat yet)."""
        settings = dict(conn.execute(select(S.c.name, S.c.value)).all())
        if SEALING not in settings:
            conn.execute(self.insert_if_absent(S).values(name=SEALING, value=SEALED_FORMAT))
        if complete is None:
            complete = conn.execute(select(C.c.id).limit(1)).first() is None
        if complete and SEALING_COMPLETE not in settings:
            when = datetime.now(UTC).isoformat()
            conn.execute(self.insert_if_absent(S).values(name=SEALING_COMPLETE, value=when))
        self.sealer.whole = self.sealer.whole or complete

    def holds_sealed(self, conn: Connection, where: ColumnElement[bool]) -> bool:
        """Whether the chats ``where`` selects are sealed (the first by id is: a database is
        encrypted whole, or chat by chat in the order of their ids by ``migrate encrypt``)."""
        found = conn.execute(select(C.c.metadata).where(where).order_by(C.c.id).limit(1)).first()
        return found is not None and is_sealed(found[0])

    def holds_keyring(self, conn: Connection) -> bool:
        """Whether the database holds a `LocalKeyProvider`'s keyring (its table of keys), in
        its default schema or the store's."""
        from agentcontext._keyring import KEYRING_TABLE

        inspector = inspect(conn)
        return any(inspector.has_table(KEYRING_TABLE, schema) for schema in {None, self.schema})

    def insert_if_absent(self, table: Table) -> Any:
        """An INSERT that leaves a row whose key exists already as it is."""
        return self.insert(table).on_conflict_do_nothing()

    def is_transient(self, exc: BaseException) -> bool:
        """Whether a failed unit of work may simply run again: the server rolled it back to
        break a deadlock, or it waited too long for a row lock (a lost race)."""
        return False

    def join_transaction(self, conn: Connection) -> None:  # noqa: B027 - optional
        """Make sure a real transaction is open on a caller's connection (``store.using``)
        before the store writes on it, so the caller's rollback undoes the store's writes."""

    @abc.abstractmethod
    def database_identity(self, conn: Connection) -> tuple[Any, ...]:
        """What tells the database ``conn`` reaches apart from any other database."""

    # --- read replicas ------------------------------------------------------------------------

    def write_position(self, conn: Connection) -> int | None:
        """After a commit on ``conn``: a position in the primary's write-ahead log that a
        replica having replayed has replayed that commit; None where there are no replicas."""
        return None

    def replay_position(self, conn: Connection) -> int | None:
        """How far the replica ``conn`` reaches has replayed the primary's log; None when it
        is not a replica."""
        return None

    def replica_identity(self, conn: Connection) -> tuple[Any, ...] | None:
        """What a replica shares with its primary and no other server does (PostgreSQL: the
        cluster's system identifier and the database's oid; MariaDB/MySQL: the database the
        store's tables are in), asked of both: a "replica" of another database (or another
        PostgreSQL cluster) is not read from. None where not checked."""
        return None

    def format_token(self, position: int) -> str:
        """A position of the primary's log as a consistency token (PostgreSQL's LSN text)."""
        return tokens.format_token(position)

    def parse_token(self, token: object, name: str = "after") -> int:
        """The position a consistency token names, or `InvalidInputError` (`InvalidTypeError`)
        saying what to pass."""
        return tokens.parse_token(token, name)

    def settle_token(self, position: int) -> int:
        """A position `parse_token` gave, once the primary has been asked where its log is:
        checked against what the store learned then (MariaDB: the token's replication
        domain, unknown when a store not yet opened took the token), or `InvalidInputError`."""
        return position

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
        """A JSON column as the UTF-8 bytes of its text, with no per-row decoding by
        SQLAlchemy or the driver: pydantic-core parses bytes directly, so a ``str`` made
        for each row would only be encoded back (a read of 10 000 messages with some
        non-ASCII text: 17 ms of fetch and 35 of decoding as text, 9 and 26 as bytes)."""

    binary_sealed_json = False
    """Whether a JSON column can hold bytes (SQLite keeps a BLOB in a column of any type): an
    encrypted store then stores a sealed value as its bytes, not as a JSON string of hex (half
    the bytes to read, nothing to decode)."""

    raw_json_misleads_planner = False
    """Whether `raw_json` is an expression whose width the planner misjudges, so that a long
    read should pick its rows in a subquery the planner cannot merge and apply it outside."""

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

    def chats_after_cursor(self, page: Select[Any]) -> Select[Any]:
        """A page of one user's chats after a keyset cursor (``list_chats(user_id=...,
        after=...)``), as this server reads it from the index on ``(user_id, updated_at, id)``:
        unchanged where the planner starts the index walk at the cursor by itself."""
        return page

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
        rows: Sequence[MessageRow],
        *,
        first: bool,
        new_head: str,
        touched_at: datetime,
        owner: str,
        report_version: bool = True,
    ) -> int | None:
        """Insert ``rows`` after the branch head and move the head to ``new_head``, in one
        statement, if the head is the first row's parent (compare-and-swap). The rows are a
        chain: each one is the parent of the next, and the last one is ``new_head``. Their
        search terms were made for the chat's ``owner``: when the chat belongs to another
        user (it was deleted and created again), nothing is written (`AppendRefused`
        ``"owner"``).

        With ``report_version`` the chat's version after the write is returned when the
        dialect can read it in the same statement (otherwise None).

        ``first`` marks the first statement of a save (it bumps the chat's version). Returns
        the chat's version after the write when the dialect reports it. Raises
        `AppendRefused` when the statement changed nothing.
        """

    # --- search ------------------------------------------------------------------------------

    @abc.abstractmethod
    def message_upsert(self) -> Any:
        """The statement that inserts a message or updates it in place (same chat only),
        returning ``(id, seq)``; its parameters are a message's columns, its data as JSON text
        (``data_json``, see `message_upsert`), and what `search_row_values` gives. Built
        once."""

    @abc.abstractmethod
    def search_row_values(self, terms: ScopedTerms) -> dict[str, Any]:
        """Extra parameters of `message_upsert` that keep the search index of a row."""

    @abc.abstractmethod
    def index_rows(self, conn: Connection, rows: Sequence[tuple[int, ScopedTerms]]) -> None:
        """Index ``(seq, terms)`` of rows just written (an index kept apart from the rows)."""

    @abc.abstractmethod
    def unindex_rows(self, conn: Connection, rows: Sequence[tuple[int, ScopedTerms]]) -> None:
        """Remove ``(seq, terms)`` of rows about to be deleted or rewritten from the index."""

    def search_shape(self, terms: int) -> int:
        """What the statement of `search_candidates` depends on of the number of distinct
        terms of a query (at least 1): 0 where one statement serves every query."""
        return 0

    def search_candidates(
        self, scope: Literal["chat", "user"], with_roles: bool, shape: int = 0
    ) -> Select[Any]:
        """Messages of the scope that may hold every query token, newest first, found through
        the scope's terms: the index entries read are the scope's, not the database's.

        Parameters: ``scope_id``, ``search_limit``, ``before_seq`` (only rows inserted before
        it) and what `search_params` gives; ``roles`` with ``with_roles``. Columns: seq, id,
        chat_id, parent_id, name, type, data (JSON text), created_at. ``shape``: what
        `search_shape` gives for the queries the statement is for.
        """
        where = (
            M.c.chat_id == bindparam("scope_id")
            if scope == "chat"
            else M.c.chat_id.in_(select(C.c.id).where(C.c.user_id == bindparam("scope_id")))
        )
        if with_roles:
            where = and_(where, self.roles_filter(M.c.name))
        return self._candidates(where, shape)

    @abc.abstractmethod
    def _candidates(self, scope: ColumnElement[bool], shape: int) -> Select[Any]:
        """`search_candidates` restricted by ``scope``, for queries of this ``shape``."""

    @abc.abstractmethod
    def search_params(self, mask: int, hashes: list[int]) -> dict[str, Any]:
        """The bound values of `search_candidates` for the query: the scope's mask and the
        hashes of its tokens (`_rows.terms.query_terms`)."""

    exact_candidates: ClassVar[bool]
    """Whether every candidate holds every query token (else each is checked)."""

    search_mode: ClassVar[Mode] = "read"
    """The unit of work a search runs in."""

    def prepare_search(
        self, conn: Connection, scope: Literal["chat", "user"], scope_id: str
    ) -> object:
        """Before the statements of a search, in its unit of work (see `search_mode`): what
        `fetch_candidates` is then given (nothing by default)."""
        return None

    def fetch_candidates(
        self, conn: Connection, statement: Select[Any], params: dict[str, Any], prepared: object
    ) -> Sequence[Any]:
        """One page of `search_candidates`: at most ``search_limit`` rows, newest first, all
        the scope's candidates before ``before_seq`` when fewer (``prepared``: what
        `prepare_search` gave)."""
        return conn.execute(statement, params).all()

    # --- locks and errors ----------------------------------------------------------------------

    @abc.abstractmethod
    def take_migration_lock(self, connection: Connection) -> None:
        """Serialise concurrent migrations (inside the migration's transaction)."""

    def release_migration_lock(self, connection: Connection) -> None:  # noqa: B027 - optional
        """Release the lock of `take_migration_lock` when it outlives the transaction."""

    def enter_schema(self, connection: Connection, schema: str, *, create: bool) -> None:
        """Inside a migration's transaction: make the store's tables go in ``schema`` (a
        checked name), creating it first with ``create``."""
        raise InvalidInputError(f"{self.title} has no schemas to keep a store's tables in")

    # --- statements a dialect may write its own way -----------------------------------------

    def prepare_migrations(self, connection: Connection, schema: str | None) -> None:  # noqa: B027
        """Before the migrations run (under their lock, in their transaction): anything the
        database needs made its own way first (nothing by default)."""

    def update_returning(
        self, conn: Connection, table: Table, where: Sequence[Any], values: Mapping[str, Any],
        column_: Any,
    ) -> Any:  # fmt: skip
        """``UPDATE table SET values WHERE where``, and ``column_`` of the row updated (None
        when none matched)."""
        return conn.scalar(update(table).where(*where).values(**values).returning(column_))

    def upsert_returning(
        self, conn: Connection, table: Table, values: Mapping[str, Any], keys: Sequence[Any],
        updates: Mapping[str, Any], returning: Sequence[Any],
    ) -> Any:  # fmt: skip
        """Insert a row, or update ``updates`` (column name → value; a value may be
        ``"excluded"`` for the inserted value) of the row with the same ``keys``; the row
        written (``returning`` columns)."""
        insert = self.insert(table)
        changed = {
            name: insert.excluded[name] if value == "excluded" else value
            for name, value in updates.items()
        }
        statement = (
            insert.values(**values)
            .on_conflict_do_update(index_elements=list(keys), set_=changed)
            .returning(*returning)
        )
        return conn.execute(statement).one()

    def upsert_messages(self, conn: Connection, rows: list[dict[str, Any]]) -> list[Any]:
        """Run `message_upsert` for ``rows``: ``(id, seq)`` of each row written (a message of
        another chat with the same id is neither written nor returned)."""
        statement = self._upsert_statement
        if statement is None:
            statement = self._upsert_statement = self.message_upsert()
        return list(conn.execute(statement, rows).all())

    _upsert_statement: Any = None

    def delete_messages(self, conn: Connection, where: ColumnElement[bool]) -> int:
        """Delete the messages matching ``where`` (children with their parents: whole
        subtrees); how many."""
        return int(conn.execute(delete(M).where(where)).rowcount or 0)

    @abc.abstractmethod
    def is_unique_violation(self, exc: BaseException) -> bool:
        """True for a unique-constraint violation reported by the driver."""

    @abc.abstractmethod
    def is_foreign_key_violation(self, exc: BaseException) -> bool:
        """True for a foreign-key violation reported by the driver."""

    @abc.abstractmethod
    def is_out_of_range(self, exc: BaseException) -> bool:
        """True when the driver refused a number (or a date) it cannot represent."""

    @abc.abstractmethod
    def translate(
        self, exc: BaseException, reason: str, url: URL, busy: bool
    ) -> ContextError | None:
        """The `ContextError` for a driver error this dialect can name (a database that
        cannot be opened or reached, a locked or damaged file), or None. ``reason`` is the
        driver's first line, ``busy`` whether an open transaction of this process holds a
        chat of the store."""

    # --- search -------------------------------------------------------------------------------

    def unindex_chats(  # noqa: B027 - optional
        self, conn: Connection, chat_ids: Sequence[str], ahead: Mapping[int, Any] | None = None
    ) -> None:
        """Remove the messages of some chats from a search index kept apart from their rows,
        before the rows are deleted (``ahead``: what `unindex_ahead` read of them before the
        write transaction, used for the rows that did not change since)."""

    def unindex_ahead(self, conn: Connection, chat_ids: Sequence[str]) -> Mapping[int, Any]:
        """What `unindex_chats` will need of these chats' messages, read and computed in a read
        transaction before the write transaction that deletes them, so that the write lock is
        not held for the computing (a retention batch). Empty where nothing is needed."""
        return {}

    def tidy_search_index(self, conn: Connection, deleted: int) -> None:  # noqa: B027 - optional
        """After ``deleted`` messages were removed in bulk (a prune, an erasure, a purge): give
        back the space their entries held in a search index kept apart from their rows, with
        work bounded by ``deleted`` (never a merge of the whole index)."""

    retention_seconds: ClassVar[float] = 0.04
    """The work one batch of a retention run aims at (see `_ops.retention`)."""

    def retention_pause(self, took: float) -> float:
        """Seconds a retention run waits between two batches, after one that took ``took``
        seconds: none where writers of other chats do not wait for a batch anyway."""
        return 0.0

    checkpoints_after_batches: ClassVar[bool] = False
    """Whether a retention run moves the write-ahead log into the database after each batch
    (`checkpoint_log`), so that writers do not find it long and pay for that themselves."""

    def checkpoint_log(self, conn: Connection) -> None:  # noqa: B027 - none by default
        """Move what the log holds into the database without waiting for anyone (outside a
        transaction)."""


class AppendRefused(Exception):
    """Internal: an append statement wrote nothing. ``reason`` says why."""

    def __init__(self, reason: Literal["moved", "exists", "branch", "owner"]) -> None:
        super().__init__(reason)
        self.reason = reason


def orig(exc: BaseException) -> BaseException:
    """The driver's exception under a SQLAlchemy one."""
    return getattr(exc, "orig", None) or exc


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE the driver reported, if any."""
    found = orig(exc)
    for candidate in (found, getattr(found, "__cause__", None)):
        for attr in ("sqlstate", "pgcode"):
            value = getattr(candidate, attr, None)
            if isinstance(value, str):
                return value
    return None


def candidate_columns(dialect: Dialect) -> list[Any]:
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


def message_upsert(insert: Any, data: Any, **search: Any) -> Any:
    """The message upsert of every dialect: insert a message, or update it in place when it
    exists in the same chat (a message of another chat is left alone, and not returned).
    ``data`` is the bound expression of the data column, given its JSON text as
    ``data_json`` (`MessageRow.data`); ``search`` adds the dialect's search-index columns
    (name: bound expression). Returns ``(id, seq)`` of each row written."""
    insert = insert.values(data=data, **search)
    changed = {name: insert.excluded[name] for name in ("name", "type", "data", "version")}
    changed.update({name: insert.excluded[name] for name in search})
    return insert.on_conflict_do_update(
        index_elements=[M.c.id], set_=changed, where=M.c.chat_id == insert.excluded.chat_id
    ).returning(M.c.id, M.c.seq)
