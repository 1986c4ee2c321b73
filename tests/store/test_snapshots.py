"""Blobs, context snapshots, resolve records and garbage collection — on both backends."""

from __future__ import annotations

import hashlib

import pytest
from sqlalchemy import func, select

from agentcontext import ChatExport, errors
from agentcontext.snapshots import (
    ContextItemKind,
    ContextSnapshot,
    SelectionStrategy,
    blob_hash,
)
from agentcontext.store import SqlContextStore
from agentcontext.store._db.schema import blobs
from tests.helpers import chain

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))


async def blob_count(store: SqlContextStore) -> int:
    async with store.engine.connect() as conn:
        return int(await conn.scalar(select(func.count()).select_from(blobs)) or 0)


@pytest.fixture
async def chat(store: SqlContextStore) -> str:
    for chat_id in ("c1", "c2"):
        await store.create_chat(chat_id, user_id="u")
        main = await store.get_active_branch(chat_id)
        assert main is not None
        await store.append_messages(
            main.id, chain(chat_id, 2, prefix=f"{chat_id}-"), expected_head=None
        )
    return "c1"


def sample() -> ContextSnapshot:
    snap = ContextSnapshot(selection=SelectionStrategy.EXPLICIT, summary="for the fix")
    snap.add_file("src/app.py", "print('hello')\n" * 100)
    snap.add_url("https://example.org/doc", "<html>docs</html>")
    snap.add_snippet("note", "remember the edge case")
    snap.add_command("pytest -q", "3 passed")
    snap.add_image("shot.png", PNG, "image/png")
    snap.add_other("env", b"\x00\x01binary")
    return snap


def test_items_have_blobs_and_previews() -> None:
    snap = sample()
    kinds = [item.kind for item in snap.items]
    assert kinds == list(ContextItemKind)
    for item in snap.items:
        assert item.blob is not None
        assert item.blob == hashlib.sha256(snap.content_of(item) or b"").hexdigest()
    file_item = snap.items[0]
    assert file_item.preview is not None
    assert len(file_item.preview) == 500
    assert file_item.size == len(("print('hello')\n" * 100).encode())
    image, binary = snap.items[4], snap.items[5]
    assert image.preview is None and image.media_type == "image/png"
    assert binary.preview is None
    assert snap.items[2].preview == "remember the edge case"


async def test_blobs_are_stored_once_and_read_back_exactly(store: SqlContextStore) -> None:
    digest = await store.put_blob(PNG, media_type="image/png")
    assert digest == blob_hash(PNG)
    assert await store.put_blob(PNG, media_type="image/png") == digest
    assert await blob_count(store) == 1
    assert await store.read_blob(digest) == PNG
    assert await store.read_blob("0" * 64) is None
    with pytest.raises(errors.InvalidInputError, match="hashes to"):
        await store.put_blob(b"other", expected_hash=digest)
    assert await blob_count(store) == 1


async def test_save_list_and_load_snapshots(store: SqlContextStore, chat: str) -> None:
    stored = await store.save_snapshot(sample(), chat_id=chat, message_id="c1-1")
    assert stored.stored and stored.id and stored.chat_id == chat
    assert stored.message_id == "c1-1"
    assert stored.created_at is not None
    listed = await store.list_snapshots(chat)
    assert [s.id for s in listed] == [stored.id]
    assert listed[0].items == stored.items
    assert listed[0].contents == {}
    loaded = await store.get_snapshot(stored.id, with_content=True)
    assert loaded is not None
    for item in loaded.items:
        assert loaded.content_of(item) == stored.content_of(item)
    assert await store.get_snapshot("nope") is None
    assert await store.list_snapshots("c2") == []


async def test_a_stored_snapshot_is_immutable(store: SqlContextStore, chat: str) -> None:
    stored = await store.save_snapshot(sample(), chat_id=chat, message_id=None)
    with pytest.raises(errors.SnapshotError, match="cannot change"):
        stored.add_snippet("late", "too late")
    with pytest.raises(errors.SnapshotError):
        stored.summary = "changed"
    with pytest.raises(errors.SnapshotError, match="stored already"):
        await store.save_snapshot(stored, chat_id=chat, message_id=None)


