"""Retention deletes a batch of chats with a statement per table, not a statement per chat.

A user with thousands of small chats is erased (or pruned) in batches of many chats; each
batch names its chats in each statement. These tests pin what that must keep: exact
reports for batches mixing plain chats with chats holding every kind of row, blobs shared
with a chat that stays, and a number of statements that does not grow with the chats.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event

from agentcontext import ContextEngine, ContextSnapshot, assistant, user
from agentcontext.store import SqlContextStore
from agentcontext.store._ops.retention import TABLES
from tests.helpers import table_counts


async def _plain_chat(store: SqlContextStore, chat_id: str, user_id: str) -> None:
    engine = ContextEngine(store=store, chat_id=chat_id, user_id=user_id)
    engine.set(user(f"question of {chat_id}"), assistant(f"answer of {chat_id}"))
    await engine.save()


async def _full_chat(store: SqlContextStore, chat_id: str, user_id: str, shared: str) -> None:
    """Messages on two branches, a checkpoint, a snapshot (one private file, one shared with
    other chats) and a resolve record."""
    engine = ContextEngine(store=store, chat_id=chat_id, user_id=user_id)
    engine.set(user(f"first of {chat_id}"), assistant("reply"))
    await engine.save()
    await engine.checkpoint("cp")
    snapshot = ContextSnapshot()
    snapshot.add_file("private.txt", f"only {chat_id}")
    snapshot.add_file("shared.txt", shared)
    await engine.snapshot(snapshot)
    await engine.resolve(record=True)
    first = (await store.get_messages(chat_id))[0].id
    await engine.rewind(first, name="alt")
    engine.set(user(f"side of {chat_id}"))
    await engine.save()


async def test_a_batch_mixing_plain_and_full_chats_reports_exactly_what_went(
    store: SqlContextStore,
) -> None:
    shared = "a file every chat's snapshot holds"
    for i in range(12):
        await _plain_chat(store, f"plain-{i:02d}", "alice")
    await _full_chat(store, "full-a", "alice", shared)
    await _full_chat(store, "full-b", "alice", shared)
    await _full_chat(store, "bobs", "bob", shared)
    before = await table_counts(store)

    report = await store.erase_user("alice")

    after = await table_counts(store)
    assert report.deleted == {name: before[name] - after[name] for name in TABLES}
    assert report.deleted["chats"] == 14
    assert report.deleted["snapshots"] == 2 and report.deleted["resolve_records"] == 2
    assert report.deleted["checkpoints"] == 2
    assert report.deleted["blobs"] >= 2  # both private files; the shared one stays for bob
    assert sorted(report.chat_ids) == sorted(
        [f"plain-{i:02d}" for i in range(12)] + ["full-a", "full-b"]
    )
    assert [chat.id for chat in await store.list_chats()] == ["bobs"]
    snapshot = (await store.list_snapshots("bobs"))[0]
    full = await store.get_snapshot(snapshot.id or "", with_content=True)
    assert full is not None
    assert sorted(data for data, _ in full.contents.values()) == [
        shared.encode(),
        b"only bobs",
    ]
    assert await store.search_user_messages("alice", "question") == []
    assert len(await store.search_messages("bobs", "side")) == 1


async def test_erasing_many_chats_runs_statements_per_batch_not_per_chat(
    store: SqlContextStore,
) -> None:
    chats = 120
    for i in range(chats):
        await _plain_chat(store, f"c-{i:03d}", "many")
    await _plain_chat(store, "kept", "someone-else")
    statements: list[str] = []

    def count(*args: Any) -> None:
        statements.append(args[2])

    event.listen(store.engine.sync_engine, "before_cursor_execute", count)
    try:
        report = await store.erase_user("many")
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", count)

    assert len(report.chat_ids) == chats and report.deleted["messages"] == 2 * chats
    assert [chat.id for chat in await store.list_chats()] == ["kept"]
    # Before, each chat cost about a dozen statements of its own (1 400 here); a batch of
    # chats now costs about twenty, and batches hold many chats.
    assert len(statements) < chats * 3, len(statements)
