"""examples/pydantic_ai_agent.py: a pydantic-ai agent on TestModel, its history in agentcontext.

TestModel runs for real, offline: on a conversation without any model response it calls
every tool, then answers with the JSON of the tool results it finds in the history. So a run
that sees the stored history answers from it without calling the tool again.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from pydantic_ai import capture_run_messages
from pydantic_ai import messages as ai
from pydantic_ai.models.test import TestModel

from agentcontext import ContextEngine, Message, ReasoningPart, SqlContextStore, TextPart, ToolPart
from agentcontext.integrations.pydantic_ai import from_model_messages, to_model_messages
from tests.examples.helpers import EXAMPLES, load_example

example = load_example("pydantic_ai_agent")

WEATHER = {"city": "a", "sky": "cloudy", "celsius": 15}  # TestModel passes "a" for a str
OUTPUT = json.dumps({"get_weather": WEATHER}, separators=(",", ":"))
CALL_ID = "pyd_ai_tool_call_id__get_weather"


def essence(messages: list[ai.ModelMessage]) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """What a model sees of a history: kinds, parts and their content (no timestamps)."""
    out: list[tuple[str, list[tuple[Any, ...]]]] = []
    for msg in messages:
        parts: list[tuple[Any, ...]] = []
        for part in msg.parts:
            if isinstance(part, ai.ToolCallPart):
                parts.append(("call", part.tool_call_id, part.tool_name, part.args_as_dict()))
            elif isinstance(part, ai.ToolReturnPart):
                parts.append(("return", part.tool_call_id, part.content, part.outcome))
            else:
                parts.append((part.part_kind, part.content))  # type: ignore[union-attr]
        out.append((msg.kind, parts))
    return out


async def stored(url: str) -> list[Message]:
    async with SqlContextStore(url) as store:
        context = ContextEngine(store=store, chat_id="pydantic-ai-demo", user_id="demo-user")
        return await context.get_messages()


async def test_the_second_run_sees_the_first_runs_history_from_the_store(store_url: str) -> None:
    agent = example.build_agent(TestModel())
    with capture_run_messages() as first_run:
        assert await example.run(agent, store_url, ["What's the weather in Paris?"]) == [OUTPUT]
    # First run: the prompt, the tool call, its result, the answer.
    assert [type(m).__name__ for m in first_run] == [
        "ModelRequest",
        "ModelResponse",
        "ModelRequest",
        "ModelResponse",
    ]
    assert "You are a travel assistant." in (first_run[0].instructions or "")  # type: ignore[union-attr]

    # Stored as one user message and one assistant message holding the call and the answer.
    user_message, answer = await stored(store_url)
    assert user_message.role == "user" and user_message.text == "What's the weather in Paris?"
    assert answer.role == "assistant"
    assert answer.parts == [
        ToolPart(
            tool_call_id=CALL_ID,
            tool_name="get_weather",
            input={"city": "a"},
            state="output-available",
            output=WEATHER,
        ),
        TextPart(text=OUTPUT),
    ]

    # Second run, new store connection and new engine: the history comes from the database.
    with capture_run_messages() as second_run:
        [output] = await example.run(agent, store_url, ["Thanks!"])
    # The same answer, built from the stored tool result (PostgreSQL's JSONB may reorder keys).
    assert json.loads(output) == {"get_weather": WEATHER}
    *history, prompt, response = second_run
    assert essence(history) == essence(first_run)  # the model saw the whole first run
    assert essence([prompt]) == [("request", [("user-prompt", "Thanks!")])]
    # It answered from the stored tool result, without calling the tool again.
    assert essence([response]) == [("response", [("text", output)])]

    messages = await stored(store_url)
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[3].parts == [TextPart(text=output)]
    async with SqlContextStore(store_url) as store:
        context = ContextEngine(store=store, chat_id="pydantic-ai-demo", user_id="demo-user")
        await context.get_messages()
        assert context.chat is not None
        usage = context.chat.metadata["usage"]
        assert usage["requests"] == 3
        assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0


async def test_without_the_stored_history_the_model_calls_the_tool_again(tmp_path: Path) -> None:
    """The control for the test above: another chat has no history to answer from."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'chat.db'}"
    agent = example.build_agent(TestModel())
    await example.run(agent, url, ["What's the weather in Paris?"])
    with capture_run_messages() as other_chat:
        await example.run(agent, url, ["Thanks!"], chat_id="another-chat")
    assert essence(other_chat[:2]) == [
        ("request", [("user-prompt", "Thanks!")]),
        ("response", [("call", CALL_ID, "get_weather", {"city": "a"})]),
    ]


