"""Copying a chat under a new id: its graph, branches, checkpoints and compactions (or one
chain of it), with fresh ids. A plain function of a connection, run as one write transaction.

`copy_export` is the one id-mapping rule of every copy: `copy_chat` and the command line's
``import --as NEW_ID`` both use it, so a chat copied either way under the same id gets the same
message and compaction ids.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Connection, select

from agentcontext._validate import MAX_ID_LENGTH
from agentcontext.errors import ChatExistsError, InvalidGraphError, InvalidInputError
from agentcontext.store._db.schema import messages as M
from agentcontext.store._dialects import Dialect
from agentcontext.store._ops import chain as _chain
from agentcontext.store._ops import chats as _chats
from agentcontext.store._ops import transfer as _transfer
from agentcontext.store._rows.checks import new_id
from agentcontext.store.records import (
    Branch,
    ChatExport,
    Checkpoint,
    MessageRecord,
    compaction_id,
    utcnow,
)

__all__ = ["copy_chat", "copy_export", "copy_message_id"]

_COMPACTION = "compaction"
_LONG_IDS = uuid.UUID("5d2c7e0a-93b4-4f61-8a0e-c1f6b27d49e3")
"""The namespace of the copy ids of messages whose ``ID@CHAT`` would be too long."""


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
    export = _transfer.export_chat(conn, dialect, source_id)
    now = utcnow()
    if up_to is not None:
        messages = _chain_to(conn, dialect, source_id, up_to, export.messages)
        main = Branch(
            id="", chat_id=source_id, name="main", head_message_id=up_to, is_active=True,
            created_at=now,
        )  # fmt: skip
        export = export.model_copy(
            update={"messages": messages, "branches": [main], "checkpoints": []}
        )
    # Snapshots and resolve records are not copied.
    export = export.model_copy(update={"snapshots": [], "blobs": []})
    copy, mapping = copy_export(export, new_chat_id)
    chat = copy.chat.model_copy(
        update={
            "user_id": user_id if user_id is not None else export.chat.user_id,
            "created_at": now,
            "updated_at": now,
        }
    )
    checked, records, held = _transfer.check_export(copy.model_copy(update={"chat": chat}))
    _transfer.import_chat(conn, dialect, checked, records, held)
    return mapping


def copy_message_id(message_id: str, chat_id: str) -> str:
    """The id of message ``message_id`` in a copy that is chat ``chat_id``: ``ID@CHAT``, or
    when that is longer than an id may be, a name-based UUID of the two (so the rule stays a
    function of its inputs). Compactions are named by `compaction_id` instead."""
    copy = f"{message_id}@{chat_id}"
    if len(copy) <= MAX_ID_LENGTH:
        return copy
    return uuid.uuid5(_LONG_IDS, f"{chat_id}\x00{message_id}").hex


def copy_export(export: ChatExport, chat_id: str) -> tuple[ChatExport, dict[str, str]]:
    """``export`` as chat ``chat_id`` with new ids for everything that has one, and the
    mapping of its message ids (old id -> new id): the one rule of every copy.

    - a message ``m`` becomes `copy_message_id` ``(m, chat_id)``, ``m@CHAT``;
    - a compaction summary (type ``compaction``) gets the id the engine derives for a
      compaction of the copy at the copied point, ``compaction_id(chat_id, new point)``, so
      compacting the copy again at that point finds it; the ids in its
      ``metadata["compaction"]`` (``through``, ``previous``) follow;
    - branches, checkpoints and snapshots get random ids; every reference follows (parents,
      branch heads, checkpoint messages and branches, snapshot messages, a message's own id
      in its JSON).

    Names, texts, metadata, the owner and the times stay. Raises `InvalidGraphError` when a
    parent is missing from the export or the messages form a cycle.
    """
    mapping = _new_ids(export.messages, chat_id)
    branch_ids = {branch.id: new_id() for branch in export.branches}

    def moved(message_id: str | None) -> str | None:
        return None if message_id is None else mapping.get(message_id, message_id)

    branches = [
        branch.model_copy(
            update={
                "id": branch_ids[branch.id],
                "chat_id": chat_id,
                "head_message_id": moved(branch.head_message_id),
            }
        )
        for branch in export.branches
    ]
    checkpoints = [_checkpoint(point, chat_id, mapping, branch_ids) for point in export.checkpoints]
    snapshots = [
        snapshot.model_copy(
            update={
                "id": None if snapshot.id is None else new_id(),
                "chat_id": chat_id,
                "message_id": moved(snapshot.message_id),
            }
        )
        for snapshot in export.snapshots
    ]
    copy = export.model_copy(
        update={
            "chat": export.chat.model_copy(update={"id": chat_id}),
            "messages": [_message(m, chat_id, mapping) for m in export.messages],
            "branches": branches,
            "checkpoints": checkpoints,
            "snapshots": snapshots,
        }
    )
    return copy, mapping


def _chain_to(
    conn: Connection,
    dialect: Dialect,
    chat_id: str,
    up_to: str,
    messages: list[MessageRecord],
) -> list[MessageRecord]:
    """The chain ending at ``up_to`` with the compactions folded on it."""
    row = conn.execute(select(M.c.id).where(M.c.id == up_to)).first()
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
    """The new id of every message, parents first: a compaction's id is derived from its
    copied point, as the engine derives it."""
    mapping: dict[str, str] = {}
    for message in _transfer.parents_first(messages):
        if message.type == _COMPACTION and message.parent_id in mapping:
            mapping[message.id] = compaction_id(chat_id, mapping[message.parent_id])
        else:
            mapping[message.id] = copy_message_id(message.id, chat_id)
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
                key: mapping.get(value, value)
                if key in ("through", "previous") and isinstance(value, str)
                else value
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
            "message_id": mapping.get(checkpoint.message_id, checkpoint.message_id),
            "branch_id": branch_ids.get(checkpoint.branch_id or ""),
        }
    )
