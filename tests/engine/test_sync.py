"""Several engines on one chat: a warm engine catches up with what the others wrote.

Engine A loads (caches) its branch; engine B — on the same store or on a second store of
the same database — saves, updates in place, completes a turn, rewinds, or the store moves
the head; A's next resolve() must give exactly what the database holds for A's branch.
On SQLite and PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentcontext import (
    ContextEngine,
    CorruptDataError,
    Message,
    assistant_text,
    user,
)
from agentcontext.fragments import is_empty_assistant_placeholder
from agentcontext.store import ChainRows, MessageRecord, SqlContextStore
from tests.engine._util import texts
from tests.engine.conftest import EngineFactory
from tests.helpers import rec


async def stored_view(store: SqlContextStore, engine: ContextEngine) -> list[Message]:
    """What the database holds for the engine's branch, as resolve() should show it."""
    assert engine.branch is not None
    branch = await store.get_branch(engine.chat_id, engine.branch)
    assert branch is not None
    if branch.head_message_id is None:
        return []
    chain = await store.get_message_chain(branch.head_message_id)
    messages = [Message.model_validate(record.data) for record in chain]
    return [m for m in messages if not is_empty_assistant_placeholder(m)]


async def assert_in_sync(store: SqlContextStore, engine: ContextEngine) -> list[Message]:
    resolved = (await engine.resolve()).messages
    assert resolved == await stored_view(store, engine)
    branch = await store.get_branch(engine.chat_id, engine.branch or "")
    assert branch is not None and engine.head_message_id == branch.head_message_id
    return resolved


@pytest.fixture(params=["same-store", "two-stores"])
def peer(
    request: pytest.FixtureRequest, make_engine: EngineFactory, store: SqlContextStore
) -> EngineFactory:
    """Engines for "another process": on the same store or on a second one."""
    if request.param == "same-store":
        return make_engine
    second: SqlContextStore = request.getfixturevalue("other_store")

    def make(chat_id: str = "c1", user_id: str = "u1", **options: object) -> ContextEngine:
        return make_engine(chat_id, user_id, on=second, **options)

    return make


async def test_a_sees_b_saves(
    store: SqlContextStore, make_engine: EngineFactory, peer: EngineFactory
) -> None:
    a, b = make_engine(), peer()
    a.set(user("q1", id="m1"), assistant_text("a1", id="m2"))
    await a.save()
    await assert_in_sync(store, a)
    for n in range(3, 9, 2):
        b.set(user(f"q{n}", id=f"m{n}"), assistant_text(f"a{n}", id=f"m{n + 1}"))
        await b.save()
        resolved = await assert_in_sync(store, a)
        assert resolved[-1].id == f"m{n + 1}"
    # A's own save after catching up chains after B's messages.
    a.set(user("from a", id="m9"))
    await a.save()
    assert (await store.get_message("m9")).parent_id == "m8"  # type: ignore[union-attr]
    await assert_in_sync(store, b)


async def test_a_grafts_onto_b_without_resolving_first(
    store: SqlContextStore, make_engine: EngineFactory, peer: EngineFactory
) -> None:
    a, b = make_engine(), peer()
    a.set(user("q1", id="m1"))
    await a.save()
    b.set(user("q2", id="m2"))
    await b.save()
    a.set(user("q3", id="m3"))  # A's cache still ends at m1
    assert (await a.save()).head_message_id == "m3"
    assert [m.id for m in await assert_in_sync(store, a)] == ["m1", "m2", "m3"]


async def test_a_sees_b_in_place_updates(
    store: SqlContextStore, make_engine: EngineFactory, peer: EngineFactory
) -> None:
    a, b = make_engine(), peer()
    a.set(user("q1", id="m1"), assistant_text("draft", id="m2"), user("q2", id="m3"))
    await a.save()
    await a.resolve()
    b.set(assistant_text("final", id="m2"))
    await b.save(branch=False)
    assert texts(await assert_in_sync(store, a)) == ["q1", "final", "q2"]
    b.set(user("q1 edited", id="m1"), user("q4", id="m4"))
    await b.save(branch=False)
    assert texts(await assert_in_sync(store, a)) == ["q1 edited", "final", "q2", "q4"]


async def test_a_sees_the_turn_b_completes(
    store: SqlContextStore, make_engine: EngineFactory, peer: EngineFactory
) -> None:
    a = make_engine()
    placeholder = await a.begin_turn(user("question"))
    assert texts(await assert_in_sync(store, a)) == ["question"]
    b = peer()
    await b.complete_turn(assistant_text("streamed answer"))
    resolved = await assert_in_sync(store, a)
    assert texts(resolved) == ["question", "streamed answer"]
    assert resolved[-1].id == placeholder
    # A's own open turn was completed elsewhere: completing it again updates it in place.
    await a.complete_turn(assistant_text("corrected answer"))
    assert texts(await assert_in_sync(store, b)) == ["question", "corrected answer"]


