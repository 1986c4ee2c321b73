"""SqlContextStore: the conversation graph in SQLite or PostgreSQL through SQLAlchemy async.

A thin facade: each method checks its arguments and runs one unit of work (a plain function of
a connection from one of the concern modules: ``_chats``, ``_messages``, ``_chain``,
``_branches``, ``_checkpoints``, ``_snapshots``, ``_search``, ``_graph``, ``_transfer``) on the
store's `Database`. Dialect differences live in ``_dialects``.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Literal, Never

from sqlalchemy import Select
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agentcontext import _validate as v
from agentcontext.errors import (
    BranchExistsError,
    InvalidGraphError,
    InvalidInputError,
    InvalidTypeError,
    SnapshotError,
    StoreError,
)
from agentcontext.snapshots import ContextSnapshot, blob_hash
from agentcontext.store import (
    _branches,
    _chain,
    _chats,
    _checkpoints,
    _graph,
    _messages,
    _migrate,
    _pages,
    _search,
    _snapshots,
    _tokenizer,
    _transfer,
)
from agentcontext.store._checks import check_metadata_filter, check_record, check_records, new_id
from agentcontext.store._database import Database, Transaction
from agentcontext.store._dialects import (
    AppendRefused,
    AppendRow,
    Mode,
    dialect_for,
    install_sqlite_hooks,
    is_memory_sqlite,
)
from agentcontext.store._options import StoreOptions, make_engine, wants_pgbouncer
from agentcontext.store._schema import resolve_records as RR
from agentcontext.store._schema import snapshots as SN
from agentcontext.store.base import AppendResult, ContextStore
from agentcontext.store.records import (
    Branch,
    BranchInfo,
    BranchState,
    ChainPage,
    ChainRows,
    Chat,
    ChatExport,
    ChatInfo,
    ChatState,
    ChatUpdate,
    Checkpoint,
    Graph,
    GraphOutline,
    MessageRecord,
    ResolveRecord,
    SearchResult,
    utcnow,
)

__all__ = ["InMemoryContextStore", "SqlContextStore"]

MigrateMode = Literal["auto"] | bool


class SqlContextStore(ContextStore):
    """A `ContextStore` on SQLite (``sqlite+aiosqlite://``) or PostgreSQL
    (``postgresql+asyncpg://``), through one SQLAlchemy `AsyncEngine`.

    Args:
        url_or_engine: A database URL, or an `AsyncEngine` you own (the store never disposes an
            engine it did not create, and reaches the database only through it).
        migrate: ``"auto"`` (default) upgrades the schema to the newest revision on first use,
            safely when several processes start at once; ``False`` only checks it and raises
            `SchemaOutdatedError` naming the command to run.
        pool_size: Connections kept open (PostgreSQL default 5).
        max_overflow: Extra connections opened under load (PostgreSQL default 10). With
            ``pool_size`` it bounds every server connection of the store.
        pool_timeout: Seconds a call waits for a free connection (default 30).
        pool_recycle: Seconds after which a pooled connection is replaced.
        connect_timeout: Seconds to open a PostgreSQL connection (default 10).
        command_timeout: Seconds one PostgreSQL statement may run.
        pgbouncer: PostgreSQL behind PgBouncer in transaction pooling mode (also with an
            engine you built).
        sqlite_busy_timeout: Seconds an SQLite write waits for another process (default 30).
        sqlite_synchronous: ``"normal"`` (default) or ``"full"``.
        lock_timeout: Seconds a write waits for a chat held by an uncommitted
            ``using()``/``begin()`` transaction of this process before it raises
            `ChatBusyError` (default 30).
        echo: Log every statement.
        connect_args: Extra arguments of the driver's ``connect()``.
        engine_options: Any other ``create_async_engine`` argument.

    The options are described in `StoreOptions`; an unknown one is an `InvalidInputError`.

    Use it as an async context manager, or call `initialize` and `close`::

        async with SqlContextStore("sqlite+aiosqlite:///chat.db") as store:
            chat = await store.upsert_chat("chat-1", user_id="user-1")

    A store belongs to the event loop that first uses it. Inside ``async with
    store.using(connection):`` its calls run in your transaction.
    """

    def __init__(
        self,
        url_or_engine: str | URL | AsyncEngine,
        *,
        migrate: MigrateMode = "auto",
        pool_size: int | None = None,
        max_overflow: int | None = None,
        pool_timeout: float | None = None,
        pool_recycle: float | None = None,
        connect_timeout: float = 10.0,
        command_timeout: float | None = None,
        pgbouncer: bool = False,
        sqlite_busy_timeout: float = 30.0,
        sqlite_synchronous: str = "normal",
        lock_timeout: float = 30.0,
        echo: bool = False,
        connect_args: Mapping[str, Any] | None = None,
        engine_options: Mapping[str, Any] | None = None,
        **unknown: Never,
    ) -> None:
        self._db: Database | None = None  # set last: __del__ checks it
        if not isinstance(migrate, (str, bool)):
            raise InvalidTypeError(f"migrate must be 'auto' or False, got {v.type_name(migrate)}")
        if migrate not in ("auto", True, False):
            raise InvalidInputError(f"migrate must be 'auto' or False, got {migrate!r}")
        options = StoreOptions.of(
            {
                "pool_size": pool_size,
                "max_overflow": max_overflow,
                "pool_timeout": pool_timeout,
                "pool_recycle": pool_recycle,
                "connect_timeout": connect_timeout,
                "command_timeout": command_timeout,
                "pgbouncer": pgbouncer,
                "sqlite_busy_timeout": sqlite_busy_timeout,
                "sqlite_synchronous": sqlite_synchronous,
                "lock_timeout": lock_timeout,
                "echo": echo,
                "connect_args": connect_args,
                "engine_options": engine_options,
                **unknown,
            }
        )
        if isinstance(url_or_engine, AsyncEngine):
            refused = sorted(set(options.changed()) - {"pgbouncer", "lock_timeout"})
            if refused:
                raise InvalidInputError(
                    f"option(s) {', '.join(refused)} cannot be applied to an engine you "
                    "created; pass them to create_async_engine instead"
                )
            engine, owns = url_or_engine, False
            pgbouncer = bool(options.pgbouncer)
            dialect_for(engine.dialect.name)
            if engine.dialect.name == "sqlite":
                install_sqlite_hooks(engine)
        elif isinstance(url_or_engine, (str, URL)):
            try:
                url = make_url(url_or_engine) if isinstance(url_or_engine, str) else url_or_engine
            except ArgumentError as exc:
                raise InvalidInputError(
                    f"cannot parse database URL: {exc}; expected e.g. "
                    "sqlite+aiosqlite:///chat.db or postgresql+asyncpg://user@host/db"
                ) from None
            engine, owns = make_engine(url, options), True
            pgbouncer = wants_pgbouncer(url, options)
        else:
            raise InvalidTypeError(
                "SqlContextStore needs a database URL or an AsyncEngine, "
                f"got {v.type_name(url_or_engine)}"
            )
        self._migrate_mode: MigrateMode = migrate
        self._dialect = dialect_for(engine.dialect.name, pgbouncer=pgbouncer)
        self._db = Database(
            engine,
            self._dialect,
            owns_engine=owns,
            memory=self._dialect.is_sqlite and is_memory_sqlite(engine.url),
            prepare=functools.partial(_migrate.prepare_schema, mode=migrate),
            lock_timeout=float(options.lock_timeout),
        )

    # --- properties -------------------------------------------------------------------------

    @property
    def db(self) -> Database:
        """The store's database object (its engine, units of work and transactions)."""
        assert self._db is not None
        return self._db

    @property
    def engine(self) -> AsyncEngine:
        """The SQLAlchemy async engine every statement of the store runs on."""
        return self.db.engine

    @property
    def dialect_name(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._dialect.name

    @property
    def url(self) -> str:
        """The database URL with its password hidden."""
        return self.db.url

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def __del__(self) -> None:
        db = self.__dict__.get("_db")
        if db is not None and db.ready and not db.closed and db._owns_engine:
            warnings.warn(
                f"{self!r} was never closed; use 'async with' or await store.close()",
                ResourceWarning,
                source=self,
                stacklevel=1,
            )

    # --- lifecycle --------------------------------------------------------------------------

    async def initialize(self) -> None:
        """Migrate (``migrate="auto"``) or check the schema. Idempotent; runs on first use."""
        await self.db.initialize()

    async def close(self) -> None:
        """Wait for calls still running, then dispose the engine if this store created it.
        Safe to call twice."""
        await self.db.close()

    def using(self, connection: AsyncConnection) -> AbstractAsyncContextManager[None]:
        """Run this task's store calls in your transaction, inside the block.

        ``connection`` is a SQLAlchemy `AsyncConnection` to the store's database, inside a
        transaction. The store writes without committing: your commit keeps the turn, your
        rollback leaves nothing of it. Each write runs in a SAVEPOINT, so a refused one (a head
        conflict, bad input) leaves your transaction usable::

            async with engine.begin() as conn, store.using(conn):
                await conn.execute(orders.insert().values(...))
                await context.save()
        """
        if not isinstance(connection, AsyncConnection):
            raise InvalidTypeError(
                "store.using() takes a SQLAlchemy AsyncConnection (from engine.connect() or "
                f"engine.begin()), got {v.type_name(connection)}"
            )
        return self.db.using(connection)

    def current_transaction(self) -> Transaction | None:
        """The caller's transaction the current task's calls run in (``using()``), or None."""
        return self.db.transaction()

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[AsyncConnection]:
        """A transaction of your own on the store's engine, with this task's store calls in it.

        Yields the connection (run your statements on it); the store's calls inside the block
        write in the same transaction (see `using`). Leaving the block commits; an exception,
        or ``await conn.rollback()``, leaves nothing of either. On SQLite the transaction takes
        the write lock up front (``BEGIN IMMEDIATE``), so it never fails half-way with
        "database is locked"::

            async with store.begin() as conn:
                await conn.execute(orders.insert().values(...))
                await context.save()
        """
        async with self.db.begin() as conn:
            yield conn

    async def _run(
        self,
        mode: Mode,
        unit: Callable[..., Any],
        *args: Any,
        holds: str | Collection[str] | None = None,
        **kwargs: Any,
    ) -> Any:
        return await self.db.run(mode, functools.partial(unit, *args, **kwargs), chat=holds)

    # --- chats ------------------------------------------------------------------------------

    @staticmethod
    def _new_chat(chat_id: object, user_id: object, title: object, metadata: object) -> Chat:
        return _chats.new_chat(
            v.check_id(chat_id, "chat_id"),
            v.check_id(user_id, "user_id"),
            v.check_optional_text(title, "title"),
            {} if metadata is None else v.check_json_object(metadata, "metadata"),
        )

    async def create_chat(
        self,
        chat_id: str,
        *,
        user_id: str,
        title: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Chat:
        chat = self._new_chat(chat_id, user_id, title, metadata)
        result: Chat = await self._run("write", _chats.create, chat=chat, holds=chat.id)
        return result

    async def upsert_chat(
        self,
        chat_id: str,
        *,
        user_id: str,
        title: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Chat:
        chat = self._new_chat(chat_id, user_id, title, metadata)
        found: Chat | None = await self._run("read", _chats.get, chat_id=chat.id)
        if found is not None:
            return found
        stored: Chat = await self._insert_or_read(chat, _chats.get_or_insert)
        return stored

    async def _insert_or_read(self, chat: Chat, unit: Callable[..., Any]) -> Any:
        """Run ``unit(conn, chat)`` (which inserts the chat unless it exists); if another
        process inserted it meanwhile, run it once more (it then reads)."""
        for attempt in range(3):
            try:
                return await self._run("write", unit, chat=chat, holds=chat.id)
            except StoreError as exc:
                if attempt == 2 or not self._dialect.is_unique_violation(exc.__cause__ or exc):
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def get_chat(self, chat_id: str) -> Chat | None:
        v.check_id(chat_id, "chat_id")
        found: Chat | None = await self._run("read", _chats.get, chat_id=chat_id)
        return found

    async def update_chat(self, chat_id: str, updater: Callable[[Chat], ChatUpdate | None]) -> Chat:
        v.check_id(chat_id, "chat_id")
        if not callable(updater):
            raise InvalidTypeError(
                f"updater must be a callable taking a Chat, got {v.type_name(updater)}"
            )
        chat: Chat = await self._run(
            "write",
            _chats.update_chat,
            dialect=self._dialect,
            chat_id=chat_id,
            updater=updater,
            holds=chat_id,
        )
        return chat

    async def list_chats(
        self,
        *,
        user_id: str | None = None,
        metadata: Mapping[str, str | int | bool] | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[ChatInfo]:
        query = self.list_chats_query(
            user_id=user_id, metadata=metadata, limit=limit, offset=offset
        )
        chats: list[ChatInfo] = await self._run("read", _chats.list_chats, query=query)
        return chats

    def list_chats_query(
        self,
        *,
        user_id: str | None = None,
        metadata: Mapping[str, str | int | bool] | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> Select[Any]:
        """The SQL `list_chats` runs (to show its query plan, for instance)."""
        v.check_optional_id(user_id, "user_id")
        return _chats.list_query(
            self._dialect,
            user_id=user_id,
            metadata=check_metadata_filter(metadata),
            limit=v.check_optional_count(limit, "limit"),
            offset=v.check_count(offset, "offset"),
        )

    async def delete_chat(self, chat_id: str, *, user_id: str | None = None) -> bool:
        v.check_id(chat_id, "chat_id")
        v.check_optional_id(user_id, "user_id")
        deleted: bool = await self._run(
            "write",
            _chats.delete_chat,
            dialect=self._dialect,
            chat_id=chat_id,
            user_id=user_id,
            holds=chat_id,
        )
        return deleted

    # --- messages ---------------------------------------------------------------------------

    async def add_message(self, message: MessageRecord) -> MessageRecord:
        return (await self.add_messages([check_record(message, "message")]))[0]

    async def add_messages(self, messages: Sequence[MessageRecord]) -> list[MessageRecord]:
        records = check_records(messages)
        if not records:
            return []

        def unit(conn: Any) -> list[MessageRecord]:
            versions = {
                chat_id: _chats.touch(conn, chat_id)
                for chat_id in dict.fromkeys(r.chat_id for r in records)
            }
            return _messages.write(conn, self._dialect, records, versions)

        stored: list[MessageRecord] = await self.db.run(
            "write", unit, chat={r.chat_id for r in records}
        )
        return stored

    async def get_message(self, message_id: str) -> MessageRecord | None:
        v.check_id(message_id, "message_id")
        found: MessageRecord | None = await self._run("read", _messages.get, message_id=message_id)
        return found

    async def get_message_chain(
        self, head_id: str, *, after: str | None = None
    ) -> list[MessageRecord]:
        v.check_id(head_id, "head_id")
        v.check_optional_id(after, "after")
        chain: list[MessageRecord] = await self._run(
            "snapshot", _chain.load_records, dialect=self._dialect, head_id=head_id, after=after
        )
        return chain

    async def get_messages(self, chat_id: str) -> list[MessageRecord]:
        v.check_id(chat_id, "chat_id")

        def unit(conn: Any) -> list[MessageRecord]:
            branch = _branches.active(conn, chat_id)
            if branch is None:
                _chats.require(conn, chat_id)
                return []
            if branch.head_message_id is None:
                return []
            return _chain.load_records(conn, self._dialect, branch.head_message_id)

        chain: list[MessageRecord] = await self.db.run("snapshot", unit)
        return chain

    async def get_changes(self, chat_id: str, since_version: int) -> list[MessageRecord]:
        """Messages of the chat written (inserted or updated) after ``since_version``.

        In insertion order. Together with `get_branch_state` this lets an engine that holds a
        chain in memory catch up without reading it again.
        """
        v.check_id(chat_id, "chat_id")
        v.check_int64(since_version, "since_version", minimum=0)
        changes: list[MessageRecord] = await self._run(
            "read", _messages.changes, chat_id=chat_id, since_version=since_version
        )
        return changes

    async def has_children(self, message_id: str) -> bool:
        v.check_id(message_id, "message_id")
        found: bool = await self._run("read", _messages.has_children, message_id=message_id)
        return found

    async def is_ancestor(self, ancestor_id: str, message_id: str) -> bool:
        v.check_id(ancestor_id, "ancestor_id")
        v.check_id(message_id, "message_id")
        found: bool = await self._run(
            "read", _messages.is_ancestor, ancestor_id=ancestor_id, message_id=message_id
        )
        return found

    async def set_message_parent(self, message_id: str, parent_id: str | None) -> None:
        v.check_id(message_id, "message_id")
        v.check_optional_id(parent_id, "parent_id")
        if parent_id == message_id:
            raise InvalidGraphError(f"message {message_id!r} cannot be its own parent")

        def unit(conn: Any) -> None:
            _messages.set_parent(
                conn, message_id, parent_id, lambda chat_id: _chats.touch(conn, chat_id)
            )

        await self.db.run("write", unit)

    # --- branches ---------------------------------------------------------------------------

    async def create_branch(
        self,
        chat_id: str,
        name: str,
        *,
        head_message_id: str | None = None,
        activate: bool = False,
    ) -> Branch:
        v.check_id(chat_id, "chat_id")
        v.check_id(name, "branch name")
        v.check_optional_id(head_message_id, "head_message_id")
        v.check_bool(activate, "activate")
        branch: Branch = await self._run(
            "write",
            _branches.create,
            chat_id=chat_id,
            name=name,
            head=head_message_id,
            activate=activate,
            holds=chat_id,
        )
        return branch

    async def fork_branch(
        self,
        chat_id: str,
        base_name: str,
        *,
        head_message_id: str | None,
        activate: bool,
        messages: Sequence[MessageRecord] = (),
        name: str | None = None,
    ) -> BranchInfo:
        v.check_id(chat_id, "chat_id")
        v.check_id(base_name, "base_name")
        v.check_optional_id(head_message_id, "head_message_id")
        v.check_optional_id(name, "branch name")
        v.check_bool(activate, "activate")
        records = check_records(messages)
        for record in records:
            if record.chat_id != chat_id:
                raise InvalidGraphError(
                    f"message {record.id!r} is for chat {record.chat_id!r}, not {chat_id!r}"
                )
        for _ in range(3):
            try:
                info: BranchInfo = await self._run(
                    "write",
                    _branches.fork,
                    dialect=self._dialect,
                    chat_id=chat_id,
                    base_name=base_name,
                    head=head_message_id,
                    activate=activate,
                    records=records,
                    name=name,
                    holds=chat_id,
                )
                return info
            except StoreError as exc:
                # Another process took the name between our read and our insert: look again.
                if not self._dialect.is_unique_violation(exc.__cause__ or exc):
                    raise
                if name is not None:
                    raise BranchExistsError(
                        f"chat {chat_id!r} already has a branch named {name!r}"
                    ) from None
        raise StoreError(f"could not find a free branch name for {base_name!r}; retry")

    async def get_branch(self, chat_id: str, name: str) -> Branch | None:
        v.check_id(chat_id, "chat_id")
        v.check_id(name, "branch name")
        found: Branch | None = await self._run("read", _branches.get, chat_id=chat_id, name=name)
        return found

    async def get_branch_by_id(self, branch_id: str) -> Branch | None:
        v.check_id(branch_id, "branch_id")
        found: Branch | None = await self._run("read", _branches.get_by_id, branch_id=branch_id)
        return found

    async def get_branch_state(self, branch_id: str) -> BranchState | None:
        """The branch with its chat's version and counts, in one query (None if it is gone)."""
        v.check_id(branch_id, "branch_id")
        found: BranchState | None = await self._run(
            "read", _branches.state, dialect=self._dialect, branch_id=branch_id
        )
        return found

    async def get_active_branch(self, chat_id: str) -> Branch | None:
        v.check_id(chat_id, "chat_id")
        found: Branch | None = await self._run("read", _branches.active, chat_id=chat_id)
        return found

    async def set_active_branch(self, chat_id: str, branch_id: str) -> Branch:
        v.check_id(chat_id, "chat_id")
        v.check_id(branch_id, "branch_id")
        branch: Branch = await self._run(
            "write", _branches.set_active, chat_id=chat_id, branch_id=branch_id, holds=chat_id
        )
        return branch

    async def update_branch_head(
        self, branch_id: str, message_id: str | None, expected_head: str | None
    ) -> bool:
        v.check_id(branch_id, "branch_id")
        v.check_optional_id(message_id, "message_id")
        v.check_optional_id(expected_head, "expected_head")
        try:
            await self._run(
                "write",
                _branches.move_head,
                branch_id=branch_id,
                message_id=message_id,
                expected=expected_head,
            )
        except _branches.HeadMoved:
            return False
        return True

    async def append_messages(
        self,
        branch_id: str,
        messages: Sequence[MessageRecord],
        *,
        expected_head: str | None,
        new_head: str | None = None,
        updates: Collection[str] | None = None,
    ) -> AppendResult:
        v.check_id(branch_id, "branch_id")
        v.check_optional_id(expected_head, "expected_head")
        allowed = None if updates is None else set(v.check_str_list(updates, "updates"))
        records = check_records(messages)
        if not records:
            raise InvalidInputError("append_messages needs at least one message")
        head = records[-1].id if new_head is None else v.check_id(new_head, "new_head")
        if all(r.id != head for r in records):
            raise InvalidInputError(f"new_head {head!r} is not one of the messages written")
        chat_id = records[0].chat_id
        for record in records:
            if record.chat_id != chat_id:
                raise InvalidGraphError(
                    f"message {record.id!r} is for chat {record.chat_id!r}, not {chat_id!r}"
                )
        if self._is_plain_append(records, expected_head, head, allowed):
            result = await self._append_fast(branch_id, chat_id, records, head, allowed, True)
            if result is not None:
                return result
        try:
            appended: AppendResult = await self._run(
                "write",
                _branches.append,
                dialect=self._dialect,
                branch_id=branch_id,
                records=records,
                expected=expected_head,
                head=head,
                allowed=allowed,
                holds=chat_id,
            )
            return appended
        except _branches.AppendConflict as conflict:
            return conflict.result

    async def append_turn(
        self, branch_id: str, messages: Sequence[MessageRecord], *, expected_head: str | None
    ) -> AppendResult:
        v.check_id(branch_id, "branch_id")
        v.check_optional_id(expected_head, "expected_head")
        records = check_records(messages)
        if not records:
            raise InvalidInputError("append_turn needs at least one message")
        chat_id = records[0].chat_id
        if any(r.chat_id != chat_id for r in records) or not self._is_plain_append(
            records, expected_head, records[-1].id, None
        ):
            raise InvalidInputError(
                "append_turn takes new messages of one chat, each the parent of the next, the "
                "first one's parent being expected_head; use append_messages otherwise"
            )
        result = await self._append_fast(branch_id, chat_id, records, records[-1].id, set(), False)
        assert result is not None
        return result

    @staticmethod
    def _is_plain_append(
        records: list[MessageRecord],
        expected: str | None,
        head: str,
        allowed: set[str] | None,
    ) -> bool:
        """New messages chained one after another from the expected head, the last one the
        new head: what a save writes, in one statement."""
        if head != records[-1].id or (allowed and any(r.id in allowed for r in records)):
            return False
        parent = expected
        for record in records:
            if record.parent_id != parent:
                return False
            parent = record.id
        return True

    async def _append_fast(
        self,
        branch_id: str,
        chat_id: str,
        records: list[MessageRecord],
        head: str,
        allowed: set[str] | None,
        report_version: bool,
    ) -> AppendResult | None:
        """The single-statement append; None when the general path must decide."""
        rows = [
            AppendRow(
                id=r.id,
                chat_id=r.chat_id,
                parent_id=r.parent_id,
                name=r.name,
                type=r.type,
                data=None if r.data is None else v.dumps(r.data),
                tokens=_search.record_tokens(r.data),
                created_at=r.created_at,
            )
            for r in records
        ]
        mode: Mode = "atomic" if len(rows) <= self._dialect.append_chunk else "write"
        try:
            result: AppendResult = await self.db.run(
                mode,
                functools.partial(
                    _branches.append_rows,
                    dialect=self._dialect,
                    branch_id=branch_id,
                    rows=rows,
                    head=head,
                    report_version=report_version,
                ),
                idempotent=True,
                chat=chat_id,
            )
            return result
        except AppendRefused as refused:
            if refused.reason == "exists" and allowed is None:
                return None  # existing messages are updated in place by the general path
            outcome: AppendResult = await self._run(
                "read",
                _branches.refused,
                branch_id=branch_id,
                chat_id=chat_id,
                reason=refused.reason,
                ids=[r.id for r in records],
            )
            return outcome

    async def list_branches(self, chat_id: str) -> list[BranchInfo]:
        v.check_id(chat_id, "chat_id")
        infos: list[BranchInfo] = await self._run("read", _branches.list_infos, chat_id=chat_id)
        return infos

    async def rename_branch(self, chat_id: str, name: str, new_name: str) -> Branch:
        v.check_id(chat_id, "chat_id")
        v.check_id(name, "branch name")
        v.check_id(new_name, "new branch name")
        branch: Branch = await self._run(
            "write", _branches.rename, chat_id=chat_id, old=name, new=new_name, holds=chat_id
        )
        return branch

    async def delete_branch(self, chat_id: str, name: str) -> bool:
        v.check_id(chat_id, "chat_id")
        v.check_id(name, "branch name")
        deleted: bool = await self._run(
            "write", _branches.remove, chat_id=chat_id, name=name, holds=chat_id
        )
        return deleted

    # --- the engine's reads -------------------------------------------------------------------

    async def open_chat(self, chat_id: str, *, user_id: str) -> ChatState:
        v.check_id(chat_id, "chat_id")
        v.check_id(user_id, "user_id")
        state: ChatState | None = await self._run(
            "read", _branches.chat_state, dialect=self._dialect, chat_id=chat_id
        )
        if state is not None:
            return state

        def unit(conn: Any, chat: Chat) -> ChatState | None:
            _chats.get_or_insert(conn, chat)
            return _branches.chat_state(conn, self._dialect, chat.id)

        state = await self._insert_or_read(self._new_chat(chat_id, user_id, None, None), unit)
        if state is None:
            raise InvalidGraphError(
                f"chat {chat_id!r} has no active branch: the database was changed outside "
                "agentcontext. Make one active with store.set_active_branch(chat_id, branch_id), "
                "or create one with store.create_branch(..., activate=True)"
            )
        return state

    async def load_chain_rows(
        self,
        chat_id: str,
        head_id: str,
        *,
        head_depth: int | None = None,
        chat_size: int | None = None,
        stop_depth: int = 0,
        stop_at: str | None = None,
        compacted: bool = False,
    ) -> ChainRows:
        v.check_id(chat_id, "chat_id")
        v.check_id(head_id, "head_id")
        v.check_optional_count(head_depth, "head_depth")
        v.check_optional_count(chat_size, "chat_size")
        v.check_count(stop_depth, "stop_depth")
        v.check_optional_id(stop_at, "stop_at")
        rows: ChainRows = await self._run(
            "read",
            _chain.load_rows,
            dialect=self._dialect,
            chat_id=chat_id,
            head_id=head_id,
            head_depth=head_depth,
            chat_size=chat_size,
            stop_depth=stop_depth,
            stop_at=stop_at,
            compacted=v.check_bool(compacted, "compacted"),
        )
        return rows

    # --- checkpoints ------------------------------------------------------------------------

    async def create_checkpoint(
        self, chat_id: str, name: str, message_id: str, *, branch_id: str | None = None
    ) -> Checkpoint:
        v.check_id(chat_id, "chat_id")
        v.check_id(name, "checkpoint name")
        v.check_id(message_id, "message_id")
        v.check_optional_id(branch_id, "branch_id")
        checkpoint: Checkpoint = await self._run(
            "write",
            _checkpoints.create,
            dialect=self._dialect,
            chat_id=chat_id,
            name=name,
            message_id=message_id,
            branch_id=branch_id,
            holds=chat_id,
        )
        return checkpoint

    async def get_checkpoint(self, chat_id: str, name: str) -> Checkpoint | None:
        v.check_id(chat_id, "chat_id")
        v.check_id(name, "checkpoint name")
        found: Checkpoint | None = await self._run(
            "read", _checkpoints.get, chat_id=chat_id, name=name
        )
        return found

    async def list_checkpoints(self, chat_id: str) -> list[Checkpoint]:
        v.check_id(chat_id, "chat_id")
        found: list[Checkpoint] = await self._run("read", _checkpoints.list_all, chat_id=chat_id)
        return found

    async def delete_checkpoint(self, chat_id: str, name: str) -> bool:
        v.check_id(chat_id, "chat_id")
        v.check_id(name, "checkpoint name")
        deleted: bool = await self._run(
            "write", _checkpoints.remove, chat_id=chat_id, name=name, holds=chat_id
        )
        return deleted

    # --- search and graph -------------------------------------------------------------------

    async def search_messages(
        self,
        chat_id: str,
        query: str,
        *,
        roles: Sequence[str] | None = None,
        limit: int = 20,
    ) -> list[SearchResult]:
        v.check_id(chat_id, "chat_id")
        return await self._search("chat", chat_id, query, roles, limit)

    async def search_user_messages(
        self,
        user_id: str,
        query: str,
        *,
        roles: Sequence[str] | None = None,
        limit: int = 20,
    ) -> list[SearchResult]:
        v.check_id(user_id, "user_id")
        return await self._search("user", user_id, query, roles, limit)

    async def _search(
        self,
        scope: Literal["chat", "user"],
        scope_id: str,
        query: object,
        roles: object,
        limit: object,
    ) -> list[SearchResult]:
        words = _tokenizer.query_tokens(v.check_text(query, "query"))
        wanted = None if roles is None else v.check_str_list(roles, "roles")
        size = v.check_count(limit, "limit", minimum=1, maximum=10_000)

        def unit(conn: Any) -> list[SearchResult]:
            hits: list[SearchResult] = []
            if words and wanted != []:
                hits = _search.search(conn, self._dialect, scope, scope_id, words, wanted, size)
            if not hits and scope == "chat":
                _chats.require(conn, scope_id)  # an unknown chat is an error
            return hits

        results: list[SearchResult] = await self.db.run("read", unit)
        return results

    async def get_graph(self, chat_id: str) -> Graph:
        v.check_id(chat_id, "chat_id")
        graph: Graph = await self._run("snapshot", _graph.graph, chat_id=chat_id)
        return graph

    async def _graph_outline(
        self,
        chat_id: str,
        *,
        fold: int = 6,
        keep: Sequence[str] = (),
        opened: Sequence[str] = (),
    ) -> GraphOutline:
        """See `ContextStore._graph_outline`; summarised in SQL: the rows read and decoded
        grow with what is drawn, not with the chat."""
        v.check_id(chat_id, "chat_id")
        v.check_int(fold, "fold", minimum=2)
        keep_ids = [v.check_id(item, "keep") for item in keep]
        opened_ids = [v.check_id(item, "opened") for item in opened]
        outline: GraphOutline = await self._run(
            "snapshot",
            _pages.graph_outline,
            dialect=self._dialect,
            chat_id=chat_id,
            fold=fold,
            keep=keep_ids,
            opened=opened_ids,
        )
        return outline

    async def _chain_page(self, chat_id: str, end_id: str, *, limit: int) -> ChainPage:
        """See `ContextStore._chain_page`; one query that reads only the page."""
        v.check_id(chat_id, "chat_id")
        v.check_id(end_id, "end_id")
        v.check_int(limit, "limit", minimum=1)
        limit = min(limit, 1_000_000)
        page: ChainPage = await self._run(
            "snapshot",
            _pages.chain_page,
            dialect=self._dialect,
            chat_id=chat_id,
            end_id=end_id,
            limit=limit,
        )
        return page

    # --- blobs, snapshots, resolve records ---------------------------------------------------

    async def put_blob(
        self,
        content: bytes,
        *,
        media_type: str = "application/octet-stream",
        expected_hash: str | None = None,
    ) -> str:
        """Store content once under its SHA-256 and return the hash.

        With ``expected_hash``, content whose hash differs is refused (`InvalidInputError`).
        Storing the same content again is free.
        """
        v.check_optional_text(expected_hash, "expected_hash")
        if not isinstance(content, (bytes, bytearray, memoryview)):
            raise InvalidTypeError(f"blob content must be bytes, got {v.type_name(content)}")
        digest = blob_hash(bytes(content))
        if expected_hash is not None and expected_hash != digest:
            raise InvalidInputError(
                f"content hashes to {digest}, not {expected_hash!r}; refusing to store it "
                "under the wrong address"
            )
        checked = _snapshots.check_blobs({digest: (bytes(content), media_type)})
        await self._run("write", _snapshots.put_blobs, dialect=self._dialect, blobs=checked)
        return digest

    async def read_blob(self, blob: str) -> bytes | None:
        """The exact bytes stored under a hash, or None."""
        v.check_id(blob, "blob")
        found: bytes | None = await self._run("read", _snapshots.read_blob, blob=blob)
        return found

    async def save_snapshot(
        self, snapshot: ContextSnapshot, *, chat_id: str, message_id: str | None
    ) -> ContextSnapshot:
        """Store a snapshot attached to a chat (and a message); returns the stored copy.

        Item contents held by the snapshot are written as blobs in the same transaction; every
        item must have its blob (held, or stored before). Raises `SnapshotError` for an already
        stored snapshot or a missing blob.
        """
        if not isinstance(snapshot, ContextSnapshot):
            raise InvalidTypeError(
                f"save_snapshot takes a ContextSnapshot, got {v.type_name(snapshot)}"
            )
        if snapshot.stored:
            raise SnapshotError(
                f"snapshot {snapshot.id!r} is stored already and cannot be stored again; "
                "build a new ContextSnapshot"
            )
        v.check_id(chat_id, "chat_id")
        v.check_optional_id(message_id, "message_id")
        v.check_optional_text(snapshot.summary, "summary")
        for index, item in enumerate(snapshot.items):
            v.check_text(item.path, f"items[{index}].path")
            if item.preview is not None:
                v.check_text(item.preview, f"items[{index}].preview")
            if item.blob is None:
                raise SnapshotError(
                    f"item {index} ({item.path!r}) has no blob; add items with the add_* helpers"
                )
        held = _snapshots.check_blobs(snapshot.contents)
        snapshot_id, created = new_id(), utcnow()
        await self._run(
            "write",
            _snapshots.save_snapshot,
            dialect=self._dialect,
            snapshot=snapshot,
            held=held,
            snapshot_id=snapshot_id,
            chat_id=chat_id,
            message_id=message_id,
            created=created,
            holds=chat_id,
        )
        return snapshot.freeze(
            id=snapshot_id, chat_id=chat_id, message_id=message_id, created_at=created
        )

    async def get_snapshot(
        self, snapshot_id: str, *, with_content: bool = False
    ) -> ContextSnapshot | None:
        """A stored snapshot, or None. ``with_content`` also loads its items' blobs."""
        v.check_id(snapshot_id, "snapshot_id")
        v.check_bool(with_content, "with_content")
        found: list[ContextSnapshot] = await self._run(
            "snapshot",
            _snapshots.snapshots,
            where=SN.c.id == snapshot_id,
            with_content=with_content,
        )
        return found[0] if found else None

    async def list_snapshots(self, chat_id: str) -> list[ContextSnapshot]:
        """The chat's snapshots, newest first (without contents)."""
        v.check_id(chat_id, "chat_id")

        def unit(conn: Any) -> list[ContextSnapshot]:
            _chats.require(conn, chat_id)
            return _snapshots.snapshots(conn, SN.c.chat_id == chat_id, False)

        found: list[ContextSnapshot] = await self.db.run("snapshot", unit)
        return found

    async def create_resolve_record(
        self,
        chat_id: str,
        *,
        branch_id: str | None,
        branch_name: str | None,
        head_message_id: str | None,
        renderer: str,
        system_prompt: str,
        messages: Sequence[tuple[str, bytes]],
    ) -> ResolveRecord:
        """Store what a model was shown: the prompt and each message's JSON, as blobs."""
        v.check_id(chat_id, "chat_id")
        v.check_optional_id(branch_id, "branch_id")
        v.check_optional_id(branch_name, "branch_name")
        v.check_optional_id(head_message_id, "head_message_id")
        # Kept as a blob (bytes), so any text that encodes to UTF-8 is fine, NUL included.
        v.check_unicode(system_prompt, "system_prompt")
        v.check_id(renderer, "renderer")
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise InvalidTypeError(
                f"messages must be a list of (message_id, bytes) pairs, got {v.type_name(messages)}"
            )
        for index, pair in enumerate(messages):
            if (
                not isinstance(pair, tuple)
                or len(pair) != 2
                or not isinstance(pair[1], (bytes, bytearray))
            ):
                raise InvalidTypeError(
                    f"messages[{index}] must be a (message_id, bytes) pair, got {v.type_name(pair)}"
                )
        prompt_blob, ids, hashes, blobs = _snapshots.record_blobs(system_prompt, messages)
        record = ResolveRecord(
            id=new_id(),
            chat_id=chat_id,
            branch_id=branch_id,
            branch_name=branch_name,
            head_message_id=head_message_id,
            renderer=renderer,
            prompt_blob=prompt_blob,
            message_ids=ids,
            message_blobs=hashes,
            created_at=utcnow(),
        )
        await self._run(
            "write",
            _snapshots.insert_record,
            dialect=self._dialect,
            record=record,
            blobs=blobs,
            holds=chat_id,
        )
        return record

    async def get_resolve_record(self, record_id: str) -> ResolveRecord | None:
        """A stored resolve record, or None."""
        v.check_id(record_id, "record_id")
        found: list[ResolveRecord] = await self._run(
            "snapshot", _snapshots.records, where=RR.c.id == record_id
        )
        return found[0] if found else None

    async def list_resolve_records(self, chat_id: str) -> list[ResolveRecord]:
        """The chat's resolve records, newest first."""
        v.check_id(chat_id, "chat_id")

        def unit(conn: Any) -> list[ResolveRecord]:
            _chats.require(conn, chat_id)
            return _snapshots.records(conn, RR.c.chat_id == chat_id)

        found: list[ResolveRecord] = await self.db.run("snapshot", unit)
        return found

    async def collect_garbage(self) -> int:
        """Delete the blobs nothing refers to any more; return how many were deleted.

        A blob another chat's snapshot or record still uses stays. Safe to run while others
        write: blobs being written concurrently are locked and skipped.
        """
        for _ in range(3):
            try:
                deleted: int = await self._run("write", _snapshots.collect_garbage)
                return deleted
            except StoreError as exc:
                # A reference committed between our read and our delete: look again.
                if not self._dialect.is_foreign_key_violation(exc.__cause__ or exc):
                    raise
        raise StoreError("garbage collection kept racing concurrent writers; run it again")

    # --- transfer ---------------------------------------------------------------------------

    async def export_chat(self, chat_id: str) -> ChatExport:
        """Everything of a chat as plain data (see `ChatExport`), read as one snapshot."""
        v.check_id(chat_id, "chat_id")
        export: ChatExport = await self._run("snapshot", _transfer.export_chat, chat_id=chat_id)
        return export

    async def import_chat(self, export: ChatExport) -> None:
        """Write an exported chat into this store as it was (ids, timestamps, branches).

        Raises `ChatExistsError` if the chat id is taken, and `InvalidGraphError` if the export
        is inconsistent (a branch or checkpoint pointing at a missing message, not exactly one
        active branch, ids that exist in this database already). Nothing is written unless
        everything is.
        """
        checked, records, held = _transfer.check_export(export)
        await self._run(
            "write",
            _transfer.import_chat,
            dialect=self._dialect,
            export=checked,
            records=records,
            held=held,
        )


class InMemoryContextStore(SqlContextStore):
    """An SQLite in-memory store for tests and notebooks; its data dies with it.

    Its one connection is shared by every call (they take turns), and a cancelled call never
    loses it.
    """

    def __init__(self, **options: Any) -> None:
        super().__init__("sqlite+aiosqlite:///:memory:", migrate="auto", **options)
