"""Naming, renaming and deleting branches through the engine (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest

from agentcontext import (
    BranchExistsError,
    BranchNotFoundError,
    ChatNotFoundError,
    InvalidInputError,
    assistant_text,
    user,
)
from agentcontext.store import SqlContextStore
from tests.engine._util import texts
from tests.engine.conftest import EngineFactory


async def names(store: SqlContextStore) -> dict[str, bool]:
    return {b.name: b.is_active for b in await store.list_branches("c1")}


async def test_rewind_restore_and_btw_take_a_name(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(user("q1", id="q1"), assistant_text("a1", id="a1"))
    await engine.save()
    side = await engine.btw(name="side-question")
    assert (side.name, side.head_message_id, side.is_active) == ("side-question", "a1", False)
    assert engine.branch == "main"
    retry = await engine.rewind("q1", name="retry")
    assert (retry.name, retry.head_message_id, engine.branch) == ("retry", "q1", "retry")
    await engine.checkpoint("start")
    back = await engine.restore("start", name="from-start")
    assert (back.name, engine.branch) == ("from-start", "from-start")
    assert await names(store) == {
        "main": False,
        "side-question": False,
        "retry": False,
        "from-start": True,
    }


async def test_a_taken_name_is_refused_and_nothing_moves(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(user("q1", id="q1"), assistant_text("a1", id="a1"))
    await engine.save()
    engine.set(user("still pending"))
    for call in (
        lambda: engine.rewind("q1", name="main"),
        lambda: engine.btw(name="main"),
    ):
        with pytest.raises(BranchExistsError):
            await call()
    assert engine.branch == "main"
    assert len(engine.pending) == 1  # a refused rewind keeps the queue
    assert await names(store) == {"main": True}


@pytest.mark.parametrize("bad", ["", "x" * 256, 3])
async def test_branch_names_are_validated_like_ids(make_engine: EngineFactory, bad: object) -> None:
    engine = make_engine()
    engine.set(user("q1", id="q1"))
    await engine.save()
    with pytest.raises(InvalidInputError):
        await engine.rewind("q1", name=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        await engine.btw(name=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        await engine.rename_branch("main", bad)  # type: ignore[arg-type]


async def test_renaming_stops_names_from_growing(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(user("q1", id="q1"), assistant_text("a1", id="a1"))
    await engine.save()
    await engine.rewind("q1")
    assert engine.branch == "main-v2"
    await engine.rename_branch("main-v2", "attempt-2")
    assert engine.branch == "attempt-2"
    assert (await engine.rewind("q1")).name == "attempt-2-v2"


async def test_rename_errors(store: SqlContextStore, make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(user("q1", id="q1"))
    await engine.save()
    await engine.btw()
    with pytest.raises(BranchExistsError):
        await engine.rename_branch("main", "main-v2")
    with pytest.raises(BranchNotFoundError):
        await engine.rename_branch("nope", "other")
    renamed = await engine.rename_branch("main", "main")  # a no-op
    assert renamed.name == "main"


async def test_a_rename_by_another_engine_names_the_next_fork(
    store: SqlContextStore, make_engine: EngineFactory, other_store: SqlContextStore
) -> None:
    engine = make_engine()
    engine.set(user("q1", id="q1"), assistant_text("a1", id="a1"))
    await engine.save()
    other = make_engine(on=other_store)
    await other.rename_branch("main", "trunk")
    assert engine.branch == "main"  # learnt on its next call
    info = await engine.rewind("q1")
    assert info.name == "trunk-v2"
    await engine.switch_branch("trunk")
    engine.set(user("edited", id="q1"))  # a resent id forks too
    await engine.save()
    assert engine.branch == "trunk-v3"


async def test_delete_keeps_the_messages(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(user("q1", id="q1"), assistant_text("a1", id="a1"))
    await engine.save()
    await engine.rewind("q1", name="alt")
    engine.set(assistant_text("other answer", id="x1"))
    await engine.save()
    await engine.checkpoint("alt-end")
    await engine.switch_branch("main")
    assert await engine.delete_branch("alt") is True
    assert await engine.delete_branch("alt") is False
    assert await names(store) == {"main": True}
    graph = await store.get_graph("c1")
    assert {n.id for n in graph.nodes} == {"q1", "a1", "x1"}
    restored = await engine.restore("alt-end", name="alt")  # the checkpoint still reaches it
    assert restored.head_message_id == "x1"
    assert texts(await engine.get_messages()) == ["q1", "other answer"]


async def test_the_active_and_own_branches_cannot_be_deleted(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(user("q1", id="q1"))
    await engine.save()
    with pytest.raises(InvalidInputError, match="switch to another branch"):
        await engine.delete_branch("main")
    await engine.btw(name="side")
    other = make_engine()
    await other.switch_branch("side")  # "side" is now active; the engine stays on "main"
    with pytest.raises(InvalidInputError, match="active"):
        await engine.delete_branch("side")
    with pytest.raises(InvalidInputError, match="this engine's branch"):
        await engine.delete_branch("main")
    assert await names(store) == {"main": False, "side": True}


async def test_an_engine_on_a_branch_deleted_elsewhere_is_told_so(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(user("q1", id="q1"))
    await engine.save()
    await engine.btw(name="side")
    await engine.switch_branch("side")
    other = make_engine()  # loads the active branch: "side"
    await other.switch_branch("main")
    assert await other.delete_branch("side") is True
    with pytest.raises(ChatNotFoundError, match="side"):
        await engine.get_messages()


@pytest.mark.parametrize("same_store", [True, False], ids=["same-store", "other-store"])
async def test_a_save_on_a_branch_deleted_elsewhere_is_told_so(
    store: SqlContextStore,
    other_store: SqlContextStore,
    make_engine: EngineFactory,
    same_store: bool,
) -> None:
    """Even when ``save`` is the first call after the delete (the engine has the chain in
    hand, so nothing is read before the write)."""
    engine = make_engine()
    engine.set(user("q1", id="q1"))
    await engine.save()
    await engine.rewind("q1", name="topic")
    other = make_engine(on=store if same_store else other_store)
    await other.switch_branch("main")
    assert await other.delete_branch("topic") is True
    before = await store.get_messages("c1"), await store.list_branches("c1")
    engine.set(user("x", id="x"))
    with pytest.raises(ChatNotFoundError, match=r"'topic'.*create a new engine"):
        await engine.save()
    assert [f.id for f in engine.pending] == ["x"]
    with pytest.raises(ChatNotFoundError, match=r"'topic'.*create a new engine"):
        await engine.begin_turn(user("y", id="y"))
    assert [f.id for f in engine.pending] == ["x"]
    assert (await store.get_messages("c1"), await store.list_branches("c1")) == before
    with pytest.raises(ChatNotFoundError, match=r"'topic'.*create a new engine"):
        await engine.get_messages()