async def test_content_is_stored_once_across_snapshots_and_chats(
    store: SqlContextStore, chat: str
) -> None:
    await store.save_snapshot(sample(), chat_id="c1", message_id=None)
    await store.save_snapshot(sample(), chat_id="c1", message_id="c1-0")
    await store.save_snapshot(sample(), chat_id="c2", message_id="c2-1")
    assert await blob_count(store) == len(sample().items)


async def test_items_without_content_are_refused(store: SqlContextStore, chat: str) -> None:
    donor = sample()
    orphan = ContextSnapshot(items=[donor.items[0]])  # the item, not its content
    with pytest.raises(errors.SnapshotError, match="no content"):
        await store.save_snapshot(orphan, chat_id=chat, message_id=None)
    assert await store.list_snapshots(chat) == []
    await store.save_snapshot(donor, chat_id=chat, message_id=None)
    # Once the content is stored, an item pointing at it is fine.
    again = await store.save_snapshot(orphan, chat_id=chat, message_id=None)
    assert again.items == [donor.items[0]]


async def test_snapshot_errors(store: SqlContextStore, chat: str) -> None:
    with pytest.raises(errors.ChatNotFoundError):
        await store.save_snapshot(sample(), chat_id="nope", message_id=None)
    with pytest.raises(errors.InvalidGraphError):
        await store.save_snapshot(sample(), chat_id="c1", message_id="c2-0")
    with pytest.raises(errors.InvalidTypeError):
        await store.save_snapshot({"items": []}, chat_id="c1", message_id=None)  # type: ignore[arg-type]
    assert await blob_count(store) == 0


async def test_resolve_records_store_the_prompt_once(store: SqlContextStore, chat: str) -> None:
    prompt = "<role>You are helpful.</role>"
    for turn in range(100):
        await store.create_resolve_record(
            chat,
            branch_id=None,
            branch_name="main",
            head_message_id="c1-1",
            renderer="XmlRenderer()",
            system_prompt=prompt,
            messages=[(f"m{turn}", f'{{"turn":{turn}}}'.encode())],
        )
    assert await blob_count(store) == 101  # one prompt + one message each
    records = await store.list_resolve_records(chat)
    assert len(records) == 100
    assert {r.prompt_blob for r in records} == {blob_hash(prompt.encode())}
    first = await store.get_resolve_record(records[-1].id)
    assert first is not None
    assert first.message_ids == ["m0"]
    assert await store.read_blob(first.message_blobs[0]) == b'{"turn":0}'


async def test_delete_chat_and_collect_garbage(store: SqlContextStore, chat: str) -> None:
    shared = ContextSnapshot()
    shared.add_snippet("shared", "used by both chats")
    only_c1 = ContextSnapshot()
    only_c1.add_snippet("mine", "used by c1 only")
    await store.save_snapshot(shared, chat_id="c1", message_id=None)
    await store.save_snapshot(only_c1, chat_id="c1", message_id=None)
    twin = ContextSnapshot()
    twin.add_snippet("shared", "used by both chats")
    await store.save_snapshot(twin, chat_id="c2", message_id=None)
    await store.create_resolve_record(
        "c1",
        branch_id=None,
        branch_name="main",
        head_message_id=None,
        renderer="XmlRenderer()",
        system_prompt="only c1's prompt",
        messages=[],
    )
    await store.put_blob(b"never referenced")
    assert await blob_count(store) == 4
    assert await store.collect_garbage() == 1  # the unreferenced one
    assert await store.delete_chat("c1")
    assert await store.list_snapshots("c2") != []
    assert await store.collect_garbage() == 2  # c1's own snippet and prompt
    assert await store.read_blob(blob_hash(b"used by both chats")) == b"used by both chats"
    assert await blob_count(store) == 1
    assert await store.collect_garbage() == 0


async def test_export_import_carries_snapshots(store: SqlContextStore, chat: str) -> None:
    await store.save_snapshot(sample(), chat_id=chat, message_id="c1-1")
    exported = await store.export_chat(chat)
    assert len(exported.snapshots) == 1
    assert len(exported.blobs) == len(sample().items)
    text = exported.model_dump_json()
    await store.delete_chat(chat)
    await store.collect_garbage()
    await store.import_chat(ChatExport.model_validate_json(text))
    again = await store.export_chat(chat)
    assert again == exported
    loaded = await store.get_snapshot(exported.snapshots[0].id or "", with_content=True)
    assert loaded is not None
    assert loaded.content_of(loaded.items[4]) == PNG
