"""Each defect found by an adversarial user, reproduced on SQLite and PostgreSQL.

1. A retried save (its commit unacknowledged) stored the turn twice and forked a branch.
2. One cancelled call wiped the in-memory store.
3. (Search parity: ``tests/store/test_search_parity.py``.)
4. Out-of-range numbers gave raw ``OverflowError``/``ValueError`` or generic database errors.
5. One store used from two event loops gave raw ``RuntimeError``s or hung.
6. ``import_chat`` validated unevenly.
7. Closed and unclosed stores misbehaved.
8. ``get_message_chain("unknown")`` raised (renderer cases: ``tests/unit/test_render_*``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import threading
import warnings
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from agentcontext import (
    BranchExistsError,
    ContextEngine,
    InMemoryContextStore,
    InvalidGraphError,
    InvalidInputError,
    SqlContextStore,
    StoreClosedError,
    StoreError,
    StoreUnavailableError,
    assistant_text,
    user,
)
from agentcontext.store import AppendResult, ChatExport, MessageRecord
from agentcontext.store._db.errors import driver_threads

# --- 1. retried saves ------------------------------------------------------------------------


class LostAcknowledgement:
    """Wraps a store method: the call happens, then the caller is told it did not."""

    def __init__(self, store: SqlContextStore, method: str, error: type[BaseException]) -> None:
        self.store, self.method, self.error = store, method, error
        self.real = getattr(store, method)
        self.armed = 1

    async def __call__(self, *args: Any, **kwargs: Any) -> AppendResult:
        result = await self.real(*args, **kwargs)
        if self.armed:
            self.armed -= 1
            raise self.error()
        return result  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "error", [asyncio.CancelledError, TimeoutError, StoreUnavailableError], ids=str
)
async def test_a_retried_save_stores_the_turn_once(
    store: SqlContextStore, monkeypatch: pytest.MonkeyPatch, error: type[BaseException]
) -> None:
    engine = ContextEngine(store=store, chat_id="retry", user_id="u")
    engine.set(user("first"), assistant_text("one"))
    await engine.save()
    monkeypatch.setattr(store, "append_turn", LostAcknowledgement(store, "append_turn", error))
    engine.set(user("second"), assistant_text("two"))
    if error is StoreUnavailableError:
        # A connection lost after the commit: the save finds its turn stored and returns.
        await engine.save()
    else:
        with pytest.raises(error):
            await engine.save()
        assert [m.text for m in await engine.get_messages()][-2:] == ["second", "two"]
        await engine.save()  # the documented recovery: save the same pending messages again
    assert engine.pending == []
    assert engine.branch == "main"
    graph = await store.get_graph("retry")
    assert [n.preview for n in graph.nodes] == ["first", "one", "second", "two"]
    assert [b.name for b in graph.branches] == ["main"]
    # And a new engine agrees.
    fresh = ContextEngine(store=store, chat_id="retry", user_id="u")
    assert [m.text for m in await fresh.get_messages()] == ["first", "one", "second", "two"]


async def test_a_retried_begin_turn_returns_the_same_placeholder(
    store: SqlContextStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = ContextEngine(store=store, chat_id="turn", user_id="u")
    question = user("a question")
    # An engine's first save reads the chat's version back (append_messages), later ones
    # do not (append_turn): the acknowledgement of whichever writes this turn is lost.
    for method in ("append_turn", "append_messages"):
        lost = LostAcknowledgement(store, method, asyncio.CancelledError)
        monkeypatch.setattr(store, method, lost)
    with pytest.raises(asyncio.CancelledError):
        await engine.begin_turn(question)
    assert engine.pending == []  # the queue is as it was before the call
    placeholder = await engine.begin_turn(question)  # the same fragment again
    await engine.complete_turn(assistant_text("the answer"))
    graph = await store.get_graph("turn")
    assert [n.preview for n in graph.nodes] == ["a question", "the answer"]
    assert graph.nodes[-1].id == placeholder
    assert len(graph.branches) == 1


async def test_a_retried_complete_turn_updates_once(
    store: SqlContextStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = ContextEngine(store=store, chat_id="complete", user_id="u")
    placeholder = await engine.begin_turn(user("q"))
    answer = assistant_text("a")
    monkeypatch.setattr(
        store, "add_messages", LostAcknowledgement(store, "add_messages", TimeoutError)
    )
    with pytest.raises(TimeoutError):
        await engine.complete_turn(answer)
    await engine.complete_turn(answer)
    messages = await store.get_messages("complete")
    assert [m.id for m in messages] == [messages[0].id, placeholder]
    assert messages[-1].data["parts"][0]["text"] == "a"


async def test_resending_other_content_still_forks(store: SqlContextStore) -> None:
    """The retry rule does not swallow a real edit: other content under a stored id forks."""
    engine = ContextEngine(store=store, chat_id="edit", user_id="u")
    engine.set(user("hello", id="u1"), assistant_text("hi", id="a1"))
    await engine.save()
    engine.set(user("hello again", id="u1"))
    await engine.save()
    assert engine.branch == "main-v2"
    assert [m.text for m in await engine.get_messages()] == ["hello again"]


# --- 2. the in-memory store ---------------------------------------------------------------------


async def test_a_cancelled_call_keeps_the_in_memory_store() -> None:
    async with InMemoryContextStore() as store:
        await store.create_chat("c", user_id="u")
        for timeout in (0.0000001, 0.0003, 0.001):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(store.get_chat("c"), timeout)
            assert await store.get_chat("c") is not None
            assert await store.list_chats() != []


# --- 4. numbers ----------------------------------------------------------------------------------

NUMBER_CALLS = {
    "list_chats limit 2**63": lambda s: s.list_chats(limit=2**63),
    "list_chats limit 2**31": lambda s: s.list_chats(limit=2**31),
    "list_chats offset 2**63": lambda s: s.list_chats(offset=2**63),
    "search limit 2**63": lambda s: s.search_messages("n", "x", limit=2**63),
    "search limit 2**31": lambda s: s.search_user_messages("u", "x", limit=2**31),
    "get_changes 2**63": lambda s: s.get_changes("n", 2**63),
    "metadata filter 2**70": lambda s: s.list_chats(metadata={"a": 2**70}),
    "message part 10**5000": lambda s: s.add_message(
        MessageRecord(
            id="big",
            chat_id="n",
            name="user",
            data={
                "id": "big",
                "role": "user",
                "parts": [{"type": "data", "name": "n", "data": 10**5000}],
            },
        )
    ),
    "chat metadata 10**5000": lambda s: s.create_chat("big", user_id="u", metadata={"n": 10**5000}),
}


@pytest.mark.parametrize("call", NUMBER_CALLS, ids=list(NUMBER_CALLS))
async def test_out_of_range_numbers_are_refused_cleanly(store: SqlContextStore, call: str) -> None:
    await store.create_chat("n", user_id="u")
    before = await store.export_chat("n")
    with pytest.raises(InvalidInputError) as caught:
        await NUMBER_CALLS[call](store)
    assert not isinstance(caught.value, StoreError)
    assert await store.export_chat("n") == before
    assert await store.get_chat("big") is None


async def test_a_2_to_the_63_minus_1_limit_is_fine(store: SqlContextStore) -> None:
    with pytest.raises(InvalidInputError, match="at most"):
        await store.list_chats(limit=2**63 - 1)
    assert await store.list_chats(limit=2**31 - 1) == []
    assert await store.get_changes("missing-is-fine", 2**63 - 1) == []


# --- 5. event loops ------------------------------------------------------------------------------


def test_one_store_in_two_event_loops_is_a_clear_error(store_url: str) -> None:
    threads = driver_threads()
    store = SqlContextStore(store_url)

    async def first() -> None:
        await store.create_chat("loops", user_id="u")

    async def second() -> None:
        with pytest.raises(StoreError, match="another event loop"):
            await store.get_chat("loops")

    asyncio.run(first())
    asyncio.run(second())
    asyncio.run(store.close())  # no raw RuntimeError either
    # SQLite's connections are closed even so: no driver thread is left to report, later, to
    # an event loop that has closed.
    for thread in driver_threads() - threads:
        thread.join(timeout=10)
        assert not thread.is_alive()


def test_one_store_in_two_threads_never_hangs(store_url: str) -> None:
    store = SqlContextStore(store_url)
    errors: list[BaseException] = []

    async def use(name: str) -> None:
        try:
            await store.upsert_chat(name, user_id="u")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=asyncio.run, args=(use(f"t{i}"),)) for i in range(2)]
    asyncio.run(use("main-loop"))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive(), "a thread hung"
    asyncio.run(store.close())
    assert len(errors) == 2
    assert all(isinstance(e, StoreError) and "another event loop" in str(e) for e in errors)


# --- 6. imports ------------------------------------------------------------------------------


async def _export(store: SqlContextStore) -> ChatExport:
    engine = ContextEngine(store=store, chat_id="src", user_id="u")
    engine.set(user("hello"), assistant_text("hi"))
    await engine.save()
    await engine.checkpoint("cp")
    return await store.export_chat("src")


def _renamed(export: ChatExport, suffix: str) -> ChatExport:
    """The export under fresh chat and message ids (branches and checkpoints untouched)."""
    chat = export.chat.model_copy(update={"id": f"src{suffix}"})
    messages = [
        m.model_copy(
            update={
                "id": m.id + suffix,
                "chat_id": chat.id,
                "parent_id": None if m.parent_id is None else m.parent_id + suffix,
                "data": {**m.data, "id": m.id + suffix},
            }
        )
        for m in export.messages
    ]
    return export.model_copy(
        update={
            "chat": chat,
            "messages": messages,
            "branches": [
                b.model_copy(
                    update={
                        "chat_id": chat.id,
                        "head_message_id": (b.head_message_id or "") + suffix,
                    }
                )
                for b in export.branches
            ],
            "checkpoints": [
                c.model_copy(update={"chat_id": chat.id, "message_id": c.message_id + suffix})
                for c in export.checkpoints
            ],
        }
    )


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ("checkpoint id too long", InvalidInputError),
        ("checkpoint id with NUL", InvalidInputError),
        ("branch id taken", BranchExistsError),
        ("checkpoint id taken", InvalidGraphError),
        ("created_at year 1 at +14:00", InvalidInputError),
    ],
)
async def test_import_validates_evenly(store: SqlContextStore, change: str, error: type) -> None:
    export = _renamed(await _export(store), "-copy")
    if change == "checkpoint id too long":
        export.checkpoints[0] = export.checkpoints[0].model_copy(update={"id": "c" * 10_000})
    elif change == "checkpoint id with NUL":
        export.checkpoints[0] = export.checkpoints[0].model_copy(update={"id": "c\x00p"})
    elif change == "branch id taken":
        pass  # the branch ids are the source chat's
    elif change == "checkpoint id taken":
        export.branches = [b.model_copy(update={"id": b.id + "-new"}) for b in export.branches]
    else:
        early = datetime(1, 1, 1, 5, tzinfo=timezone(timedelta(hours=14)))
        export.messages[0] = export.messages[0].model_copy(update={"created_at": early})
    if change not in ("branch id taken",):
        export.branches = [b.model_copy(update={"id": b.id + "-new"}) for b in export.branches]
    before = await store.list_chats()
    with pytest.raises(error):
        await store.import_chat(export)
    assert await store.list_chats() == before


# --- 7. closed and unclosed stores ------------------------------------------------------------


async def test_a_closed_store_says_so(store_url: str) -> None:
    store = SqlContextStore(store_url)
    engine = ContextEngine(store=store, chat_id="closed", user_id="u")
    engine.set(user("x"))
    await engine.save()
    await store.close()
    engine.set(user("y"))
    with pytest.raises(StoreClosedError, match="closed"):
        await engine.save()
    with pytest.raises(StoreClosedError, match="closed"):
        async with store:
            pass


async def test_a_missing_sqlite_directory_names_the_file(tmp_path: Path) -> None:
    store = SqlContextStore(f"sqlite+aiosqlite:///{tmp_path / 'nope' / 'x.db'}")
    with pytest.raises(StoreUnavailableError) as caught:
        await store.initialize()
    assert "server" not in str(caught.value)
    assert "nope" in str(caught.value)
    await store.close()


def test_a_store_never_closed_warns(tmp_path: Path) -> None:
    async def leak() -> None:
        store = SqlContextStore(f"sqlite+aiosqlite:///{tmp_path / 'leak.db'}")
        await store.create_chat("c", user_id="u")
        await store.engine.dispose()  # (the test's own clean-up of the connections)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(leak())
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning) for w in caught)


async def test_a_cancelled_call_logs_nothing(
    store: SqlContextStore, caplog: pytest.LogCaptureFixture
) -> None:
    await store.create_chat("quiet", user_id="u")
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    with caplog.at_level(logging.WARNING):
        for timeout in (0.00001, 0.0002, 0.001, 0.003):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(store.list_chats(), timeout)
        await asyncio.sleep(0.05)
        gc.collect()
        await asyncio.sleep(0)
    loop.set_exception_handler(None)
    assert reported == []
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
    assert await store.get_chat("quiet") is not None


# --- 8. an unknown head -------------------------------------------------------------------------


async def test_the_chain_of_an_unknown_message_is_empty(store: SqlContextStore) -> None:
    assert await store.get_message_chain("unknown") == []
