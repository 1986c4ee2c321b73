"""Content-addressed blobs, context snapshots, resolve records, and garbage collection."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from sqlalchemy import delete, exists, select
from sqlalchemy.ext.asyncio import AsyncConnection

from agentcontext import _validate as v
from agentcontext.errors import InvalidInputError, InvalidTypeError, SnapshotError, StoreError
from agentcontext.snapshots import ContextItem, ContextSnapshot, blob_hash
from agentcontext.store import _rows
from agentcontext.store._branches import BranchesMixin
from agentcontext.store._core import new_id
from agentcontext.store._schema import blobs as BL
from agentcontext.store._schema import record_messages as RM
from agentcontext.store._schema import resolve_records as RR
from agentcontext.store._schema import snapshot_items as SI
from agentcontext.store._schema import snapshots as SN
from agentcontext.store.records import ResolveRecord, utcnow

Blobs = Mapping[str, tuple[bytes, str]]
"""Blob contents by hash: ``(bytes, media_type)``."""

TEXT_TYPE = "text/plain; charset=utf-8"
JSON_TYPE = "application/json"


def _check_blobs(blobs: Blobs) -> dict[str, tuple[bytes, str]]:
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


class SnapshotsMixin(BranchesMixin):
    """Blob, snapshot and audit methods of :class:`~agentcontext.SqlContextStore`."""

    # --- blobs ------------------------------------------------------------------------------

    async def _put_blobs(
        self, conn: AsyncConnection, blobs: Mapping[str, tuple[bytes, str]]
    ) -> None:
        if not blobs:
            return
        now = utcnow()
        rows = [
            {
                "hash": digest,
                "size": len(data),
                "media_type": media,
                "content": data,
                "created_at": now,
            }
            for digest, (data, media) in blobs.items()
        ]
        await conn.execute(self._dialect.insert_blobs(BL), rows)

    async def put_blob(
        self,
        content: bytes,
        *,
        media_type: str = "application/octet-stream",
        expected_hash: str | None = None,
    ) -> str:
        """Store content once under its SHA-256 and return the hash.

        With ``expected_hash``, content whose hash differs is refused
        (:class:`~agentcontext.InvalidInputError`). Storing the same content again is free.
        """
        v.check_optional_text(expected_hash, "expected_hash")
        digest = blob_hash(content)
        if expected_hash is not None and expected_hash != digest:
            raise InvalidInputError(
                f"content hashes to {digest}, not {expected_hash!r}; refusing to store it "
                "under the wrong address"
            )
        checked = _check_blobs({digest: (bytes(content), media_type)})
        async with self._tx(write=True) as conn:
            await self._put_blobs(conn, checked)
        return digest

    async def read_blob(self, blob: str) -> bytes | None:
        """The exact bytes stored under a hash, or None."""
        v.check_id(blob, "blob")
        async with self._tx() as conn:
            content = await conn.scalar(select(BL.c.content).where(BL.c.hash == blob))
        return None if content is None else bytes(content)

    async def _read_blobs(self, conn: AsyncConnection, hashes: set[str]) -> dict[str, bytes]:
        if not hashes:
            return {}
        rows = await conn.execute(
            select(BL.c.hash, BL.c.content).where(BL.c.hash.in_(sorted(hashes)))
        )
        return {row[0]: bytes(row[1]) for row in rows}

    # --- snapshots --------------------------------------------------------------------------

    async def save_snapshot(
        self, snapshot: ContextSnapshot, *, chat_id: str, message_id: str | None
    ) -> ContextSnapshot:
        """Store a snapshot attached to a chat (and a message); returns the stored copy.

        Item contents held by the snapshot are written as blobs in the same transaction;
        every item must have its blob (held, or stored before). Raises
        :class:`~agentcontext.SnapshotError` for an already stored snapshot or a missing blob.
        """
        if not isinstance(snapshot, ContextSnapshot):
            raise InvalidTypeError(
                f"save_snapshot takes a ContextSnapshot, got {v.type_name(snapshot)}"
            )
        if snapshot.stored:
            raise SnapshotError(
                f"snapshot {snapshot.id!r} is stored already and cannot be stored again; "
                "build a new ContextSnapshot"
            )
        v.check_id(chat_id, "chat_id")
        v.check_optional_id(message_id, "message_id")
        v.check_optional_text(snapshot.summary, "summary")
        for index, item in enumerate(snapshot.items):
            v.check_text(item.path, f"items[{index}].path")
            if item.preview is not None:
                v.check_text(item.preview, f"items[{index}].preview")
            if item.blob is None:
                raise SnapshotError(
                    f"item {index} ({item.path!r}) has no blob; add items with the add_* helpers"
                )
        held = _check_blobs(snapshot.contents)
        snapshot_id, created = new_id(), utcnow()
        async with self._tx(write=True) as conn:
            await self._touch_existing(conn, chat_id)
            if message_id is not None:
                await self._check_head(conn, chat_id, message_id)
            await self._put_blobs(conn, held)
            wanted = {item.blob for item in snapshot.items if item.blob is not None}
            missing = wanted - held.keys()
            if missing:
                found = set(
                    await conn.scalars(select(BL.c.hash).where(BL.c.hash.in_(sorted(missing))))
                )
                if missing - found:
                    raise SnapshotError(
                        f"no content for blob(s) {sorted(missing - found)}: the snapshot does "
                        "not hold them and the store has none"
                    )
            await self._insert_snapshot(conn, snapshot, snapshot_id, chat_id, message_id, created)
        return snapshot.freeze(
            id=snapshot_id, chat_id=chat_id, message_id=message_id, created_at=created
        )

    async def _insert_snapshot(
        self,
        conn: AsyncConnection,
        snapshot: ContextSnapshot,
        snapshot_id: str,
        chat_id: str,
        message_id: str | None,
        created: datetime,
    ) -> None:
        await conn.execute(
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
            await conn.execute(
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

    async def get_snapshot(
        self, snapshot_id: str, *, with_content: bool = False
    ) -> ContextSnapshot | None:
        """A stored snapshot, or None. ``with_content`` also loads its items' blobs."""
        v.check_id(snapshot_id, "snapshot_id")
        v.check_bool(with_content, "with_content")
        async with self._tx() as conn:
            found = await self._snapshots(conn, SN.c.id == snapshot_id, with_content)
        return found[0] if found else None

    async def list_snapshots(self, chat_id: str) -> list[ContextSnapshot]:
        """The chat's snapshots, newest first (without contents)."""
        v.check_id(chat_id, "chat_id")
        async with self._tx() as conn:
            await self._require_chat(conn, chat_id)
            return await self._snapshots(conn, SN.c.chat_id == chat_id, False)

    async def _snapshots(
        self, conn: AsyncConnection, where: object, with_content: bool
    ) -> list[ContextSnapshot]:
        heads = (
            await conn.execute(
                select(
                    SN.c.id,
                    SN.c.chat_id,
                    SN.c.message_id,
                    SN.c.selection,
                    SN.c.summary,
                    SN.c.created_at,
                )
                .where(where)  # type: ignore[arg-type]
                .order_by(SN.c.created_at.desc(), SN.c.id)
            )
        ).all()
        if not heads:
            return []
        items = (
            await conn.execute(
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
            )
        ).all()
        by_snapshot: dict[str, list[ContextItem]] = {}
        for item_row in items:
            by_snapshot.setdefault(item_row[0], []).append(
                ContextItem(
                    kind=item_row[1],
                    path=item_row[2],
                    blob=item_row[3],
                    preview=item_row[4],
                    media_type=item_row[5],
                    size=int(item_row[6]),
                    selection=item_row[7],
                )
            )
        contents: dict[str, bytes] = {}
        if with_content:
            contents = await self._read_blobs(
                conn, {item.blob for group in by_snapshot.values() for item in group if item.blob}
            )
        out = []
        for row in heads:
            group = by_snapshot.get(row[0], [])
            draft = ContextSnapshot(selection=row[3], summary=row[4], items=group)
            for item in group:
                if item.blob in contents:
                    draft._contents[item.blob] = (contents[item.blob], item.media_type)
            out.append(
                draft.freeze(id=row[0], chat_id=row[1], message_id=row[2], created_at=row[5])
            )
        return out

    # --- resolve records --------------------------------------------------------------------

    async def create_resolve_record(
        self,
        chat_id: str,
        *,
        branch_id: str | None,
        branch_name: str | None,
        head_message_id: str | None,
        renderer: str,
        system_prompt: str,
        messages: Sequence[tuple[str, bytes]],
    ) -> ResolveRecord:
        """Store what a model was shown: the prompt and each message's JSON, as blobs."""
        v.check_id(chat_id, "chat_id")
        v.check_optional_id(branch_id, "branch_id")
        v.check_optional_id(branch_name, "branch_name")
        v.check_optional_id(head_message_id, "head_message_id")
        # Kept as a blob (bytes), so any text that encodes to UTF-8 is fine, NUL included.
        v.check_unicode(system_prompt, "system_prompt")
        v.check_id(renderer, "renderer")
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise InvalidTypeError(
                f"messages must be a list of (message_id, bytes) pairs, got {v.type_name(messages)}"
            )
        for index, pair in enumerate(messages):
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise InvalidTypeError(
                    f"messages[{index}] must be a (message_id, bytes) pair, got {v.type_name(pair)}"
                )
        prompt = system_prompt.encode("utf-8")
        blobs: dict[str, tuple[bytes, str]] = {blob_hash(prompt): (prompt, TEXT_TYPE)}
        message_ids, message_blobs = [], []
        for message_id, payload in messages:
            digest = blob_hash(payload)
            blobs[digest] = (bytes(payload), JSON_TYPE)
            message_ids.append(v.check_id(message_id, "message id"))
            message_blobs.append(digest)
        record = _rows.build(
            ResolveRecord,
            {
                "id": new_id(),
                "chat_id": chat_id,
                "branch_id": branch_id,
                "branch_name": branch_name,
                "head_message_id": head_message_id,
                "renderer": renderer,
                "prompt_blob": blob_hash(prompt),
                "message_ids": message_ids,
                "message_blobs": message_blobs,
                "created_at": utcnow(),
            },
        )
        async with self._tx(write=True) as conn:
            await self._touch_existing(conn, chat_id)
            if head_message_id is not None:
                await self._check_head(conn, chat_id, head_message_id)
            await self._put_blobs(conn, blobs)
            await conn.execute(
                RR.insert().values(
                    id=record.id,
                    chat_id=chat_id,
                    branch_id=branch_id,
                    branch_name=branch_name,
                    head_message_id=head_message_id,
                    renderer=renderer,
                    prompt_hash=record.prompt_blob,
                    created_at=record.created_at,
                )
            )
            if message_ids:
                await conn.execute(
                    RM.insert(),
                    [
                        {"record_id": record.id, "position": i, "message_id": mid, "blob_hash": h}
                        for i, (mid, h) in enumerate(zip(message_ids, message_blobs, strict=True))
                    ],
                )
        return record

    async def get_resolve_record(self, record_id: str) -> ResolveRecord | None:
        """A stored resolve record, or None."""
        v.check_id(record_id, "record_id")
        async with self._tx() as conn:
            found = await self._records(conn, RR.c.id == record_id)
        return found[0] if found else None

    async def list_resolve_records(self, chat_id: str) -> list[ResolveRecord]:
        """The chat's resolve records, newest first."""
        v.check_id(chat_id, "chat_id")
        async with self._tx() as conn:
            await self._require_chat(conn, chat_id)
            return await self._records(conn, RR.c.chat_id == chat_id)

    async def _records(self, conn: AsyncConnection, where: object) -> list[ResolveRecord]:
        rows = (
            await conn.execute(
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
                .where(where)  # type: ignore[arg-type]
                .order_by(RR.c.created_at.desc(), RR.c.id)
            )
        ).all()
        if not rows:
            return []
        parts = (
            await conn.execute(
                select(RM.c.record_id, RM.c.message_id, RM.c.blob_hash)
                .where(RM.c.record_id.in_([row[0] for row in rows]))
                .order_by(RM.c.record_id, RM.c.position)
            )
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

    # --- garbage collection -----------------------------------------------------------------

    async def collect_garbage(self) -> int:
        """Delete the blobs nothing refers to any more; return how many were deleted.

        A blob another chat's snapshot or record still uses stays. Safe to run while others
        write: blobs being written concurrently are locked and skipped.
        """
        unreferenced = (
            select(BL.c.hash)
            .where(
                ~exists().where(SI.c.blob_hash == BL.c.hash),
                ~exists().where(RR.c.prompt_hash == BL.c.hash),
                ~exists().where(RM.c.blob_hash == BL.c.hash),
            )
            .with_for_update(skip_locked=True)
        )
        for _ in range(3):
            try:
                async with self._tx(write=True) as conn:
                    result = await conn.execute(delete(BL).where(BL.c.hash.in_(unreferenced)))
                return int(result.rowcount or 0)
            except StoreError as exc:
                # A reference committed between our read and our delete: look again.
                if not self._dialect.is_foreign_key_violation(exc.__cause__ or exc):
                    raise
        raise StoreError("garbage collection kept racing concurrent writers; run it again")

    async def _delete_snapshot_rows(self, conn: AsyncConnection, chat_id: str) -> None:
        """Delete a chat's snapshots and resolve records (their items follow by cascade)."""
        records = select(RR.c.id).where(RR.c.chat_id == chat_id)
        await conn.execute(delete(RM).where(RM.c.record_id.in_(records)))
        await conn.execute(delete(RR).where(RR.c.chat_id == chat_id))
        snapshot_ids = select(SN.c.id).where(SN.c.chat_id == chat_id)
        await conn.execute(delete(SI).where(SI.c.snapshot_id.in_(snapshot_ids)))
        await conn.execute(delete(SN).where(SN.c.chat_id == chat_id))
