"""Export a whole chat as plain data, and import it again, exactly, on any backend."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, select
from sqlalchemy.exc import DBAPIError

from agentcontext import _validate as v
from agentcontext.errors import (
    BranchExistsError,
    ChatExistsError,
    ChatNotFoundError,
    InvalidGraphError,
    InvalidInputError,
    InvalidTypeError,
)
from agentcontext.store._db.schema import branches as B
from agentcontext.store._db.schema import checkpoints as K
from agentcontext.store._db.schema import messages as M
from agentcontext.store._db.schema import snapshots as SN
from agentcontext.store._dialects import Dialect
from agentcontext.store._ops import branches as _branches
from agentcontext.store._ops import chats as _chats
from agentcontext.store._ops import checkpoints as _checkpoints
from agentcontext.store._ops import messages as _messages
from agentcontext.store._ops import snapshots as _snapshots
from agentcontext.store._rows import decode as _rows
from agentcontext.store._rows.checks import check_records
from agentcontext.store._rows.codec import message_columns, row_record
from agentcontext.store.records import Branch, ChatExport, ExportedBlob, MessageRecord

__all__ = ["check_export", "export_chat", "import_chat", "parents_first"]


def export_chat(conn: Connection, dialect: Dialect, chat_id: str) -> ChatExport:
    """Everything of a chat (read in one snapshot transaction)."""
    chat = _chats.get(conn, dialect, chat_id)
    if chat is None:
        raise ChatNotFoundError(f"chat {chat_id!r} does not exist")
    messages = conn.execute(
        select(*message_columns(dialect, M))
        .where(M.c.chat_id == chat_id)
        .order_by(M.c.depth, M.c.seq)
    ).all()
    branches = _branches.list_infos(conn, chat_id)
    checkpoints = _checkpoints.list_all(conn, chat_id)
    snapshots = list(reversed(_snapshots.snapshots(conn, dialect, SN.c.chat_id == chat_id, True)))
    blobs: dict[str, ExportedBlob] = {}
    for snapshot in snapshots:
        for digest, (data, media_type) in snapshot.contents.items():
            blobs.setdefault(digest, ExportedBlob.of(digest, media_type, data))
    return ChatExport(
        chat=chat,
        messages=[row_record(dialect, r) for r in messages],
        branches=[_rows.build(Branch, b.model_dump(exclude={"message_count"})) for b in branches],
        checkpoints=checkpoints,
        snapshots=snapshots,
        blobs=sorted(blobs.values(), key=lambda blob: blob.hash),
    )


def parents_first(records: list[MessageRecord]) -> list[MessageRecord]:
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


def _check_time(value: datetime, what: str) -> None:
    v.check_timestamp(value, what)


def _at_summary(what: str, summary_id: str, role: str) -> InvalidGraphError:
    return InvalidGraphError(
        f"{what} points at the compaction summary {summary_id!r}, which sits beside a branch "
        f"and cannot be {role}; point it at the message the summary folds up to (its parent)"
    )


def _check_messages(records: list[MessageRecord]) -> set[str]:
    """Refuse a compaction summary as a parent, a summary without a parent, and one whose
    parent is not the message it says it folds through (records parents first). The records
    themselves are taken as the store takes them (`add_message`), so that every export of a
    stored chat imports. The summaries' ids."""
    summaries: set[str] = set()
    for record in records:
        data = record.data if isinstance(record.data, dict) else {}
        if record.parent_id in summaries:
            raise _at_summary(f"message {record.id!r}", record.parent_id, "its parent")
        if record.type == _messages.COMPACTION:
            meta = data.get("metadata")
            folded = meta.get("compaction") if isinstance(meta, dict) else None
            through = folded.get("through") if isinstance(folded, dict) else None
            if record.parent_id is None or (through is not None and through != record.parent_id):
                raise InvalidGraphError(
                    f"compaction summary {record.id!r} has parent {record.parent_id!r} but "
                    f"folds through {through!r}; a summary's parent is the last message it "
                    "folds (metadata.compaction.through)"
                )
            summaries.add(record.id)
    return summaries