async def test_b_rewinds_and_a_stays_consistent_on_its_branch(
    store: SqlContextStore, make_engine: EngineFactory, peer: EngineFactory
) -> None:
    a, b = make_engine(), peer()
    a.set(user("q1", id="m1"), assistant_text("a1", id="m2"), user("q2", id="m3"))
    await a.save()
    await a.resolve()
    await b.get_messages()
    await b.rewind("m1")
    b.set(assistant_text("other answer", id="m4"))
    await b.save()

    # A keeps the branch it loaded; it is unchanged by B's fork.
    assert a.branch == "main"
    assert [m.id for m in await assert_in_sync(store, a)] == ["m1", "m2", "m3"]
    # A fresh engine follows the active branch.
    fresh = make_engine()
    assert [m.id for m in await fresh.get_messages()] == ["m1", "m4"]
    assert fresh.branch == "main-v2"
    # A moves to B's branch and sees exactly its chain (cache truncated, then extended).
    await a.switch_branch("main-v2")
    assert [m.id for m in await assert_in_sync(store, a)] == ["m1", "m4"]
    b.set(user("q5", id="m5"))
    await b.save()
    assert [m.id for m in await assert_in_sync(store, a)] == ["m1", "m4", "m5"]


async def test_a_follows_its_head_moved_backwards_and_forwards(
    store: SqlContextStore, make_engine: EngineFactory, peer: EngineFactory
) -> None:
    a = make_engine()
    a.set(*(user(f"q{i}", id=f"m{i}") for i in range(1, 6)))
    await a.save()
    await a.resolve()
    main = await store.get_branch("c1", "main")
    assert main is not None
    assert await store.update_branch_head(main.id, "m2", "m5")
    assert [m.id for m in await assert_in_sync(store, a)] == ["m1", "m2"]

    # Forward again along a new path, written by B.
    b = peer()
    b.set(user("new", id="n1"), user("newer", id="n2"))
    await b.save()
    assert [m.id for m in await assert_in_sync(store, a)] == ["m1", "m2", "n1", "n2"]

    # To a message written before A's cache (off its chain): a full reload.
    assert await store.update_branch_head(main.id, "m4", "n2")
    assert [m.id for m in await assert_in_sync(store, a)] == ["m1", "m2", "m3", "m4"]
    assert await store.update_branch_head(main.id, None, "m4")
    assert await assert_in_sync(store, a) == []


