"""Lazy initialisation, ownership, the real active branch, deleted chats and odd database files.

On SQLite and PostgreSQL (the ``store`` fixture), except the database-file tests, which are
about SQLite files by nature.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from agentcontext import (
    ChatNotFoundError,
    ChatOwnershipError,
    ContextEngine,
    StoreError,
    assistant_text,
    role,
    user,
)
from agentcontext.store import ChatUpdate, SqlContextStore
from tests.engine._util import texts
from tests.engine.conftest import EngineFactory


async def test_nothing_happens_until_the_first_async_call(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(role("You are terse."), user("hi"))
    assert (engine.branch, engine.head_message_id, engine.chat) == (None, None, None)
    assert await store.get_chat("c1") is None

    result = await engine.resolve()
    chat = await store.get_chat("c1")
    assert chat is not None and chat.user_id == "u1"
    assert engine.chat == chat
    assert engine.branch == "main"
    assert engine.head_message_id is None
    assert texts(result.messages) == ["hi"]
    assert await store.get_messages("c1") == []  # resolve never writes messages


async def test_an_existing_chat_is_reused_not_recreated(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    first = make_engine()
    first.set(user("hello", id="m1"))
    await first.save()
    created = await store.get_chat("c1")

    second = make_engine()
    assert texts(await second.get_messages()) == ["hello"]
    assert second.head_message_id == "m1"
    assert await store.get_chat("c1") == created
    assert [b.name for b in await store.list_branches("c1")] == ["main"]


async def test_another_users_chat_is_refused(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    await store.create_chat("c1", user_id="alice", metadata={"k": 1})
    before = await store.get_chat("c1")
    engine = make_engine(user_id="bob", metadata={"k": 2})
    engine.set(user("let me in"))
    calls: list[Callable[[], Awaitable[object]]] = [
        engine.resolve,
        engine.save,
        engine.get_messages,
        engine.btw,
        lambda: engine.rewind("m1"),
        lambda: engine.checkpoint("cp"),
        lambda: engine.switch_branch("main"),
        lambda: engine.update_chat(title="mine"),
        lambda: engine.track_usage({"input_tokens": 1}),
        lambda: engine.begin_turn(user("q")),
    ]
    for call in calls:
        with pytest.raises(ChatOwnershipError, match="another user"):
            await call()
    assert engine.branch is None
    assert await store.get_chat("c1") == before  # metadata not merged, title untouched
    assert await store.get_messages("c1") == []
    assert len(engine.pending) == 1


async def test_initial_metadata_is_merged_once(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    await store.create_chat("c1", user_id="u1", metadata={"a": 1, "b": 2})
    engine = make_engine(metadata={"b": 3, "c": {"deep": True}})
    await engine.get_messages()
    chat = await store.get_chat("c1")
    assert chat is not None and chat.metadata == {"a": 1, "b": 3, "c": {"deep": True}}
    assert engine.chat is not None and engine.chat.metadata == chat.metadata

    # Changed elsewhere afterwards: the engine does not merge its metadata again.
    await store.update_chat("c1", lambda c: ChatUpdate(metadata={**c.metadata, "b": 9}))
    await engine.get_messages()
    engine.set(user("x"))
    await engine.save()
    chat = await store.get_chat("c1")
    assert chat is not None and chat.metadata["b"] == 9


async def test_metadata_already_present_does_not_count_as_activity(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    await store.create_chat("c1", user_id="u1", metadata={"a": 1})
    before = await store.get_chat("c1")
    await make_engine(metadata={"a": 1}).get_messages()
    assert await store.get_chat("c1") == before


async def test_new_chat_gets_the_initial_metadata(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    await make_engine(metadata={"source": "web"}).get_messages()
    chat = await store.get_chat("c1")
    assert chat is not None and chat.metadata == {"source": "web"}


async def test_engine_reports_the_real_active_branch(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    first = make_engine()
    first.set(user("q1", id="m1"), assistant_text("a1", id="m2"))
    await first.save()
    branch = await first.rewind("m1")
    assert branch.name == first.branch == "main-v2"
    first.set(assistant_text("a1 again", id="m3"))
    await first.save()

    second = make_engine()
    assert texts(await second.get_messages()) == ["q1", "a1 again"]
    assert second.branch == "main-v2"
    assert second.head_message_id == "m3"
    inspected = await second.inspect()
    assert inspected.meta.branch == "main-v2"

    # A rewind from the reopened engine starts from the real branch name.
    assert (await second.rewind("m1")).name == "main-v3"


async def test_engine_opened_on_a_switched_branch(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    first = make_engine()
    first.set(user("q1", id="m1"))
    await first.save()
    await first.rewind("m1")
    await first.switch_branch("main")
    assert make_engine().branch is None
    reopened = make_engine()
    await reopened.resolve()
    assert reopened.branch == "main"


async def test_deleted_chat_is_reported_clearly(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(user("q", id="m1"), assistant_text("a", id="m2"))
    await engine.save()
    await engine.checkpoint("cp")
    assert await store.delete_chat("c1")

    engine.set(user("after the delete"))
    with pytest.raises(ChatNotFoundError, match=r"'c1'.*deleted") as info:
        await engine.resolve()
    assert "new engine" in str(info.value)
    for call in (
        engine.save,
        engine.get_messages,
        engine.btw,
        lambda: engine.rewind("m1"),
        lambda: engine.checkpoint("cp2"),
        lambda: engine.restore("cp"),
        lambda: engine.switch_branch("main"),
        lambda: engine.update_chat(title="t"),
        lambda: engine.track_usage({"n": 1}),
    ):
        with pytest.raises(ChatNotFoundError, match="'c1'"):
            await call()
    assert len(engine.pending) == 1
    assert await store.get_chat("c1") is None
    assert await store.get_message("m1") is None

    # A new engine starts the chat again, empty.
    fresh = make_engine()
    assert await fresh.get_messages() == []
    assert fresh.branch == "main"


async def test_chat_deleted_by_another_engine_while_the_first_is_warm(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    warm = make_engine()
    warm.set(user("q"))
    await warm.save()
    await warm.resolve()
    await store.delete_chat("c1", user_id="u1")
    warm.set(user("more"))
    with pytest.raises(ChatNotFoundError):
        await warm.save()
    assert await store.get_chat("c1") is None  # the save did not resurrect it


# --- database files (SQLite) --------------------------------------------------------------


async def test_an_existing_empty_sqlite_file_works(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.write_bytes(b"")
    async with SqlContextStore(f"sqlite+aiosqlite:///{path}") as store:
        engine = ContextEngine(store=store, chat_id="c1", user_id="u1")
        assert (await engine.resolve()).messages == []
        engine.set(user("hello"))
        await engine.save()
    async with SqlContextStore(f"sqlite+aiosqlite:///{path}") as store:
        reopened = ContextEngine(store=store, chat_id="c1", user_id="u1")
        assert texts(await reopened.get_messages()) == ["hello"]


@pytest.mark.parametrize("header", [b"", b"SQLite format 3\x00"], ids=["random", "bad-pages"])
async def test_a_corrupt_sqlite_file_is_refused_and_left_untouched(
    tmp_path: Path, header: bytes
) -> None:
    path = tmp_path / "corrupt.db"
    content = header + os.urandom(8192)
    path.write_bytes(content)
    store = SqlContextStore(f"sqlite+aiosqlite:///{path}")
    engine = ContextEngine(store=store, chat_id="c1", user_id="u1")
    engine.set(user("hello"))
    try:
        with pytest.raises(StoreError, match="not a valid SQLite database") as info:
            await engine.save()
        assert str(path) in str(info.value)
        assert "backup" in str(info.value) or "new file" in str(info.value)
        with pytest.raises(StoreError):
            await engine.resolve()
    finally:
        await store.close()
    assert path.read_bytes() == content
    assert sorted(os.listdir(tmp_path)) == ["corrupt.db"]
    assert len(engine.pending) == 1