def check_export(
    export: object,
) -> tuple[ChatExport, list[MessageRecord], dict[str, tuple[bytes, str]]]:
    """Check an export completely before anything is written: the export, its messages
    (parents first) and its blob contents."""
    if not isinstance(export, ChatExport):
        raise InvalidTypeError(f"import_chat takes a ChatExport, got {v.type_name(export)}")
    chat = export.chat
    v.check_id(chat.id, "chat.id")
    v.check_id(chat.user_id, "chat.user_id")
    v.check_optional_text(chat.title, "chat.title")
    v.check_json_object(chat.metadata, "chat.metadata")
    _check_time(chat.created_at, "chat.created_at")
    _check_time(chat.updated_at, "chat.updated_at")
    records = parents_first(check_records(export.messages, "messages"))
    ids = {r.id for r in records}
    for record in records:
        if record.chat_id != chat.id:
            raise InvalidGraphError(f"message {record.id!r} is not in chat {chat.id!r}")
    summaries = _check_messages(records)
    active = [b for b in export.branches if b.is_active]
    if len(active) != 1:
        raise InvalidGraphError(
            f"an export needs exactly one active branch, this one has {len(active)}"
        )
    names: set[str] = set()
    branch_ids: set[str] = set()
    for branch in export.branches:
        v.check_id(branch.id, "branch.id")
        v.check_id(branch.name, "branch.name")
        _check_time(branch.created_at, f"branch {branch.name!r} created_at")
        if branch.chat_id != chat.id or branch.name in names or branch.id in branch_ids:
            raise InvalidGraphError(f"branch {branch.name!r} is duplicated or in another chat")
        names.add(branch.name)
        branch_ids.add(branch.id)
        if branch.head_message_id is not None and branch.head_message_id not in ids:
            raise InvalidGraphError(f"branch {branch.name!r} points at a missing message")
        if branch.head_message_id in summaries:
            raise _at_summary(f"branch {branch.name!r}", branch.head_message_id, "its head")
    checkpoint_ids: set[str] = set()
    for checkpoint in export.checkpoints:
        v.check_id(checkpoint.id, "checkpoint.id")
        v.check_id(checkpoint.name, "checkpoint.name")
        v.check_optional_id(checkpoint.branch_id, f"checkpoint {checkpoint.name!r} branch_id")
        _check_time(checkpoint.created_at, f"checkpoint {checkpoint.name!r} created_at")
        if checkpoint.chat_id != chat.id or checkpoint.message_id not in ids:
            raise InvalidGraphError(f"checkpoint {checkpoint.name!r} points at a missing message")
        if checkpoint.message_id in summaries:
            raise _at_summary(
                f"checkpoint {checkpoint.name!r}", checkpoint.message_id, "a checkpoint's message"
            )
        if checkpoint.id in checkpoint_ids:
            raise InvalidGraphError(f"checkpoint id {checkpoint.id!r} appears twice in the export")
        checkpoint_ids.add(checkpoint.id)
    if len({c.name for c in export.checkpoints}) != len(export.checkpoints):
        raise InvalidInputError("an export holds two checkpoints with the same name")
    try:
        contents = {blob.hash: (blob.data, blob.media_type) for blob in export.blobs}
    except ValueError:
        raise InvalidInputError("a blob of the export is not valid base64") from None
    held = _snapshots.check_blobs(contents)
    snapshot_ids: set[str] = set()
    for position, snapshot in enumerate(export.snapshots):
        if snapshot.id is None or snapshot.created_at is None or snapshot.chat_id != chat.id:
            raise InvalidGraphError("an exported snapshot lacks its id, time or chat")
        v.check_id(snapshot.id, "snapshot.id")
        _check_time(snapshot.created_at, f"snapshot {snapshot.id!r} created_at")
        if snapshot.id in snapshot_ids:
            raise InvalidGraphError(f"snapshot id {snapshot.id!r} appears twice in the export")
        snapshot_ids.add(snapshot.id)
        _snapshots.check_snapshot_fields(snapshot, f"snapshots[{position}].")
        if snapshot.message_id is not None and snapshot.message_id not in ids:
            raise InvalidGraphError(f"snapshot {snapshot.id!r} points at a missing message")
        for item in snapshot.items:
            if item.blob is None or item.blob not in held:
                raise InvalidGraphError(
                    f"snapshot {snapshot.id!r} item {item.path!r} has no content in the export"
                )
    return export, records, held


