"""Content-addressed blobs, context snapshots, resolve records, and garbage collection.
Plain functions of a connection; arguments are checked by the caller."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from sqlalchemy import ColumnElement, Connection, delete, exists, select

from agentcontext import _validate as v
from agentcontext.errors import InvalidInputError, InvalidTypeError, SnapshotError, StoreError
from agentcontext.snapshots import ContextItem, ContextSnapshot, blob_hash
from agentcontext.store._db.database import Database
from agentcontext.store._db.schema import blobs as BL
from agentcontext.store._db.schema import record_messages as RM
from agentcontext.store._db.schema import resolve_records as RR
from agentcontext.store._db.schema import snapshot_items as SI
from agentcontext.store._db.schema import snapshots as SN
from agentcontext.store._dialects import Dialect
from agentcontext.store._ops import branches as _branches
from agentcontext.store._ops import chats as _chats
from agentcontext.store._rows import decode as _rows
from agentcontext.store._rows.checks import new_id
from agentcontext.store.records import ResolveRecord, utcnow

__all__ = [
    "Blobs",
    "check_blobs",
    "check_put",
    "new_record",
    "check_shown",
    "check_snapshot",
    "chat_records",
    "chat_snapshots",
    "collect_garbage",
    "collect_garbage_retrying",
    "insert_record",
    "insert_snapshot",
    "put_blobs",
    "read_blob",
    "read_blobs",
    "records",
    "save_snapshot",
    "snapshots",
]

Blobs = Mapping[str, tuple[bytes, str]]
"""Blob contents by hash: ``(bytes, media_type)``."""


def check_blobs(blobs: Blobs) -> dict[str, tuple[bytes, str]]:
    """Check that each blob is bytes stored under the SHA-256 of exactly those bytes."""
    checked: dict[str, tuple[bytes, str]] = {}
    for digest, (content, media_type) in blobs.items():
        if not isinstance(content, (bytes, bytearray, memoryview)):
            raise InvalidTypeError(f"blob content must be bytes, got {v.type_name(content)}")
        data = bytes(content)
        if blob_hash(data) != digest:
            raise InvalidInputError(
                f"blob {digest!r} does not match its content (SHA-256 {blob_hash(data)}); "
                "a blob is addressed by the hash of exactly its bytes"
            )
        checked[digest] = (data, v.check_id(media_type, "media_type"))
    return checked


def put_blobs(conn: Connection, dialect: Dialect, blobs: Blobs) -> None:
    """Insert the blobs that are not stored yet."""
    if not blobs:
        return
    dialect.sealer.refuse_unsealed("blobs (snapshot contents, resolve records)")
    now = utcnow()
    rows = [
        {"hash": digest, "size": len(data), "media_type": media, "content": data, "created_at": now}
        for digest, (data, media) in blobs.items()
    ]
    conn.execute(dialect.insert_blobs(BL), rows)


def read_blob(conn: Connection, blob: str) -> bytes | None:
    """The exact bytes stored under a hash, or None."""
    content = conn.scalar(select(BL.c.content).where(BL.c.hash == blob))
    return None if content is None else bytes(content)


def read_blobs(conn: Connection, hashes: set[str]) -> dict[str, bytes]:
    """The stored bytes of several hashes (missing ones left out)."""
    if not hashes:
        return {}
    rows = conn.execute(select(BL.c.hash, BL.c.content).where(BL.c.hash.in_(sorted(hashes))))
    return {row[0]: bytes(row[1]) for row in rows}


def save_snapshot(
    conn: Connection,
    dialect: Dialect,
    snapshot: ContextSnapshot,
    held: dict[str, tuple[bytes, str]],
    snapshot_id: str,
    chat_id: str,
    message_id: str | None,
    created: datetime,
) -> None:
    """Store a checked snapshot and the contents it holds (write transaction)."""
    dialect.sealer.refuse_unsealed("context snapshots")
    _chats.touch(conn, dialect, chat_id)
    if message_id is not None:
        _branches.check_head(conn, chat_id, message_id)
    put_blobs(conn, dialect, held)
    wanted = {item.blob for item in snapshot.items if item.blob is not None}
    missing = wanted - held.keys()
    if missing:
        found = set(conn.scalars(select(BL.c.hash).where(BL.c.hash.in_(sorted(missing)))))
        if missing - found:
            raise SnapshotError(
                f"no content for blob(s) {sorted(missing - found)}: the snapshot does "
                "not hold them and the store has none"
            )
    insert_snapshot(conn, snapshot, snapshot_id, chat_id, message_id, created)


def insert_snapshot(
    conn: Connection,
    snapshot: ContextSnapshot,
    snapshot_id: str,
    chat_id: str,
    message_id: str | None,
    created: datetime,
) -> None:
    """Insert a snapshot's rows (its blobs are stored already)."""
    conn.execute(
        SN.insert().values(
            id=snapshot_id,
            chat_id=chat_id,
            message_id=message_id,
            selection=snapshot.selection.value,
            summary=snapshot.summary,
            created_at=created,
        )
    )
    if snapshot.items:
        conn.execute(
            SI.insert(),
            [
                {
                    "snapshot_id": snapshot_id,
                    "position": position,
                    "kind": item.kind.value,
                    "path": item.path,
                    "blob_hash": item.blob,
                    "preview": item.preview,
                    "media_type": item.media_type,
                    "size": item.size,
                    "selection": None if item.selection is None else item.selection.value,
                }
                for position, item in enumerate(snapshot.items)
            ],
        )


