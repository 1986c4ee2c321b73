"""Async means cancellable: random cancellations never damage the graph or the store.

Each round picks an operation (save, resolve, rewind, search, begin_turn, complete_turn) and
interrupts it at a random moment, by cancelling its task or by ``asyncio.wait_for``'s timeout.
An interrupted save is retried the documented way (``save()`` again with the same pending
messages; ``begin_turn``/``complete_turn`` again with the same fragment); after an interrupted
rewind a new engine takes over (a request handler would). At the end:

- every acknowledged turn is stored exactly once, on the active chain, in order;
- no branch appeared that no caller asked for (at most one per rewind), one branch is active,
  every head is a message of the chat;
- the store still works, and no connection or thread was left behind.

Encrypted stores too (``-sealed``): their key provider takes a moment for each key, and the
store lets go of the key now and then, so that calls are interrupted while they wait for it.

Seeded; ``AGENTCONTEXT_CANCEL_ROUNDS`` (default 30) and ``AGENTCONTEXT_CANCEL_SEED`` make it
longer or another run (``nox -s cancel``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from agentcontext import (
    ContextEngine,
    InMemoryContextStore,
    LocalKeyProvider,
    SqlContextStore,
    assistant_text,
    user,
)
from agentcontext.fragments import ContextFragment
from tests.conftest import require_backend, session_url

ROUNDS = int(os.environ.get("AGENTCONTEXT_CANCEL_ROUNDS", "30"))
SEED = int(os.environ.get("AGENTCONTEXT_CANCEL_SEED", "20261124"))
DELAYS = (0.0, 0.0, 0.00001, 0.0001, 0.0003, 0.001, 0.002, 0.005)


class SlowProvider:
    """A key provider that takes a moment for each key (a KMS's round trip): the awaits a
    cancellation can land in while an encrypted store fetches, makes or forgets keys."""

    def __init__(self, inner: LocalKeyProvider) -> None:
        self.inner = inner

    async def get_data_key(self, user_id: str) -> bytes | None:
        await asyncio.sleep(0.0003)
        return await self.inner.get_data_key(user_id)

    async def create_data_key(self, user_id: str) -> bytes:
        await asyncio.sleep(0.0003)
        return await self.inner.create_data_key(user_id)

    async def destroy_data_key(self, user_id: str) -> bool:
        await asyncio.sleep(0.0003)
        return await self.inner.destroy_data_key(user_id)

    async def destroyed_at(self, user_id: str) -> Any:
        return await self.inner.destroyed_at(user_id)

    def forget_cached_key(self, user_id: str) -> None:
        self.inner.forget_cached_key(user_id)


@pytest.fixture(
    params=["sqlite", "postgres", "mariadb", "memory", "sqlite-sealed", "postgres-sealed",
            "mariadb-sealed"]
)  # fmt: skip
async def cancel_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    backend, _, sealed = str(request.param).partition("-")
    keys = LocalKeyProvider(secrets.token_bytes(32), tmp_path / "keyring.db") if sealed else None
    encryption = None if keys is None else SlowProvider(keys)
    if backend == "memory":
        store: SqlContextStore = InMemoryContextStore()
    elif backend == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'cancel.db'}"
        store = SqlContextStore(url, encryption=encryption)
    else:
        require_backend(backend)
        store = SqlContextStore(session_url(backend, request), encryption=encryption)
    threads = threading.active_count()
    await store.initialize()
    yield store, request.param
    await store.close()
    if keys is not None:
        await keys.aclose()
    # aiosqlite's threads end with their connections; give them a moment.
    for _ in range(100):
        if threading.active_count() <= threads:
            break
        await asyncio.sleep(0.01)
    assert threading.active_count() <= threads, "a thread outlived the store"


class Rollback(Exception):
    """The caller rolls its transaction back on purpose."""


async def interrupted(rng: random.Random, call: Callable[[], Awaitable[Any]]) -> tuple[bool, Any]:
    """Run ``call`` and interrupt it at a random moment; ``(completed, result)``."""
    delay = rng.choice(DELAYS)
    if rng.random() < 0.5:
        try:
            return True, await asyncio.wait_for(call(), timeout=delay or 0.00001)
        except TimeoutError:
            return False, None
    task = asyncio.ensure_future(call())
    if delay:
        await asyncio.sleep(delay)
    else:
        await asyncio.sleep(0)
    task.cancel()
    try:
        return True, await task
    except asyncio.CancelledError:
        return False, None


async def until_done(call: Callable[[], Awaitable[Any]]) -> Any:
    """The documented recovery: call again (uninterrupted) until it returns."""
    return await call()


async def test_random_cancellations_leave_the_graph_whole(cancel_store: Any) -> None:
    store, backend = cancel_store
    rng = random.Random(f"{SEED}-{backend}")
    chat = f"cancel-{backend}"
    await store.upsert_chat(chat, user_id="u")  # (a first turn may be rolled back on purpose)
    engine = ContextEngine(store=store, chat_id=chat, user_id="u")
    acknowledged: list[str] = []  # texts of the turns whose save returned
    rewinds = 0
    turn = 0
    for _ in range(ROUNDS):
        op = rng.choice(
            [
                "save",
                "save",
                "save",
                "turn",
                "turn",
                "whole",
                "using",
                "resolve",
                "search",
                "rewind",
                "forget",
            ]
        )
        if op == "save":
            turn += 1
            question, answer = f"question {turn}", f"answer {turn}"
            engine.set(user(question), assistant_text(answer))
            done, _ = await interrupted(rng, engine.save)
            if not done:
                await until_done(engine.save)
            acknowledged += [question, answer]
        elif op == "turn":
            turn += 1
            question, answer = f"question {turn}", f"answer {turn}"
            asked: ContextFragment = user(question)
            done, placeholder = await interrupted(
                rng, lambda asked=asked, e=engine: e.begin_turn(asked)
            )
            if not done:
                # Retried with the same fragment, or with one built again (a new id, the same
                # words), as a retry loop that calls user("...") each time does.
                if rng.random() < 0.5:
                    asked = user(question)
                placeholder = await until_done(lambda asked=asked, e=engine: e.begin_turn(asked))
            reply = assistant_text(answer)
            done, _ = await interrupted(rng, lambda reply=reply, e=engine: e.complete_turn(reply))
            if not done:
                await until_done(lambda reply=reply, e=engine: e.complete_turn(reply))
            assert placeholder
            acknowledged += [question, answer]
        elif op == "whole":
            # A whole streaming turn (begin and complete) under one timeout; when it is
            # interrupted, the caller retries the whole turn: begin_turn and complete_turn again
            # with the same fragments, whatever of it had landed.
            turn += 1
            question, answer = f"question {turn}", f"answer {turn}"
            asked, reply = user(question), assistant_text(answer)

            async def whole(e: ContextEngine, asked: Any = asked, reply: Any = reply) -> None:
                await e.begin_turn(asked)
                await e.complete_turn(reply)

            done, _ = await interrupted(rng, lambda e=engine: whole(e))
            if not done:
                if rng.random() < 0.5:  # (built again: a new id, the same words)
                    asked, reply = user(question), assistant_text(answer)
                await until_done(lambda e=engine, a=asked, r=reply: whole(e, a, r))
            acknowledged += [question, answer]
        elif op == "using":
            # A turn saved inside the caller's own transaction, interrupted anywhere (before,
            # during or after its commit); the caller retries the whole block with the same
            # fragments. Sometimes the caller rolls back on purpose: nothing of it stays.
            turn += 1
            question, answer = f"question {turn}", f"answer {turn}"
            fragments = (user(question), assistant_text(answer))
            keep = rng.random() < 0.8

            async def in_transaction(
                e: ContextEngine, keep: bool = keep, f: Any = fragments
            ) -> None:
                async with store.begin():
                    e.clear_pending()
                    e.set(*f)
                    await e.save()
                    if not keep:
                        raise Rollback

            try:
                done, _ = await interrupted(rng, lambda e=engine: in_transaction(e))
                if not done:
                    await until_done(lambda e=engine: in_transaction(e))
            except Rollback:
                pass
            if keep:
                acknowledged += [question, answer]
            else:
                turn -= 1  # rolled back: its texts may be used again
            engine.clear_pending()
        elif op == "resolve":
            done, result = await interrupted(rng, engine.resolve)
            if done:
                assert [m.text for m in result.messages] == acknowledged
        elif op == "search":
            await interrupted(rng, lambda: store.search_messages(chat, "question"))
        elif op == "forget":
            # An encrypted store lets go of the user's key (its memory is bounded): the next
            # call waits for the provider, and may be interrupted there.
            store.db.dialect.sealer.forget("u")
        else:
            rewinds += 1
            head = engine.head_message_id
            if head is None:
                continue
            done, _ = await interrupted(rng, lambda head=head, e=engine: e.rewind(head))
            if not done:
                # Whether the branch was made is unknown to this engine: a new one (as the
                # next request's handler would) opens the chat's active branch.
                engine = ContextEngine(store=store, chat_id=chat, user_id="u")
    # Let units still running after their caller was cancelled finish.
    for _ in range(200):
        if not store.db._inflight:
            break
        await asyncio.sleep(0.01)
    assert not store.db._inflight
    fresh = ContextEngine(store=store, chat_id=chat, user_id="u")
    active = [m.text for m in await fresh.get_messages()]
    assert active == acknowledged, "a turn is missing, duplicated or out of order"
    graph = await store.get_graph(chat)
    texts = [node.preview for node in graph.nodes]
    for text in acknowledged:
        assert texts.count(text) == 1, f"{text!r} is stored {texts.count(text)} times"
    assert len(graph.branches) <= 1 + rewinds, "a branch appeared that no caller asked for"
    assert sum(b.is_active for b in graph.branches) == 1
    ids = {node.id for node in graph.nodes}
    assert all(b.head_message_id is None or b.head_message_id in ids for b in graph.branches)
    # The store still works, and holds no connection.
    fresh.set(user("after the storm"), assistant_text("calm"))
    await fresh.save()
    assert [m.text for m in (await fresh.resolve()).messages][-2:] == ["after the storm", "calm"]
    assert len(await store.search_messages(chat, "storm")) == 1
    pool = store.engine.sync_engine.pool
    if hasattr(pool, "checkedout"):  # (the in-memory store's one connection is static)
        assert pool.checkedout() == 0


async def test_a_cancelled_call_keeps_the_in_memory_database() -> None:
    async with InMemoryContextStore() as store:
        await store.create_chat("c", user_id="u")
        for delay in (0.0, 0.00001, 0.0003, 0.001):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(store.get_chat("c"), delay or 0.000001)
            assert (await store.get_chat("c")) is not None
