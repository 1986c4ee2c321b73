"""Chats: create, upsert, read, update under a lock, list by activity, delete."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import Select, delete, func, literal, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from agentcontext import _validate as v
from agentcontext.errors import ChatExistsError, ChatNotFoundError, InvalidTypeError, StoreError
from agentcontext.store import _rows
from agentcontext.store._core import CHAT_COLS, SqlCore, check_metadata_filter, new_id
from agentcontext.store._schema import branches as B
from agentcontext.store._schema import chats as C
from agentcontext.store._schema import checkpoints as K
from agentcontext.store._schema import messages as M
from agentcontext.store.records import Chat, ChatInfo, ChatUpdate, utcnow


class ChatsMixin(SqlCore):
    """The chat methods of :class:`~agentcontext.SqlContextStore`."""

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
            taken = (await conn.execute(select(literal(1)).where(C.c.id == chat.id))).first()
            if taken is not None:
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
        existing = await self._read_chat(chat.id)
        if existing is not None:
            return existing
        for _ in range(3):
            try:
                async with self._tx(write=True) as conn:
                    row = (await conn.execute(select(*CHAT_COLS).where(C.c.id == chat.id))).first()
                    if row is not None:
                        return _rows.chat(row)
                    await self._insert_chat(conn, chat)
                    return chat
            except StoreError as exc:
                # Another process created it between our read and our insert: read it back.
                if not self._dialect.is_unique_violation(exc.__cause__ or exc):
                    raise
        existing = await self._read_chat(chat.id)
        if existing is None:  # pragma: no cover - would need a concurrent delete
            raise StoreError(f"could not create or read chat {chat.id!r}")
        return existing

    async def _read_chat(self, chat_id: str) -> Chat | None:
        async with self._tx() as conn:
            row = (await conn.execute(select(*CHAT_COLS).where(C.c.id == chat_id))).first()
        return None if row is None else _rows.chat(row)

    @staticmethod
    def _new_chat(chat_id: object, user_id: object, title: object, metadata: object) -> Chat:
        meta = {} if metadata is None else v.check_json_object(metadata, "metadata")
        now = utcnow()
        return _rows.build(
            Chat,
            {
                "id": v.check_id(chat_id, "chat_id"),
                "user_id": v.check_id(user_id, "user_id"),
                "title": v.check_optional_text(title, "title"),
                "metadata": meta,
                "created_at": now,
                "updated_at": now,
            },
        )

    async def _insert_chat(self, conn: AsyncConnection, chat: Chat) -> None:
        """Insert a chat with its active ``main`` branch (so there is always exactly one)."""
        await conn.execute(
            C.insert().values(
                id=chat.id,
                user_id=chat.user_id,
                title=chat.title,
                metadata=chat.metadata,
                created_at=chat.created_at,
                updated_at=chat.updated_at,
                version=1,
            )
        )
        await conn.execute(
            B.insert().values(
                id=new_id(),
                chat_id=chat.id,
                name="main",
                head_message_id=None,
                is_active=True,
                created_at=chat.created_at,
            )
        )

    async def get_chat(self, chat_id: str) -> Chat | None:
        v.check_id(chat_id, "chat_id")
        return await self._read_chat(chat_id)

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
            values: dict[str, Any] = {"updated_at": utcnow(), "version": C.c.version + 1}
            fields = change.model_fields_set
            if "title" in fields:
                values["title"] = v.check_optional_text(change.title, "title")
            if "metadata" in fields:
                values["metadata"] = v.check_json_object(change.metadata or {}, "metadata")
            await conn.execute(update(C).where(C.c.id == chat_id).values(**values))
            row = (await conn.execute(select(*CHAT_COLS).where(C.c.id == chat_id))).one()
        return _rows.chat(row)

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
        async with self._tx() as conn:
            rows = (await conn.execute(query)).all()
        return [
            _rows.build(
                ChatInfo,
                {
                    **_rows.chat(row).__dict__,
                    "message_count": int(row[6]),
                    "branch_count": int(row[7]),
                },
            )
            for row in rows
        ]

    def list_chats_query(
        self,
        *,
        user_id: str | None = None,
        metadata: Mapping[str, str | int | bool] | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> Select[Any]:
        """The SQL :meth:`list_chats` runs (to show its query plan, for instance)."""
        v.check_optional_id(user_id, "user_id")
        wanted = check_metadata_filter(metadata)
        v.check_optional_int(limit, "limit", minimum=0)
        v.check_int(offset, "offset", minimum=0)
        # The page first (an index walk on (user_id, updated_at, id)), then the branch counts
        # for its rows only: counting inside the page query would count skipped rows too.
        # Message counts are kept on the chat row, as a chat may hold millions.
        page = select(*CHAT_COLS, C.c.message_count).order_by(C.c.updated_at.desc(), C.c.id.desc())
        if user_id is not None:
            page = page.where(C.c.user_id == user_id)
        if wanted:
            page = page.where(self._dialect.metadata_filter(C.c.metadata, wanted))
        if limit is not None:
            page = page.limit(limit)
        if offset:
            page = page.offset(offset)
        rows = page.subquery("page")
        branch_count = (
            select(func.count()).select_from(B).where(B.c.chat_id == rows.c.id).scalar_subquery()
        )
        return select(*rows.c, branch_count).order_by(rows.c.updated_at.desc(), rows.c.id.desc())

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
        """Delete everything of a chat, children before parents."""
        await self._delete_snapshot_rows(conn, chat_id)
        await conn.execute(delete(K).where(K.c.chat_id == chat_id))
        await conn.execute(delete(B).where(B.c.chat_id == chat_id))
        await conn.execute(delete(M).where(M.c.chat_id == chat_id))
        await conn.execute(delete(C).where(C.c.id == chat_id))
