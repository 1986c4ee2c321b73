"""Snapshots through the engine, and the audit trail: record, replay, garbage collection."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from agentcontext import (
    ContextEngine,
    MarkdownRenderer,
    NotFoundError,
    SqlContextStore,
    XmlRenderer,
    approximate_tokens,
    assistant_text,
    hint,
    role,
    user,
)
from agentcontext.snapshots import ContextSnapshot, SelectionStrategy, blob_hash, snapshot_fragment
from agentcontext.store._db.schema import blobs


async def blob_rows(store: SqlContextStore) -> int:
    async with store.engine.connect() as conn:
        return int(await conn.scalar(select(func.count()).select_from(blobs)) or 0)


def engine(store: SqlContextStore, chat: str = "c") -> ContextEngine:
    return ContextEngine(store=store, chat_id=chat, user_id="u")


async def test_a_snapshot_is_attached_to_the_chat_and_its_head(store: SqlContextStore) -> None:
    context = engine(store)
    context.set(user("fix the bug"), assistant_text("looking"))
    saved = await context.save()
    snap = ContextSnapshot(summary="what I read")
    snap.add_file("src/app.py", "def main():\n    return 1\n")
    stored = await context.snapshot(snap)
    assert stored.chat_id == "c"
    assert stored.message_id == saved.head_message_id
    assert [s.id for s in await context.list_snapshots()] == [stored.id]
    loaded = await context.load_snapshot(stored.id or "", with_content=True)
    assert loaded.content_of(loaded.items[0]) == b"def main():\n    return 1\n"
    other = engine(store, "other")
    with pytest.raises(NotFoundError):
        await other.load_snapshot(stored.id or "")


async def test_snapshot_fragments_render_previews_full_text_and_budgets(
    store: SqlContextStore,
) -> None:
    context = engine(store)
    snap = ContextSnapshot(selection=SelectionStrategy.EXPLICIT, summary="inputs")
    snap.add_file("notes.md", "A" * 600)
    snap.add("snippet", "ranked", "low relevance " * 40, selection="heuristic")
    snap.add_image("shot.png", b"\x89PNG" + bytes(64), "image/png")
    stored = await context.snapshot(snap)
    listed = (await context.list_snapshots())[0]
    assert listed.contents == {}

    preview = XmlRenderer().render([snapshot_fragment(listed)])
    assert "A" * 500 in preview and "A" * 501 not in preview
    assert "image/png, 68 bytes" in preview

    context.set(role("helper"), snapshot_fragment(listed, content="full"))
    full = (await context.resolve(renderer=MarkdownRenderer())).system_prompt
    assert "A" * 600 in full  # loaded lazily from the store through the engine
    assert "low relevance" in full

    count = approximate_tokens
    explicit_cost = count("notes.md\n" + "A" * 600) + count("shot.png\n")
    fits_explicit = snapshot_fragment(stored, content="full", budget=explicit_cost)
    rendered = XmlRenderer().render([fits_explicit])
    assert "low relevance" not in rendered  # the heuristic item goes first
    assert "A" * 600 in rendered
    one_less = snapshot_fragment(stored, content="full", budget=explicit_cost - 1)
    rendered = XmlRenderer().render([one_less])
    assert "shot.png" not in rendered  # then explicit items, the last first
    assert "A" * 600 in rendered
    tight = XmlRenderer().render([snapshot_fragment(stored, content="full", budget=10)])
    assert "notes.md" not in tight
    assert "<summary>inputs</summary>" in tight


async def test_resolve_record_and_replay_byte_for_byte(store: SqlContextStore) -> None:
    context = engine(store)
    context.set(role("You are helpful."), hint("Be concise."))
    context.set(user("first question"))
    placeholder = await context.begin_turn(user("tell me a story"))
    recorded = await context.resolve(record=True)
    assert recorded.record_id is not None
    assert placeholder not in [m.id for m in recorded.messages]
    # The branch moves on: the placeholder is filled in place, more turns, a rewind.
    await context.complete_turn(assistant_text("once upon a time"))
    context.set(user("again"), assistant_text("sure"))
    await context.save()
    await context.rewind(recorded.messages[0].id)
    replayed = await context.replay(recorded.record_id)
    assert replayed.model_dump_json() == recorded.model_dump_json()
    assert replayed.to_openai() == recorded.to_openai()
    fresh = engine(store)
    assert (await fresh.replay(recorded.record_id)).model_dump_json() == recorded.model_dump_json()
    with pytest.raises(NotFoundError):
        await engine(store, "other").replay(recorded.record_id)
    assert [r.id for r in await context.list_records()] == [recorded.record_id]


async def test_a_windowed_resolve_replays_with_its_report(store: SqlContextStore) -> None:
    """``replay`` gives back what ``resolve(record=True, window=...)`` returned, the ids the
    window left out and the tokens it counted included (they came back empty)."""
    from agentcontext import ContextWindow

    context = engine(store)
    context.set(role("You are helpful."))
    for turn in range(12):
        context.set(user(f"question {turn} " + "words " * 40), assistant_text(f"answer {turn}"))
    await context.save()
    recorded = await context.resolve(record=True, window=ContextWindow(400))
    assert recorded.omitted and recorded.estimate is not None and recorded.record_id
    replayed = await engine(store).replay(recorded.record_id)
    assert replayed.model_dump_json() == recorded.model_dump_json()
    whole = await context.resolve(record=True)  # no window: nothing left out, no estimate
    again = await context.replay(whole.record_id or "")
    assert again.omitted == [] and again.estimate is None
    assert again.model_dump_json() == whole.model_dump_json()
    [listed] = [r for r in await context.list_records() if r.id == recorded.record_id]
    assert (listed.omitted, listed.estimate) == (recorded.omitted, recorded.estimate)


async def test_one_hundred_turns_store_the_prompt_once(store: SqlContextStore) -> None:
    context = engine(store)
    context.set(role("You are a patient tutor."), hint("Ask before answering."))
    records = []
    for turn in range(100):
        context.set(user(f"question {turn}"))
        result = await context.resolve(record=True)
        records.append(result)
        context.set(assistant_text(f"answer {turn}"))
        await context.save()
    prompt_hash = blob_hash(records[0].system_prompt.encode())
    stored = await store.list_resolve_records("c")
    assert len(stored) == 100
    assert {r.prompt_blob for r in stored} == {prompt_hash}
    # 1 prompt + 199 distinct messages shown (100 questions, 99 answers before the last
    # resolve), each stored once however many of the records show it.
    assert await blob_rows(store) == 1 + 199
    assert (await context.replay(records[57].record_id or "")).messages == records[57].messages


async def test_deleting_a_chat_then_collecting_garbage(store: SqlContextStore) -> None:
    keep, drop = engine(store, "keep"), engine(store, "drop")
    for context in (keep, drop):
        context.set(role("shared prompt"), user("hi"))
        snap = ContextSnapshot()
        snap.add_snippet("shared", "the same content in both chats")
        await context.snapshot(snap)
        await context.resolve(record=True)
    only = ContextSnapshot()
    only.add_snippet("mine", "only in the dropped chat")
    await drop.snapshot(only)
    before = await blob_rows(store)
    assert await store.delete_chat("drop")
    assert await store.list_resolve_records("keep") != []
    removed = await store.collect_garbage()
    # The dropped chat's own snippet and its recorded message (message ids differ per chat);
    # the shared prompt and the shared snippet stay.
    assert removed == 2
    assert await blob_rows(store) == before - 2
    assert await store.read_blob(blob_hash(b"the same content in both chats")) is not None
    replay = await keep.replay((await keep.list_records())[0].id)
    assert replay.system_prompt == "<role>shared prompt</role>"
