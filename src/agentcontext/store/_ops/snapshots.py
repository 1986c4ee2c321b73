"""Content-addressed blobs, context snapshots, resolve records, and garbage collection.
Plain functions of a connection; arguments are checked by the caller."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from sqlalchemy import ColumnElement, Connection, delete, exists, select

from agentcontext import _validate as v
from agentcontext.errors import InvalidInputError, InvalidTypeError, SnapshotError, StoreError
from agentcontext.snapshots import ContextItem, ContextSnapshot, blob_hash
from agentcontext.store._db.database import Database
from agentcontext.store._db.schema import blobs as BL
from agentcontext.store._db.schema import chats as C
from agentcontext.store._db.schema import record_messages as RM
from agentcontext.store._db.schema import resolve_records as RR
from agentcontext.store._db.schema import snapshot_items as SI
from agentcontext.store._db.schema import snapshots as SN
from agentcontext.store._dialects import Dialect
from agentcontext.store._ops import branches as _branches
from agentcontext.store._ops import chats as _chats
from agentcontext.store._rows import codec
from agentcontext.store._rows import decode as _rows
from agentcontext.store._rows.checks import new_id
from agentcontext.store._rows.sealing import is_sealed
from agentcontext.store.records import ResolveRecord, utcnow

__all__ = [
    "Blobs",
    "check_blobs",
    "check_put",
    "new_record",
    "check_shown",
    "check_snapshot",
    "check_snapshot_fields",
    "chat_owners",
    "chat_records",
    "chat_snapshots",
    "collect_garbage",
    "collect_garbage_retrying",
    "insert_record",
    "insert_snapshot",
    "put_blobs",
    "read_blob",
    "read_blobs",
    "record_contents",
    "record",
    "records",
    "snapshot",
    "insert_record_rows",
    "save_snapshot",
    "snapshots",
    "store_blobs",
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


def chat_owners(conn: Connection, dialect: Dialect, chat_ids: Iterable[str]) -> dict[str, str]:
    """The owners of those of ``chat_ids`` that are sealed (none in a store without
    encryption): the namespaces their blobs live in, the keys their rows are sealed under. A
    chat is sealed when its metadata is (an encrypted store seals it when the chat is made,
    `migrate encrypt` when it reaches the chat)."""
    if not dialect.sealer.encrypted:
        return {}
    ids = sorted(set(chat_ids))
    rows = conn.execute(select(C.c.id, C.c.user_id, C.c.metadata).where(C.c.id.in_(ids)))
    owners = {}
    for row in rows:
        if is_sealed(row[2]):
            owners[str(row[0])] = str(row[1])
        else:  # (a corrupt chat once every value of the database is sealed)
            dialect.sealer.refuse_plain("chats.metadata", str(row[0]), str(row[0]))
    dialect.sealer.require(set(owners.values()))
    return owners


def put_blobs(conn: Connection, dialect: Dialect, owner: str | None, blobs: Blobs) -> None:
    """Insert the blobs that are not stored yet, for a chat of ``owner`` (see
    `chat_owners`; None for a plain chat)."""
    if not blobs:
        return
    conn.execute(dialect.insert_blobs(BL), codec.blob_rows(dialect, owner, blobs, utcnow()))


def store_blobs(conn: Connection, dialect: Dialect, blobs: Blobs, chat_id: str | None) -> None:
    """Store blobs given on their own (``put_blob``): in an encrypted store, for the owner of
    ``chat_id``, which it must name (write transaction)."""
    owner = None
    if chat_id is not None:
        _chats.require(conn, chat_id)
        owner = chat_owners(conn, dialect, [chat_id]).get(chat_id)
    elif dialect.sealer.encrypted:
        raise InvalidInputError(
            "an encrypted store keeps blobs apart per user: pass chat_id= (the chat whose "
            "snapshots or records will hold the blob) to put_blob"
        )
    put_blobs(conn, dialect, owner, blobs)


_DIGEST = re.compile(r"[0-9a-f]{64}")
"""A blob's hash: the SHA-256 of its content in lowercase hex (`blob_hash`)."""


def read_blob(conn: Connection, dialect: Dialect, blob: str, chat_id: str | None) -> bytes | None:
    """The exact bytes stored under a hash, or None. An encrypted store keeps blobs per user:
    ``chat_id`` names the chat whose owner's blob is read."""
    owner = None
    if dialect.sealer.encrypted:
        if chat_id is None:
            raise InvalidInputError(
                "an encrypted store keeps blobs apart per user: pass chat_id= (the chat whose "
                "snapshot or resolve record holds the blob) to read_blob"
            )
        _chats.require(conn, chat_id)
        owner = chat_owners(conn, dialect, [chat_id]).get(chat_id)
        if _DIGEST.fullmatch(blob) is None:
            return None  # no blob has this hash (a SHA-256 is 64 hex digits)
    address = codec.blob_address(dialect, owner, blob, write=False)
    content = conn.scalar(select(BL.c.content).where(BL.c.hash == address))
    return None if content is None else codec.open_blob(dialect, address, content)


