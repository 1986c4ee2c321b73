"""examples/anthropic_agent.py, run offline with a fake AsyncAnthropic client.

The fake client answers with real ``anthropic.types.Message`` objects and records every
request, which is validated against the SDK's parameter types.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import subprocess
import sys
from collections import deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from anthropic.types import (
    Message,
    MessageParam,
    TextBlock,
    ThinkingBlock,
    ToolParam,
    ToolUseBlock,
    Usage,
)

from agentcontext import ContextEngine, SqlContextStore, TextPart, ToolPart
from tests.examples.helpers import EXAMPLES, assert_valid, load_example

example = load_example("anthropic_agent")

PARIS = "What's the weather in Paris?"


def reply(
    text: str | None = None,
    *tool_uses: tuple[str, str, dict[str, Any]],
    input_tokens: int = 100,
    output_tokens: int = 10,
) -> Message:
    """A Message as the API returns it; ``tool_uses`` are (id, tool name, input)."""
    content: list[TextBlock | ToolUseBlock] = [TextBlock(type="text", text=text)] if text else []
    content += [
        ToolUseBlock(type="tool_use", id=call_id, name=name, input=args)
        for call_id, name, args in tool_uses
    ]
    return Message(
        id="msg_test",
        type="message",
        role="assistant",
        model=example.DEFAULT_MODEL,
        content=content,
        stop_reason="tool_use" if tool_uses else "end_turn",
        stop_sequence=None,
        usage=Usage(input_tokens=input_tokens, output_tokens=output_tokens),
    )


class FakeAnthropic:
    """Stands in for AsyncAnthropic: ``messages.create`` returns the scripted replies."""

    def __init__(self, *replies: Message) -> None:
        self.replies = deque(replies)
        self.requests: list[dict[str, Any]] = []
        self.messages = SimpleNamespace(create=self._create)

    async def _create(self, **kwargs: Any) -> Message:
        self.requests.append(copy.deepcopy(kwargs))
        return self.replies.popleft()


def assert_valid_request(request: dict[str, Any]) -> list[dict[str, Any]]:
    assert set(request) == {"model", "max_tokens", "system", "messages", "tools"}
    assert request["model"] == example.DEFAULT_MODEL
    assert request["max_tokens"] == example.MAX_TOKENS
    assert isinstance(request["system"], str)
    for text in ("You are a travel assistant.", "one or two sentences", "Never guess the weather"):
        assert text in request["system"]
    assert_valid(list[MessageParam], request["messages"])
    assert_valid(list[ToolParam], request["tools"])
    roles = [m["role"] for m in request["messages"]]
    assert roles[0] == "user"
    assert all(a != b for a, b in itertools.pairwise(roles)), roles  # roles alternate
    return request["messages"]  # type: ignore[no-any-return]


async def test_a_turn_with_a_tool_call_is_sent_and_stored(store_url: str) -> None:
    answer = "It is sunny and 24 °C in Paris."
    client = FakeAnthropic(
        reply("Let me check.", ("toolu_1", "get_weather", {"city": "Paris"}), input_tokens=120),
        reply(answer, input_tokens=180, output_tokens=12),
    )

    # The answer is the turn's whole text, as a chat would show it.
    assert await example.run(client, store_url, [PARIS]) == [f"Let me check.\n\n{answer}"]

    first, second = (assert_valid_request(r) for r in client.requests)
    assert client.requests[0]["system"] == client.requests[1]["system"]
    assert first == [{"role": "user", "content": PARIS}]
    # The text and the tool_use block, then the tool_result in the next user message.
    assert second[0] == first[0]
    call, result = second[1:]
    assert call == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me check."},
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "get_weather",
                "input": {"city": "Paris"},
            },
        ],
    }
    assert result["role"] == "user"
    [block] = result["content"]
    assert block["type"] == "tool_result" and block["tool_use_id"] == "toolu_1"
    assert "is_error" not in block
    assert json.loads(block["content"]) == {"city": "Paris", "sky": "sunny", "celsius": 24}

    # A fresh engine on the same chat reads the turn back and would send the same request,
    # plus the answer.
    async with SqlContextStore(store_url) as store:
        context = ContextEngine(store=store, chat_id="anthropic-demo", user_id="demo-user")
        context.set(*example.system_prompt())
        resolved = await context.resolve()
        user_message, assistant_message = resolved.messages
        assert user_message.role == "user" and user_message.text == PARIS
        assert assistant_message.parts == [
            TextPart(text="Let me check."),
            ToolPart(
                tool_call_id="toolu_1",
                tool_name="get_weather",
                input={"city": "Paris"},
                state="output-available",
                output=block["content"],  # the JSON text the model read
            ),
            TextPart(text=answer),
        ]
        assert resolved.to_anthropic() == {
            "system": client.requests[1]["system"],
            "messages": [*second, {"role": "assistant", "content": answer}],
        }
        assert context.chat is not None
        usage = context.chat.metadata["usage"]
        assert usage["input_tokens"] == 300
        assert usage["output_tokens"] == 22


async def test_the_next_run_continues_the_stored_conversation(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'chat.db'}"
    first = FakeAnthropic(
        reply(None, ("toolu_1", "get_weather", {"city": "Paris"})),
        reply("Sunny, 24 °C."),
    )
    await example.run(first, url, [PARIS])

    second = FakeAnthropic(
        reply(None, ("toolu_2", "get_weather", {"city": "Tokyo"})),
        reply("Rainy, 18 °C."),
        reply("Paris is warmer by 6 °C."),
    )
    answers = await example.run(second, url, ["And in Tokyo?", "Which one is warmer?"])
    assert answers == ["Rainy, 18 °C.", "Paris is warmer by 6 °C."]

    requests = [assert_valid_request(r) for r in second.requests]
    assert requests[0] == [
        *first.requests[-1]["messages"],
        {"role": "assistant", "content": "Sunny, 24 °C."},
        {"role": "user", "content": "And in Tokyo?"},
    ]
    results = [
        json.loads(block["content"])["city"]
        for m in requests[2]
        if m["role"] == "user" and isinstance(m["content"], list)
        for block in m["content"]
        if block["type"] == "tool_result"
    ]
    assert results == ["Paris", "Tokyo"]
    assert requests[2][-1] == {"role": "user", "content": "Which one is warmer?"}

    async with SqlContextStore(url) as store:
        context = ContextEngine(store=store, chat_id="anthropic-demo", user_id="demo-user")
        messages = await context.get_messages()
        assert [m.role for m in messages] == ["user", "assistant"] * 3


async def test_tool_errors_are_sent_back_as_is_error_results(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'chat.db'}"
    client = FakeAnthropic(
        reply(
            None,
            ("toolu_1", "book_flight", {"to": "Paris"}),  # no such tool
            ("toolu_2", "get_weather", {"town": "Paris"}),  # wrong argument
        ),
        reply("Sorry, I could not get the weather."),
    )
    await example.run(client, url, [PARIS])

    results = assert_valid_request(client.requests[1])[-1]["content"]
    assert [(b["tool_use_id"], b.get("is_error")) for b in results] == [
        ("toolu_1", True),
        ("toolu_2", True),
    ]
    assert "unknown tool 'book_flight'" in results[0]["content"]
    assert "town" in results[1]["content"]

    async with SqlContextStore(url) as store:
        context = ContextEngine(store=store, chat_id="anthropic-demo", user_id="demo-user")
        answer = (await context.get_messages())[1]
    assert [p.state for p in answer.parts if isinstance(p, ToolPart)] == ["output-error"] * 2


def run_script(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "AGENTCONTEXT"))
    }
    return subprocess.run(
        [sys.executable, str(EXAMPLES / "anthropic_agent.py"), PARIS],
        cwd=tmp_path,
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_script_without_a_key_explains_how_to_set_it(tmp_path: Path) -> None:
    done = run_script(tmp_path)
    assert done.returncode == 2
    assert "export ANTHROPIC_API_KEY=" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "agentcontext.db").exists()


async def test_the_script_reports_an_unreachable_api_and_stores_nothing(tmp_path: Path) -> None:
    done = run_script(
        tmp_path, ANTHROPIC_API_KEY="sk-ant-test", ANTHROPIC_BASE_URL="http://127.0.0.1:9"
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("Anthropic API error: Connection error")
    assert "Traceback" not in done.stderr

    async with SqlContextStore(f"sqlite+aiosqlite:///{tmp_path / 'agentcontext.db'}") as store:
        context = ContextEngine(store=store, chat_id="anthropic-demo", user_id="demo-user")
        assert await context.get_messages() == []


async def test_with_cache_the_thinking_goes_back_signed_and_the_prefix_is_marked(
    tmp_path: Path,
) -> None:
    thinking = ThinkingBlock(type="thinking", thinking="Use the tool.", signature="EqQBsig")
    first = reply(None, ("toolu_1", "get_weather", {"city": "Paris"}))
    first = first.model_copy(update={"content": [thinking, *first.content]})
    client = FakeAnthropic(first, reply("It is sunny."))
    url = f"sqlite+aiosqlite:///{tmp_path / 'chat.db'}"
    await example.run(client, url, [PARIS], cache=True)

    ephemeral = {"type": "ephemeral"}
    for request in client.requests:
        [system] = request["system"]
        assert system["cache_control"] == ephemeral and "travel assistant" in system["text"]
        marks = json.dumps(request["messages"]).count('"cache_control"')
        assert 1 <= marks <= 2  # with the system prompt: at most 3 of Anthropic's 4
        assert request["messages"][-1]["content"][-1]["cache_control"] == ephemeral
    sent = client.requests[1]["messages"][1]
    assert sent["role"] == "assistant"
    assert sent["content"][0] == {
        "type": "thinking",
        "thinking": "Use the tool.",
        "signature": "EqQBsig",
    }
