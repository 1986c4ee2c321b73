"""The store's memory of decoded chains (``cache_bytes``): a fresh engine starts from what
another engine of the same store decoded, and still resolves exactly what is stored.

Every check compares a fresh engine on the store with the memory against a fresh engine on a
store that keeps none (``cache_bytes=0``) over the same database. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agentcontext import (
    ChatExport,
    ChatNotFoundError,
    ContextEngine,
    ContextError,
    InvalidInputError,
    InvalidTypeError,
    Message,
    SqlContextStore,
    assistant_text,
    user,
)
from tests.conftest import run_sync


def engine(store: SqlContextStore, chat: str = "c1") -> ContextEngine:
    return ContextEngine(store=store, chat_id=chat, user_id="u1")


async def fresh_view(store: SqlContextStore, chat: str = "c1") -> list[Message]:
    return (await engine(store, chat).resolve()).messages


async def summarize(messages: list[Message]) -> str:
    return "summary of " + ",".join(m.id for m in messages)


async def test_a_fresh_engine_starts_from_the_chain_another_one_decoded(store_url: str) -> None:
    async with (
        SqlContextStore(store_url) as store,
        SqlContextStore(store_url, cache_bytes=0) as plain,
    ):
        writer = engine(store)
        writer.set(*(user(f"q{i}", id=f"m{i}") for i in range(50)))
        await writer.save()
        memory = store.chain_memory
        first = await fresh_view(store)
        hits = memory.hits
        second = await fresh_view(store)
        assert memory.hits == hits + 1
        assert second == first == await fresh_view(plain)
        assert len(memory) >= 1 and 0 < memory.size <= memory.max_bytes
        assert plain.chain_memory.hits == 0 and len(plain.chain_memory) == 0


async def test_what_others_wrote_since_is_read_not_the_history(store_url: str) -> None:
    async with (
        SqlContextStore(store_url) as store,
        SqlContextStore(store_url, cache_bytes=0) as other,
    ):
        writer = engine(store)
        writer.set(*(user(f"q{i}", id=f"m{i}") for i in range(20)))
        await writer.save()
        await fresh_view(store)
        # Another process adds a turn and rewrites a message in place.
        peer = engine(other)
        peer.set(user("new", id="m20"), assistant_text("answer", id="m21"))
        await peer.save()
        peer.set(user("q3 edited", id="m3"))
        await peer.save(branch=False)
        hits = store.chain_memory.hits
        seen = await fresh_view(store)
        assert store.chain_memory.hits == hits + 1  # caught up from the memory
        assert seen == await fresh_view(other)
        assert seen[3].text == "q3 edited" and [m.id for m in seen[-2:]] == ["m20", "m21"]


async def test_a_rolled_back_turn_is_never_remembered(store_url: str) -> None:
    async with (
        SqlContextStore(store_url) as store,
        SqlContextStore(store_url, cache_bytes=0) as plain,
    ):
        writer = engine(store)
        writer.set(user("q0", id="m0"))
        await writer.save()
        await fresh_view(store)
        async with store.begin() as conn:
            inside = engine(store)
            inside.set(user("rolled back", id="m1"))
            await inside.save()
            assert [m.id for m in await fresh_view(store)] == ["m0", "m1"]
            await conn.rollback()
        assert [m.id for m in await fresh_view(store)] == ["m0"]
        assert await fresh_view(store) == await fresh_view(plain)


async def test_a_chat_deleted_and_created_again_is_another_chat(store_url: str) -> None:
    async with SqlContextStore(store_url) as store, SqlContextStore(store_url) as other:
        writer = engine(store)
        writer.set(user("old text", id="m0"))
        await writer.save()
        await fresh_view(store)
        await fresh_view(other)  # the other store remembers it too
        assert len(other.chain_memory) == 1
        assert await other.delete_chat("c1")
        assert len(other.chain_memory) == 0  # forgotten at the delete
        again = engine(other)
        again.set(user("new text", id="m0"))
        await again.save()
        # The store that still holds the old chat's chain sees the new one.
        assert [m.text for m in await fresh_view(store)] == ["new text"]
        assert [m.text for m in await fresh_view(other)] == ["new text"]


async def test_removals_leave_no_decoded_copy_in_any_store_of_the_process(
    store_url: str,
) -> None:
    """``erase_user``, ``purge`` and ``delete_chat`` through one store drop what every store
    of the process holds of those chats (decoded chains and outlines), not only its own."""
    async with SqlContextStore(store_url) as store_a, SqlContextStore(store_url) as store_b:
        for chat in ("e1", "e2", "kept"):
            writer = ContextEngine(
                store=store_a, chat_id=chat, user_id="gone" if chat != "kept" else "u1"
            )
            writer.set(user(f"secret of {chat}", id=f"{chat}-m0"))
            await writer.save()
        for chat, owner in (("e1", "gone"), ("e2", "gone"), ("kept", "u1")):
            await ContextEngine(store=store_b, chat_id=chat, user_id=owner).resolve()
            await store_b.graph_outline(chat)
        held = {e.chat_key[0] for entries in store_b.chain_memory._chats.values() for e in entries}
        assert held == {"e1", "e2", "kept"}
        report = await store_a.erase_user("gone")
        assert sorted(report.chat_ids) == ["e1", "e2"]
        held = {e.chat_key[0] for entries in store_b.chain_memory._chats.values() for e in entries}
        assert held == {"kept"}
        assert set(store_b._memory.outlines._held) == {"kept"}
        await store_a.purge("kept")
        assert len(store_b.chain_memory) == 0
        assert not store_b._memory.outlines._held
        await ContextEngine(store=store_b, chat_id="kept", user_id="u1").resolve()
        assert await store_a.delete_chat("kept")
        assert len(store_b.chain_memory) == 0


async def test_the_memory_stays_within_its_bound(store_url: str) -> None:
    bound = 40_000
    async with SqlContextStore(store_url, cache_bytes=bound) as store:
        for chat in range(8):
            writer = engine(store, f"chat-{chat}")
            writer.set(*(user("x" * 400, id=f"c{chat}-m{i}") for i in range(10)))
            await writer.save()
            await fresh_view(store, f"chat-{chat}")
            assert store.chain_memory.size <= bound
        assert 0 < len(store.chain_memory) < 8  # the least recently used chats went first


async def test_a_growing_branch_is_held_once(store_url: str) -> None:
    """Each turn of a fresh engine leaves the longer chain; the shorter one it outgrew is
    dropped (the copies share their messages), so many chats fit the bound and every turn
    after the first starts from memory."""
    turns, chats = 6, 5
    async with SqlContextStore(store_url) as store:
        memory = store.chain_memory
        for chat in range(chats):
            writer = engine(store, f"g{chat}")
            writer.set(*(user(f"q{i}", id=f"g{chat}-m{i}") for i in range(20)))
            await writer.save()
        hits = memory.hits
        for turn in range(turns):
            for chat in range(chats):
                context = engine(store, f"g{chat}")
                await context.resolve()
                context.set(user(f"t{turn}", id=f"g{chat}-t{turn}"))
                await context.save()
        assert memory.hits - hits == turns * chats
        assert len(memory) == chats  # one chain per chat, not one per version
        # A branch forked off one of them is a chain of its own, held beside it.
        context = engine(store, "g0")
        await context.rewind("g0-m10")
        context.set(user("other way", id="g0-fork"))
        await context.save()
        assert len(memory) == chats + 1
        assert [m.id for m in await fresh_view(store, "g0")][-2:] == ["g0-m10", "g0-fork"]


async def test_an_engine_per_request_reads_no_changes_on_a_long_chat(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine made per request saves once and leaves its chain in the memory, however
    long the chat (here longer than `CHEAP_COPY`): the next request's engine starts from
    exactly that chain, with no read of the changes since, and resolves what is stored."""
    from sqlalchemy import event

    from agentcontext import _conversation

    monkeypatch.setattr(_conversation, "CHEAP_COPY", 5)
    async with (
        SqlContextStore(store_url) as store,
        SqlContextStore(store_url, cache_bytes=0) as plain,
    ):
        seed = engine(store, "long")
        seed.set(*(user(f"q{i}", id=f"l{i}") for i in range(20)))
        await seed.save()
        statements: list[str] = []

        def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            statements.append(" ".join(statement.split()))

        event.listen(store.engine.sync_engine, "before_cursor_execute", seen)
        try:
            for turn in range(8):
                request = engine(store, "long")
                request.set(user(f"turn {turn}", id=f"r{turn}"))
                await request.save()
        finally:
            event.remove(store.engine.sync_engine, "before_cursor_execute", seen)
        changes = [s for s in statements if "messages.version >" in s]
        assert changes == []
        expected = [f"l{i}" for i in range(20)] + [f"r{turn}" for turn in range(8)]
        assert [m.id for m in await fresh_view(store, "long")] == expected
        assert [m.id for m in await fresh_view(plain, "long")] == expected