def snapshots(
    conn: Connection, where: ColumnElement[bool], with_content: bool
) -> list[ContextSnapshot]:
    """Stored snapshots matching ``where``, newest first."""
    heads = conn.execute(
        select(
            SN.c.id, SN.c.chat_id, SN.c.message_id, SN.c.selection, SN.c.summary, SN.c.created_at
        )
        .where(where)
        .order_by(SN.c.created_at.desc(), SN.c.id)
    ).all()
    if not heads:
        return []
    items = conn.execute(
        select(
            SI.c.snapshot_id,
            SI.c.kind,
            SI.c.path,
            SI.c.blob_hash,
            SI.c.preview,
            SI.c.media_type,
            SI.c.size,
            SI.c.selection,
        )
        .where(SI.c.snapshot_id.in_([row[0] for row in heads]))
        .order_by(SI.c.snapshot_id, SI.c.position)
    ).all()
    by_snapshot: dict[str, list[ContextItem]] = {}
    for item in items:
        by_snapshot.setdefault(item[0], []).append(
            ContextItem(
                kind=item[1],
                path=item[2],
                blob=item[3],
                preview=item[4],
                media_type=item[5],
                size=int(item[6]),
                selection=item[7],
            )
        )
    contents: dict[str, bytes] = {}
    if with_content:
        contents = read_blobs(
            conn, {item.blob for group in by_snapshot.values() for item in group if item.blob}
        )
    out = []
    for row in heads:
        group = by_snapshot.get(row[0], [])
        draft = ContextSnapshot(selection=row[3], summary=row[4], items=group)
        for entry in group:
            if entry.blob in contents:
                draft._contents[entry.blob] = (contents[entry.blob], entry.media_type)
        out.append(draft.freeze(id=row[0], chat_id=row[1], message_id=row[2], created_at=row[5]))
    return out


def insert_record(
    conn: Connection,
    dialect: Dialect,
    record: ResolveRecord,
    blobs: dict[str, tuple[bytes, str]],
) -> None:
    """Store a resolve record with its blobs (write transaction)."""
    dialect.sealer.refuse_unsealed("resolve records")
    _chats.touch(conn, dialect, record.chat_id)
    if record.head_message_id is not None:
        _branches.check_head(conn, record.chat_id, record.head_message_id)
    put_blobs(conn, dialect, blobs)
    conn.execute(
        RR.insert().values(
            id=record.id,
            chat_id=record.chat_id,
            branch_id=record.branch_id,
            branch_name=record.branch_name,
            head_message_id=record.head_message_id,
            renderer=record.renderer,
            prompt_hash=record.prompt_blob,
            created_at=record.created_at,
        )
    )
    if record.message_ids:
        conn.execute(
            RM.insert(),
            [
                {"record_id": record.id, "position": i, "message_id": mid, "blob_hash": h}
                for i, (mid, h) in enumerate(
                    zip(record.message_ids, record.message_blobs, strict=True)
                )
            ],
        )


