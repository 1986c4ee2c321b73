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

Both ways go through the store's sealer (``dialect.sealer``, `_rows.sealing`): in an encrypted
store, message contents, chat titles and chat metadata are sealed here on the way down and
opened here on the way up, and search terms are hashed under the owner's search key. The
chats' columns take the same path (`chat_values`, `open_chat_row`), and so do context snapshots
and resolve records (`blob_rows`, `snapshot_summary`, `snapshot_item`, `open_blob`,
`open_summary`, `open_item`, `blob_digest`): in an encrypted store their blobs are kept per
user, at an address enciphered under the user's key, their contents, summaries, item paths and
previews sealed.

Snapshots and records follow their chat: ``owner`` is the chat's user when the chat is sealed,
None when it is plain (a database that `migrate encrypt` has not reached yet), and a plain
chat's rows stay plain until `migrate encrypt` seals the chat with all it holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from agentcontext._validate import dumps
from agentcontext.errors import EncryptionError
from agentcontext.store._rows.decode import Damaged, corrupt, message_of
from agentcontext.store._rows.sealing import Sealer, is_sealed_json
from agentcontext.store._rows.terms import ScopedTerms, message_terms
from agentcontext.store._rows.text import index_tokens
from agentcontext.store.records import MessageRecord

__all__ = [
    "MessageRow",
    "blob_address",
    "blob_digest",
    "blob_rows",
    "open_blob",
    "open_item",
    "open_summary",
    "snapshot_item",
    "snapshot_summary",
    "chat_values",
    "checked_data",
    "data_of",
    "json_of",
    "message_columns",
    "message_rows",
    "open_chat_row",
    "open_chat_rows",
    "record_of",
    "row_record",
    "stored_terms",
]


class Dialect(Protocol):
    """What the conversion needs of the store's dialect (`_dialects.Dialect`)."""

    @property
    def sealer(self) -> Sealer: ...

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
    data: str | bytes | None
    """The JSON text of the message data."""
    terms: ScopedTerms
    """What the search index holds for it (its tokens, under its chat's and user's masks)."""
    created_at: datetime


def message_rows(
    dialect: Dialect, records: Sequence[MessageRecord], owners: Mapping[str, str]
) -> list[MessageRow]:
    """The rows of checked records: each one's JSON text (sealed, in an encrypted store) and
    search terms, computed once. ``owners`` gives the user of each chat (the scope of its
    user-wide search, and the key its rows are sealed under)."""
    sealer = dialect.sealer
    rows = []
    for chat_id, owner in owners.items():
        sealer.note_owner(chat_id, owner)
    for r in records:
        owner = owners.get(r.chat_id, "")
        data = None
        if r.data is not None:
            data = sealer.seal_json(dumps(r.data), owner, "messages", r.chat_id, r.id)
        key = sealer.search_key(owner) if sealer.encrypted else None
        terms = message_terms(index_tokens(r.data), r.chat_id, owner, key)
        rows.append(
            MessageRow(
                id=r.id,
                chat_id=r.chat_id,
                parent_id=r.parent_id,
                name=r.name,
                type=r.type,
                data=data,
                terms=terms,
                created_at=r.created_at,
            )
        )
    return rows


def stored_terms(
    dialect: Dialect, raw: Any, chat_id: str, message_id: str, user_id: str
) -> ScopedTerms:
    """What the search index holds for a stored message (to take it out again), from its
    raw data column and its chat's owner."""
    sealer = dialect.sealer
    if sealer.encrypted and not is_sealed_json(raw):
        # A row in the clear (one `migrate encrypt` has not reached yet, or one written behind
        # the store's back) was indexed under plain hashes of its text as it is: its entries
        # are taken out the same way, even where a value in the clear is corrupt to a reader.
        return message_terms(index_tokens(dialect.decode_json(raw)), chat_id, user_id, None)
    key = sealer.search_key(user_id) if sealer.encrypted else None
    data = data_of(dialect, raw, chat_id, message_id)
    return message_terms(index_tokens(data), chat_id, user_id, key)


def terms_to_unindex(
    dialect: Dialect, raw: Any, chat_id: str, message_id: str, user_id: str
) -> ScopedTerms | None:
    """`stored_terms` of a message about to be deleted, or None when its owner's data key was
    destroyed (a backup restored after an erasure): its text, and so its terms, can no longer
    be computed. An index that needs them to forget a row (SQLite's FTS5) then keeps its
    entries: keyed hashes of a key that no longer exists, pointing at a deleted row, which no
    search can match."""
    try:
        return stored_terms(dialect, raw, chat_id, message_id, user_id)
    except EncryptionError:
        return None


def data_of(dialect: Dialect, raw: Any, chat_id: str, message_id: str) -> Any:
    """A message's data from its raw data column (`Damaged` when it is not JSON)."""
    return dialect.decode_json(dialect.sealer.open_json(raw, "messages", chat_id, message_id))


def json_of(dialect: Dialect, chat_id: str, ids: list[str], raws: list[Any]) -> list[Any]:
    """The JSON texts of messages of ``chat_id`` (their data columns as the driver returns
    `Dialect.raw_json`, in a chain load), for the engine's decoder; one call per chain."""
    return dialect.sealer.open_chain(ids, raws, "messages", chat_id)


