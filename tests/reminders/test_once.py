"""``once=`` latches: stored in the chat, claimed only when the reminder fires, so no engine
in any process fires one twice (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from agentcontext import (
    ContextEngine,
    Message,
    ReminderContext,
    assistant_text,
    every_n_turns,
    reminder,
    strip_reminders,
    user,
)
from agentcontext.reminders._core import ONCE_KEY
from agentcontext.store import SqlContextStore
from tests.engine.conftest import EngineFactory

WORKER = Path(__file__).with_name("once_worker.py")


async def user_texts(store: SqlContextStore, chat_id: str = "c1") -> list[str]:
    records = await store.get_messages(chat_id)
    return [Message.model_validate(r.data).text for r in records if r.name == "user"]


async def test_once_fires_on_the_first_save_only(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(reminder("one-time", once="welcome"))
    engine.set(user("first"))
    await engine.save()
    engine.set(user("second"))
    await engine.save()
    assert await user_texts(store) == [
        "first\n\n<system-reminder>one-time</system-reminder>",
        "second",
    ]
    chat = await store.get_chat("c1")
    assert chat is not None
    first = (await engine.get_messages())[0]
    assert chat.metadata[ONCE_KEY]["welcome"]["message_id"] == first.id


async def test_once_stays_latched_across_engine_restarts(
    store: SqlContextStore, make_engine: EngineFactory, other_store: SqlContextStore
) -> None:
    first = make_engine()
    first.set(reminder("one-time", once="welcome"), user("first"))
    await first.save()
    for name, on in (("second", store), ("third", other_store)):
        again = make_engine(on=on)
        again.set(reminder("one-time", once="welcome"), user(name))
        await again.save()
    assert await user_texts(store) == [
        "first\n\n<system-reminder>one-time</system-reminder>",
        "second",
        "third",
    ]


async def test_a_latch_is_claimed_only_when_the_reminder_fires(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(reminder("on turn 2", when=every_n_turns(2), once="t2"))
    engine.set(reminder(lambda ctx: "", once="declines"))
    engine.set(user("turn 1"))
    await engine.save()
    chat = await store.get_chat("c1")
    assert chat is not None and ONCE_KEY not in chat.metadata
    engine.set(user("turn 2"))
    await engine.save()
    engine.set(user("turn 3"), assistant_text("a"), user("turn 4"))
    await engine.save()
    assert [t.count("on turn 2") for t in await user_texts(store)] == [0, 1, 0, 0]
    chat = await store.get_chat("c1")
    assert chat is not None and set(chat.metadata[ONCE_KEY]) == {"t2"}


async def test_two_reminders_sharing_a_latch_fire_once(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(reminder("a", once="shared"), reminder("b", once="shared"), user("hi"))
    sent = (await engine.resolve()).messages[-1]
    assert sent.text == "hi\n\n<system-reminder>a</system-reminder>"


async def test_latches_survive_other_metadata_updates(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(reminder("hello", once="hello"), user("one"))
    await engine.save()
    await engine.update_chat(title="renamed", metadata={"topic": "x"})
    await engine.track_usage({"total_tokens": 5})
    engine.set(user("two"))
    await engine.save()
    assert [t.count("hello") for t in await user_texts(store)] == [1, 0]


async def test_concurrent_engines_fire_a_latch_once_and_lose_no_turn(
    store: SqlContextStore, other_store: SqlContextStore
) -> None:
    engines = [
        ContextEngine(store=store if i % 2 else other_store, chat_id="c1", user_id="u1")
        for i in range(6)
    ]
    await engines[0].initialize()

    def counted(ctx: ReminderContext) -> str:
        return f"seen at turn {ctx.turn}"

    async def turn(i: int, engine: ContextEngine) -> Message:
        engine.set(reminder("welcome", once="welcome"), reminder(counted), user(f"user {i}"))
        sent = (await engine.resolve()).messages[-1]
        engine.set(assistant_text(f"answer {i}"))
        await engine.save()
        return sent

    sent = await asyncio.gather(*(turn(i, e) for i, e in enumerate(engines)))
    assert sum("welcome" in m.text for m in sent) == 1
    stored = {
        m.id: m for m in await ContextEngine(store=store, chat_id="c1", user_id="u1").get_messages()
    }
    assert len(stored) == 12  # every turn saved, grafted onto one chain
    for message in sent:
        assert stored[message.id] == message  # saved exactly as sent
        assert strip_reminders(message).text == message.text.split("\n\n")[0]


async def test_processes_fire_a_latch_once(store_url: str, store: SqlContextStore) -> None:
    await ContextEngine(store=store, chat_id="c1", user_id="u1").initialize()
    workers = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            str(WORKER),
            store_url,
            "c1",
            f"worker {i}",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        for i in range(4)
    ]
    for worker in workers:
        assert worker.stdout is not None
        assert (await worker.stdout.readline()).strip() == b"ready"
    for worker in workers:  # start them together
        assert worker.stdin is not None
        worker.stdin.write(b"go\n")
        await worker.stdin.drain()
    outputs = [(await w.communicate())[0].decode().split() for w in workers]
    assert [w.returncode for w in workers] == [0, 0, 0, 0]
    assert sorted(o[-1] for o in outputs) == ["fired", "quiet", "quiet", "quiet"]
    texts = await user_texts(store)
    assert len(texts) == 4
    assert sum("welcome" in t for t in texts) == 1