def records(conn: Connection, where: ColumnElement[bool]) -> list[ResolveRecord]:
    """Resolve records matching ``where``, newest first."""
    rows = conn.execute(
        select(
            RR.c.id,
            RR.c.chat_id,
            RR.c.branch_id,
            RR.c.branch_name,
            RR.c.head_message_id,
            RR.c.renderer,
            RR.c.prompt_hash,
            RR.c.created_at,
        )
        .where(where)
        .order_by(RR.c.created_at.desc(), RR.c.id)
    ).all()
    if not rows:
        return []
    parts = conn.execute(
        select(RM.c.record_id, RM.c.message_id, RM.c.blob_hash)
        .where(RM.c.record_id.in_([row[0] for row in rows]))
        .order_by(RM.c.record_id, RM.c.position)
    ).all()
    messages: dict[str, list[tuple[str, str]]] = {}
    for part in parts:
        messages.setdefault(part[0], []).append((part[1], part[2]))
    return [
        _rows.build(
            ResolveRecord,
            {
                "id": row[0],
                "chat_id": row[1],
                "branch_id": row[2],
                "branch_name": row[3],
                "head_message_id": row[4],
                "renderer": row[5],
                "prompt_blob": row[6],
                "message_ids": [m for m, _ in messages.get(row[0], [])],
                "message_blobs": [h for _, h in messages.get(row[0], [])],
                "created_at": row[7],
            },
        )
        for row in rows
    ]


def collect_garbage(conn: Connection) -> int:
    """Delete the blobs nothing refers to; how many (write transaction). Blobs being written
    concurrently are locked and skipped."""
    unreferenced = (
        select(BL.c.hash)
        .where(
            ~exists().where(SI.c.blob_hash == BL.c.hash),
            ~exists().where(RR.c.prompt_hash == BL.c.hash),
            ~exists().where(RM.c.blob_hash == BL.c.hash),
        )
        .with_for_update(skip_locked=True)
    )
    # Read first, then delete: a DELETE whose subquery reads the table it deletes from is
    # refused by MySQL.
    hashes = list(conn.scalars(unreferenced))
    dropped = 0
    for start in range(0, len(hashes), 500):
        chunk = hashes[start : start + 500]
        dropped += int(conn.execute(delete(BL).where(BL.c.hash.in_(chunk))).rowcount or 0)
    return dropped


def record_blobs(
    system_prompt: str, messages: Sequence[tuple[str, bytes]]
) -> tuple[str, list[str], list[str], dict[str, tuple[bytes, str]]]:
    """The prompt hash, message ids, message hashes and blobs of a resolve record."""
    prompt = system_prompt.encode("utf-8")
    blobs: dict[str, tuple[bytes, str]] = {blob_hash(prompt): (prompt, TEXT_TYPE)}
    ids, hashes = [], []
    for message_id, payload in messages:
        digest = blob_hash(payload)
        blobs[digest] = (bytes(payload), JSON_TYPE)
        ids.append(v.check_id(message_id, "message id"))
        hashes.append(digest)
    return blob_hash(prompt), ids, hashes, blobs


TEXT_TYPE = "text/plain; charset=utf-8"
JSON_TYPE = "application/json"


def check_snapshot(snapshot: object) -> dict[str, tuple[bytes, str]]:
    """Check a snapshot to store (new, every item with its blob); the contents it holds."""
    if not isinstance(snapshot, ContextSnapshot):
        raise InvalidTypeError(
            f"save_snapshot takes a ContextSnapshot, got {v.type_name(snapshot)}"
        )
    if snapshot.stored:
        raise SnapshotError(
            f"snapshot {snapshot.id!r} is stored already and cannot be stored again; "
            "build a new ContextSnapshot"
        )
    v.check_optional_text(snapshot.summary, "summary")
    for index, item in enumerate(snapshot.items):
        v.check_text(item.path, f"items[{index}].path")
        if item.preview is not None:
            v.check_text(item.preview, f"items[{index}].preview")
        if item.blob is None:
            raise SnapshotError(
                f"item {index} ({item.path!r}) has no blob; add items with the add_* helpers"
            )
    return check_blobs(snapshot.contents)


