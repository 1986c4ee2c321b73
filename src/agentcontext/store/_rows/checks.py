"""Checks of what callers give the store, shared by its public methods."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

from agentcontext import _validate as v
from agentcontext.errors import InvalidGraphError, InvalidInputError, InvalidTypeError
from agentcontext.store.records import MessageRecord

__all__ = ["check_metadata_filter", "check_record", "check_records", "new_id"]


def new_id() -> str:
    """A fresh id for branches, checkpoints, snapshots and records (32 hex characters)."""
    return uuid.uuid4().hex


def check_record(value: object, what: str) -> MessageRecord:
    """Check one MessageRecord the caller wants written."""
    if not isinstance(value, MessageRecord):
        raise InvalidTypeError(f"{what} must be a MessageRecord, got {v.type_name(value)}")
    v.check_id(value.id, f"{what}.id")
    v.check_id(value.chat_id, f"{what}.chat_id")
    v.check_optional_id(value.parent_id, f"{what}.parent_id")
    v.check_id(value.name, f"{what}.name")
    v.check_id(value.type, f"{what}.type")
    v.check_json(value.data, f"message {value.id!r}", max_bytes=v.MAX_MESSAGE_BYTES)
    v.check_timestamp(value.created_at, f"{what}.created_at")
    if value.parent_id == value.id:
        raise InvalidGraphError(f"message {value.id!r} cannot be its own parent")
    return value


def check_records(values: object, what: str = "messages") -> list[MessageRecord]:
    """Check a sequence of MessageRecords (no id twice)."""
    if isinstance(values, (str, bytes, MessageRecord)) or not isinstance(values, Sequence):
        raise InvalidTypeError(
            f"{what} must be a sequence of MessageRecord, got {v.type_name(values)}"
        )
    records = [check_record(item, f"{what}[{i}]") for i, item in enumerate(values)]
    seen: set[str] = set()
    for record in records:
        if record.id in seen:
            raise InvalidInputError(f"{what} holds message id {record.id!r} twice")
        seen.add(record.id)
    return records


def check_metadata_filter(value: object) -> dict[str, str | int | bool] | None:
    """Check a ``list_chats`` metadata filter: str keys, str/int/bool values."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidTypeError(f"metadata filter must be a dict, got {v.type_name(value)}")
    out: dict[str, str | int | bool] = {}
    for key, item in value.items():
        v.check_text(key, "metadata filter key")
        if isinstance(item, str):
            v.check_text(item, f"metadata filter value for {key!r}")
        elif isinstance(item, bool):
            pass
        elif isinstance(item, int):
            v.check_int64(item, f"metadata filter value for {key!r}")
        else:
            raise InvalidInputError(
                f"metadata filter value for {key!r} must be a str, int or bool "
                f"(exact match), got {v.type_name(item)}"
            )
        out[key] = item
    return out
