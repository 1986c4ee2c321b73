"""Turning result rows into records, fast.

Rows read back from our own schema are already valid, so records are built without
re-validation (like ``model_construct``, but several times cheaper): chain loads of
100 000 messages spend their time in the database and the JSON decoder, not here.

Every record of a class shares one "fields set" (all fields are always given). Records are
frozen, and pydantic copies that set before changing it (``model_copy``), so sharing is safe;
allocating one per record cost more than the rest of the record.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

from agentcontext.errors import CorruptDataError
from agentcontext.store.records import (
    Branch,
    Chat,
    ChatInfo,
    Checkpoint,
    GraphNode,
    MessageRecord,
    ResolveRecord,
)

_M = TypeVar("_M", bound=BaseModel)

_setattr = object.__setattr__


class Damaged:
    """A stored value that could not be decoded (a timestamp that is not one, JSON that is not
    JSON). The column types give it back instead of raising, so that the row it belongs to can
    be named when a record is built from it (`corrupt`)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"Damaged({self.reason!r})"


def damaged_time(value: Any) -> Damaged:
    return Damaged(f"its timestamp {_short(value)} is not a date and time")


def damaged_json(value: Any, error: BaseException) -> Damaged:
    return Damaged(f"its JSON {_short(value)} does not parse ({error})")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "…"


_TABLES: dict[type[BaseModel], str] = {
    Chat: "chats",
    ChatInfo: "chats",
    Branch: "branches",
    Checkpoint: "checkpoints",
    GraphNode: "messages",
    MessageRecord: "messages",
    ResolveRecord: "resolve_records",
}


def corrupt(
    table: str, row_id: Any, chat_id: Any, reason: str, *, what: str = "row"
) -> CorruptDataError:
    """The error for a stored row that cannot be decoded."""
    chat = "" if chat_id is None or table == "chats" else f" of chat {chat_id!r}"
    return CorruptDataError(
        f"the stored {what} {row_id!r}{chat} (table {table}) cannot be decoded: {reason}. It was "
        "damaged or written outside agentcontext; delete or repair that row",
        table=table,
        chat_id=None if chat_id is None else str(chat_id),
        row_id=None if row_id is None else str(row_id),
    )


def check(cls: type[BaseModel], fields: dict[str, Any]) -> None:
    """Raise `CorruptDataError` if a field of a row to build is `Damaged`."""
    for value in fields.values():
        if isinstance(value, Damaged):
            table = _TABLES.get(cls, cls.__name__)
            row_id = fields.get("id")
            chat_id = row_id if table == "chats" else fields.get("chat_id")
            what = "chat" if table == "chats" else "message" if table == "messages" else "row"
            raise corrupt(table, row_id, chat_id, value.reason, what=what)


_FIELD_SETS: dict[type[BaseModel], set[str]] = {}


def build(cls: type[_M], fields: dict[str, Any]) -> _M:
    """An instance of ``cls`` holding ``fields`` (every field of it, already valid).

    Raises `CorruptDataError` when a stored value of the row could not be decoded."""
    check(cls, fields)
    shared = _FIELD_SETS.get(cls)
    if shared is None:
        shared = _FIELD_SETS[cls] = set(cls.model_fields)
    obj = cls.__new__(cls)
    _setattr(obj, "__dict__", fields)
    _setattr(obj, "__pydantic_fields_set__", shared)
    _setattr(obj, "__pydantic_extra__", None)
    _setattr(obj, "__pydantic_private__", None)
    return obj


_MESSAGE_FIELDS = set(MessageRecord.model_fields)
_new_message = MessageRecord.__new__


def message_of(
    id_: str, chat_id: str, parent_id: str | None, name: str, type_: str, data: Any, created: Any
) -> MessageRecord:
    """A MessageRecord from its field values (the hot path of chain loads)."""
    if isinstance(data, Damaged) or isinstance(created, Damaged):
        reason = (data if isinstance(data, Damaged) else created).reason
        raise corrupt("messages", id_, chat_id, reason, what="message")
    obj = _new_message(MessageRecord)
    _setattr(
        obj,
        "__dict__",
        {
            "id": id_,
            "chat_id": chat_id,
            "parent_id": parent_id,
            "name": name,
            "type": type_,
            "data": data,
            "created_at": created,
        },
    )
    _setattr(obj, "__pydantic_fields_set__", _MESSAGE_FIELDS)
    _setattr(obj, "__pydantic_extra__", None)
    _setattr(obj, "__pydantic_private__", None)
    return obj


def message(row: Any) -> MessageRecord:
    """(id, chat_id, parent_id, name, type, data, created_at, ...) → MessageRecord."""
    return message_of(row[0], row[1], row[2], row[3], row[4], row[5], row[6])


def chat(row: Any) -> Chat:
    """(id, user_id, title, metadata, created_at, updated_at, ...) → Chat."""
    if row[3] is not None and not isinstance(row[3], (dict, Damaged)):
        raise corrupt("chats", row[0], row[0], "its metadata is not a JSON object", what="chat")
    return build(
        Chat,
        {
            "id": row[0],
            "user_id": row[1],
            "title": row[2],
            "metadata": row[3] if row[3] is not None else {},
            "created_at": row[4],
            "updated_at": row[5],
        },
    )


def branch(row: Any) -> Branch:
    """(id, chat_id, name, head_message_id, is_active, created_at, ...) → Branch."""
    return build(
        Branch,
        {
            "id": row[0],
            "chat_id": row[1],
            "name": row[2],
            "head_message_id": row[3],
            "is_active": bool(row[4]),
            "created_at": row[5],
        },
    )


def checkpoint(row: Any) -> Checkpoint:
    """(id, chat_id, name, message_id, created_at, branch_id) → Checkpoint."""
    return build(
        Checkpoint,
        {
            "id": row[0],
            "chat_id": row[1],
            "name": row[2],
            "message_id": row[3],
            "created_at": row[4],
            "branch_id": row[5],
        },
    )