def test_the_converters_round_trip_a_history() -> None:
    history: list[ai.ModelMessage] = [
        ai.ModelRequest(parts=[ai.UserPromptPart("Paris or Tokyo?")]),
        ai.ModelResponse(
            parts=[
                ai.ThinkingPart("Compare both."),
                ai.TextPart("Checking."),
                ai.ToolCallPart("get_weather", {"city": "Paris"}, "c1"),
                ai.ToolCallPart("get_weather", '{"city": "Tokyo"}', "c2"),
            ]
        ),
        ai.ModelRequest(
            parts=[
                ai.ToolReturnPart("get_weather", {"celsius": 24}, "c1"),
                ai.ToolReturnPart("get_weather", "service down", "c2", outcome="failed"),
            ]
        ),
        ai.ModelResponse(parts=[ai.TextPart("Paris: 24 °C; Tokyo unknown.")]),
        ai.ModelRequest(parts=[ai.UserPromptPart("Thanks")]),
        ai.ModelResponse(parts=[ai.TextPart("You're welcome.")]),
    ]
    messages = from_model_messages(history)
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[1].parts == [
        ReasoningPart(text="Compare both."),
        TextPart(text="Checking."),
        ToolPart(
            tool_call_id="c1",
            tool_name="get_weather",
            input={"city": "Paris"},
            state="output-available",
            output={"celsius": 24},
        ),
        ToolPart(
            tool_call_id="c2",
            tool_name="get_weather",
            input={"city": "Tokyo"},  # JSON text arguments are parsed
            state="output-error",
            error="service down",
        ),
        TextPart(text="Paris: 24 °C; Tokyo unknown."),
    ]

    # Back to pydantic-ai: the same history, step by step.
    assert essence(to_model_messages(messages)) == [
        ("request", [("user-prompt", "Paris or Tokyo?")]),
        (
            "response",
            [
                ("thinking", "Compare both."),
                ("text", "Checking."),
                ("call", "c1", "get_weather", {"city": "Paris"}),
                ("call", "c2", "get_weather", {"city": "Tokyo"}),
            ],
        ),
        (
            "request",
            [
                ("return", "c1", {"celsius": 24}, "success"),
                ("return", "c2", "service down", "failed"),
            ],
        ),
        ("response", [("text", "Paris: 24 °C; Tokyo unknown.")]),
        ("request", [("user-prompt", "Thanks")]),
        ("response", [("text", "You're welcome.")]),
    ]


def test_the_script_runs_offline_and_continues_the_chat(tmp_path: Path) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AGENTCONTEXT")}

    def script(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(EXAMPLES / "pydantic_ai_agent.py"), *args],
            cwd=tmp_path,
            env=environ,
            capture_output=True,
            text=True,
            timeout=120,
        )

    first = script("What's the weather in Paris?")
    assert first.returncode == 0, first.stderr
    assert first.stdout == f"> What's the weather in Paris?\n{OUTPUT}\n\n"
    second = script("Thanks!")
    assert second.returncode == 0, second.stderr
    assert second.stdout == f"> Thanks!\n{OUTPUT}\n\n"

    messages = asyncio.run(stored(f"sqlite+aiosqlite:///{tmp_path / 'agentcontext.db'}"))
    assert [m.text for m in messages if m.role == "user"] == [
        "What's the weather in Paris?",
        "Thanks!",
    ]
    assert [type(p).__name__ for p in messages[3].parts] == ["TextPart"]  # no second tool call


async def test_with_the_history_processor_the_second_run_reads_the_store(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'chat.db'}"
    async with SqlContextStore(url) as store:
        first = await example.ask_with_processor(
            TestModel(), store, "What's the weather in Paris?", chat_id="c", user_id="u"
        )
    assert first == OUTPUT
    async with SqlContextStore(url) as store:
        with capture_run_messages() as second_run:
            second = await example.ask_with_processor(
                TestModel(), store, "Thanks!", chat_id="c", user_id="u"
            )
        # The stored run came first, then this run's prompt; the model answered from the
        # stored tool result instead of calling the tool again.
        assert json.loads(second) == {"get_weather": WEATHER}
        calls = [p for m in second_run for p in m.parts if isinstance(p, ai.ToolCallPart)]
        assert len(calls) == 1  # the stored call only
        context = ContextEngine(store=store, chat_id="c", user_id="u")
        messages = await context.get_messages()
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[2].text == "Thanks!"
