"""SqlContextStore: the conversation graph in SQLite, PostgreSQL or MariaDB through SQLAlchemy.

A facade: each method checks its arguments and calls one function of a concern module of
``_ops`` — a plain function of a connection run as one unit of work on the store's `Database`,
or an async policy of that module (a retry, a choice of write path, batches) built on such
units. What differs between databases lives on the dialect object (``_dialects``); the
methods' documentation is on the capability protocols (``protocols``).
"""

from __future__ import annotations

import asyncio
import functools
import warnings
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime, timedelta
from typing import Any, Never

from sqlalchemy import Select
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agentcontext import _telemetry as telemetry
from agentcontext import _validate as v
from agentcontext._shape import DEFAULT_FOLD
from agentcontext.encryption import KeyProvider
from agentcontext.errors import InvalidGraphError, InvalidInputError, InvalidTypeError
from agentcontext.snapshots import ContextSnapshot
from agentcontext.store._db import migrate as _migrate
from agentcontext.store._db.database import Database, Transaction, unit
from agentcontext.store._db.migrate import MigrateMode
from agentcontext.store._db.options import StoreOptions, open_database
from agentcontext.store._memory import (
    DEFAULT_CACHE_BYTES,
    ChainMemory,
    StoreMemory,
    forget_everywhere,
)
from agentcontext.store._ops import appends as _appends
from agentcontext.store._ops import branches as _branches
from agentcontext.store._ops import chain as _chain
from agentcontext.store._ops import chats as _chats
from agentcontext.store._ops import checkpoints as _checkpoints
from agentcontext.store._ops import copy as _copy
from agentcontext.store._ops import graph as _graph
from agentcontext.store._ops import messages as _messages
from agentcontext.store._ops import pages as _pages
from agentcontext.store._ops import retention as _retention
from agentcontext.store._ops import search as _search
from agentcontext.store._ops import snapshots as _snapshots
from agentcontext.store._ops import transfer as _transfer
from agentcontext.store._rows.checks import (
    check_metadata_filter,
    check_record,
    check_records,
    new_id,
)
from agentcontext.store.base import ContextStore
from agentcontext.store.records import (
    AppendResult,
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
    ErasureReport,
    Graph,
    GraphOutline,
    MessageRecord,
    PruneReport,
    PurgeReport,
    ResolveRecord,
    SearchResult,
    utcnow,
)

__all__ = ["SqlContextStore"]