def chat_values(
    dialect: Dialect, chat_id: str, user_id: str, values: dict[str, Any]
) -> dict[str, Any]:
    """The column values of a chat row to write: its ``title`` and ``metadata``, when given,
    sealed in an encrypted store (bound to the chat)."""
    sealer = dialect.sealer
    if not sealer.encrypted:
        return values
    out = dict(values)
    if "title" in out:
        out["title"] = sealer.seal_text(out["title"], user_id, "chats.title", chat_id, chat_id)
    if "metadata" in out:
        out["metadata"] = sealer.seal_text(
            dumps(out["metadata"]), user_id, "chats.metadata", chat_id, chat_id
        )
    return out


def open_chat_row(dialect: Dialect, row: Any) -> Any:
    """A chats row (id, user_id, title, metadata, ...) with its title and metadata opened."""
    sealer = dialect.sealer
    sealer.note_owner(row[0], row[1])
    title, metadata = row[2], row[3]
    opened_title = sealer.open_text(title, "chats.title", row[0], row[0])
    opened_metadata = sealer.open_value(metadata, "chats.metadata", row[0], row[0])
    if opened_title is title and opened_metadata is metadata:
        return row
    return (row[0], row[1], opened_title, opened_metadata, *row[4:])


def open_chat_rows(dialect: Dialect, rows: Sequence[Any]) -> list[Any]:
    """`open_chat_row` of each row (the keys of all their owners asked for at once)."""
    if dialect.sealer.encrypted:
        dialect.sealer.require({row[1] for row in rows})
    return [open_chat_row(dialect, row) for row in rows]


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
        dialect.decode_json(dialect.sealer.open_json(raw_data, "messages", chat_id, message_id)),
        dialect.decode_time(raw_time),
    )


def checked_data(dialect: Dialect, raw: Any, chat_id: str, message_id: str) -> Any:
    """`data_of`, raising `CorruptDataError` naming the row for data that is not JSON."""
    data = data_of(dialect, raw, chat_id, message_id)
    if isinstance(data, Damaged):
        raise corrupt("messages", message_id, chat_id, data.reason, what="message")
    return data


# --- blobs, snapshots and resolve records --------------------------------------------------


def blob_address(dialect: Dialect, owner: str | None, digest: str, *, write: bool) -> str:
    """Where the blob with SHA-256 ``digest`` of a chat owned by ``owner`` is stored: the
    digest itself in a plain chat, the owner's address for it in a sealed one."""
    if owner is None:
        return digest
    return dialect.sealer.blob_address(owner, digest, write=write)


def blob_digest(dialect: Dialect, owner: str | None, address: str) -> str:
    """The SHA-256 of the blob stored at ``address`` for a chat of ``owner``."""
    if owner is None:
        return address
    return dialect.sealer.blob_digest(owner, address)


def blob_rows(
    dialect: Dialect,
    owner: str | None,
    blobs: Mapping[str, tuple[bytes, str]],
    now: datetime,
) -> list[dict[str, Any]]:
    """The rows of blobs (content and media type by SHA-256) to store for a chat of
    ``owner``: at their addresses, their contents sealed."""
    rows = []
    for digest, (data, media_type) in blobs.items():
        address = blob_address(dialect, owner, digest, write=True)
        content = data if owner is None else dialect.sealer.seal_bytes(data, owner, address)
        rows.append(
            {
                "hash": address,
                "size": len(data),
                "media_type": media_type,
                "content": content,
                "created_at": now,
            }
        )
    return rows


def open_blob(dialect: Dialect, address: str, raw: Any) -> bytes:
    """A stored blob's content (the raw column value), opened."""
    return dialect.sealer.open_bytes(bytes(raw), address)


def snapshot_summary(
    dialect: Dialect, owner: str | None, chat_id: str, snapshot_id: str, summary: str | None
) -> str | None:
    """A snapshot's summary to store."""
    if owner is None:
        return summary
    return dialect.sealer.seal_text(summary, owner, "snapshots", chat_id, snapshot_id)


def open_summary(dialect: Dialect, chat_id: str, snapshot_id: str, summary: Any) -> Any:
    """A stored snapshot's summary, opened."""
    return dialect.sealer.open_text(summary, "snapshots", chat_id, snapshot_id)


def snapshot_item(
    dialect: Dialect,
    owner: str | None,
    chat_id: str,
    snapshot_id: str,
    position: int,
    path: str,
    digest: str,
    preview: str | None,
) -> tuple[str, str, str | None]:
    """A snapshot item's path, blob address and preview to store."""
    if owner is None:
        return path, digest, preview
    sealer, row = dialect.sealer, f"{snapshot_id}.{position}"
    sealed_path = sealer.seal_text(path, owner, "snapshot_items", chat_id, row)
    sealed_preview = sealer.seal_text(preview, owner, "snapshot_items.preview", chat_id, row)
    assert sealed_path is not None
    return sealed_path, blob_address(dialect, owner, digest, write=True), sealed_preview


def open_item(
    dialect: Dialect,
    owner: str | None,
    chat_id: str,
    snapshot_id: str,
    position: int,
    path: Any,
    address: str,
    preview: Any,
) -> tuple[Any, str, Any]:
    """A stored snapshot item's path, blob SHA-256 and preview, opened."""
    sealer, row = dialect.sealer, f"{snapshot_id}.{position}"
    return (
        sealer.open_text(path, "snapshot_items", chat_id, row),
        blob_digest(dialect, owner, address),
        sealer.open_text(preview, "snapshot_items.preview", chat_id, row),
    )