def read_blobs(conn: Connection, dialect: Dialect, addresses: set[str]) -> dict[str, bytes]:
    """The contents stored at several addresses (missing ones left out), opened."""
    if not addresses:
        return {}
    rows = conn.execute(select(BL.c.hash, BL.c.content).where(BL.c.hash.in_(sorted(addresses))))
    return {row[0]: codec.open_blob(dialect, row[0], row[1]) for row in rows}


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
    _chats.touch(conn, dialect, chat_id)
    if message_id is not None:
        _branches.check_head(conn, chat_id, message_id)
    owner = chat_owners(conn, dialect, [chat_id]).get(chat_id)
    put_blobs(conn, dialect, owner, held)
    wanted = {item.blob for item in snapshot.items if item.blob is not None}
    missing = {
        codec.blob_address(dialect, owner, digest, write=True): digest
        for digest in wanted - held.keys()
    }
    if missing:
        found = set(conn.scalars(select(BL.c.hash).where(BL.c.hash.in_(sorted(missing)))))
        if missing.keys() - found:
            raise SnapshotError(
                f"no content for blob(s) {sorted(missing[a] for a in missing.keys() - found)}: "
                "the snapshot does not hold them and the store has none"
            )
    insert_snapshot(conn, dialect, owner, snapshot, snapshot_id, chat_id, message_id, created)


def insert_snapshot(
    conn: Connection,
    dialect: Dialect,
    owner: str | None,
    snapshot: ContextSnapshot,
    snapshot_id: str,
    chat_id: str,
    message_id: str | None,
    created: datetime,
) -> None:
    """Insert a snapshot's rows (its blobs are stored already) in a chat of ``owner`` (see
    `chat_owners`)."""
    conn.execute(
        SN.insert().values(
            id=snapshot_id,
            chat_id=chat_id,
            message_id=message_id,
            selection=snapshot.selection.value,
            summary=codec.snapshot_summary(dialect, owner, chat_id, snapshot_id, snapshot.summary),
            created_at=created,
        )
    )
    rows = []
    for position, item in enumerate(snapshot.items):
        assert item.blob is not None
        path, address, preview = codec.snapshot_item(
            dialect, owner, chat_id, snapshot_id, position, item.path, item.blob, item.preview
        )
        rows.append(
            {
                "snapshot_id": snapshot_id,
                "position": position,
                "kind": item.kind.value,
                "path": path,
                "blob_hash": address,
                "preview": preview,
                "media_type": item.media_type,
                "size": item.size,
                "selection": None if item.selection is None else item.selection.value,
            }
        )
    if rows:
        conn.execute(SI.insert(), rows)


