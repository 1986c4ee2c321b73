"""Anthropic Messages API: a reply into the graph and back through the real client, caching."""

from __future__ import annotations

import json
from typing import Any

import pytest
from anthropic import AsyncAnthropic
from anthropic.types import Message as AnthropicMessage

from agentcontext import (
    InvalidInputError,
    Message,
    ReasoningPart,
    ResolveResult,
    TextPart,
    ToolPart,
)
from agentcontext.adapters import from_anthropic, to_anthropic
from tests.adapters.helpers import breakpoints, http_of, valid_anthropic

REPLY: dict[str, Any] = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "model": "claude-test",
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "content": [
        {"type": "thinking", "thinking": "The user wants Paris.", "signature": "EqQBCgIYAhIM"},
        {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"},
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
    ],
    "usage": {
        "input_tokens": 12,
        "output_tokens": 30,
        "cache_creation_input_tokens": 100,
        "cache_read_input_tokens": 2000,
    },
}


HTTP = http_of("anthropic")


class Recorder:
    def __init__(self, *replies: dict[str, Any]) -> None:
        self.replies = list(replies)
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: Any) -> Any:
        self.bodies.append(json.loads(request.content))
        return HTTP.Response(200, json=self.replies.pop(0))

    def client(self) -> AsyncAnthropic:
        transport = HTTP.MockTransport(self)
        return AsyncAnthropic(api_key="test", http_client=HTTP.AsyncClient(transport=transport))


async def test_thinking_goes_back_verbatim_with_its_signature() -> None:
    transport = Recorder(REPLY, REPLY)
    client = transport.client()
    question = Message(id="u1", role="user", parts=[TextPart(text="Weather in Paris?")])
    request = ResolveResult(system_prompt="Be brief.", messages=[question]).to_anthropic()
    reply = await client.messages.create(model="claude-test", max_tokens=100, **request)
    assert isinstance(reply, AnthropicMessage)
    assert transport.bodies[0]["system"] == "Be brief."

    message = Message.from_anthropic(reply)
    assert message.id == "msg_01"
    assert message.parts == [
        ReasoningPart(text="The user wants Paris.", signature="EqQBCgIYAhIM"),
        ReasoningPart(text="", redacted_data="EmwKAhgBEgy3va3pzix"),
        TextPart(text="Let me check."),
        ToolPart(
            tool_call_id="toolu_1",
            tool_name="get_weather",
            input={"city": "Paris"},
            state="input-available",
        ),
    ]
    assert message.metadata == {
        "provider": "anthropic",
        "model": "claude-test",
        "response_id": "msg_01",
        "stop_reason": "tool_use",
        "usage": {
            "input_tokens": 2112,
            "output_tokens": 30,
            "cached_input_tokens": 2000,
            "reasoning_tokens": 0,
            "total_tokens": 2142,
            "requests": 1,
        },
    }

    done = [
        p.model_copy(update={"state": "output-available", "output": "sunny"})
        if isinstance(p, ToolPart)
        else p
        for p in message.parts
    ]
    answered = message.model_copy(update={"parts": done})
    request = ResolveResult(system_prompt="Be brief.", messages=[question, answered]).to_anthropic()
    await client.messages.create(model="claude-test", max_tokens=100, **request)
    valid_anthropic(request)
    sent = transport.bodies[1]
    assert sent["messages"][1] == {
        "role": "assistant",
        "content": REPLY["content"],
    }  # block for block
    assert sent["messages"][2] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}],
    }


def test_cache_marks_the_system_prompt_and_the_end_of_the_conversation() -> None:
    turns = [
        Message(id="u1", role="user", parts=[TextPart(text="One")]),
        Message(id="a1", role="assistant", parts=[TextPart(text="Two")]),
        Message(id="u2", role="user", parts=[TextPart(text="Three")]),
    ]
    request = valid_anthropic(to_anthropic("System.", turns, cache=True))
    ephemeral = {"type": "ephemeral"}
    assert request["system"] == [{"type": "text", "text": "System.", "cache_control": ephemeral}]
    assert request["messages"] == [
        {"role": "user", "content": "One"},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Two", "cache_control": ephemeral}],
        },
        {
            "role": "user",
            "content": [{"type": "text", "text": "Three", "cache_control": ephemeral}],
        },
    ]
    assert breakpoints(request) == 3
    # Without cache the request is as before.
    assert to_anthropic("System.", turns) == {
        "system": "System.",
        "messages": [
            {"role": "user", "content": "One"},
            {"role": "assistant", "content": "Two"},
            {"role": "user", "content": "Three"},
        ],
    }
    assert to_anthropic("", [], cache=True) == {"messages": []}


def test_unsigned_reasoning_is_not_sent_and_bad_replies_are_refused() -> None:
    message = Message(
        id="a", role="assistant", parts=[ReasoningPart(text="mine"), TextPart(text="Hi")]
    )
    assert to_anthropic("", [message]) == {"messages": [{"role": "assistant", "content": "Hi"}]}
    with pytest.raises(InvalidInputError, match="from_anthropic"):
        from_anthropic({"id": "x"})