def import_chat(
    conn: Connection,
    dialect: Dialect,
    export: ChatExport,
    records: list[MessageRecord],
    held: dict[str, tuple[bytes, str]],
) -> None:
    """Write a checked export (write transaction)."""
    chat = export.chat
    if _chats.exists(conn, chat.id):
        raise ChatExistsError(
            f"chat {chat.id!r} already exists; delete it first or import under another id"
        )
    taken = _taken(conn, B, [b.id for b in export.branches])
    if taken:
        raise BranchExistsError(
            f"branch id(s) {', '.join(map(repr, taken[:3]))} of the export exist in this database "
            "already (ids are global); import the chat under another id"
        )
    taken = _taken(conn, K, [c.id for c in export.checkpoints])
    if taken:
        raise InvalidGraphError(
            f"checkpoint id(s) {', '.join(map(repr, taken[:3]))} of the export exist in this "
            "database already (ids are global); import the chat under another id"
        )
    taken = _taken(conn, SN, [s.id for s in export.snapshots if s.id is not None])
    if taken:
        raise InvalidGraphError(
            f"snapshot id(s) {', '.join(map(repr, taken[:3]))} of the export exist in this "
            "database already (ids are global); import the chat under another id"
        )
    taken = _taken(conn, M, [r.id for r in records])
    if taken:
        raise InvalidGraphError(
            f"message id(s) {', '.join(map(repr, taken[:3]))} of the export exist in this "
            "database already (message ids are global); import the chat under another id"
        )
    try:
        _chats.insert_chat_row(conn, dialect, chat)
    except DBAPIError as exc:
        if not dialect.is_unique_violation(exc):
            raise
        # Created between the check above and this insert, by a writer of another connection
        # (an import, a copy, an engine's first save): its transaction committed first.
        raise ChatExistsError(
            f"chat {chat.id!r} already exists (another writer created it meanwhile); delete "
            "it first or use another id"
        ) from None
    try:
        _write_rows(conn, dialect, export, records, held)
    except DBAPIError as exc:
        if not dialect.is_unique_violation(exc):
            raise
        raise InvalidGraphError(
            f"ids of the export of chat {chat.id!r} were written to this database by another "
            "writer while it was imported (ids are global); import the chat under another id"
        ) from None


def _write_rows(
    conn: Connection,
    dialect: Dialect,
    export: ChatExport,
    records: list[MessageRecord],
    held: dict[str, tuple[bytes, str]],
) -> None:
    """Everything of a checked export but its chat row (inserted already)."""
    chat = export.chat
    if records:
        _messages.write(conn, dialect, records, {chat.id: 1})
    for branch in export.branches:
        conn.execute(
            B.insert().values(
                id=branch.id,
                chat_id=chat.id,
                name=branch.name,
                head_message_id=branch.head_message_id,
                is_active=branch.is_active,
                created_at=branch.created_at,
            )
        )
    _branches.sync_head_depths(conn, chat.id)
    for checkpoint in export.checkpoints:
        conn.execute(
            K.insert().values(
                id=checkpoint.id,
                chat_id=chat.id,
                name=checkpoint.name,
                message_id=checkpoint.message_id,
                created_at=checkpoint.created_at,
                branch_id=checkpoint.branch_id,
            )
        )
    owner = _snapshots.chat_owners(conn, dialect, [chat.id]).get(chat.id)
    _snapshots.put_blobs(conn, dialect, owner, held)
    for snapshot in export.snapshots:
        assert snapshot.id is not None
        assert snapshot.created_at is not None
        _snapshots.insert_snapshot(
            conn, dialect, owner, snapshot, snapshot.id, chat.id, snapshot.message_id,
            snapshot.created_at,
        )  # fmt: skip


def _taken(conn: Connection, table: object, ids: list[str]) -> list[str]:
    """The ids among ``ids`` that the table holds already."""
    column = table.c.id  # type: ignore[attr-defined]
    found: list[str] = []
    for start in range(0, len(ids), _messages.IN_CHUNK):
        found += conn.scalars(
            select(column).where(column.in_(ids[start : start + _messages.IN_CHUNK]))
        )
    return sorted(found)
