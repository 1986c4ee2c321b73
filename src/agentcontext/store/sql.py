"""SqlContextStore: the conversation graph in SQLite or PostgreSQL through SQLAlchemy async."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from typing import Any, Literal

from sqlalchemy import (
    ColumnElement,
    and_,
    delete,
    exists,
    func,
    literal,
    select,
    true,
    update,
)
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agentcontext import _validate as v
from agentcontext.errors import (
    BranchExistsError,
    BranchNotFoundError,
    ChatExistsError,
    ChatNotFoundError,
    ContextError,
    InvalidGraphError,
    InvalidInputError,
    InvalidTypeError,
    MessageNotFoundError,
    SchemaOutdatedError,
    StoreError,
    StoreUnavailableError,
)
from agentcontext.store import _migrate, _rows, _text
from agentcontext.store._chain import load_chain
from agentcontext.store._dialect import (
    WRITE_OPTION,
    create_engine,
    dialect_for,
    install_sqlite_hooks,
    is_connection_error,
    is_memory_sqlite,
)
from agentcontext.store._schema import branches as B
from agentcontext.store._schema import chats as C
from agentcontext.store._schema import checkpoints as K
from agentcontext.store._schema import messages as M
from agentcontext.store.base import AppendResult, ContextStore
from agentcontext.store.records import (
    Branch,
    BranchInfo,
    Chat,
    ChatInfo,
    ChatUpdate,
    Checkpoint,
    Graph,
    GraphNode,
    MessageRecord,
    SearchResult,
    utcnow,
)

__all__ = ["InMemoryContextStore", "SqlContextStore"]

_IN_CHUNK = 2000
"""Ids per ``IN (...)`` lookup (well under every backend's bound-parameter limit)."""

_MESSAGE_COLS = (M.c.id, M.c.chat_id, M.c.parent_id, M.c.name, M.c.type, M.c.data, M.c.created_at)
_CHAT_COLS = (C.c.id, C.c.user_id, C.c.title, C.c.metadata, C.c.created_at, C.c.updated_at)
_BRANCH_COLS = (B.c.id, B.c.chat_id, B.c.name, B.c.head_message_id, B.c.is_active, B.c.created_at)
_CHECKPOINT_COLS = (K.c.id, K.c.chat_id, K.c.name, K.c.message_id, K.c.created_at)

MigrateMode = Literal["auto"] | bool


def _new_id() -> str:
    return uuid.uuid4().hex


_message = _rows.message
_chat = _rows.chat
_branch = _rows.branch
_checkpoint = _rows.checkpoint


def _check_record(value: object, what: str) -> MessageRecord:
    if not isinstance(value, MessageRecord):
        raise InvalidTypeError(f"{what} must be a MessageRecord, got {v.type_name(value)}")
    v.check_id(value.id, f"{what}.id")
    v.check_id(value.chat_id, f"{what}.chat_id")
    v.check_optional_id(value.parent_id, f"{what}.parent_id")
    v.check_id(value.name, f"{what}.name")
    v.check_id(value.type, f"{what}.type")
    v.check_json(value.data, f"{what}.data")
    if value.parent_id == value.id:
        raise InvalidGraphError(f"message {value.id!r} cannot be its own parent")
    return value


def _check_records(values: object, what: str = "messages") -> list[MessageRecord]:
    if isinstance(values, (str, bytes, MessageRecord)) or not isinstance(values, Sequence):
        raise InvalidTypeError(
            f"{what} must be a sequence of MessageRecord, got {v.type_name(values)}"
        )
    records = [_check_record(item, f"{what}[{i}]") for i, item in enumerate(values)]
    seen: set[str] = set()
    for record in records:
        if record.id in seen:
            raise InvalidInputError(f"{what} holds message id {record.id!r} twice")
        seen.add(record.id)
    return records


def _check_roles(roles: object) -> list[str] | None:
    if roles is None:
        return None
    return v.check_str_list(roles, "roles")


def _check_metadata_filter(value: object) -> dict[str, str | int | bool] | None:
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


class _Conflict(Exception):
    """Internal: the branch head moved; unwinds (and rolls back) the transaction."""

    def __init__(self, head: str | None) -> None:
        super().__init__(head)
        self.head = head


class SqlContextStore(ContextStore):
    """A :class:`ContextStore` on SQLite (``sqlite+aiosqlite://``) or PostgreSQL
    (``postgresql+asyncpg://``).

    Args:
        url_or_engine: a database URL, or an ``AsyncEngine`` you own (the store never disposes
            an engine it did not create).
        migrate: ``"auto"`` (default) upgrades the schema to the newest revision on first use,
            safely when several processes start at once; ``False`` only checks it and raises
            :class:`~agentcontext.SchemaOutdatedError` naming the command to run.
        **engine_options: passed to ``create_async_engine``. Extra options:
            ``sqlite_busy_timeout`` (seconds, default 30) and ``postgres_connect_timeout``
            (seconds, default 10).

    Use it as an async context manager, or call :meth:`initialize` and :meth:`close`.
    """

    def __init__(
        self,
        url_or_engine: str | URL | AsyncEngine,
        *,
        migrate: MigrateMode = "auto",
        **engine_options: Any,
    ) -> None:
        if migrate not in ("auto", True, False):
            raise InvalidInputError(f"migrate must be 'auto' or False, got {migrate!r}")
        self._migrate_mode: MigrateMode = migrate
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
        elif isinstance(url_or_engine, (str, URL)):
            try:
                url = make_url(url_or_engine) if isinstance(url_or_engine, str) else url_or_engine
            except ArgumentError as exc:
                raise InvalidInputError(
                    f"cannot parse database URL: {exc}; expected e.g. "
                    "sqlite+aiosqlite:///chat.db or postgresql+asyncpg://user@host/db"
                ) from None
            self._engine = create_engine(url, **engine_options)
            self._owns_engine = True
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

    async def _lock_chat(self, conn: AsyncConnection, chat_id: str) -> Chat:
        """Lock the chat row for this transaction (PostgreSQL; SQLite holds the write lock)."""
        row = (
            await conn.execute(select(*_CHAT_COLS).where(C.c.id == chat_id).with_for_update())
        ).first()
        if row is None:
            raise ChatNotFoundError(f"chat {chat_id!r} does not exist")
        return _chat(row)

    async def _require_chat(self, conn: AsyncConnection, chat_id: str) -> None:
        found = (await conn.execute(select(literal(1)).where(C.c.id == chat_id))).first()
        if found is None:
            raise ChatNotFoundError(f"chat {chat_id!r} does not exist")

    async def _touch(self, conn: AsyncConnection, chat_id: str) -> bool:
        """Record activity on a chat (and lock its row). False if the chat does not exist."""
        result = await conn.execute(update(C).where(C.c.id == chat_id).values(updated_at=utcnow()))
        return bool(result.rowcount)

    # --- chats ------------------------------------------------------------------------------

    async def create_chat(
        self,
        chat_id: str,
        *,
        user_id: str,
        title: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Chat:
        chat = self._new_chat(chat_id, user_id, title, metadata)
        async with self._tx(write=True) as conn:
            exists_ = (await conn.execute(select(literal(1)).where(C.c.id == chat.id))).first()
            if exists_ is not None:
                raise ChatExistsError(
                    f"chat {chat.id!r} already exists; use upsert_chat to reuse it"
                )
            await self._insert_chat(conn, chat)
        return chat

    async def upsert_chat(
        self,
        chat_id: str,
        *,
        user_id: str,
        title: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Chat:
        chat = self._new_chat(chat_id, user_id, title, metadata)
        async with self._tx() as conn:
            row = (await conn.execute(select(*_CHAT_COLS).where(C.c.id == chat.id))).first()
        if row is not None:
            return _chat(row)
        for _ in range(3):
            try:
                async with self._tx(write=True) as conn:
                    row = (await conn.execute(select(*_CHAT_COLS).where(C.c.id == chat.id))).first()
                    if row is not None:
                        return _chat(row)
                    await self._insert_chat(conn, chat)
                    return chat
            except StoreError as exc:
                # Another process created it between our read and our insert: read it back.
                if not self._dialect.is_unique_violation(exc.__cause__ or exc):
                    raise
        async with self._tx() as conn:
            row = (await conn.execute(select(*_CHAT_COLS).where(C.c.id == chat.id))).first()
        if row is None:  # pragma: no cover - would need a concurrent delete
            raise StoreError(f"could not create or read chat {chat.id!r}")
        return _chat(row)

    @staticmethod
    def _new_chat(chat_id: object, user_id: object, title: object, metadata: object) -> Chat:
        meta = {} if metadata is None else v.check_json_object(metadata, "metadata")
        now = utcnow()
        return Chat.model_construct(
            id=v.check_id(chat_id, "chat_id"),
            user_id=v.check_id(user_id, "user_id"),
            title=v.check_optional_text(title, "title"),
            metadata=meta,
            created_at=now,
            updated_at=now,
        )

    async def _insert_chat(self, conn: AsyncConnection, chat: Chat) -> None:
        await conn.execute(
            C.insert().values(
                id=chat.id,
                user_id=chat.user_id,
                title=chat.title,
                metadata=chat.metadata,
                created_at=chat.created_at,
                updated_at=chat.updated_at,
            )
        )
        await conn.execute(
            B.insert().values(
                id=_new_id(),
                chat_id=chat.id,
                name="main",
                head_message_id=None,
                is_active=True,
                created_at=chat.created_at,
            )
        )

    async def get_chat(self, chat_id: str) -> Chat | None:
        v.check_id(chat_id, "chat_id")
        async with self._tx() as conn:
            row = (await conn.execute(select(*_CHAT_COLS).where(C.c.id == chat_id))).first()
        return None if row is None else _chat(row)

    async def update_chat(self, chat_id: str, updater: Callable[[Chat], ChatUpdate | None]) -> Chat:
        v.check_id(chat_id, "chat_id")
        if not callable(updater):
            raise InvalidTypeError(
                f"updater must be a callable taking a Chat, got {v.type_name(updater)}"
            )
        async with self._tx(write=True) as conn:
            chat = await self._lock_chat(conn, chat_id)
            change = updater(chat)
            if change is None:
                return chat
            if not isinstance(change, ChatUpdate):
                raise InvalidTypeError(
                    f"updater must return a ChatUpdate or None, got {v.type_name(change)}"
                )
            values: dict[str, Any] = {"updated_at": utcnow()}
            fields = change.model_fields_set
            if "title" in fields:
                values["title"] = v.check_optional_text(change.title, "title")
            if "metadata" in fields:
                values["metadata"] = v.check_json_object(change.metadata or {}, "metadata")
            await conn.execute(update(C).where(C.c.id == chat_id).values(**values))
            row = (await conn.execute(select(*_CHAT_COLS).where(C.c.id == chat_id))).one()
        return _chat(row)

    async def list_chats(
        self,
        *,
        user_id: str | None = None,
        metadata: Mapping[str, str | int | bool] | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[ChatInfo]:
        v.check_optional_id(user_id, "user_id")
        wanted = _check_metadata_filter(metadata)
        v.check_optional_int(limit, "limit", minimum=0)
        v.check_int(offset, "offset", minimum=0)
        message_count = (
            select(func.count()).select_from(M).where(M.c.chat_id == C.c.id).scalar_subquery()
        )
        branch_count = (
            select(func.count()).select_from(B).where(B.c.chat_id == C.c.id).scalar_subquery()
        )
        query = select(*_CHAT_COLS, message_count, branch_count).order_by(
            C.c.updated_at.desc(), C.c.id.desc()
        )
        if user_id is not None:
            query = query.where(C.c.user_id == user_id)
        if wanted:
            query = query.where(self._dialect.metadata_filter(C.c.metadata, wanted))
        if limit is not None:
            query = query.limit(limit)
        if offset:
            query = query.offset(offset)
        async with self._tx() as conn:
            rows = (await conn.execute(query)).all()
        out = []
        for row in rows:
            chat = _chat(row)
            out.append(
                _rows.build(
                    ChatInfo,
                    {**chat.__dict__, "message_count": int(row[6]), "branch_count": int(row[7])},
                )
            )
        return out

    async def delete_chat(self, chat_id: str, *, user_id: str | None = None) -> bool:
        v.check_id(chat_id, "chat_id")
        v.check_optional_id(user_id, "user_id")
        async with self._tx(write=True) as conn:
            try:
                chat = await self._lock_chat(conn, chat_id)
            except ChatNotFoundError:
                return False
            if user_id is not None and chat.user_id != user_id:
                return False
            await self._delete_chat_rows(conn, chat_id)
        return True

    async def _delete_chat_rows(self, conn: AsyncConnection, chat_id: str) -> None:
        """Delete everything of a chat, children before parents (subclass hook)."""
        await conn.execute(delete(K).where(K.c.chat_id == chat_id))
        await conn.execute(delete(B).where(B.c.chat_id == chat_id))
        await conn.execute(delete(M).where(M.c.chat_id == chat_id))
        await conn.execute(delete(C).where(C.c.id == chat_id))

    # --- messages ---------------------------------------------------------------------------

    async def add_message(self, message: MessageRecord) -> MessageRecord:
        return (await self.add_messages([_check_record(message, "message")]))[0]

    async def add_messages(self, messages: Sequence[MessageRecord]) -> list[MessageRecord]:
        records = _check_records(messages)
        if not records:
            return []
        async with self._tx(write=True) as conn:
            for chat_id in dict.fromkeys(r.chat_id for r in records):
                if not await self._touch(conn, chat_id):
                    raise ChatNotFoundError(f"chat {chat_id!r} does not exist")
            return await self._write_messages(conn, records)

    async def _fetch_nodes(self, conn: AsyncConnection, ids: set[str]) -> dict[str, Any]:
        """(id, chat_id, parent_id, depth, created_at) of the existing messages among ``ids``."""
        found: dict[str, Any] = {}
        pending = list(ids)
        for start in range(0, len(pending), _IN_CHUNK):
            chunk = pending[start : start + _IN_CHUNK]
            rows = await conn.execute(
                select(M.c.id, M.c.chat_id, M.c.parent_id, M.c.depth, M.c.created_at).where(
                    M.c.id.in_(chunk)
                )
            )
            for row in rows:
                found[row[0]] = row
        return found

    async def _write_messages(
        self, conn: AsyncConnection, records: list[MessageRecord]
    ) -> list[MessageRecord]:
        """Upsert checked records inside the caller's write transaction."""
        batch_ids = {r.id for r in records}
        lookup = set(batch_ids)
        lookup.update(r.parent_id for r in records if r.parent_id is not None)
        existing = await self._fetch_nodes(conn, lookup)
        depth: dict[str, int] = {}
        chat_of: dict[str, str] = {}
        rows: list[dict[str, Any]] = []
        stored: list[MessageRecord] = []
        for record in records:
            old = existing.get(record.id)
            if old is not None:
                if old[1] != record.chat_id:
                    raise InvalidGraphError(
                        f"message {record.id!r} belongs to chat {old[1]!r}, not "
                        f"{record.chat_id!r}; message ids are global, pick a new id"
                    )
                depth[record.id] = old[3]
                chat_of[record.id] = old[1]
                parent_id, created_at = old[2], old[4]
                row_depth = old[3]
            else:
                parent_id, created_at = record.parent_id, record.created_at
                if parent_id is None:
                    row_depth = 1
                else:
                    if parent_id in depth:
                        parent_chat, parent_depth = chat_of[parent_id], depth[parent_id]
                    elif parent_id in existing:
                        parent_row = existing[parent_id]
                        parent_chat, parent_depth = parent_row[1], parent_row[3]
                    elif parent_id in batch_ids:
                        raise InvalidInputError(
                            f"message {record.id!r} comes before its parent {parent_id!r} in "
                            "the batch; put parents first"
                        )
                    else:
                        raise MessageNotFoundError(
                            f"parent message {parent_id!r} of {record.id!r} does not exist"
                        )
                    if parent_chat != record.chat_id:
                        raise InvalidGraphError(
                            f"parent {parent_id!r} of message {record.id!r} is in chat "
                            f"{parent_chat!r}, not {record.chat_id!r}"
                        )
                    row_depth = parent_depth + 1
                depth[record.id] = row_depth
                chat_of[record.id] = record.chat_id
            rows.append(
                {
                    "id": record.id,
                    "chat_id": record.chat_id,
                    "parent_id": parent_id,
                    "depth": row_depth,
                    "name": record.name,
                    "type": record.type,
                    "data": record.data,
                    "search_text": _text.search_text(record.data),
                    "created_at": created_at,
                }
            )
            stored.append(
                record
                if old is None
                else record.model_copy(update={"parent_id": parent_id, "created_at": created_at})
            )
        insert = self._dialect.insert(M)
        statement = insert.on_conflict_do_update(
            index_elements=[M.c.id],
            set_={
                "name": insert.excluded.name,
                "type": insert.excluded.type,
                "data": insert.excluded.data,
                "search_text": insert.excluded.search_text,
            },
            where=M.c.chat_id == insert.excluded.chat_id,
        ).returning(M.c.id)
        written = (await conn.execute(statement, rows)).all()
        if len(written) != len(rows):
            # A concurrent writer created one of these ids in another chat after our check.
            raise InvalidGraphError(
                "a message id of this batch was just created in another chat; "
                "message ids are global, pick new ids"
            )
        return stored

    async def get_message(self, message_id: str) -> MessageRecord | None:
        v.check_id(message_id, "message_id")
        async with self._tx() as conn:
            row = (await conn.execute(select(*_MESSAGE_COLS).where(M.c.id == message_id))).first()
        return None if row is None else _message(row)

    async def get_message_chain(
        self, head_id: str, *, after: str | None = None
    ) -> list[MessageRecord]:
        v.check_id(head_id, "head_id")
        v.check_optional_id(after, "after")
        async with self._tx() as conn:
            return await self._chain(conn, head_id, after=after)

    async def _chain(
        self, conn: AsyncConnection, head_id: str, *, after: str | None = None
    ) -> list[MessageRecord]:
        return await load_chain(conn, self._dialect.name, head_id, after=after)

    async def get_messages(self, chat_id: str) -> list[MessageRecord]:
        v.check_id(chat_id, "chat_id")
        async with self._tx() as conn:
            active = (
                await conn.execute(
                    select(B.c.head_message_id).where(B.c.chat_id == chat_id, B.c.is_active)
                )
            ).first()
            if active is None:
                await self._require_chat(conn, chat_id)
                return []
            if active[0] is None:
                return []
            return await self._chain(conn, active[0])

    async def has_children(self, message_id: str) -> bool:
        v.check_id(message_id, "message_id")
        async with self._tx() as conn:
            found = await conn.scalar(select(exists().where(M.c.parent_id == message_id)))
        return bool(found)

    async def is_ancestor(self, ancestor_id: str, message_id: str) -> bool:
        v.check_id(ancestor_id, "ancestor_id")
        v.check_id(message_id, "message_id")
        async with self._tx() as conn:
            return await self._is_ancestor(conn, ancestor_id, message_id)

    async def _is_ancestor(self, conn: AsyncConnection, ancestor_id: str, message_id: str) -> bool:
        if ancestor_id == message_id:
            found = await conn.scalar(select(literal(1)).where(M.c.id == message_id))
            return found is not None
        nodes = await self._fetch_nodes(conn, {ancestor_id, message_id})
        if ancestor_id not in nodes or message_id not in nodes:
            return False
        anc, msg = nodes[ancestor_id], nodes[message_id]
        if anc[1] != msg[1] or anc[3] >= msg[3]:
            return False
        # Walk up from message_id; depth strictly decreases, so corrupt cycles still end.
        base = (
            select(M.c.id, M.c.parent_id, M.c.depth)
            .where(M.c.id == message_id)
            .cte("up", recursive=True)
        )
        parent = M.alias("parent")
        step = select(parent.c.id, parent.c.parent_id, parent.c.depth).where(
            parent.c.id == base.c.parent_id,
            parent.c.depth < base.c.depth,
            parent.c.depth >= anc[3],
        )
        up = base.union_all(step)
        found = await conn.scalar(select(literal(1)).select_from(up).where(up.c.id == ancestor_id))
        return found is not None

    async def set_message_parent(self, message_id: str, parent_id: str | None) -> None:
        v.check_id(message_id, "message_id")
        v.check_optional_id(parent_id, "parent_id")
        if parent_id == message_id:
            raise InvalidGraphError(f"message {message_id!r} cannot be its own parent")
        async with self._tx(write=True) as conn:
            nodes = await self._fetch_nodes(
                conn, {message_id} | ({parent_id} if parent_id else set())
            )
            node = nodes.get(message_id)
            if node is None:
                raise MessageNotFoundError(f"message {message_id!r} does not exist")
            chat_id, old_depth = node[1], node[3]
            await self._lock_chat(conn, chat_id)
            if parent_id is None:
                new_depth = 1
            else:
                parent = nodes.get(parent_id)
                if parent is None:
                    raise MessageNotFoundError(f"parent message {parent_id!r} does not exist")
                if parent[1] != chat_id:
                    raise InvalidGraphError(
                        f"parent {parent_id!r} is in chat {parent[1]!r}, but message "
                        f"{message_id!r} is in chat {chat_id!r}"
                    )
                if await self._is_ancestor(conn, message_id, parent_id):
                    raise InvalidGraphError(
                        f"{parent_id!r} descends from {message_id!r}; making it the parent "
                        "would create a cycle"
                    )
                new_depth = parent[3] + 1
            await conn.execute(update(M).where(M.c.id == message_id).values(parent_id=parent_id))
            delta = new_depth - old_depth
            if delta:
                base = select(M.c.id).where(M.c.id == message_id).cte("subtree", recursive=True)
                child = M.alias("child")
                subtree = base.union_all(
                    select(child.c.id).where(
                        child.c.chat_id == chat_id, child.c.parent_id == base.c.id
                    )
                )
                await conn.execute(
                    update(M)
                    .where(M.c.id.in_(select(subtree.c.id)))
                    .values(depth=M.c.depth + delta)
                )

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
        async with self._tx(write=True) as conn:
            await self._lock_chat(conn, chat_id)
            await self._check_head(conn, chat_id, head_message_id)
            taken = await conn.scalar(
                select(literal(1)).where(B.c.chat_id == chat_id, B.c.name == name)
            )
            if taken is not None:
                raise BranchExistsError(f"chat {chat_id!r} already has a branch named {name!r}")
            return await self._insert_branch(conn, chat_id, name, head_message_id, activate)

    async def _check_head(
        self, conn: AsyncConnection, chat_id: str, head_message_id: str | None
    ) -> None:
        if head_message_id is None:
            return
        owner = await conn.scalar(select(M.c.chat_id).where(M.c.id == head_message_id))
        if owner is None:
            raise MessageNotFoundError(f"message {head_message_id!r} does not exist")
        if owner != chat_id:
            raise InvalidGraphError(
                f"message {head_message_id!r} is in chat {owner!r}, not {chat_id!r}"
            )

    async def _insert_branch(
        self,
        conn: AsyncConnection,
        chat_id: str,
        name: str,
        head_message_id: str | None,
        activate: bool,
    ) -> Branch:
        if activate:
            await conn.execute(
                update(B).where(B.c.chat_id == chat_id, B.c.is_active).values(is_active=False)
            )
        branch = Branch.model_construct(
            id=_new_id(),
            chat_id=chat_id,
            name=name,
            head_message_id=head_message_id,
            is_active=activate,
            created_at=utcnow(),
        )
        await conn.execute(
            B.insert().values(
                id=branch.id,
                chat_id=chat_id,
                name=name,
                head_message_id=head_message_id,
                is_active=activate,
                created_at=branch.created_at,
            )
        )
        await self._touch(conn, chat_id)
        return branch

    async def fork_branch(
        self,
        chat_id: str,
        base_name: str,
        *,
        head_message_id: str | None,
        activate: bool,
        messages: Sequence[MessageRecord] = (),
    ) -> Branch:
        v.check_id(chat_id, "chat_id")
        v.check_id(base_name, "base_name")
        v.check_optional_id(head_message_id, "head_message_id")
        v.check_bool(activate, "activate")
        records = _check_records(messages)
        for record in records:
            if record.chat_id != chat_id:
                raise InvalidGraphError(
                    f"message {record.id!r} is for chat {record.chat_id!r}, not {chat_id!r}"
                )
        pattern = re.compile(re.escape(base_name) + r"-v(\d+)")
        for _ in range(5):
            try:
                async with self._tx(write=True) as conn:
                    await self._lock_chat(conn, chat_id)
                    await self._check_head(conn, chat_id, head_message_id)
                    names = await conn.scalars(select(B.c.name).where(B.c.chat_id == chat_id))
                    used = [int(m.group(1)) for n in names if (m := pattern.fullmatch(n))]
                    name = f"{base_name}-v{max(used, default=1) + 1}"
                    if len(name) > v.MAX_ID_LENGTH:
                        raise InvalidInputError(
                            f"the new branch name {name[:40]}… would be longer than "
                            f"{v.MAX_ID_LENGTH} characters; switch to a branch with a shorter name"
                        )
                    head = head_message_id
                    if records:
                        await self._write_messages(conn, records)
                        head = records[-1].id
                    return await self._insert_branch(conn, chat_id, name, head, activate)
            except StoreError as exc:
                if not self._dialect.is_unique_violation(exc.__cause__ or exc):
                    raise
        raise StoreError(f"could not find a free branch name for {base_name!r}; retry")

    async def get_branch(self, chat_id: str, name: str) -> Branch | None:
        v.check_id(chat_id, "chat_id")
        v.check_id(name, "branch name")
        async with self._tx() as conn:
            row = (
                await conn.execute(
                    select(*_BRANCH_COLS).where(B.c.chat_id == chat_id, B.c.name == name)
                )
            ).first()
        return None if row is None else _branch(row)

    async def get_branch_by_id(self, branch_id: str) -> Branch | None:
        v.check_id(branch_id, "branch_id")
        async with self._tx() as conn:
            row = (await conn.execute(select(*_BRANCH_COLS).where(B.c.id == branch_id))).first()
        return None if row is None else _branch(row)

    async def get_active_branch(self, chat_id: str) -> Branch | None:
        v.check_id(chat_id, "chat_id")
        async with self._tx() as conn:
            row = (
                await conn.execute(
                    select(*_BRANCH_COLS).where(B.c.chat_id == chat_id, B.c.is_active)
                )
            ).first()
        return None if row is None else _branch(row)

    async def set_active_branch(self, chat_id: str, branch_id: str) -> Branch:
        v.check_id(chat_id, "chat_id")
        v.check_id(branch_id, "branch_id")
        async with self._tx(write=True) as conn:
            await self._lock_chat(conn, chat_id)
            row = (
                await conn.execute(
                    select(*_BRANCH_COLS).where(B.c.id == branch_id, B.c.chat_id == chat_id)
                )
            ).first()
            if row is None:
                raise BranchNotFoundError(f"chat {chat_id!r} has no branch with id {branch_id!r}")
            if not row[4]:
                await conn.execute(
                    update(B).where(B.c.chat_id == chat_id, B.c.is_active).values(is_active=False)
                )
                await conn.execute(update(B).where(B.c.id == branch_id).values(is_active=True))
            return _branch(row).model_copy(update={"is_active": True})

    async def update_branch_head(
        self, branch_id: str, message_id: str | None, expected_head: str | None
    ) -> bool:
        v.check_id(branch_id, "branch_id")
        v.check_optional_id(message_id, "message_id")
        v.check_optional_id(expected_head, "expected_head")
        async with self._tx(write=True) as conn:
            chat_id = await conn.scalar(select(B.c.chat_id).where(B.c.id == branch_id))
            if chat_id is None:
                raise BranchNotFoundError(f"no branch with id {branch_id!r}")
            await self._lock_chat(conn, chat_id)
            await self._check_head(conn, chat_id, message_id)
            moved = await conn.execute(
                update(B)
                .where(B.c.id == branch_id, B.c.head_message_id.is_not_distinct_from(expected_head))
                .values(head_message_id=message_id)
            )
            if not moved.rowcount:
                return False
            await self._touch(conn, chat_id)
            return True

    async def append_messages(
        self,
        branch_id: str,
        messages: Sequence[MessageRecord],
        *,
        expected_head: str | None,
    ) -> AppendResult:
        v.check_id(branch_id, "branch_id")
        v.check_optional_id(expected_head, "expected_head")
        records = _check_records(messages)
        if not records:
            raise InvalidInputError("append_messages needs at least one message")
        chat_id = records[0].chat_id
        try:
            return await self._append(branch_id, chat_id, records, expected_head)
        except _Conflict as conflict:
            return AppendResult(ok=False, head_message_id=conflict.head)

    async def _append(
        self,
        branch_id: str,
        chat_id: str,
        records: list[MessageRecord],
        expected_head: str | None,
    ) -> AppendResult:
        async with self._tx(write=True) as conn:
            # Lock order everywhere: the chat row first, then branches.
            if not await self._touch(conn, chat_id):
                raise ChatNotFoundError(f"chat {chat_id!r} does not exist")
            row = (
                await conn.execute(
                    select(B.c.chat_id, B.c.head_message_id).where(B.c.id == branch_id)
                )
            ).first()
            if row is None or row[0] != chat_id:
                raise BranchNotFoundError(f"chat {chat_id!r} has no branch with id {branch_id!r}")
            if row[1] != expected_head:
                raise _Conflict(row[1])  # rolls back the activity update
            for record in records:
                if record.chat_id != chat_id:
                    raise InvalidGraphError(
                        f"message {record.id!r} is for chat {record.chat_id!r}, not {chat_id!r}"
                    )
            await self._write_messages(conn, records)
            head = records[-1].id
            await conn.execute(update(B).where(B.c.id == branch_id).values(head_message_id=head))
        return AppendResult(ok=True, head_message_id=head)

    async def list_branches(self, chat_id: str) -> list[BranchInfo]:
        v.check_id(chat_id, "chat_id")
        async with self._tx() as conn:
            return await self._list_branches(conn, chat_id)

    async def _list_branches(self, conn: AsyncConnection, chat_id: str) -> list[BranchInfo]:
        query = (
            select(*_BRANCH_COLS, func.coalesce(M.c.depth, 0))
            .select_from(B.outerjoin(M, M.c.id == B.c.head_message_id))
            .where(B.c.chat_id == chat_id)
            .order_by(B.c.created_at, B.c.name)
        )
        rows = (await conn.execute(query)).all()
        if not rows:
            await self._require_chat(conn, chat_id)
        return [
            _rows.build(BranchInfo, {**_branch(row).__dict__, "message_count": int(row[6])})
            for row in rows
        ]

    # --- checkpoints ------------------------------------------------------------------------

    async def create_checkpoint(self, chat_id: str, name: str, message_id: str) -> Checkpoint:
        v.check_id(chat_id, "chat_id")
        v.check_id(name, "checkpoint name")
        v.check_id(message_id, "message_id")
        now = utcnow()
        async with self._tx(write=True) as conn:
            await self._lock_chat(conn, chat_id)
            await self._check_head(conn, chat_id, message_id)
            insert = self._dialect.insert(K)
            statement = (
                insert.values(
                    id=_new_id(), chat_id=chat_id, name=name, message_id=message_id, created_at=now
                )
                .on_conflict_do_update(
                    index_elements=[K.c.chat_id, K.c.name],
                    set_={"message_id": insert.excluded.message_id, "created_at": now},
                )
                .returning(*_CHECKPOINT_COLS)
            )
            row = (await conn.execute(statement)).one()
        return _checkpoint(row)

    async def get_checkpoint(self, chat_id: str, name: str) -> Checkpoint | None:
        v.check_id(chat_id, "chat_id")
        v.check_id(name, "checkpoint name")
        async with self._tx() as conn:
            row = (
                await conn.execute(
                    select(*_CHECKPOINT_COLS).where(K.c.chat_id == chat_id, K.c.name == name)
                )
            ).first()
        return None if row is None else _checkpoint(row)

    async def list_checkpoints(self, chat_id: str) -> list[Checkpoint]:
        v.check_id(chat_id, "chat_id")
        async with self._tx() as conn:
            return await self._list_checkpoints(conn, chat_id)

    async def _list_checkpoints(self, conn: AsyncConnection, chat_id: str) -> list[Checkpoint]:
        rows = (
            await conn.execute(
                select(*_CHECKPOINT_COLS)
                .where(K.c.chat_id == chat_id)
                .order_by(K.c.created_at.desc(), K.c.name)
            )
        ).all()
        if not rows:
            await self._require_chat(conn, chat_id)
        return [_checkpoint(row) for row in rows]

    async def delete_checkpoint(self, chat_id: str, name: str) -> bool:
        v.check_id(chat_id, "chat_id")
        v.check_id(name, "checkpoint name")
        async with self._tx(write=True) as conn:
            result = await conn.execute(delete(K).where(K.c.chat_id == chat_id, K.c.name == name))
        return bool(result.rowcount)

    # --- search -----------------------------------------------------------------------------

    async def search_messages(
        self,
        chat_id: str,
        query: str,
        *,
        roles: Sequence[str] | None = None,
        limit: int = 20,
    ) -> list[SearchResult]:
        v.check_id(chat_id, "chat_id")
        return await self._search(M.c.chat_id == chat_id, query, roles, limit, chat_id=chat_id)

    async def search_user_messages(
        self,
        user_id: str,
        query: str,
        *,
        roles: Sequence[str] | None = None,
        limit: int = 20,
    ) -> list[SearchResult]:
        v.check_id(user_id, "user_id")
        scope = M.c.chat_id.in_(select(C.c.id).where(C.c.user_id == user_id))
        return await self._search(scope, query, roles, limit)

    async def _search(
        self,
        scope: ColumnElement[bool],
        query: object,
        roles: object,
        limit: object,
        *,
        chat_id: str | None = None,
    ) -> list[SearchResult]:
        v.check_text(query, "query")
        assert isinstance(query, str)
        wanted_roles = _check_roles(roles)
        checked_limit = v.check_int(limit, "limit", minimum=1)
        terms = _text.plain_terms(query)
        if wanted_roles is not None:
            scope = and_(scope, M.c.name.in_(wanted_roles)) if wanted_roles else ~true()
        async with self._tx() as conn:
            if chat_id is not None:
                await self._require_chat(conn, chat_id)
            if not terms:
                return []
            statement = self._dialect.search(terms, scope=scope, limit=checked_limit)
            rows = (await conn.execute(statement)).all()
        return [
            SearchResult.model_construct(
                message=_message(row), rank=float(row[7]), snippet=_text.snippet(row[8], terms)
            )
            for row in rows
        ]

    # --- graph ------------------------------------------------------------------------------

    async def get_graph(self, chat_id: str) -> Graph:
        v.check_id(chat_id, "chat_id")
        async with self._tx() as conn:
            await self._require_chat(conn, chat_id)
            rows = (
                await conn.execute(
                    select(M.c.id, M.c.parent_id, M.c.name, M.c.data, M.c.created_at)
                    .where(M.c.chat_id == chat_id)
                    .order_by(M.c.seq)
                )
            ).all()
            branch_list = await self._list_branches(conn, chat_id)
            checkpoint_list = await self._list_checkpoints(conn, chat_id)
        nodes = [
            GraphNode.model_construct(
                id=row[0],
                parent_id=row[1],
                role=row[2],
                preview=_text.preview(row[3]),
                created_at=row[4],
            )
            for row in rows
        ]
        return Graph.model_construct(
            chat_id=chat_id,
            nodes=nodes,
            branches=branch_list,
            checkpoints=checkpoint_list,
        )


class InMemoryContextStore(SqlContextStore):
    """An SQLite in-memory store for tests and notebooks; its data dies with it."""

    def __init__(self, **engine_options: Any) -> None:
        super().__init__("sqlite+aiosqlite:///:memory:", migrate="auto", **engine_options)
