"""Copying a chat under a new id: its graph, branches, checkpoints and compactions (or one
chain of it), with fresh ids. A plain function of a connection, run as one write transaction."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select

from agentcontext.errors import ChatExistsError, InvalidGraphError, InvalidInputError
from agentcontext.store import _chain, _chats, _transfer
from agentcontext.store._checks import new_id
from agentcontext.store._dialects import Dialect
from agentcontext.store._messages import MESSAGE_COLS
from agentcontext.store._schema import messages as M
from agentcontext.store.records import (
    Branch,
    Chat,
    ChatExport,
    Checkpoint,
    MessageRecord,
    compaction_id,
    utcnow,
)

__all__ = ["copy_chat"]

_COMPACTION = "compaction"


def copy_chat(
    conn: Connection,
    dialect: Dialect,
    source_id: str,
    new_chat_id: str,
    up_to: str | None,
    user_id: str | None,
) -> dict[str, str]:
    """Copy ``source_id`` to ``new_chat_id`` (write transaction); old message id -> new id."""
    if _chats.exists(conn, new_chat_id):
        raise ChatExistsError(
            f"chat {new_chat_id!r} already exists; copy to a new id or delete that chat first"
        )
    export = _transfer.export_chat(conn, source_id)
    now = utcnow()
    chat = Chat(
        id=new_chat_id,
        user_id=user_id if user_id is not None else export.chat.user_id,
        title=export.chat.title,
        metadata=export.chat.metadata,
        created_at=now,
        updated_at=now,
    )
    if up_to is None:
        messages, branches, checkpoints = export.messages, export.branches, export.checkpoints
    else:
        messages = _chain_to(conn, dialect, source_id, up_to, export.messages)
        main = Branch(
            id="", chat_id=source_id, name="main", head_message_id=up_to, is_active=True,
            created_at=now,
        )  # fmt: skip
        branches, checkpoints = [main], []
    mapping = _new_ids(messages, new_chat_id)
    branch_ids = {b.id: new_id() for b in branches}
    copy = ChatExport(
        chat=chat,
        messages=[_message(m, new_chat_id, mapping) for m in messages],
        branches=[
            b.model_copy(
                update={
                    "id": branch_ids[b.id],
                    "chat_id": new_chat_id,
                    "head_message_id": mapping.get(b.head_message_id or ""),
                }
            )
            for b in branches
        ],
        checkpoints=[
            _checkpoint(c, new_chat_id, mapping, branch_ids)
            for c in checkpoints
            if c.message_id in mapping
        ],
    )
    checked, records, held = _transfer.check_export(copy)
    _transfer.import_chat(conn, dialect, checked, records, held)
    return mapping


def _chain_to(
    conn: Connection,
    dialect: Dialect,
    chat_id: str,
    up_to: str,
    messages: list[MessageRecord],
) -> list[MessageRecord]:
    """The chain ending at ``up_to`` with the compactions folded on it."""
    row = conn.execute(select(*MESSAGE_COLS).where(M.c.id == up_to)).first()
    if row is None:
        raise _chats.missing_message_error(conn, chat_id, up_to)
    chain = _chain.load_records(conn, dialect, up_to)
    if not chain or chain[-1].chat_id != chat_id:
        raise InvalidGraphError(f"message {up_to!r} belongs to another chat, not {chat_id!r}")
    if chain[-1].type == _COMPACTION:
        raise InvalidInputError(
            f"message {up_to!r} is a compaction summary; copy up to the message it follows"
        )
    on_chain = {record.id for record in chain}
    summaries = [m for m in messages if m.type == _COMPACTION and m.parent_id in on_chain]
    return chain + summaries


def _new_ids(messages: list[MessageRecord], chat_id: str) -> dict[str, str]:
    """Fresh ids, parents first; a compaction's id is derived from its copied point, as the
    engine derives it, so compacting the copy again at that point finds it."""
    mapping: dict[str, str] = {}
    for message in _transfer.parents_first(messages):
        if message.type == _COMPACTION and message.parent_id in mapping:
            mapping[message.id] = compaction_id(chat_id, mapping[message.parent_id])
        else:
            mapping[message.id] = new_id()
    return mapping


def _message(message: MessageRecord, chat_id: str, mapping: dict[str, str]) -> MessageRecord:
    data: Any = message.data
    if isinstance(data, dict):
        data = dict(data)
        if data.get("id") == message.id:
            data["id"] = mapping[message.id]
        meta = data.get("metadata")
        folded = meta.get("compaction") if isinstance(meta, dict) else None
        if isinstance(folded, dict):
            folded = {
                key: mapping.get(value, value) if key in ("through", "previous") else value
                for key, value in folded.items()
            }
            data["metadata"] = {**meta, "compaction": folded}
    parent = None if message.parent_id is None else mapping[message.parent_id]
    return message.model_copy(
        update={"id": mapping[message.id], "chat_id": chat_id, "parent_id": parent, "data": data}
    )


def _checkpoint(
    checkpoint: Checkpoint, chat_id: str, mapping: dict[str, str], branch_ids: dict[str, str]
) -> Checkpoint:
    return checkpoint.model_copy(
        update={
            "id": new_id(),
            "chat_id": chat_id,
            "message_id": mapping[checkpoint.message_id],
            "branch_id": branch_ids.get(checkpoint.branch_id or ""),
        }
    )
