"""rewind, checkpoint, restore, switch_branch and btw — on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest

from agentcontext import (
    BranchInfo,
    BranchNotFoundError,
    CheckpointNotFoundError,
    EmptyConversationError,
    InvalidGraphError,
    MessageNotFoundError,
    assistant_text,
    user,
)
from agentcontext.store import SqlContextStore
from tests.engine._util import ids, texts
from tests.engine.conftest import EngineFactory
from tests.helpers import rec


async def active(store: SqlContextStore) -> list[str]:
    return [b.name for b in await store.list_branches("c1") if b.is_active]


async def test_rewind_forks_a_new_active_branch(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(user("Hello", id="m1"), assistant_text("Hi!", id="m2"), user("Wrong path", id="m3"))
    await engine.save()
    engine.set(user("pending, dropped by the rewind"))

    branch = await engine.rewind("m2")
    assert isinstance(branch, BranchInfo)
    assert (branch.name, branch.head_message_id, branch.is_active) == ("main-v2", "m2", True)
    assert branch.message_count == 2
    assert engine.branch == "main-v2" and engine.head_message_id == "m2"
    assert engine.pending == []
    assert await active(store) == ["main-v2"]
    assert texts(await engine.get_messages()) == ["Hello", "Hi!"]

    # The original branch and messages are intact.
    main = await store.get_branch("c1", "main")
    assert main is not None and main.head_message_id == "m3"
    assert (await store.get_message("m3")) is not None

    # New messages link to the fork point.
    engine.set(user("Right path", id="m4"))
    await engine.save()
    assert (await store.get_message("m4")).parent_id == "m2"  # type: ignore[union-attr]
    assert texts(await make_engine().get_messages()) == ["Hello", "Hi!", "Right path"]


async def test_branch_names_count_from_the_root_name_and_stay_flat(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(user("Start", id="m1"))
    await engine.save()
    assert (await engine.rewind("m1")).name == "main-v2"
    engine.set(assistant_text("Path A"))
    await engine.save()
    assert (await engine.rewind("m1")).name == "main-v3"  # from main-v2: still main-vN
    await engine.switch_branch("main")
    assert (await engine.rewind("m1")).name == "main-v4"
    await engine.switch_branch("main")
    assert (await engine.btw()).name == "main-v5"
    await engine.switch_branch("main-v2")
    assert (await engine.rewind("m1")).name == "main-v6"
    await engine.delete_branch("main-v3")
    assert (await engine.rewind("m1")).name == "main-v3"  # the smallest free number
    names = [b.name for b in await store.list_branches("c1")]
    assert sorted(names) == sorted(["main", "main-v2", "main-v3", "main-v4", "main-v5", "main-v6"])
    assert await active(store) == ["main-v3"]


async def test_each_branch_keeps_its_own_chain(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(user("Hello", id="msg-1"), assistant_text("Response A", id="msg-2"))
    await engine.save()
    await engine.rewind("msg-1")
    engine.set(assistant_text("Response B", id="msg-3"))
    await engine.save()
    assert texts((await engine.resolve()).messages) == ["Hello", "Response B"]

    switched = await engine.switch_branch("main")
    assert (switched.name, switched.is_active, switched.message_count) == ("main", True, 2)
    assert engine.branch == "main"
    assert texts((await engine.resolve()).messages) == ["Hello", "Response A"]
    assert await active(store) == ["main"]
    heads = {b.name: b.head_message_id for b in await store.list_branches("c1")}
    assert heads == {"main": "msg-2", "main-v2": "msg-3"}


async def test_rewind_refuses_unknown_messages_and_other_chats(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    await store.create_chat("other", user_id="u1")
    await store.add_message(rec("foreign", "other"))
    engine = make_engine()
    engine.set(user("q", id="m1"))
    await engine.save()
    engine.set(user("kept"))
    with pytest.raises(MessageNotFoundError, match="ghost"):
        await engine.rewind("ghost")
    with pytest.raises(InvalidGraphError, match="another chat"):
        await engine.rewind("foreign")
    assert [b.name for b in await store.list_branches("c1")] == ["main"]
    assert len(engine.pending) == 1  # a refused rewind does not drop the queue
    assert engine.branch == "main"


async def test_rewind_from_a_cold_engine_to_a_message_off_its_chain(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(user("q", id="m1"), assistant_text("a", id="m2"))
    await engine.save()
    await engine.rewind("m1")
    engine.set(assistant_text("b", id="m3"))
    await engine.save()
    cold = make_engine()
    branch = await cold.rewind("m2")  # on main, not on the active main-v2
    assert (branch.name, branch.head_message_id) == ("main-v3", "m2")
    assert texts(await cold.get_messages()) == ["q", "a"]


async def test_checkpoint_and_restore(store: SqlContextStore, make_engine: EngineFactory) -> None:
    engine = make_engine()
    with pytest.raises(EmptyConversationError, match="no messages"):
        await engine.checkpoint("start")
    assert await store.list_checkpoints("c1") == []

    engine.set(user("q1", id="m1"), assistant_text("a1", id="m2"))
    await engine.save()
    checkpoint = await engine.checkpoint("before-risk")
    assert (checkpoint.name, checkpoint.message_id, checkpoint.chat_id) == (
        "before-risk",
        "m2",
        "c1",
    )
    engine.set(user("risky", id="m3"), assistant_text("oops", id="m4"))
    await engine.save()
    engine.set(user("pending"))

    branch = await engine.restore("before-risk")
    assert (branch.name, branch.head_message_id, branch.is_active) == ("main-v2", "m2", True)
    assert engine.branch == "main-v2" and engine.pending == []
    assert texts(await engine.get_messages()) == ["q1", "a1"]
    assert (await store.get_branch("c1", "main")).head_message_id == "m4"  # type: ignore[union-attr]

    # A checkpoint of the same name moves.
    engine.set(user("safe", id="m5"))
    await engine.save()
    moved = await engine.checkpoint("before-risk")
    assert moved.message_id == "m5"
    assert [c.name for c in await store.list_checkpoints("c1")] == ["before-risk"]

    with pytest.raises(CheckpointNotFoundError, match="nope"):
        await engine.restore("nope")
    assert engine.branch == "main-v2"


async def test_checkpoint_uses_the_head_another_engine_moved(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    first, second = make_engine(), make_engine()
    first.set(user("q", id="m1"))
    await first.save()
    await first.get_messages()
    second.set(assistant_text("a", id="m2"))
    await second.save()
    assert (await first.checkpoint("cp")).message_id == "m2"


async def test_switch_branch(store: SqlContextStore, make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(user("q", id="m1"), assistant_text("a", id="m2"))
    await engine.save()
    await engine.rewind("m1")
    engine.set(user("pending"))
    with pytest.raises(BranchNotFoundError, match="nonexistent"):
        await engine.switch_branch("nonexistent")
    assert engine.branch == "main-v2" and len(engine.pending) == 1

    await engine.switch_branch("main")
    assert engine.pending == []
    assert engine.head_message_id == "m2"
    assert ids(await engine.get_messages()) == ["m1", "m2"]
    # Switching to the branch it is on is harmless.
    again = await engine.switch_branch("main")
    assert again.is_active and again.head_message_id == "m2"
    assert await active(store) == ["main"]
    reopened = make_engine()
    await reopened.get_messages()
    assert reopened.branch == "main"


async def test_btw_forks_without_switching_and_keeps_pending(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    with pytest.raises(EmptyConversationError):
        await engine.btw()
    assert len(await store.list_branches("c1")) == 1

    engine.set(user("q", id="m1"), assistant_text("a", id="m2"))
    await engine.save()
    engine.set(user("still pending", id="m3"))
    side = await engine.btw()
    assert (side.name, side.head_message_id, side.is_active) == ("main-v2", "m2", False)
    assert side.message_count == 2
    assert engine.branch == "main"
    assert [f.id for f in engine.pending] == ["m3"]
    assert await active(store) == ["main"]

    await engine.save()
    assert (await store.get_branch("c1", "main-v2")).head_message_id == "m2"  # type: ignore[union-attr]
    assert (await store.get_branch("c1", "main")).head_message_id == "m3"  # type: ignore[union-attr]

    await engine.switch_branch("main-v2")
    assert texts(await engine.get_messages()) == ["q", "a"]
    assert (await engine.btw()).name == "main-v3"


async def test_concurrent_forks_from_two_stores_never_collide(
    store: SqlContextStore, other_store: SqlContextStore, make_engine: EngineFactory
) -> None:
    seed = make_engine()
    seed.set(user("q", id="m1"))
    await seed.save()
    engines = [make_engine(on=store if i % 2 else other_store) for i in range(6)]
    for engine in engines:
        await engine.get_messages()
    results = await asyncio.gather(
        *(engine.btw() if i % 2 else engine.rewind("m1") for i, engine in enumerate(engines))
    )
    names = [branch.name for branch in results]
    assert sorted(names) == sorted(f"main-v{n}" for n in range(2, 8))
    assert len(await active(store)) == 1
