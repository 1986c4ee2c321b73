"""Export a whole chat as plain data, and import it again, exactly, on any backend."""

from __future__ import annotations

from sqlalchemy import literal, select

from agentcontext import _validate as v
from agentcontext.errors import (
    ChatExistsError,
    ChatNotFoundError,
    InvalidGraphError,
    InvalidInputError,
    InvalidTypeError,
)
from agentcontext.store import _rows
from agentcontext.store._core import CHAT_COLS, MESSAGE_COLS, check_records
from agentcontext.store._schema import branches as B
from agentcontext.store._schema import chats as C
from agentcontext.store._schema import checkpoints as K
from agentcontext.store._schema import messages as M
from agentcontext.store._schema import snapshots as SN
from agentcontext.store._search import SearchMixin
from agentcontext.store._snapshots import _check_blobs
from agentcontext.store.records import Branch, ChatExport, ExportedBlob, MessageRecord


def _parents_first(records: list[MessageRecord]) -> list[MessageRecord]:
    """The messages with every parent before its children, otherwise in the given order.

    Refuses a parent missing from the export and cycles.
    """
    by_id = {r.id: r for r in records}
    depth: dict[str, int] = {}
    for record in records:
        path: list[str] = []
        current: str | None = record.id
        while current is not None and current not in depth:
            if current in path:
                raise InvalidGraphError("the messages of the export form a cycle")
            if current not in by_id:
                raise InvalidGraphError(
                    f"message {path[-1]!r} has parent {current!r}, which is not in the export"
                )
            path.append(current)
            current = by_id[current].parent_id
        base = 0 if current is None else depth[current]
        for offset, message_id in enumerate(reversed(path), start=1):
            depth[message_id] = base + offset
    return sorted(records, key=lambda r: depth[r.id])


class TransferMixin(SearchMixin):
    """``export_chat`` and ``import_chat`` of :class:`~agentcontext.SqlContextStore`."""

    async def export_chat(self, chat_id: str) -> ChatExport:
        """Everything of a chat, read in one transaction (a consistent snapshot)."""
        v.check_id(chat_id, "chat_id")
        async with self._tx() as conn:
            row = (await conn.execute(select(*CHAT_COLS).where(C.c.id == chat_id))).first()
            if row is None:
                raise ChatNotFoundError(f"chat {chat_id!r} does not exist")
            messages = (
                await conn.execute(
                    select(*MESSAGE_COLS).where(M.c.chat_id == chat_id).order_by(M.c.depth, M.c.seq)
                )
            ).all()
            branches = await self._list_branches(conn, chat_id)
            checkpoints = await self._list_checkpoints(conn, chat_id)
            snapshots = list(reversed(await self._snapshots(conn, SN.c.chat_id == chat_id, True)))
        blobs: dict[str, ExportedBlob] = {}
        for snapshot in snapshots:
            for digest, (data, media_type) in snapshot.contents.items():
                blobs.setdefault(digest, ExportedBlob.of(digest, media_type, data))
        return ChatExport(
            chat=_rows.chat(row),
            messages=[_rows.message(r) for r in messages],
            branches=[
                _rows.build(Branch, b.model_dump(exclude={"message_count"})) for b in branches
            ],
            checkpoints=checkpoints,
            snapshots=snapshots,
            blobs=sorted(blobs.values(), key=lambda blob: blob.hash),
        )

    async def import_chat(self, export: ChatExport) -> None:
        """Write an exported chat into this store as it was (ids, timestamps, branches).

        Raises :class:`~agentcontext.ChatExistsError` if the chat id is taken, and
        :class:`~agentcontext.InvalidGraphError` if the export is inconsistent (a branch or
        checkpoint pointing at a missing message, not exactly one active branch). Nothing is
        written unless everything is.
        """
        if not isinstance(export, ChatExport):
            raise InvalidTypeError(f"import_chat takes a ChatExport, got {v.type_name(export)}")
        chat = export.chat
        v.check_id(chat.id, "chat.id")
        v.check_id(chat.user_id, "chat.user_id")
        v.check_optional_text(chat.title, "chat.title")
        v.check_json_object(chat.metadata, "chat.metadata")
        records = _parents_first(check_records(export.messages, "messages"))
        ids = {r.id for r in records}
        for record in records:
            if record.chat_id != chat.id:
                raise InvalidGraphError(f"message {record.id!r} is not in chat {chat.id!r}")
        active = [b for b in export.branches if b.is_active]
        if len(active) != 1:
            raise InvalidGraphError(
                f"an export needs exactly one active branch, this one has {len(active)}"
            )
        names: set[str] = set()
        for branch in export.branches:
            v.check_id(branch.id, "branch.id")
            v.check_id(branch.name, "branch.name")
            if branch.chat_id != chat.id or branch.name in names:
                raise InvalidGraphError(f"branch {branch.name!r} is duplicated or in another chat")
            names.add(branch.name)
            if branch.head_message_id is not None and branch.head_message_id not in ids:
                raise InvalidGraphError(f"branch {branch.name!r} points at a missing message")
        for checkpoint in export.checkpoints:
            v.check_id(checkpoint.name, "checkpoint.name")
            if checkpoint.chat_id != chat.id or checkpoint.message_id not in ids:
                raise InvalidGraphError(
                    f"checkpoint {checkpoint.name!r} points at a missing message"
                )
        if len({c.name for c in export.checkpoints}) != len(export.checkpoints):
            raise InvalidInputError("an export holds two checkpoints with the same name")
        try:
            contents = {blob.hash: (blob.data, blob.media_type) for blob in export.blobs}
        except ValueError:
            raise InvalidInputError("a blob of the export is not valid base64") from None
        held = _check_blobs(contents)
        for snapshot in export.snapshots:
            if snapshot.id is None or snapshot.created_at is None or snapshot.chat_id != chat.id:
                raise InvalidGraphError("an exported snapshot lacks its id, time or chat")
            if snapshot.message_id is not None and snapshot.message_id not in ids:
                raise InvalidGraphError(f"snapshot {snapshot.id!r} points at a missing message")
            for item in snapshot.items:
                if item.blob is None or item.blob not in held:
                    raise InvalidGraphError(
                        f"snapshot {snapshot.id!r} item {item.path!r} has no content in the export"
                    )
        async with self._tx(write=True) as conn:
            taken = await conn.scalar(select(literal(1)).where(C.c.id == chat.id))
            if taken is not None:
                raise ChatExistsError(
                    f"chat {chat.id!r} already exists; delete it first or import under another id"
                )
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
            if records:
                await self._write_messages(conn, records, {chat.id: 1})
            for branch in export.branches:
                await conn.execute(
                    B.insert().values(
                        id=branch.id,
                        chat_id=chat.id,
                        name=branch.name,
                        head_message_id=branch.head_message_id,
                        is_active=branch.is_active,
                        created_at=branch.created_at,
                    )
                )
            for checkpoint in export.checkpoints:
                await conn.execute(
                    K.insert().values(
                        id=checkpoint.id,
                        chat_id=chat.id,
                        name=checkpoint.name,
                        message_id=checkpoint.message_id,
                        created_at=checkpoint.created_at,
                    )
                )
            await self._put_blobs(conn, held)
            for snapshot in export.snapshots:
                assert snapshot.id is not None
                assert snapshot.created_at is not None
                await self._insert_snapshot(
                    conn, snapshot, snapshot.id, chat.id, snapshot.message_id, snapshot.created_at
                )