def check_shown(messages: object) -> list[tuple[str, bytes]]:
    """Check the ``(message_id, json bytes)`` pairs of a resolve record."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidTypeError(
            f"messages must be a list of (message_id, bytes) pairs, got {v.type_name(messages)}"
        )
    pairs: list[tuple[str, bytes]] = []
    for index, pair in enumerate(messages):
        if (
            not isinstance(pair, tuple)
            or len(pair) != 2
            or not isinstance(pair[1], (bytes, bytearray))
        ):
            raise InvalidTypeError(
                f"messages[{index}] must be a (message_id, bytes) pair, got {v.type_name(pair)}"
            )
        pairs.append((pair[0], bytes(pair[1])))
    return pairs


async def collect_garbage_retrying(db: Database) -> int:
    """`collect_garbage`, run again when a reference committed between its read and its
    delete (the foreign key refuses the delete)."""
    for _ in range(3):
        try:
            return await db.run("write", collect_garbage)
        except StoreError as exc:
            if not db.dialect.is_foreign_key_violation(exc.__cause__ or exc):
                raise
    raise StoreError("garbage collection kept racing concurrent writers; run it again")


def chat_snapshots(conn: Connection, chat_id: str) -> list[ContextSnapshot]:
    """A chat's snapshots, newest first, without contents; `ChatNotFoundError` for an unknown
    chat (snapshot read)."""
    _chats.require(conn, chat_id)
    return snapshots(conn, SN.c.chat_id == chat_id, False)


def chat_records(conn: Connection, chat_id: str) -> list[ResolveRecord]:
    """A chat's resolve records, newest first; `ChatNotFoundError` for an unknown chat."""
    _chats.require(conn, chat_id)
    return records(conn, RR.c.chat_id == chat_id)


def check_put(
    content: object, media_type: object, expected_hash: object
) -> tuple[str, dict[str, tuple[bytes, str]]]:
    """Check a blob to store (``put_blob``): its hash and the blob, or `InvalidInputError`
    for content whose hash is not the one expected."""
    v.check_optional_text(expected_hash, "expected_hash")
    if not isinstance(content, (bytes, bytearray, memoryview)):
        raise InvalidTypeError(f"blob content must be bytes, got {v.type_name(content)}")
    data = bytes(content)
    digest = blob_hash(data)
    if expected_hash is not None and expected_hash != digest:
        raise InvalidInputError(
            f"content hashes to {digest}, not {expected_hash!r}; refusing to store it "
            "under the wrong address"
        )
    return digest, check_blobs({digest: (data, media_type)})  # type: ignore[dict-item]


def new_record(
    chat_id: object,
    branch_id: object,
    branch_name: object,
    head_message_id: object,
    renderer: object,
    system_prompt: object,
    messages: object,
) -> tuple[ResolveRecord, dict[str, tuple[bytes, str]]]:
    """A checked resolve record to store (``create_resolve_record``) and its blobs."""
    v.check_id(chat_id, "chat_id")
    v.check_optional_id(branch_id, "branch_id")
    v.check_optional_id(branch_name, "branch_name")
    v.check_optional_id(head_message_id, "head_message_id")
    # Kept as a blob (bytes), so any text that encodes to UTF-8 is fine, NUL included.
    prompt = v.check_unicode(system_prompt, "system_prompt")
    v.check_id(renderer, "renderer")
    prompt_blob, ids, hashes, blobs = record_blobs(prompt, check_shown(messages))
    record = ResolveRecord(
        id=new_id(),
        chat_id=chat_id,
        branch_id=branch_id,
        branch_name=branch_name,
        head_message_id=head_message_id,
        renderer=renderer,
        prompt_blob=prompt_blob,
        message_ids=ids,
        message_blobs=hashes,
        created_at=utcnow(),
    )
    return record, blobs