async def test_a_save_goes_after_what_another_engine_saved_meanwhile(store_url: str) -> None:
    """Two engines of one store resolve the same head; the second to save finds in the memory
    the chain the first one saved and goes after it with one write: no refused write, no read
    of the head it lost to. What is stored is what the race would have stored."""
    from sqlalchemy import event

    async with (
        SqlContextStore(store_url) as store,
        SqlContextStore(store_url, cache_bytes=0) as plain,
    ):
        seed = engine(store)
        seed.set(user("hello", id="s1"), assistant_text("hi", id="s2"))
        await seed.save()
        first, second = engine(store), engine(store)
        await first.resolve()
        await second.resolve()
        first.set(user("one", id="a1"), assistant_text("first answer", id="a2"))
        await first.save()

        statements: list[str] = []
        sync_engine = store.engine.sync_engine

        def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            statements.append(statement)

        event.listen(sync_engine, "before_cursor_execute", seen)
        try:
            second.set(user("two", id="b1"), assistant_text("second answer", id="b2"))
            saved = await second.save()
        finally:
            event.remove(sync_engine, "before_cursor_execute", seen)
        # (MariaDB's append is one compound statement, BEGIN NOT ATOMIC ... END.)
        writes = [
            s
            for s in statements
            if s.lstrip().upper().startswith(("INSERT", "WITH", "BEGIN NOT ATOMIC"))
        ]
        assert len(writes) == 1, statements
        assert saved.head_message_id == "b2"
        ids = ["s1", "s2", "a1", "a2", "b1", "b2"]
        assert [m.id for m in (await second.resolve()).messages] == ids
        assert [m.id for m in await fresh_view(plain)] == ids

        # A stale engine whose pending ids the newer chain already holds (a retried save)
        # does not take it: the store decides, as before.
        third, late = engine(store), engine(store)
        await third.resolve()
        await late.resolve()
        third.set(user("three", id="c1"))
        await third.save()
        late.set(user("three", id="c1"))
        await late.save()
        assert [m.id for m in await fresh_view(plain)] == [*ids, "c1"]


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (-1, InvalidInputError),
        (2**60, InvalidInputError),
        ("big", InvalidTypeError),
        (True, InvalidTypeError),
    ],
)
def test_cache_bytes_is_checked(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="cache_bytes"):
        SqlContextStore("sqlite+aiosqlite:///:memory:", cache_bytes=value)