def snapshots(
    conn: Connection, dialect: Dialect, where: ColumnElement[bool], with_content: bool
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
    chat_of = {row[0]: row[1] for row in heads}
    owners = chat_owners(conn, dialect, chat_of.values())
    items = conn.execute(
        select(
            SI.c.snapshot_id,
            SI.c.position,
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
    addresses: dict[str, str] = {}
    for item in items:
        snapshot_id, chat_id = item[0], chat_of[item[0]]
        path, digest, preview = codec.open_item(
            dialect, owners.get(chat_id), chat_id, snapshot_id, item[1], item[3], item[4], item[5]
        )
        addresses[item[4]] = digest
        by_snapshot.setdefault(snapshot_id, []).append(
            ContextItem(
                kind=item[2],
                path=path,
                blob=digest,
                preview=preview,
                media_type=item[6],
                size=int(item[7]),
                selection=item[8],
            )
        )
    contents: dict[str, bytes] = {}
    if with_content:
        contents = {
            addresses[address]: data
            for address, data in read_blobs(conn, dialect, set(addresses)).items()
        }
    out = []
    for row in heads:
        group = by_snapshot.get(row[0], [])
        summary = codec.open_summary(dialect, row[1], row[0], row[4])
        draft = ContextSnapshot(selection=row[3], summary=summary, items=group)
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
    _chats.touch(conn, dialect, record.chat_id)
    if record.head_message_id is not None:
        _branches.check_head(conn, record.chat_id, record.head_message_id)
    owner = chat_owners(conn, dialect, [record.chat_id]).get(record.chat_id)
    insert_record_rows(conn, dialect, owner, record, blobs)


def insert_record_rows(
    conn: Connection,
    dialect: Dialect,
    owner: str | None,
    record: ResolveRecord,
    blobs: dict[str, tuple[bytes, str]],
) -> None:
    """Insert a resolve record's rows and blobs in a chat of ``owner`` (see `chat_owners`)."""
    put_blobs(conn, dialect, owner, blobs)

    def address(digest: str) -> str:
        return codec.blob_address(dialect, owner, digest, write=True)

    conn.execute(
        RR.insert().values(
            id=record.id,
            chat_id=record.chat_id,
            branch_id=record.branch_id,
            branch_name=record.branch_name,
            head_message_id=record.head_message_id,
            renderer=record.renderer,
            prompt_hash=address(record.prompt_blob),
            created_at=record.created_at,
            window_omitted=v.dumps(record.omitted) if record.omitted else None,
            window_estimate=record.estimate,
        )
    )
    if record.message_ids:
        conn.execute(
            RM.insert(),
            [
                {
                    "record_id": record.id,
                    "position": i,
                    "message_id": mid,
                    "blob_hash": address(h),
                }
                for i, (mid, h) in enumerate(
                    zip(record.message_ids, record.message_blobs, strict=True)
                )
            ],
        )


def record_contents(
    conn: Connection, dialect: Dialect, record: ResolveRecord
) -> dict[str, tuple[bytes, str]]:
    """The blobs of a record of a plain chat, by SHA-256 (to seal them)."""
    wanted = sorted({record.prompt_blob, *record.message_blobs})
    rows = conn.execute(
        select(BL.c.hash, BL.c.content, BL.c.media_type).where(BL.c.hash.in_(wanted))
    )
    return {row[0]: (codec.open_blob(dialect, row[0], row[1]), str(row[2])) for row in rows}


def records(conn: Connection, dialect: Dialect, where: ColumnElement[bool]) -> list[ResolveRecord]:
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
            RR.c.window_omitted,
            RR.c.window_estimate,
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
    owners = chat_owners(conn, dialect, {row[1] for row in rows})
    owner_of = {row[0]: owners.get(row[1]) for row in rows}
    messages: dict[str, list[tuple[str, str]]] = {}
    for part in parts:
        digest = codec.blob_digest(dialect, owner_of[part[0]], part[2])
        messages.setdefault(part[0], []).append((part[1], digest))
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
                "prompt_blob": codec.blob_digest(dialect, owners.get(row[1]), row[6]),
                "message_ids": [m for m, _ in messages.get(row[0], [])],
                "message_blobs": [h for _, h in messages.get(row[0], [])],
                "created_at": row[7],
                "omitted": json.loads(row[8]) if row[8] else [],
                "estimate": row[9],
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
    check_snapshot_fields(snapshot)
    for index, item in enumerate(snapshot.items):
        if item.blob is None:
            raise SnapshotError(
                f"item {index} ({item.path!r}) has no blob; add items with the add_* helpers"
            )
    return check_blobs(snapshot.contents)


def check_snapshot_fields(snapshot: ContextSnapshot, where: str = "") -> None:
    """Check the values a snapshot's rows hold: its summary and each item's path, preview,
    media type and size. ``where`` prefixes the names in errors (``snapshots[2].``)."""
    v.check_optional_text(snapshot.summary, f"{where}summary")
    for index, item in enumerate(snapshot.items):
        what = f"{where}items[{index}]"
        v.check_text(item.path, f"{what}.path")
        v.check_optional_text(item.preview, f"{what}.preview")
        v.check_id(item.media_type, f"{what}.media_type")
        v.check_int64(item.size, f"{what}.size", minimum=0)


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


def snapshot(
    conn: Connection, dialect: Dialect, snapshot_id: str, with_content: bool
) -> ContextSnapshot | None:
    """The stored snapshot ``snapshot_id``, or None (snapshot read)."""
    found = snapshots(conn, dialect, SN.c.id == snapshot_id, with_content)
    return found[0] if found else None


def record(conn: Connection, dialect: Dialect, record_id: str) -> ResolveRecord | None:
    """The resolve record ``record_id``, or None (snapshot read)."""
    found = records(conn, dialect, RR.c.id == record_id)
    return found[0] if found else None


def chat_snapshots(conn: Connection, dialect: Dialect, chat_id: str) -> list[ContextSnapshot]:
    """A chat's snapshots, newest first, without contents; `ChatNotFoundError` for an unknown
    chat (snapshot read)."""
    _chats.require(conn, chat_id)
    return snapshots(conn, dialect, SN.c.chat_id == chat_id, False)


def chat_records(conn: Connection, dialect: Dialect, chat_id: str) -> list[ResolveRecord]:
    """A chat's resolve records, newest first; `ChatNotFoundError` for an unknown chat."""
    _chats.require(conn, chat_id)
    return records(conn, dialect, RR.c.chat_id == chat_id)


def check_put(
    content: object, media_type: object, expected_hash: object, chat_id: object
) -> tuple[str, dict[str, tuple[bytes, str]]]:
    """Check a blob to store (``put_blob``): its hash and the blob, or `InvalidInputError`
    for content whose hash is not the one expected."""
    v.check_optional_text(expected_hash, "expected_hash")
    v.check_optional_id(chat_id, "chat_id")
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
    omitted: object = (),
    estimate: object = None,
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
        omitted=_checked_omitted(omitted),
        estimate=v.check_optional_count(estimate, "estimate"),
    )
    return record, blobs


def _checked_omitted(omitted: object) -> list[str]:
    """The ids a window left out, checked as ids."""
    if isinstance(omitted, (str, bytes)) or not isinstance(omitted, (list, tuple)):
        raise InvalidTypeError(f"omitted must be a list of message ids, got {v.type_name(omitted)}")
    return [v.check_id(item, "omitted[]") for item in omitted]
