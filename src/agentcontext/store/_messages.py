"""Messages: upserts, chains, ancestry, re-parenting and change feeds."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import exists, literal, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from agentcontext import _validate as v
from agentcontext.errors import InvalidGraphError, InvalidInputError, MessageNotFoundError
from agentcontext.store import _rows, _text
from agentcontext.store._chain import load_chain
from agentcontext.store._core import IN_CHUNK, MESSAGE_COLS, SqlCore, check_record, check_records
from agentcontext.store._schema import branches as B
from agentcontext.store._schema import chats as C
from agentcontext.store._schema import messages as M
from agentcontext.store.records import MessageRecord

_UPSERTS: dict[str, Any] = {}
"""The message upsert per dialect name (see ``MessagesMixin._message_upsert``)."""


class ExistingMessages(Exception):
    """Internal: messages that were to be inserted exist already (rolls the transaction back)."""

    def __init__(self, ids: list[str]) -> None:
        super().__init__(ids)
        self.ids = ids


class MessagesMixin(SqlCore):
    """The message methods of :class:`~agentcontext.SqlContextStore`."""

    async def add_message(self, message: MessageRecord) -> MessageRecord:
        return (await self.add_messages([check_record(message, "message")]))[0]

    async def add_messages(self, messages: Sequence[MessageRecord]) -> list[MessageRecord]:
        records = check_records(messages)
        if not records:
            return []
        async with self._tx(write=True) as conn:
            versions = {
                chat_id: await self._touch_existing(conn, chat_id)
                for chat_id in dict.fromkeys(r.chat_id for r in records)
            }
            return await self._write_messages(conn, records, versions)

    async def _fetch_nodes(self, conn: AsyncConnection, ids: set[str]) -> dict[str, Any]:
        """(id, chat_id, parent_id, depth, created_at) of the existing messages among ``ids``."""
        found: dict[str, Any] = {}
        pending = list(ids)
        for start in range(0, len(pending), IN_CHUNK):
            chunk = pending[start : start + IN_CHUNK]
            rows = await conn.execute(
                select(M.c.id, M.c.chat_id, M.c.parent_id, M.c.depth, M.c.created_at).where(
                    M.c.id.in_(chunk)
                )
            )
            for row in rows:
                found[row[0]] = row
        return found

    async def _write_messages(
        self,
        conn: AsyncConnection,
        records: list[MessageRecord],
        versions: dict[str, int],
        *,
        updates: Collection[str] | None = None,
    ) -> list[MessageRecord]:
        """Upsert checked records inside the caller's write transaction.

        ``versions`` maps each chat to the change version this transaction writes with.
        New messages get their depth from their parent (stored, or earlier in the batch);
        existing ones keep parent, chat, depth and creation time and take the new content.
        With ``updates``, only those ids may exist already; others raise ExistingMessages.
        """
        batch_ids = {r.id for r in records}
        lookup = set(batch_ids)
        lookup.update(r.parent_id for r in records if r.parent_id is not None)
        existing = await self._fetch_nodes(conn, lookup)
        if updates is not None:
            refused = [r.id for r in records if r.id in existing and r.id not in updates]
            if refused:
                raise ExistingMessages(refused)
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
                parent_id, row_depth, created_at = old[2], old[3], old[4]
            else:
                parent_id, created_at = record.parent_id, record.created_at
                row_depth = (
                    1
                    if parent_id is None
                    else self._child_depth(record, existing, depth, chat_of, batch_ids)
                )
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
                    "version": versions[record.chat_id],
                }
            )
            stored.append(
                record
                if old is None
                else record.model_copy(update={"parent_id": parent_id, "created_at": created_at})
            )
        written = (await conn.execute(self._message_upsert(), rows)).all()
        if len(written) != len(rows):
            # A concurrent writer created one of these ids in another chat after our check.
            raise InvalidGraphError(
                "a message id of this batch was just created in another chat; "
                "message ids are global, pick new ids"
            )
        added: dict[str, int] = {}
        for record in records:
            if record.id not in existing:
                added[record.chat_id] = added.get(record.chat_id, 0) + 1
        for chat_id, count in added.items():
            await conn.execute(
                update(C).where(C.c.id == chat_id).values(message_count=C.c.message_count + count)
            )
        return stored

    def _message_upsert(self) -> Any:
        """The message upsert statement, built once per dialect: building it (the
        ``excluded`` column proxies) costs more than executing it."""
        statement = _UPSERTS.get(self._dialect.name)
        if statement is None:
            insert = self._dialect.insert(M)
            statement = insert.on_conflict_do_update(
                index_elements=[M.c.id],
                set_={
                    "name": insert.excluded.name,
                    "type": insert.excluded.type,
                    "data": insert.excluded.data,
                    "search_text": insert.excluded.search_text,
                    "version": insert.excluded.version,
                },
                where=M.c.chat_id == insert.excluded.chat_id,
            ).returning(M.c.id)
            _UPSERTS[self._dialect.name] = statement
        return statement

    @staticmethod
    def _child_depth(
        record: MessageRecord,
        existing: dict[str, Any],
        depth: dict[str, int],
        chat_of: dict[str, str],
        batch_ids: set[str],
    ) -> int:
        parent_id = record.parent_id
        assert parent_id is not None
        if parent_id in depth:
            parent_chat, parent_depth = chat_of[parent_id], depth[parent_id]
        elif parent_id in existing:
            parent_chat, parent_depth = existing[parent_id][1], existing[parent_id][3]
        elif parent_id in batch_ids:
            raise InvalidInputError(
                f"message {record.id!r} comes before its parent {parent_id!r} in the batch; "
                "put parents first"
            )
        else:
            raise MessageNotFoundError(
                f"parent message {parent_id!r} of {record.id!r} does not exist"
            )
        if parent_chat != record.chat_id:
            raise InvalidGraphError(
                f"parent {parent_id!r} of message {record.id!r} is in chat {parent_chat!r}, "
                f"not {record.chat_id!r}"
            )
        return parent_depth + 1

    async def get_message(self, message_id: str) -> MessageRecord | None:
        v.check_id(message_id, "message_id")
        async with self._tx() as conn:
            row = (await conn.execute(select(*MESSAGE_COLS).where(M.c.id == message_id))).first()
        return None if row is None else _rows.message(row)

    async def get_message_chain(
        self, head_id: str, *, after: str | None = None
    ) -> list[MessageRecord]:
        v.check_id(head_id, "head_id")
        v.check_optional_id(after, "after")
        async with self._tx() as conn:
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
            return await load_chain(conn, self._dialect.name, active[0])

    async def get_changes(self, chat_id: str, since_version: int) -> list[MessageRecord]:
        """Messages of the chat written (inserted or updated) after ``since_version``.

        In insertion order. Together with :meth:`get_branch_state` this lets an engine that
        holds a chain in memory catch up without reading it again.
        """
        v.check_id(chat_id, "chat_id")
        v.check_int(since_version, "since_version", minimum=0)
        async with self._tx() as conn:
            rows = (
                await conn.execute(
                    select(*MESSAGE_COLS)
                    .where(M.c.chat_id == chat_id, M.c.version > since_version)
                    .order_by(M.c.seq)
                )
            ).all()
        return [_rows.message(row) for row in rows]

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
            version = await self._touch_existing(conn, chat_id)
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
            base = select(M.c.id).where(M.c.id == message_id).cte("subtree", recursive=True)
            child = M.alias("child")
            subtree = base.union_all(
                select(child.c.id).where(child.c.chat_id == chat_id, child.c.parent_id == base.c.id)
            )
            await conn.execute(update(M).where(M.c.id == message_id).values(parent_id=parent_id))
            # The whole subtree's chains changed: new depths, and a new version so that
            # engines holding any of it in memory notice.
            await conn.execute(
                update(M)
                .where(M.c.id.in_(select(subtree.c.id)))
                .values(depth=M.c.depth + (new_depth - old_depth), version=version)
            )