STEPS = ["turn", "peer-turn", "fresh-turn", "edit", "rewind", "compact", "switch", "view"]
STEPS += ["export", "restore", "recreate", "copy-into", "erase"]
OPS = st.lists(
    st.tuples(
        st.sampled_from(STEPS),
        st.integers(min_value=0, max_value=1000),
    ),
    min_size=1,
    max_size=14,
)


@pytest.mark.usefixtures("store")
@settings(
    max_examples=int(os.environ.get("AGENTCONTEXT_MEMORY_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=OPS, cheap=st.sampled_from([2000, 3]))
@example(
    ops=[("turn", 0), ("view", 0), ("rewind", 1), ("view", 0), ("turn", 0), ("switch", 0)],
    cheap=2000,
)
@example(
    ops=[("turn", 0), ("turn", 0), ("compact", 0), ("view", 0), ("edit", 3), ("turn", 1)],
    cheap=2000,
)
@example(  # restored from before an in-place edit: a long-lived engine that saw the edit
    # must not leave it in the memory as the restored chat's (same head, creation time, ids)
    ops=[("turn", 0), ("export", 0), ("edit", 0), ("view", 0), ("restore", 0), ("view", 0)],
    cheap=2000,
)
@example(  # ... nor once the restored chat reaches the version the memory holds the edit at
    ops=[("turn", 0), ("export", 0), ("edit", 0), ("peer-turn", 0), ("restore", 0)]
    + [("peer-turn", 0)] * 6,
    cheap=2000,
)
@example(  # a long-lived engine of the restored chat must not put its chain back
    ops=[("turn", 0), ("export", 0), ("edit", 1), ("turn", 0), ("restore", 0), ("turn", 0)],
    cheap=2000,
)
@example(  # engines made per request on a chat longer than CHEAP_COPY, among a long-lived one
    ops=[
        ("turn", 0),
        ("turn", 0),
        ("fresh-turn", 0),
        ("turn", 0),
        ("rewind", 1),
        ("fresh-turn", 0),
        ("edit", 2),
        ("fresh-turn", 0),
        ("view", 0),
    ],
    cheap=3,
)
@example(
    ops=[("turn", 0), ("recreate", 0), ("view", 0), ("turn", 0), ("erase", 0), ("turn", 0)],
    cheap=2000,
)
@example(ops=[("turn", 0), ("export", 0), ("turn", 0), ("copy-into", 0), ("view", 0)], cheap=2000)
def test_fresh_engines_always_resolve_what_is_stored(
    store_url: str, ops: list[tuple[str, int]], cheap: int
) -> None:
    """Random writes by engines of this store and of another one (a process without the
    memory), rewinds, compactions and branch switches, and the chat deleted and created again
    by another process: restored from an export (same creation time, branch and message ids,
    its version starting over), re-created by a new first save, copied into its id, erased
    with its user. After each step, a fresh engine of the store with the memory resolves
    exactly what a fresh engine without it resolves; a long-lived engine of a chat deleted
    under it says so (and is replaced), never serving or remembering the old chat.

    More examples: ``AGENTCONTEXT_MEMORY_EXAMPLES=500``."""
    from agentcontext import _conversation

    chat = f"p-{uuid.uuid4().hex[:10]}"
    saved, _conversation.CHEAP_COPY = _conversation.CHEAP_COPY, cheap
    try:
        run_sync(lambda: _scenario(store_url, chat, ops))
    finally:
        _conversation.CHEAP_COPY = saved


async def _scenario(url: str, chat: str, ops: list[tuple[str, int]]) -> None:
    counter = itertools.count()
    exports: list[ChatExport] = []
    async with SqlContextStore(url) as store, SqlContextStore(url, cache_bytes=0) as other:
        mine = engine(store, chat)
        for op, n in ops:
            try:
                await _step(store, other, mine, chat, counter, op, n, exports)
            except ChatNotFoundError as exc:
                if "was deleted while this engine had it open" in str(exc):
                    # The chat was deleted (and maybe created again) under the long-lived
                    # engine: it says so and stays out of it; a new engine takes over.
                    mine = engine(store, chat)
            except ContextError:
                pass  # a refused step (documented) changes nothing
            with_memory = await fresh_view(store, chat)
            without = await fresh_view(other, chat)
            assert with_memory == without, (op, n)
        await asyncio.sleep(0)


async def _step(
    store: SqlContextStore,
    other: SqlContextStore,
    mine: ContextEngine,
    chat: str,
    counter: Iterator[int],
    op: str,
    n: int,
    exports: list[ChatExport],
) -> None:
    if op == "export":
        exports.append(await other.export_chat(chat))
        await other.delete_chat(f"{chat}-copy")
        await other.copy_chat(chat, f"{chat}-copy")
    elif op == "restore" and exports:
        await other.delete_chat(chat)
        await other.import_chat(exports[n % len(exports)])
    elif op == "recreate":
        chain = await fresh_view(other, chat)
        await other.delete_chat(chat)
        peer = engine(other, chat)
        peer.set(*(user(f"again {n}", id=m.id) for m in chain[:2]))
        if chain:
            await peer.save()
    elif op == "copy-into" and exports:
        await other.delete_chat(chat)
        await other.copy_chat(f"{chat}-copy", chat)
    elif op == "erase":
        await other.erase_user("u1")
    elif op in ("turn", "peer-turn", "fresh-turn"):
        # This store's long-lived engine, another process's, or one made per request.
        writer = {"turn": mine, "peer-turn": engine(other, chat)}.get(op) or engine(store, chat)
        k = next(counter)
        writer.set(user(f"q{k}", id=f"{chat}-{k}"), assistant_text(f"a{k}"))
        await writer.save()
    elif op == "edit":
        chain = await fresh_view(other, chat)
        if chain:
            target = chain[n % len(chain)]
            make = user if target.role == "user" else assistant_text
            peer = engine(other, chat)
            peer.set(make(f"edited {n}", id=target.id))
            await peer.save(branch=False)
    elif op == "view":
        await mine.resolve()
    elif op == "rewind":
        chain = await mine.get_messages()
        if chain:
            await mine.rewind(chain[n % len(chain)].id)
    elif op == "compact":
        if len(await mine.get_messages()) >= 2:
            await mine.compact(summarize, keep_last_turns=n % 2)
    elif op == "switch":
        branches = await store.list_branches(chat)
        if branches:
            await mine.switch_branch(branches[n % len(branches)].name)