async def test_a_follows_a_reparented_chain(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    a = make_engine()
    a.set(*(user(f"q{i}", id=f"m{i}") for i in range(1, 5)))
    await a.save()
    await a.resolve()
    await store.set_message_parent("m3", "m1")  # m2 drops out of the chain
    assert [m.id for m in await assert_in_sync(store, a)] == ["m1", "m3", "m4"]


async def test_a_sees_messages_written_through_the_store(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    a = make_engine()
    a.set(user("q1", id="m1"))
    await a.save()
    await a.resolve()
    # Written outside the engine, with message JSON whose "id" differs from the record's.
    await store.add_messages([rec("x1", "c1", "m1"), rec("x2", "c1", "x1")])
    main = await store.get_branch("c1", "main")
    assert main is not None
    assert await store.update_branch_head(main.id, "x2", "m1")
    resolved = (await a.resolve()).messages
    assert [m.id for m in resolved] == ["m1", "x1", "x2"]  # the record id is the identity
    assert [m.id for m in await make_engine().get_messages()] == ["m1", "x1", "x2"]
    await a.rewind("x1")
    assert [m.id for m in await a.get_messages()] == ["m1", "x1"]


async def test_many_engines_interleaved(
    store: SqlContextStore, make_engine: EngineFactory, peer: EngineFactory
) -> None:
    engines = [make_engine() if i % 2 else peer() for i in range(4)]
    for step in range(12):
        writer = engines[step % 4]
        if step % 3 == 2:
            writer.set(assistant_text(f"edit {step}", id="m0"))
            await writer.save(branch=False)
        else:
            writer.set(user(f"q{step}", id=f"m{step}"))
            await writer.save()
        for engine in engines:
            await assert_in_sync(store, engine)
    assert len({tuple(m.id for m in await e.get_messages()) for e in engines}) == 1


async def test_switching_back_after_a_rewind_sees_what_changed_meanwhile(
    store: SqlContextStore, make_engine: EngineFactory, peer: EngineFactory
) -> None:
    a, b = make_engine(), peer()
    a.set(*(user(f"q{i}", id=f"m{i}") for i in range(1, 6)))
    await a.save()
    await a.resolve()
    await a.rewind("m2")  # m3..m5 leave A's chain
    await b.get_messages()
    b.set(user("m4 edited", id="m4"))
    await b.save(branch=False)  # on main, while A is elsewhere
    a.set(user("on the fork", id="f1"))
    await a.save()
    assert [m.id for m in await assert_in_sync(store, a)] == ["m1", "m2", "f1"]

    await a.switch_branch("main")
    resolved = await assert_in_sync(store, a)
    assert texts(resolved) == ["q1", "q2", "q3", "m4 edited", "q5"]
    await a.switch_branch("main-v2")
    assert [m.id for m in await assert_in_sync(store, a)] == ["m1", "m2", "f1"]
    # Back and forth again, with a re-parenting in between.
    await store.set_message_parent("m5", "m3")
    await a.switch_branch("main")
    assert [m.id for m in await assert_in_sync(store, a)] == ["m1", "m2", "m3", "m5"]


async def test_rewinds_back_and_forth_along_one_chain(
    store: SqlContextStore, make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = make_engine()
    a.set(*(user(f"q{i}", id=f"m{i}") for i in range(1, 9)))
    await a.save()
    await a.resolve()
    loads: list[str] = []
    load_chain = store.load_chain_rows

    async def counting(chat_id: str, head_id: str, **options: Any) -> ChainRows:
        loads.append(head_id)
        return await load_chain(chat_id, head_id, **options)

    monkeypatch.setattr(store, "load_chain_rows", counting)
    await a.rewind("m6")
    await a.rewind("m3")  # main-v3
    seen = {}
    for name in ("main", "main-v2", "main-v3", "main"):
        await a.switch_branch(name)  # to the cut tails, re-attached (the first time as one)
        seen[name] = [m.id for m in (await a.resolve()).messages]
    monkeypatch.undo()
    assert seen == {
        "main": [f"m{i}" for i in range(1, 9)],
        "main-v2": [f"m{i}" for i in range(1, 7)],
        "main-v3": ["m1", "m2", "m3"],
    }
    await assert_in_sync(store, a)
    assert loads == []  # the engine never read the chain again: it kept what it had cut


async def test_cold_engine_loads_once_then_catches_up_incrementally(
    store: SqlContextStore, make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = make_engine()
    writer.set(*(user(f"q{i}", id=f"m{i}") for i in range(20)))
    await writer.save()
    changes: list[int] = []
    loads: list[str] = []
    get_changes, load_chain = store.get_changes, store.load_chain_rows

    async def counting_changes(chat_id: str, since_version: int) -> list[MessageRecord]:
        found = await get_changes(chat_id, since_version)
        changes.append(len(found))
        return found

    async def counting_loads(chat_id: str, head_id: str, **options: Any) -> ChainRows:
        loads.append(head_id)
        return await load_chain(chat_id, head_id, **options)

    monkeypatch.setattr(store, "get_changes", counting_changes)
    monkeypatch.setattr(store, "load_chain_rows", counting_loads)
    store.chain_memory.clear()  # cold: the store holds no decoded chain of the chat
    reader = make_engine()
    await reader.resolve()
    assert loads == ["m19"]
    await reader.resolve()
    assert changes == []  # nothing changed: one small query, no rows
    writer.set(user("new", id="n1"), assistant_text("newer", id="n2"))
    await writer.save()
    assert [m.id for m in (await reader.resolve()).messages][-2:] == ["n1", "n2"]
    assert changes == [2] and loads == ["m19"]  # only the two new rows were read
    reader.set(user("own", id="o1"))
    await reader.save()
    await reader.resolve()
    assert changes == [2] and loads == ["m19"]  # after its own save: nothing to read


async def test_a_long_chain_decodes_in_batches_and_names_a_bad_message(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    # More messages than one decoding batch: a message far along the chain whose JSON carries
    # another id keeps its record id, and one that is not a Message is named in the error.
    records = []
    for i in range(1203):
        record = rec(f"n{i}", "c1", f"n{i - 1}" if i else None)
        if i == 1100:
            record = rec("n1100", "c1", "n1099", data={"id": "other", "role": "user", "parts": []})
        records.append(record)
    a = make_engine()
    await a.resolve()
    await store.add_messages(records)
    main = await store.get_branch("c1", "main")
    assert main is not None
    assert await store.update_branch_head(main.id, "n1202", None)
    messages = (await make_engine().resolve()).messages
    assert [m.id for m in messages] == [f"n{i}" for i in range(1203)]
    assert messages[1100].parts == []
    bad = rec("n1203", "c1", "n1202", data={"id": "n1203", "role": "robot", "parts": []})
    await store.add_messages([bad])
    assert await store.update_branch_head(main.id, "n1203", "n1202")
    with pytest.raises(CorruptDataError, match="'n1203'"):
        await make_engine().resolve()
