"""AgentContextSession driven by the real ``agents.Runner`` with a scripted model."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from agents import Runner, SQLiteSession
from agents.memory import Session

from agentcontext import (
    ContextEngine,
    InvalidInputError,
    InvalidTypeError,
    SqlContextStore,
    ToolPart,
)
from agentcontext.integrations.openai_agents import ITEM_KEY, AgentContextSession
from tests.integrations.agents_helpers import ScriptedModel, build_agent, call, turn

ROOT = Path(__file__).resolve().parents[2]


async def run_two_turns(session: Any) -> ScriptedModel:
    model = ScriptedModel(turn(1, "Paris") + turn(2, "Tokyo"))
    agent = build_agent(model)
    first = await Runner.run(agent, "What's the weather in Paris?", session=session)
    assert first.final_output == "Paris: sunny, 24 °C."
    second = await Runner.run(agent, "And Tokyo?", session=session)
    assert second.final_output == "Tokyo: rainy, 18 °C."
    return model


async def test_runner_turns_are_stored_as_the_sdk_own_session_stores_them(
    tmp_path: Path,
) -> None:
    reference = SQLiteSession("trip")  # the SDK's own session, in memory
    await run_two_turns(reference)
    expected = await reference.get_items()

    async with SqlContextStore(f"sqlite+aiosqlite:///{tmp_path / 'a.db'}") as store:
        session = AgentContextSession("trip", store=store, user_id="u1")
        assert isinstance(session, Session)
        model = await run_two_turns(session)
        items = await session.get_items()
        assert items == expected
        assert [item.get("type", "message") for item in items] == [
            "message",
            "reasoning",
            "function_call",
            "function_call_output",
            "message",
        ] * 2
        # The second turn's model call saw the first turn, reasoning included.
        assert model.inputs[2][: len(expected) // 2] == expected[: len(expected) // 2]
        assert await session.get_items(limit=2) == expected[-2:]
        assert await session.get_items(limit=0) == []

        # The graph holds the meaning of each item, and resolve() sends each call once.
        engine = ContextEngine(store=store, chat_id="trip", user_id="u1")
        messages = await engine.get_messages()
        assert [m.role for m in messages] == ["user", *["assistant"] * 4] * 2
        assert messages[0].text == "What's the weather in Paris?"
        assert all(m.metadata and ITEM_KEY in m.metadata for m in messages)
        sent = (await engine.resolve()).to_openai()
        calls = [c for m in sent if m["role"] == "assistant" for c in m.get("tool_calls", [])]
        assert [c["id"] for c in calls] == ["call_1", "call_2"]
        assert [c["function"]["name"] for c in calls] == ["get_weather"] * 2
        tool_results = [m["content"] for m in sent if m["role"] == "tool"]
        assert tool_results == ["sunny, 24 °C", "rainy, 18 °C"]


async def test_pop_moves_the_head_back_and_clear_keeps_the_history(tmp_path: Path) -> None:
    async with SqlContextStore(f"sqlite+aiosqlite:///{tmp_path / 'a.db'}") as store:
        session = AgentContextSession("trip", store=store, user_id="u1")
        assert await session.pop_item() is None
        await run_two_turns(session)
        before = await session.get_items()
        head = session.engine.head_message_id
        assert head is not None

        popped = await session.pop_item()
        assert popped == before[-1]
        assert await session.get_items() == before[:-1]
        # Nothing deleted: the popped node is still stored, reachable from the old branch.
        assert await store.get_message(head) is not None
        branches = {b.name: b for b in await store.list_branches("trip")}
        assert branches["main"].head_message_id == head
        assert session.engine.branch != "main"

        await session.add_items([{"role": "user", "content": "Thanks!"}])
        assert (await session.get_items())[-1] == {"role": "user", "content": "Thanks!"}

        await session.clear_session()
        assert await session.get_items() == []
        assert branches["main"].message_count == len(before)
        # The history is all still there.
        assert await store.get_message(head) is not None
        await session.clear_session()  # clearing an empty session changes nothing
        assert len(await store.list_branches("trip")) == 3

        # Popping the first item of a branch leaves an empty branch.
        await session.add_items([{"role": "user", "content": "Hi"}])
        assert await session.pop_item() == {"role": "user", "content": "Hi"}
        assert await session.get_items() == []


async def test_a_new_process_resumes_from_the_same_sqlite_file(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'a.db'}"
    async with SqlContextStore(url) as store:
        session = AgentContextSession("trip", store=store, user_id="u1")
        model = ScriptedModel(turn(1, "Paris"))
        await Runner.run(build_agent(model), "What's the weather in Paris?", session=session)
        stored = await session.get_items()

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "tests.integrations.agents_resume", url],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["output"] == "Tokyo: rainy, 18 °C."
    # The new process sent the stored history to its model, then its own turn.
    assert out["first_input"][: len(stored)] == stored
    assert out["items"][: len(stored)] == stored
    assert len(out["items"]) == 2 * len(stored)


async def test_session_arguments_are_checked(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="store"):
        AgentContextSession("x")
    async with SqlContextStore(f"sqlite+aiosqlite:///{tmp_path / 'a.db'}") as store:
        engine = ContextEngine(store=store, chat_id="c", user_id="u")
        with pytest.raises(InvalidInputError, match="chat"):
            AgentContextSession("other", engine=engine)
        session = AgentContextSession(engine=engine)
        assert session.session_id == "c"
        # SDK output objects are taken in their input form, as the SDK's own sessions do.
        item = call("call_7", "Oslo")
        await session.add_items([item])  # type: ignore[list-item]
        assert await session.get_items() == [item.model_dump(exclude_unset=True, mode="json")]
        [stored] = await engine.get_messages()
        assert stored.parts[0] == ToolPart(
            tool_call_id="call_7",
            tool_name="get_weather",
            input={"city": "Oslo"},
            state="input-available",
        )
        with pytest.raises(InvalidTypeError, match="dict"):
            await session.add_items([42])  # type: ignore[list-item]
