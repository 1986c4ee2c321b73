"""The one conversion each way between a message and its stored row.

Down: `message_rows` turns the records a store is given into `MessageRow` (the JSON text of
the data, the terms the search index holds, scoped to the message's chat and user): every
writer of messages — a save's append, an
in-place update, an import, a copy, a compaction — stores what it returns, and nothing else
makes a message row. Up: `record_of` turns a raw row (the data column as the driver returns it,
see `Dialect.raw_json`, and the raw timestamp) into a `MessageRecord`, `data_of` the data column
alone into a value, and `json_of` into the JSON text a chain load hands to the engine; every
reader of messages goes through them. A stored value that cannot be decoded is named with its
row (`CorruptDataError`), never returned as something else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from agentcontext._validate import dumps
from agentcontext.store._rows.decode import Damaged, corrupt, message_of
from agentcontext.store._rows.terms import ScopedTerms, message_terms
from agentcontext.store._rows.text import index_tokens
from agentcontext.store.records import MessageRecord

__all__ = [
    "MessageRow",
    "checked_data",
    "data_of",
    "json_of",
    "message_columns",
    "message_rows",
    "record_of",
    "row_record",
    "stored_terms",
]


class Dialect(Protocol):
    """What the conversion needs of the store's dialect (`_dialects.Dialect`)."""

    def decode_json(self, value: Any) -> Any: ...
    def decode_time(self, value: Any) -> Any: ...


@dataclass(frozen=True, slots=True)
class MessageRow:
    """A message as it is stored: what every writer of messages writes."""

    id: str
    chat_id: str
    parent_id: str | None
    name: str
    type: str
    data: str | None
    """The JSON text of the message data."""
    terms: ScopedTerms
    """What the search index holds for it (its tokens, under its chat's and user's masks)."""
    created_at: datetime


def message_rows(records: Sequence[MessageRecord], owners: Mapping[str, str]) -> list[MessageRow]:
    """The rows of checked records: each one's JSON text and search terms, computed once.
    ``owners`` gives the user of each chat (the scope of its user-wide search)."""
    return [
        MessageRow(
            id=r.id,
            chat_id=r.chat_id,
            parent_id=r.parent_id,
            name=r.name,
            type=r.type,
            data=None if r.data is None else dumps(r.data),
            terms=message_terms(index_tokens(r.data), r.chat_id, owners.get(r.chat_id, "")),
            created_at=r.created_at,
        )
        for r in records
    ]


def stored_terms(dialect: Dialect, raw: Any, chat_id: str, user_id: str) -> ScopedTerms:
    """What the search index holds for a stored message (to take it out again), from its
    raw data column and its chat's owner."""
    return message_terms(index_tokens(data_of(dialect, raw)), chat_id, user_id)


def data_of(dialect: Dialect, raw: Any) -> Any:
    """A message's data from its raw data column (`Damaged` when it is not JSON)."""
    return dialect.decode_json(raw)


def json_of(raws: list[Any]) -> list[Any]:
    """The JSON texts of messages (their data columns as the driver returns `Dialect.raw_json`,
    in a chain load), for the engine's decoder; one call per chain, not per row."""
    return raws


def message_columns(dialect: Any, table: Any) -> tuple[Any, ...]:
    """The columns every reader of whole messages selects, raw (id, chat id, parent id, name,
    type, data, created at): `row_record` turns such a row into a record."""
    c = table.c
    return (
        c.id, c.chat_id, c.parent_id, c.name, c.type, dialect.raw_json(c.data),
        dialect.raw_time(c.created_at),
    )  # fmt: skip


def row_record(dialect: Dialect, row: Any) -> MessageRecord:
    """`record_of` of a row of `message_columns`."""
    return record_of(dialect, row[0], row[1], row[2], row[3], row[4], row[5], row[6])


def record_of(
    dialect: Dialect,
    message_id: str,
    chat_id: str,
    parent_id: str | None,
    name: str,
    type_: str,
    raw_data: Any,
    raw_time: Any,
) -> MessageRecord:
    """A `MessageRecord` from a raw row (`CorruptDataError` naming it when a value of it
    cannot be decoded)."""
    return message_of(
        message_id,
        chat_id,
        parent_id,
        name,
        type_,
        dialect.decode_json(raw_data),
        dialect.decode_time(raw_time),
    )


def checked_data(dialect: Dialect, raw: Any, chat_id: str, message_id: str) -> Any:
    """`data_of`, raising `CorruptDataError` naming the row for data that is not JSON."""
    data = dialect.decode_json(raw)
    if isinstance(data, Damaged):
        raise corrupt("messages", message_id, chat_id, data.reason, what="message")
    return data
