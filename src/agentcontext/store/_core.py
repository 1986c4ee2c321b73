"""The shared core of SqlContextStore: engine, schema preparation, transactions, errors."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from typing import Any, Literal

from sqlalchemy import literal, select, update
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agentcontext import _validate as v
from agentcontext.errors import (
    ChatNotFoundError,
    ContextError,
    InvalidGraphError,
    InvalidInputError,
    InvalidTypeError,
    SchemaOutdatedError,
    StoreError,
    StoreUnavailableError,
)
from agentcontext.store import _migrate, _rows, _text
from agentcontext.store._dialect import (
    WRITE_OPTION,
    Dialect,
    create_engine,
    dialect_for,
    install_sqlite_hooks,
    is_connection_error,
    is_memory_sqlite,
    postgres_driver_args,
    sqlite_synchronous,
)
from agentcontext.store._fastpath import PostgresAppender, RawQuery, SqliteAppender, SqliteReader
from agentcontext.store._schema import branches as B
from agentcontext.store._schema import chats as C
from agentcontext.store._schema import checkpoints as K
from agentcontext.store._schema import messages as M
from agentcontext.store.base import ContextStore
from agentcontext.store.records import Chat, MessageRecord, utcnow

IN_CHUNK = 2000
"""Ids per ``IN (...)`` lookup (well under every backend's bound-parameter limit)."""

MESSAGE_COLS = (M.c.id, M.c.chat_id, M.c.parent_id, M.c.name, M.c.type, M.c.data, M.c.created_at)
CHAT_COLS = (C.c.id, C.c.user_id, C.c.title, C.c.metadata, C.c.created_at, C.c.updated_at)
BRANCH_COLS = (B.c.id, B.c.chat_id, B.c.name, B.c.head_message_id, B.c.is_active, B.c.created_at)
CHECKPOINT_COLS = (K.c.id, K.c.chat_id, K.c.name, K.c.message_id, K.c.created_at)

MigrateMode = Literal["auto"] | bool


def new_id() -> str:
    """A fresh id for branches and checkpoints (32 hex characters)."""
    return uuid.uuid4().hex


def check_record(value: object, what: str) -> MessageRecord:
    """Check one MessageRecord the caller wants written."""
    if not isinstance(value, MessageRecord):
        raise InvalidTypeError(f"{what} must be a MessageRecord, got {v.type_name(value)}")
    v.check_id(value.id, f"{what}.id")
    v.check_id(value.chat_id, f"{what}.chat_id")
    v.check_optional_id(value.parent_id, f"{what}.parent_id")
    v.check_id(value.name, f"{what}.name")
    v.check_id(value.type, f"{what}.type")
    v.check_json(value.data, f"{what}.data")
    v.check_search_text(_text.search_text(value.data), f"message {value.id!r}")
    if value.parent_id == value.id:
        raise InvalidGraphError(f"message {value.id!r} cannot be its own parent")
    return value


def check_records(values: object, what: str = "messages") -> list[MessageRecord]:
    """Check a sequence of MessageRecords (no id twice)."""
    if isinstance(values, (str, bytes, MessageRecord)) or not isinstance(values, Sequence):
        raise InvalidTypeError(
            f"{what} must be a sequence of MessageRecord, got {v.type_name(values)}"
        )
    records = [check_record(item, f"{what}[{i}]") for i, item in enumerate(values)]
    seen: set[str] = set()
    for record in records:
        if record.id in seen:
            raise InvalidInputError(f"{what} holds message id {record.id!r} twice")
        seen.add(record.id)
    return records


def check_metadata_filter(value: object) -> dict[str, str | int | bool] | None:
    """Check a ``list_chats`` metadata filter: str keys, str/int/bool values."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidTypeError(f"metadata filter must be a dict, got {v.type_name(value)}")
    out: dict[str, str | int | bool] = {}
    for key, item in value.items():
        v.check_text(key, "metadata filter key")
        if isinstance(item, str):
            v.check_text(item, f"metadata filter value for {key!r}")
        elif not isinstance(item, (int, bool)):
            raise InvalidInputError(
                f"metadata filter value for {key!r} must be a str, int or bool "
                f"(exact match), got {v.type_name(item)}"
            )
        out[key] = item
    return out


class SqlCore(ContextStore):
    """Engine ownership, schema preparation, transactions and error translation."""

    _dialect: Dialect

    def __init__(
        self,
        url_or_engine: str | URL | AsyncEngine,
        *,
        migrate: MigrateMode = "auto",
        **engine_options: Any,
    ) -> None:
        if not isinstance(migrate, (str, bool)):
            raise InvalidTypeError(f"migrate must be 'auto' or False, got {v.type_name(migrate)}")
        if migrate not in ("auto", True, False):
            raise InvalidInputError(f"migrate must be 'auto' or False, got {migrate!r}")
        self._migrate_mode: MigrateMode = migrate
        busy_timeout = 30.0
        synchronous = "NORMAL"
        # The driver-level paths open their own connections from the URL and the options;
        # they are only safe when those describe every connection the engine makes.
        driver_paths = True
        postgres_connect_args: dict[str, Any] = {"timeout": 10.0}
        if isinstance(url_or_engine, AsyncEngine):
            if engine_options:
                raise InvalidInputError(
                    "engine options cannot be applied to an engine you created; "
                    "pass them to create_async_engine instead"
                )
            self._engine = url_or_engine
            self._owns_engine = False
            if self._engine.dialect.name == "sqlite":
                install_sqlite_hooks(self._engine)
            # An engine you built may connect in ways its URL does not say (connect_args such
            # as ssl or a search_path, a creator): on PostgreSQL, or an SQLite URL with query
            # options, every call goes through it.
            driver_paths = self._engine.dialect.name == "sqlite" and not self._engine.url.query
        elif isinstance(url_or_engine, (str, URL)):
            try:
                url = make_url(url_or_engine) if isinstance(url_or_engine, str) else url_or_engine
            except ArgumentError as exc:
                raise InvalidInputError(
                    f"cannot parse database URL: {exc}; expected e.g. "
                    "sqlite+aiosqlite:///chat.db or postgresql+asyncpg://user@host/db"
                ) from None
            busy_timeout = float(engine_options.get("sqlite_busy_timeout", busy_timeout))
            synchronous = sqlite_synchronous(engine_options.get("sqlite_synchronous", "normal"))
            self._engine = create_engine(url, **engine_options)
            postgres_connect_args = postgres_driver_args(url, engine_options)
            self._owns_engine = True
            driver_paths = not (
                {"creator", "async_creator"} & engine_options.keys()
                or (self._engine.dialect.name == "sqlite" and url.query)
            )
        else:
            raise InvalidTypeError(
                "SqlContextStore needs a database URL or an AsyncEngine, "
                f"got {v.type_name(url_or_engine)}"
            )
        self._dialect = dialect_for(self._engine)
        url_ = self._engine.url
        self._memory = self._dialect.is_sqlite and is_memory_sqlite(url_)
        # One in-memory connection is shared, so all its transactions take turns; a file
        # database lets readers run alongside one writer per process.
        self._all_lock: asyncio.Lock | None = asyncio.Lock() if self._memory else None
        self._write_lock: asyncio.Lock | None = (
            asyncio.Lock() if self._dialect.is_sqlite and not self._memory else None
        )
        self._init_lock = asyncio.Lock()
        self._initialized = False
        self._closed = False
        # The driver-level paths for the hottest write (appending messages) and single-statement
        # reads (search); None for an in-memory database, whose one shared connection only
        # SQLAlchemy may use. Reads get their own small pool, planned per call.
        self._appender: SqliteAppender | PostgresAppender | None = None
        self._reader: SqliteReader | PostgresAppender | None = None
        if not driver_paths or self._memory:
            pass
        elif self._dialect.is_sqlite and url_.database:
            self._appender = SqliteAppender(url_.database, busy_timeout, synchronous)
            self._reader = SqliteReader(url_.database, busy_timeout)
        elif not self._dialect.is_sqlite:
            _args, connect_kwargs = self._engine.dialect.create_connect_args(url_)
            connect_kwargs.update(postgres_connect_args)
            self._appender = PostgresAppender(dict(connect_kwargs))
            self._reader = PostgresAppender(dict(connect_kwargs), max_size=5, generic_plans=False)

    # --- properties -------------------------------------------------------------------------

    @property
    def engine(self) -> AsyncEngine:
        """The SQLAlchemy async engine."""
        return self._engine

    @property
    def dialect_name(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._dialect.name

    @property
    def url(self) -> str:
        """The database URL with its password hidden."""
        return self._engine.url.render_as_string(hide_password=True)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # --- lifecycle --------------------------------------------------------------------------

    async def initialize(self) -> None:
        """Migrate (``migrate="auto"``) or check the schema. Idempotent; runs on first use."""
        if self._initialized:
            return
        if self._closed:
            raise StoreError("this store is closed; create a new one")
        async with self._init_lock:
            if self._initialized:
                return
            lock = self._all_lock if self._all_lock is not None else self._write_lock
            async with lock if lock is not None else nullcontext():
                try:
                    await self._prepare_schema()
                except ContextError:
                    raise
                except Exception as exc:
                    raise self._translate(exc) from exc
            self._initialized = True

    async def _prepare_schema(self) -> None:
        head = _migrate.head_revision()
        async with self._engine.connect() as conn:
            current = await conn.run_sync(_migrate.current_revision)
        if current == head:
            return
        if self._migrate_mode is False:
            raise SchemaOutdatedError(self._outdated_message(current, head))
        try:
            await _migrate.run_in_write_transaction(self._engine, _migrate.upgrade_in_transaction)
        except Exception as exc:
            if "Can't locate revision" in str(exc) or "No such revision" in str(exc):
                raise SchemaOutdatedError(
                    f"the database at {self.url} is at revision {current!r}, which this version "
                    "of agentcontext does not know: it was migrated by a newer version. "
                    "Upgrade agentcontext."
                ) from None
            raise

    def _outdated_message(self, current: str | None, head: str) -> str:
        state = "has no agentcontext schema" if current is None else f"is at revision {current}"
        return (
            f"the database at {self.url} {state}; this version of agentcontext needs "
            f"revision {head}. Upgrade it with: agentcontext migrate upgrade --url '{self.url}' "
            "(or use SqlContextStore(..., migrate='auto'))"
        )

    async def close(self) -> None:
        """Dispose the engine if this store created it. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._appender is not None:
                await self._appender.close()
        finally:
            try:
                if self._reader is not None:
                    await self._reader.close()
            finally:
                if self._owns_engine:
                    await self._engine.dispose()

    # --- transactions and errors ------------------------------------------------------------

    @asynccontextmanager
    async def _tx(self, *, write: bool = False) -> AsyncIterator[AsyncConnection]:
        """One transaction. ``write=True`` takes the SQLite write lock up front."""
        if not self._initialized:
            await self.initialize()
        if self._closed:
            raise StoreError("this store is closed; create a new one")
        lock: AbstractAsyncContextManager[Any] = nullcontext()
        if self._all_lock is not None:
            lock = self._all_lock
        elif write and self._write_lock is not None:
            lock = self._write_lock
        async with lock:
            try:
                async with self._engine.connect() as conn:
                    if write:
                        await conn.execution_options(**{WRITE_OPTION: True})
                    async with conn.begin():
                        yield conn
            except ContextError:
                raise
            except (TimeoutError, SQLAlchemyError, OSError) as exc:
                raise self._translate(exc) from exc

    def _translate(self, exc: BaseException) -> ContextError:
        if is_connection_error(exc):
            reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0:1]
            return StoreUnavailableError(
                f"cannot reach the database at {self.url}: "
                f"{reason[0] if reason else type(exc).__name__}. Check that the server is "
                "running and the URL is right; the store reconnects by itself once it is back."
            )
        message = str(getattr(exc, "orig", None) or exc)
        if "file is not a database" in message or "database disk image is malformed" in message:
            return StoreError(
                f"{self.url} is not a valid SQLite database ({message}); point the store at a "
                "new file or restore this one from a backup"
            )
        return StoreError(f"database error on {self.url}: {message}")

    async def _fetch_raw(self, query: RawQuery, params: dict[str, Any]) -> list[Any] | None:
        """Rows of one read statement through the driver-level path, or None when the store
        has none (an in-memory database: its one connection belongs to SQLAlchemy)."""
        if self._reader is None:
            return None
        if not self._initialized:
            await self.initialize()
        if self._closed:
            raise StoreError("this store is closed; create a new one")
        try:
            return await self._reader.fetch(query, params)
        except ContextError:
            raise
        except Exception as exc:
            # Driver errors become ContextErrors; anything else is a bug and stays as it is.
            if isinstance(exc, (sqlite3.Error, OSError)) or type(exc).__module__.startswith(
                "asyncpg"
            ):
                raise self._translate(exc) from exc
            raise

    async def _lock_chat(self, conn: AsyncConnection, chat_id: str) -> Chat:
        """Lock the chat row for this transaction (PostgreSQL; SQLite holds the write lock)."""
        row = (
            await conn.execute(select(*CHAT_COLS).where(C.c.id == chat_id).with_for_update())
        ).first()
        if row is None:
            raise ChatNotFoundError(f"chat {chat_id!r} does not exist")
        return _rows.chat(row)

    async def _require_chat(self, conn: AsyncConnection, chat_id: str) -> None:
        found = (await conn.execute(select(literal(1)).where(C.c.id == chat_id))).first()
        if found is None:
            raise ChatNotFoundError(f"chat {chat_id!r} does not exist")

    async def _touch(self, conn: AsyncConnection, chat_id: str) -> int | None:
        """Record a change to a chat: newer activity time, next change version.

        Also locks the chat row until the transaction ends; every write takes this lock first,
        so writers of one chat never deadlock. Returns the new version, or None when the chat
        does not exist.
        """
        version = await conn.scalar(
            update(C)
            .where(C.c.id == chat_id)
            .values(updated_at=utcnow(), version=C.c.version + 1)
            .returning(C.c.version)
        )
        return None if version is None else int(version)

    async def _touch_existing(self, conn: AsyncConnection, chat_id: str) -> int:
        version = await self._touch(conn, chat_id)
        if version is None:
            raise ChatNotFoundError(f"chat {chat_id!r} does not exist")
        return version

    async def _delete_snapshot_rows(self, conn: AsyncConnection, chat_id: str) -> None:
        """Delete a chat's snapshots and resolve records (implemented with snapshots)."""
        raise NotImplementedError
