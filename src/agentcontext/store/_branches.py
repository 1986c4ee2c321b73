"""Branches (named heads, one active per chat, compare-and-swap moves) and checkpoints."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from contextlib import nullcontext

from sqlalchemy import delete, func, literal, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from agentcontext import _validate as v
from agentcontext.errors import (
    BranchExistsError,
    BranchNotFoundError,
    ContextError,
    InvalidGraphError,
    InvalidInputError,
    MessageNotFoundError,
    StoreError,
)
from agentcontext.store import _rows
from agentcontext.store._core import BRANCH_COLS, CHECKPOINT_COLS, check_records, new_id
from agentcontext.store._fastpath import SlowPath, plan
from agentcontext.store._messages import ExistingMessages, MessagesMixin
from agentcontext.store._schema import branches as B
from agentcontext.store._schema import chats as C
from agentcontext.store._schema import checkpoints as K
from agentcontext.store._schema import messages as M
from agentcontext.store.base import AppendResult
from agentcontext.store.records import (
    Branch,
    BranchInfo,
    BranchState,
    Checkpoint,
    MessageRecord,
    utcnow,
)


class _Conflict(Exception):
    """Internal: the append cannot go ahead; unwinds (and rolls back) the transaction."""

    def __init__(self, head: str | None, version: int, existing: list[str] | None = None) -> None:
        super().__init__(head)
        self.head = head
        self.version = version
        self.existing = existing or []


class BranchesMixin(MessagesMixin):
    """The branch and checkpoint methods of :class:`~agentcontext.SqlContextStore`."""

    async def _check_head(
        self, conn: AsyncConnection, chat_id: str, head_message_id: str | None
    ) -> int:
        """Check that the message is in the chat; return its depth (0 for None)."""
        if head_message_id is None:
            return 0
        row = (
            await conn.execute(select(M.c.chat_id, M.c.depth).where(M.c.id == head_message_id))
        ).first()
        if row is None:
            raise MessageNotFoundError(f"message {head_message_id!r} does not exist")
        if row[0] != chat_id:
            raise InvalidGraphError(
                f"message {head_message_id!r} is in chat {row[0]!r}, not {chat_id!r}"
            )
        return int(row[1])

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
        branch = _rows.build(
            Branch,
            {
                "id": new_id(),
                "chat_id": chat_id,
                "name": name,
                "head_message_id": head_message_id,
                "is_active": activate,
                "created_at": utcnow(),
            },
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
        return branch

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
            await self._touch_existing(conn, chat_id)
            await self._check_head(conn, chat_id, head_message_id)
            taken = await conn.scalar(
                select(literal(1)).where(B.c.chat_id == chat_id, B.c.name == name)
            )
            if taken is not None:
                raise BranchExistsError(f"chat {chat_id!r} already has a branch named {name!r}")
            return await self._insert_branch(conn, chat_id, name, head_message_id, activate)

    async def fork_branch(
        self,
        chat_id: str,
        base_name: str,
        *,
        head_message_id: str | None,
        activate: bool,
        messages: Sequence[MessageRecord] = (),
    ) -> BranchInfo:
        v.check_id(chat_id, "chat_id")
        v.check_id(base_name, "base_name")
        v.check_optional_id(head_message_id, "head_message_id")
        v.check_bool(activate, "activate")
        records = check_records(messages)
        for record in records:
            if record.chat_id != chat_id:
                raise InvalidGraphError(
                    f"message {record.id!r} is for chat {record.chat_id!r}, not {chat_id!r}"
                )
        pattern = re.compile(re.escape(base_name) + r"-v(\d+)")
        for _ in range(5):
            try:
                async with self._tx(write=True) as conn:
                    # The chat row lock serialises forks, so the next name is free.
                    version = await self._touch_existing(conn, chat_id)
                    depth = await self._check_head(conn, chat_id, head_message_id)
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
                        await self._write_messages(conn, records, {chat_id: version})
                        head = records[-1].id
                        depth = await self._check_head(conn, chat_id, head)
                    branch = await self._insert_branch(conn, chat_id, name, head, activate)
                    return _rows.build(BranchInfo, {**branch.__dict__, "message_count": depth})
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
                    select(*BRANCH_COLS).where(B.c.chat_id == chat_id, B.c.name == name)
                )
            ).first()
        return None if row is None else _rows.branch(row)

    async def get_branch_by_id(self, branch_id: str) -> Branch | None:
        v.check_id(branch_id, "branch_id")
        async with self._tx() as conn:
            row = (await conn.execute(select(*BRANCH_COLS).where(B.c.id == branch_id))).first()
        return None if row is None else _rows.branch(row)

    async def get_branch_state(self, branch_id: str) -> BranchState | None:
        """The branch and its chat's change version, in one query (None if it is gone)."""
        v.check_id(branch_id, "branch_id")
        async with self._tx() as conn:
            row = (
                await conn.execute(
                    select(*BRANCH_COLS, C.c.version)
                    .join_from(B, C, C.c.id == B.c.chat_id)
                    .where(B.c.id == branch_id)
                )
            ).first()
        if row is None:
            return None
        return _rows.build(BranchState, {"branch": _rows.branch(row), "version": int(row[6])})

    async def get_active_branch(self, chat_id: str) -> Branch | None:
        v.check_id(chat_id, "chat_id")
        async with self._tx() as conn:
            row = (
                await conn.execute(
                    select(*BRANCH_COLS).where(B.c.chat_id == chat_id, B.c.is_active)
                )
            ).first()
        return None if row is None else _rows.branch(row)

    async def set_active_branch(self, chat_id: str, branch_id: str) -> Branch:
        v.check_id(chat_id, "chat_id")
        v.check_id(branch_id, "branch_id")
        async with self._tx(write=True) as conn:
            await self._touch_existing(conn, chat_id)
            row = (
                await conn.execute(
                    select(*BRANCH_COLS).where(B.c.id == branch_id, B.c.chat_id == chat_id)
                )
            ).first()
            if row is None:
                raise BranchNotFoundError(f"chat {chat_id!r} has no branch with id {branch_id!r}")
            if not row[4]:
                await conn.execute(
                    update(B).where(B.c.chat_id == chat_id, B.c.is_active).values(is_active=False)
                )
                await conn.execute(update(B).where(B.c.id == branch_id).values(is_active=True))
            return _rows.build(Branch, {**_rows.branch(row).__dict__, "is_active": True})

    async def update_branch_head(
        self, branch_id: str, message_id: str | None, expected_head: str | None
    ) -> bool:
        v.check_id(branch_id, "branch_id")
        v.check_optional_id(message_id, "message_id")
        v.check_optional_id(expected_head, "expected_head")
        try:
            async with self._tx(write=True) as conn:
                chat_id = await conn.scalar(select(B.c.chat_id).where(B.c.id == branch_id))
                if chat_id is None:
                    raise BranchNotFoundError(f"no branch with id {branch_id!r}")
                await self._touch_existing(conn, chat_id)
                await self._check_head(conn, chat_id, message_id)
                moved = await conn.execute(
                    update(B)
                    .where(
                        B.c.id == branch_id,
                        B.c.head_message_id.is_not_distinct_from(expected_head),
                    )
                    .values(head_message_id=message_id)
                )
                if not moved.rowcount:
                    raise _Conflict(None, 0)  # rolls back the version bump
        except _Conflict:
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
        if self._appender is not None and not (allowed and any(r.id in allowed for r in records)):
            try:
                return await self._append_fast(branch_id, chat_id, records, expected_head, head)
            except SlowPath:
                pass  # something unusual: the general path below names it precisely
        try:
            async with self._tx(write=True) as conn:
                # Lock order everywhere: the chat row first, then branches.
                version = await self._touch_existing(conn, chat_id)
                row = (
                    await conn.execute(
                        select(B.c.chat_id, B.c.head_message_id).where(B.c.id == branch_id)
                    )
                ).first()
                if row is None or row[0] != chat_id:
                    raise BranchNotFoundError(
                        f"chat {chat_id!r} has no branch with id {branch_id!r}"
                    )
                if row[1] != expected_head:
                    raise _Conflict(row[1], version - 1)  # rolls back the version bump
                try:
                    await self._write_messages(conn, records, {chat_id: version}, updates=allowed)
                except ExistingMessages as refused:
                    raise _Conflict(row[1], version - 1, refused.ids) from None
                await conn.execute(
                    update(B).where(B.c.id == branch_id).values(head_message_id=head)
                )
        except _Conflict as conflict:
            return AppendResult(
                ok=False,
                head_message_id=conflict.head,
                version=conflict.version,
                existing=conflict.existing,
            )
        return AppendResult(ok=True, head_message_id=head, version=version)

    async def _append_fast(
        self,
        branch_id: str,
        chat_id: str,
        records: list[MessageRecord],
        expected_head: str | None,
        head: str,
    ) -> AppendResult:
        """All-new messages through the driver-level path of ``_fastpath``."""
        assert self._appender is not None
        rows = plan(records)
        if not self._initialized:
            await self.initialize()
        lock = self._write_lock if self._write_lock is not None else nullcontext()
        async with lock:
            try:
                return await self._appender.append(chat_id, branch_id, rows, expected_head, head)
            except (ContextError, SlowPath):
                raise
            except Exception as exc:
                raise self._translate(exc) from exc

    async def list_branches(self, chat_id: str) -> list[BranchInfo]:
        v.check_id(chat_id, "chat_id")
        async with self._tx() as conn:
            return await self._list_branches(conn, chat_id)

    async def _list_branches(self, conn: AsyncConnection, chat_id: str) -> list[BranchInfo]:
        query = (
            select(*BRANCH_COLS, func.coalesce(M.c.depth, 0))
            .select_from(B.outerjoin(M, M.c.id == B.c.head_message_id))
            .where(B.c.chat_id == chat_id)
            .order_by(B.c.created_at, B.c.name)
        )
        rows = (await conn.execute(query)).all()
        if not rows:
            await self._require_chat(conn, chat_id)
        return [
            _rows.build(BranchInfo, {**_rows.branch(row).__dict__, "message_count": int(row[6])})
            for row in rows
        ]

    # --- checkpoints ------------------------------------------------------------------------

    async def create_checkpoint(self, chat_id: str, name: str, message_id: str) -> Checkpoint:
        v.check_id(chat_id, "chat_id")
        v.check_id(name, "checkpoint name")
        v.check_id(message_id, "message_id")
        now = utcnow()
        async with self._tx(write=True) as conn:
            await self._touch_existing(conn, chat_id)
            await self._check_head(conn, chat_id, message_id)
            insert = self._dialect.insert(K)
            statement = (
                insert.values(
                    id=new_id(), chat_id=chat_id, name=name, message_id=message_id, created_at=now
                )
                .on_conflict_do_update(
                    index_elements=[K.c.chat_id, K.c.name],
                    set_={"message_id": insert.excluded.message_id, "created_at": now},
                )
                .returning(*CHECKPOINT_COLS)
            )
            row = (await conn.execute(statement)).one()
        return _rows.checkpoint(row)

    async def get_checkpoint(self, chat_id: str, name: str) -> Checkpoint | None:
        v.check_id(chat_id, "chat_id")
        v.check_id(name, "checkpoint name")
        async with self._tx() as conn:
            row = (
                await conn.execute(
                    select(*CHECKPOINT_COLS).where(K.c.chat_id == chat_id, K.c.name == name)
                )
            ).first()
        return None if row is None else _rows.checkpoint(row)

    async def list_checkpoints(self, chat_id: str) -> list[Checkpoint]:
        v.check_id(chat_id, "chat_id")
        async with self._tx() as conn:
            return await self._list_checkpoints(conn, chat_id)

    async def _list_checkpoints(self, conn: AsyncConnection, chat_id: str) -> list[Checkpoint]:
        rows = (
            await conn.execute(
                select(*CHECKPOINT_COLS)
                .where(K.c.chat_id == chat_id)
                .order_by(K.c.created_at.desc(), K.c.name)
            )
        ).all()
        if not rows:
            await self._require_chat(conn, chat_id)
        return [_rows.checkpoint(row) for row in rows]

    async def delete_checkpoint(self, chat_id: str, name: str) -> bool:
        v.check_id(chat_id, "chat_id")
        v.check_id(name, "checkpoint name")
        async with self._tx(write=True) as conn:
            result = await conn.execute(delete(K).where(K.c.chat_id == chat_id, K.c.name == name))
        return bool(result.rowcount)