class SqlContextStore(ContextStore):
    """A `ContextStore` on SQLite, PostgreSQL or MariaDB/MySQL, through one `AsyncEngine`.

    Args:
        url_or_engine: A database URL, or an `AsyncEngine` you own (the store never disposes an
            engine it did not create, and reaches the database only through it).
        migrate: ``"auto"`` (default) upgrades the schema to the newest revision on first use,
            safely when several processes start at once; ``False`` only checks it and raises
            `SchemaOutdatedError` naming the command to run.
        encryption: A `KeyProvider`: users' text is encrypted at rest, still searchable.

    The other options are keyword-only and typed (see `StoreOptions`, where each is described;
    an unknown one is an `InvalidInputError`).

    Use it as an async context manager, or call `initialize` and `close`:

    ```python
    async with SqlContextStore("sqlite+aiosqlite:///chat.db") as store:
        chat = await store.upsert_chat("chat-1", user_id="user-1")
    ```

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
        schema: str | None = None,
        read_replicas: Sequence[str | URL | AsyncEngine] = (),
        replica_wait: float = 0.1,
        lock_timeout: float = 30.0,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        encryption: KeyProvider | None = None,
        echo: bool = False,
        connect_args: Mapping[str, Any] | None = None,
        engine_options: Mapping[str, Any] | None = None,
        **unknown: Never,
    ) -> None:
        self._db: Database | None = None  # set last: __del__ checks it
        given = dict(locals())  # the parameters above: every option by its name
        options = StoreOptions.of(
            {name: given[name] for name in StoreOptions.names()} | dict(unknown)
        )
        prepare = functools.partial(_migrate.prepare_schema, mode=_migrate.check_mode(migrate))
        self._memory = StoreMemory(options.cache_bytes)
        self._db = open_database(url_or_engine, options, prepare)
        self._dialect = self._db.dialect

    # --- properties and lifecycle -------------------------------------------------------------

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
    def chain_memory(self) -> ChainMemory:
        return self._memory.chains

    def write_turn(self, chat_id: str) -> asyncio.Lock:
        return self._memory.turns.lock(v.check_id(chat_id, "chat_id"))

    @property
    def url(self) -> str:
        """The database URL with its password hidden."""
        return self.db.url

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def __del__(self) -> None:
        db = self.__dict__.get("_db")
        if db is not None and db.ready and not db.closed and db.owns_engine:
            message = f"{self!r} was never closed; use 'async with' or await store.close()"
            warnings.warn(message, ResourceWarning, source=self, stacklevel=1)

    async def initialize(self) -> None:
        await self.db.initialize()

    async def close(self) -> None:
        await self.db.close()

    async def opening_failed(self) -> None:
        await self.db.release()

    def using(self, connection: AsyncConnection) -> AbstractAsyncContextManager[None]:
        """Run this task's store calls in your transaction, inside the block.

        ``connection`` is a SQLAlchemy `AsyncConnection` to the store's database, inside a
        transaction (any engine's). The store writes without committing: your commit keeps
        the turn, your rollback leaves nothing of it. Each write runs in a SAVEPOINT, so a
        refused one (a head conflict, bad input) leaves your transaction usable. Writers of
        the same chat outside the block wait for your commit or rollback (`ChatBusyError`
        after ``lock_timeout``); tasks started inside the block take turns on the connection:

        ```python
        async with engine.begin() as conn, store.using(conn):
            await conn.execute(orders.insert().values(...))
            await context.save()
        ```
        """
        return self.db.callers.using(connection)

    def consistency_token(self, chat_id: str) -> str | None:
        v.check_id(chat_id, "chat_id")
        replicas = self.db.replicas
        return None if replicas is None or self.db.callers.bound else replicas.token(chat_id)

    def read_after(self, chat_id: str, token: str | None) -> None:
        v.check_id(chat_id, "chat_id")
        position = None if token is None else self.db.dialect.parse_token(token)
        if position is not None and self.db.replicas is not None:
            self.db.replicas.told(chat_id, position)

    def current_transaction(self) -> Transaction | None:
        return self.db.callers.transaction()

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[AsyncConnection]:
        """A transaction of your own on the store's engine, with this task's store calls in it.

        Yields the connection (run your statements on it); the store's calls inside the block
        write in the same transaction (see `using`). Leaving the block commits; an exception,
        or ``await conn.rollback()``, leaves nothing of either. On SQLite the transaction takes
        the write lock up front (``BEGIN IMMEDIATE``), so it never fails half-way with
        "database is locked":

        ```python
        async with store.begin() as conn:
            await conn.execute(orders.insert().values(...))
            await context.save()
        ```
        """
        async with self.db.callers.begin() as conn:
            yield conn

    # --- chats ------------------------------------------------------------------------------

    async def create_chat(
        self, chat_id: str, *, user_id: str, title: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Chat:  # fmt: skip
        chat = _chats.checked_new(chat_id, user_id, title, metadata)
        return await self.db.run("write", unit(_chats.create, self._dialect, chat), chat=chat.id)

    async def upsert_chat(
        self, chat_id: str, *, user_id: str, title: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Chat:  # fmt: skip
        chat = _chats.checked_new(chat_id, user_id, title, metadata)
        found = await self.db.run("read", unit(_chats.get, self._dialect, chat.id))
        if found is not None:
            return found
        return await _chats.insert_or_read(self.db, self._dialect, chat, _chats.get_or_insert)

    async def get_chat(self, chat_id: str) -> Chat | None:
        v.check_id(chat_id, "chat_id")
        return await self.db.run("read", unit(_chats.get, self._dialect, chat_id), chat=chat_id)

    async def update_chat(self, chat_id: str, updater: Callable[[Chat], ChatUpdate | None]) -> Chat:
        v.check_id(chat_id, "chat_id")
        if not callable(updater):
            raise InvalidTypeError(
                f"updater must be a callable taking a Chat, got {v.type_name(updater)}"
            )
        write = unit(_chats.update_chat, self._dialect, chat_id, updater)
        return await self.db.run("write", write, chat=chat_id)

    async def list_chats(
        self, *, user_id: str | None = None, metadata: Mapping[str, str | int | bool] | None = None,
        limit: int | None = None, offset: int = 0, after: str | None = None,
    ) -> list[ChatInfo]:  # fmt: skip
        query = self.list_chats_query(
            user_id=user_id, metadata=metadata, limit=limit, offset=offset, after=after
        )
        return await self.db.run("read", unit(_chats.list_chats, self._dialect, query))

    def list_chats_query(
        self, *, user_id: str | None = None, metadata: Mapping[str, str | int | bool] | None = None,
        limit: int | None = None, offset: int = 0, after: str | None = None,
    ) -> Select[Any]:  # fmt: skip
        """The SQL `list_chats` runs (to show its query plan, for instance)."""
        v.check_optional_id(user_id, "user_id")
        return _chats.list_query(
            self._dialect,
            user_id=user_id,
            metadata=check_metadata_filter(metadata),
            limit=v.check_optional_count(limit, "limit"),
            offset=v.check_count(offset, "offset"),
            after=_chats.check_cursor(after),
        )

    async def delete_chat(self, chat_id: str, *, user_id: str | None = None) -> bool:
        v.check_id(chat_id, "chat_id")
        v.check_optional_id(user_id, "user_id")
        write = unit(_chats.delete_chat, self._dialect, chat_id, user_id)
        deleted: bool = await self.db.run("write", write, chat=chat_id)
        forget_everywhere(chat_id)
        return deleted

    # --- messages ---------------------------------------------------------------------------

    async def add_message(self, message: MessageRecord) -> MessageRecord:
        return (await self.add_messages([check_record(message, "message")]))[0]

    async def add_messages(self, messages: Sequence[MessageRecord]) -> list[MessageRecord]:
        records = check_records(messages)
        if not records:
            return []
        write = unit(_messages.add, self._dialect, records)
        return await self.db.run("write", write, chat={r.chat_id for r in records})

    async def get_message(self, message_id: str) -> MessageRecord | None:
        v.check_id(message_id, "message_id")
        return await self.db.run("read", unit(_messages.get, self._dialect, message_id))

    async def get_message_chain(
        self, head_id: str, *, after: str | None = None
    ) -> list[MessageRecord]:
        v.check_id(head_id, "head_id")
        v.check_optional_id(after, "after")
        read = unit(_chain.load_records, self._dialect, head_id, after=after)
        return await self.db.run("snapshot", read)

    async def get_messages(self, chat_id: str) -> list[MessageRecord]:
        v.check_id(chat_id, "chat_id")
        read = unit(_chain.active_records, self._dialect, chat_id)
        return await self.db.run("snapshot", read, chat=chat_id)

    async def get_changes(self, chat_id: str, since_version: int) -> list[MessageRecord]:
        v.check_id(chat_id, "chat_id")
        v.check_int64(since_version, "since_version", minimum=0)
        return await self.db.run(
            "read", unit(_messages.changes, self._dialect, chat_id, since_version), chat=chat_id
        )

    async def has_children(self, message_id: str) -> bool:
        v.check_id(message_id, "message_id")
        return await self.db.run("read", unit(_messages.has_children, message_id))

    async def is_ancestor(self, ancestor_id: str, message_id: str) -> bool:
        v.check_id(ancestor_id, "ancestor_id")
        v.check_id(message_id, "message_id")
        return await self.db.run("read", unit(_messages.is_ancestor, ancestor_id, message_id))

    async def set_message_parent(self, message_id: str, parent_id: str | None) -> None:
        v.check_id(message_id, "message_id")
        v.check_optional_id(parent_id, "parent_id")
        if parent_id == message_id:
            raise InvalidGraphError(f"message {message_id!r} cannot be its own parent")
        await self.db.run("write", unit(_messages.reparent, self._dialect, message_id, parent_id))

    # --- branches ---------------------------------------------------------------------------

    async def create_branch(
        self, chat_id: str, name: str, *, head_message_id: str | None = None,
        activate: bool = False,
    ) -> Branch:  # fmt: skip
        v.check_id(chat_id, "chat_id")
        v.check_id(name, "branch name")
        v.check_optional_id(head_message_id, "head_message_id")
        v.check_bool(activate, "activate")
        write = unit(_branches.create, self._dialect, chat_id, name, head_message_id, activate)
        return await self.db.run("write", write, chat=chat_id)

    async def fork_branch(
        self, chat_id: str, base_name: str, *, head_message_id: str | None, activate: bool,
        messages: Sequence[MessageRecord] = (), name: str | None = None,
    ) -> BranchInfo:  # fmt: skip
        v.check_id(chat_id, "chat_id")
        v.check_id(base_name, "base_name")
        v.check_optional_id(head_message_id, "head_message_id")
        v.check_optional_id(name, "branch name")
        v.check_bool(activate, "activate")
        records = _branches.check_fork_records(chat_id, check_records(messages))
        return await _branches.fork_retrying(
            self.db, self._dialect, chat_id, base_name, head_message_id, activate, records, name
        )

    async def get_branch(self, chat_id: str, name: str) -> Branch | None:
        v.check_id(chat_id, "chat_id")
        v.check_id(name, "branch name")
        return await self.db.run("read", unit(_branches.get, chat_id, name), chat=chat_id)

    async def get_branch_by_id(self, branch_id: str) -> Branch | None:
        v.check_id(branch_id, "branch_id")
        return await self.db.run("read", unit(_branches.get_by_id, branch_id))

    async def get_branch_state(self, branch_id: str) -> BranchState | None:
        v.check_id(branch_id, "branch_id")
        read = unit(_branches.state, self._dialect, branch_id)
        return await self.db.run("read", read, branch=branch_id)

    async def get_active_branch(self, chat_id: str) -> Branch | None:
        v.check_id(chat_id, "chat_id")
        return await self.db.run("read", unit(_branches.active, chat_id), chat=chat_id)

    async def set_active_branch(self, chat_id: str, branch_id: str) -> Branch:
        v.check_id(chat_id, "chat_id")
        v.check_id(branch_id, "branch_id")
        write = unit(_branches.set_active, self._dialect, chat_id, branch_id)
        return await self.db.run("write", write, chat=chat_id)

    async def update_branch_head(
        self, branch_id: str, message_id: str | None, expected_head: str | None
    ) -> bool:
        v.check_id(branch_id, "branch_id")
        v.check_optional_id(message_id, "message_id")
        v.check_optional_id(expected_head, "expected_head")
        write = unit(_branches.move_head, self._dialect, branch_id, message_id, expected_head)
        try:
            await self.db.run("write", write)
        except _branches.HeadMoved:
            return False
        return True

    async def append_messages(
        self, branch_id: str, messages: Sequence[MessageRecord], *, expected_head: str | None,
        new_head: str | None = None, updates: Collection[str] | None = None,
    ) -> AppendResult:  # fmt: skip
        v.check_id(branch_id, "branch_id")
        v.check_optional_id(expected_head, "expected_head")
        allowed = None if updates is None else set(v.check_str_list(updates, "updates"))
        records = _appends.check(check_records(messages), "append_messages")
        head = records[-1].id if new_head is None else v.check_id(new_head, "new_head")
        if all(r.id != head for r in records):
            raise InvalidInputError(f"new_head {head!r} is not one of the messages written")
        return await _appends.append(
            self.db, self._dialect, self._memory.owners, branch_id, records,
            expected=expected_head, head=head, allowed=allowed,
        )  # fmt: skip

    async def append_turn(
        self, branch_id: str, messages: Sequence[MessageRecord], *, expected_head: str | None
    ) -> AppendResult:
        v.check_id(branch_id, "branch_id")
        v.check_optional_id(expected_head, "expected_head")
        records = _appends.check(check_records(messages), "append_turn")
        if not _appends.is_plain(records, expected_head, records[-1].id, None):
            raise InvalidInputError(
                "append_turn takes new messages of one chat (no compaction summary), each the "
                "parent of the next, the first one's parent being expected_head; use "
                "append_messages otherwise"
            )
        return await _appends.append(
            self.db, self._dialect, self._memory.owners, branch_id, records,
            expected=expected_head, head=records[-1].id, allowed=set(), report_version=False,
        )  # fmt: skip

    async def list_branches(self, chat_id: str) -> list[BranchInfo]:
        v.check_id(chat_id, "chat_id")
        return await self.db.run("read", unit(_branches.list_infos, chat_id), chat=chat_id)

    async def rename_branch(self, chat_id: str, name: str, new_name: str) -> Branch:
        v.check_id(chat_id, "chat_id")
        v.check_id(name, "branch name")
        v.check_id(new_name, "new branch name")
        return await self.db.run(
            "write", unit(_branches.rename, self._dialect, chat_id, name, new_name), chat=chat_id
        )

    async def delete_branch(self, chat_id: str, name: str) -> bool:
        v.check_id(chat_id, "chat_id")
        v.check_id(name, "branch name")
        write = unit(_branches.remove, self._dialect, chat_id, name)
        return await self.db.run("write", write, chat=chat_id)

    # --- the engine's reads -------------------------------------------------------------------

    async def open_chat(self, chat_id: str, *, user_id: str) -> ChatState:
        v.check_id(chat_id, "chat_id")
        v.check_id(user_id, "user_id")
        read = unit(_branches.chat_state, self._dialect, chat_id)
        state = await self.db.run("read", read, chat=chat_id)
        if state is None:
            chat = _chats.checked_new(chat_id, user_id, None, None)
            opened = _branches.open_or_create
            state = await _chats.insert_or_read(self.db, self._dialect, chat, opened)
        self._memory.owners.note(chat_id, state.chat.user_id)
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
        _chain.check_load(chat_id, head_id, head_depth, chat_size, stop_depth, stop_at, compacted)
        read = unit(
            _chain.load_rows, self._dialect, chat_id, head_id, head_depth=head_depth,
            chat_size=chat_size, stop_depth=stop_depth, stop_at=stop_at, compacted=compacted,
        )  # fmt: skip
        return await self.db.run("read", read, chat=chat_id)

    # --- checkpoints ------------------------------------------------------------------------

    async def create_checkpoint(
        self, chat_id: str, name: str, message_id: str, *, branch_id: str | None = None
    ) -> Checkpoint:
        v.check_id(chat_id, "chat_id")
        v.check_id(name, "checkpoint name")
        v.check_id(message_id, "message_id")
        v.check_optional_id(branch_id, "branch_id")
        write = unit(_checkpoints.create, self._dialect, chat_id, name, message_id, branch_id)
        return await self.db.run("write", write, chat=chat_id)

    async def get_checkpoint(self, chat_id: str, name: str) -> Checkpoint | None:
        v.check_id(chat_id, "chat_id")
        v.check_id(name, "checkpoint name")
        return await self.db.run("read", unit(_checkpoints.get, chat_id, name), chat=chat_id)

    async def list_checkpoints(self, chat_id: str) -> list[Checkpoint]:
        v.check_id(chat_id, "chat_id")
        return await self.db.run("read", unit(_checkpoints.list_all, chat_id), chat=chat_id)

    async def delete_checkpoint(self, chat_id: str, name: str) -> bool:
        v.check_id(chat_id, "chat_id")
        v.check_id(name, "checkpoint name")
        write = unit(_checkpoints.remove, chat_id, name)
        return await self.db.run("write", write, chat=chat_id)

    # --- search, graph and pages ------------------------------------------------------------

    @telemetry.search("chat")
    async def search_messages(
        self, chat_id: str, query: str, *, roles: Sequence[str] | None = None, limit: int = 20
    ) -> list[SearchResult]:
        v.check_id(chat_id, "chat_id")
        return await _search.run(self.db, "chat", chat_id, query, roles, limit)

    @telemetry.search("user")
    async def search_user_messages(
        self, user_id: str, query: str, *, roles: Sequence[str] | None = None, limit: int = 20
    ) -> list[SearchResult]:
        v.check_id(user_id, "user_id")
        return await _search.run(self.db, "user", user_id, query, roles, limit)

    async def get_graph(self, chat_id: str) -> Graph:
        v.check_id(chat_id, "chat_id")
        graph = unit(_graph.graph, self._dialect, chat_id)
        return await self.db.run("snapshot", graph, chat=chat_id)

    async def graph_outline(
        self, chat_id: str, *, fold: int = DEFAULT_FOLD, keep: Sequence[str] = (),
        opened: Sequence[str] = (),
    ) -> GraphOutline:  # fmt: skip
        v.check_id(chat_id, "chat_id")
        v.check_int(fold, "fold", minimum=2)
        keep_ids, opened_ids = v.check_str_list(keep, "keep"), v.check_str_list(opened, "opened")
        memory = self._memory.outlines if self.current_transaction() is None else None
        read = unit(
            _pages.graph_outline, self._dialect, chat_id, fold=fold, keep=keep_ids,
            opened=opened_ids, memory=memory,
        )  # fmt: skip
        return await self.db.run("snapshot", read, chat=chat_id)

    async def chain_page(self, chat_id: str, end_id: str, *, limit: int) -> ChainPage:
        v.check_id(chat_id, "chat_id")
        v.check_id(end_id, "end_id")
        v.check_int(limit, "limit", minimum=1)
        read = unit(_pages.chain_page, self._dialect, chat_id, end_id, min(limit, 1_000_000))
        return await self.db.run("snapshot", read, chat=chat_id)

    # --- blobs, snapshots, resolve records ---------------------------------------------------

    async def put_blob(
        self, content: bytes, *, media_type: str = "application/octet-stream",
        expected_hash: str | None = None, chat_id: str | None = None,
    ) -> str:  # fmt: skip
        digest, checked = _snapshots.check_put(content, media_type, expected_hash, chat_id)
        await self.db.run("write", unit(_snapshots.store_blobs, self._dialect, checked, chat_id))
        return digest

    async def read_blob(self, blob: str, *, chat_id: str | None = None) -> bytes | None:
        v.check_id(blob, "blob")
        v.check_optional_id(chat_id, "chat_id")
        return await self.db.run("read", unit(_snapshots.read_blob, self._dialect, blob, chat_id))

    async def save_snapshot(
        self, snapshot: ContextSnapshot, *, chat_id: str, message_id: str | None
    ) -> ContextSnapshot:
        held = _snapshots.check_snapshot(snapshot)
        v.check_id(chat_id, "chat_id")
        v.check_optional_id(message_id, "message_id")
        snapshot_id, created = new_id(), utcnow()
        write = unit(
            _snapshots.save_snapshot, self._dialect, snapshot, held, snapshot_id, chat_id,
            message_id, created,
        )  # fmt: skip
        await self.db.run("write", write, chat=chat_id)
        return snapshot.freeze(
            id=snapshot_id, chat_id=chat_id, message_id=message_id, created_at=created
        )

    async def get_snapshot(
        self, snapshot_id: str, *, with_content: bool = False
    ) -> ContextSnapshot | None:
        v.check_id(snapshot_id, "snapshot_id")
        v.check_bool(with_content, "with_content")
        read = unit(_snapshots.snapshot, self._dialect, snapshot_id, with_content)
        return await self.db.run("snapshot", read)

    async def list_snapshots(self, chat_id: str) -> list[ContextSnapshot]:
        v.check_id(chat_id, "chat_id")
        read = unit(_snapshots.chat_snapshots, self._dialect, chat_id)
        return await self.db.run("snapshot", read, chat=chat_id)

    async def create_resolve_record(
        self, chat_id: str, *, branch_id: str | None, branch_name: str | None,
        head_message_id: str | None, renderer: str, system_prompt: str,
        messages: Sequence[tuple[str, bytes]], omitted: Sequence[str] = (),
        estimate: int | None = None,
    ) -> ResolveRecord:  # fmt: skip
        record, blobs = _snapshots.new_record(
            chat_id, branch_id, branch_name, head_message_id, renderer, system_prompt, messages,
            omitted, estimate,
        )  # fmt: skip
        write = unit(_snapshots.insert_record, self._dialect, record, blobs)
        await self.db.run("write", write, chat=chat_id)
        return record

    async def get_resolve_record(self, record_id: str) -> ResolveRecord | None:
        v.check_id(record_id, "record_id")
        return await self.db.run("snapshot", unit(_snapshots.record, self._dialect, record_id))

    async def list_resolve_records(self, chat_id: str) -> list[ResolveRecord]:
        v.check_id(chat_id, "chat_id")
        read = unit(_snapshots.chat_records, self._dialect, chat_id)
        return await self.db.run("snapshot", read, chat=chat_id)

    async def collect_garbage(self) -> int:
        return await _snapshots.collect_garbage_retrying(self.db)

    # --- retention, erasure and copies -------------------------------------------------------

    async def prune(
        self, *, older_than: datetime | timedelta, user_id: str | None = None,
        progress: Callable[[int, int], object] | None = None,
    ) -> PruneReport:  # fmt: skip
        cutoff = _retention.check_cutoff(older_than)
        v.check_optional_id(user_id, "user_id")
        return await _retention.prune(
            self.db, self._dialect, cutoff, user_id, v.check_callback(progress, "progress")
        )

    async def purge(
        self, chat_id: str, *, progress: Callable[[int, int], object] | None = None
    ) -> PurgeReport:
        v.check_id(chat_id, "chat_id")
        report = await _retention.purge(
            self.db, self._dialect, chat_id, v.check_callback(progress, "progress")
        )
        forget_everywhere(chat_id)
        return report

    async def erase_user(
        self, user_id: str, *, progress: Callable[[int, int], object] | None = None
    ) -> ErasureReport:
        v.check_id(user_id, "user_id")
        return await _retention.erase_user(
            self.db, self._dialect, user_id, v.check_callback(progress, "progress")
        )

    async def copy_chat(
        self, source_id: str, new_chat_id: str, *, up_to: str | None = None,
        user_id: str | None = None,
    ) -> dict[str, str]:  # fmt: skip
        v.check_id(source_id, "source_id")
        v.check_id(new_chat_id, "new_chat_id")
        v.check_optional_id(up_to, "up_to")
        v.check_optional_id(user_id, "user_id")
        write = unit(_copy.copy_chat, self._dialect, source_id, new_chat_id, up_to, user_id)
        return await self.db.run("write", write, chat={source_id, new_chat_id})

    # --- transfer ---------------------------------------------------------------------------

    async def export_chat(self, chat_id: str) -> ChatExport:
        v.check_id(chat_id, "chat_id")
        export = unit(_transfer.export_chat, self._dialect, chat_id)
        return await self.db.run("snapshot", export, chat=chat_id)

    async def import_chat(self, export: ChatExport) -> None:
        checked, records, held = _transfer.check_export(export)
        write = unit(_transfer.import_chat, self._dialect, checked, records, held)
        await self.db.run("write", write)
