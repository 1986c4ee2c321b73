"""Chat Completions and Responses: SDK replies into messages and back, field by field.

The requests go through the real ``openai`` client over a fake HTTP transport, so what is
checked is the JSON the SDK would send.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from agentcontext import (
    InvalidInputError,
    Message,
    ReasoningPart,
    ResolveResult,
    TextPart,
    ToolPart,
)
from agentcontext.adapters import from_openai, to_openai, to_openai_responses
from tests.adapters.helpers import http_of, valid_openai, valid_responses

CHAT_REPLY: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "gpt-test",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": "Let me check.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "get_time", "arguments": "{}"},
                    },
                ],
            },
        }
    ],
    "usage": {
        "prompt_tokens": 50,
        "completion_tokens": 20,
        "total_tokens": 70,
        "prompt_tokens_details": {"cached_tokens": 32},
        "completion_tokens_details": {"reasoning_tokens": 8},
    },
}

RESPONSE: dict[str, Any] = {
    "id": "resp_1",
    "object": "response",
    "created_at": 1,
    "model": "gpt-test",
    "status": "completed",
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "output": [
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [
                {"type": "summary_text", "text": "First, the city."},
                {"type": "summary_text", "text": "Then the tool."},
            ],
            "encrypted_content": "gAAAA-opaque",
        },
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Checking Paris.", "annotations": []}],
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_9",
            "name": "get_weather",
            "arguments": '{"city": "Paris", "unit": "C"}',
            "status": "completed",
        },
    ],
    "usage": {
        "input_tokens": 100,
        "output_tokens": 40,
        "total_tokens": 140,
        "input_tokens_details": {"cached_tokens": 64, "cache_write_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 30},
    },
}


HTTP = http_of("openai")


class Recorder:
    """A fake HTTP transport: records request bodies, answers with canned JSON."""

    def __init__(self, *replies: dict[str, Any]) -> None:
        self.replies = list(replies)
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: Any) -> Any:
        self.bodies.append(json.loads(request.content))
        return HTTP.Response(200, json=self.replies.pop(0))

    def client(self) -> AsyncOpenAI:
        transport = HTTP.MockTransport(self)
        return AsyncOpenAI(api_key="test", http_client=HTTP.AsyncClient(transport=transport))


def finish(message: Message, outputs: dict[str, Any]) -> Message:
    """The reply with its tool calls answered."""
    parts = [
        part.model_copy(update={"state": "output-available", "output": outputs[part.tool_call_id]})
        if isinstance(part, ToolPart)
        else part
        for part in message.parts
    ]
    return message.model_copy(update={"parts": parts})


async def test_a_chat_completion_goes_into_the_graph_and_back_field_by_field() -> None:
    transport = Recorder(CHAT_REPLY, CHAT_REPLY)
    client = transport.client()
    question = Message(id="u1", role="user", parts=[TextPart(text="Weather?")])
    first = ResolveResult(system_prompt="Be brief.", messages=[question])
    completion = await client.chat.completions.create(model="gpt-test", messages=first.to_openai())
    assert isinstance(completion, ChatCompletion)
    assert transport.bodies[0]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
    ]

    reply = Message.from_openai(completion)
    assert reply.id == "chatcmpl-1" and reply.role == "assistant"
    assert reply.parts == [
        TextPart(text="Let me check."),
        ToolPart(
            tool_call_id="call_1",
            tool_name="get_weather",
            input={"city": "Paris"},
            state="input-available",
        ),
        ToolPart(tool_call_id="call_2", tool_name="get_time", input={}, state="input-available"),
    ]
    assert reply.metadata == {
        "provider": "openai",
        "model": "gpt-test",
        "response_id": "chatcmpl-1",
        "finish_reason": "tool_calls",
        "usage": {
            "input_tokens": 50,
            "output_tokens": 20,
            "cached_input_tokens": 32,
            "reasoning_tokens": 8,
            "total_tokens": 70,
            "requests": 1,
        },
    }
    assert Message.from_openai(completion.choices[0].message).parts == reply.parts

    answered = finish(reply, {"call_1": {"sky": "sunny"}, "call_2": "12:00"})
    second = ResolveResult(system_prompt="Be brief.", messages=[question, answered])
    await client.chat.completions.create(model="gpt-test", messages=second.to_openai())
    sent = valid_openai(transport.bodies[1]["messages"])
    original = CHAT_REPLY["choices"][0]["message"]
    assistant = sent[2]
    assert assistant["content"] == original["content"]
    assert len(assistant["tool_calls"]) == len(original["tool_calls"])
    for back, there in zip(assistant["tool_calls"], original["tool_calls"], strict=True):
        assert back["id"] == there["id"] and back["type"] == there["type"]
        assert back["function"]["name"] == there["function"]["name"]
        assert json.loads(back["function"]["arguments"]) == json.loads(
            there["function"]["arguments"]
        )
    assert sent[3:] == [
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "sunny"}'},
        {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
    ]


async def test_a_responses_reply_round_trips_reasoning_verbatim() -> None:
    transport = Recorder(RESPONSE, RESPONSE)
    client = transport.client()
    question = Message(id="u1", role="user", parts=[TextPart(text="Weather in Paris?")])
    response = await client.responses.create(
        model="gpt-test",
        instructions="Be brief.",
        input=ResolveResult(system_prompt="", messages=[question]).to_openai_responses(),
    )
    assert isinstance(response, Response)
    assert transport.bodies[0]["input"] == [{"role": "user", "content": "Weather in Paris?"}]

    reply = Message.from_openai(response)
    assert reply.id == "resp_1"
    assert reply.parts == [
        ReasoningPart(text="First, the city.", item_id="rs_1", encrypted_content="gAAAA-opaque"),
        ReasoningPart(text="Then the tool.", item_id="rs_1"),
        TextPart(text="Checking Paris."),
        ToolPart(
            tool_call_id="call_9",
            tool_name="get_weather",
            input={"city": "Paris", "unit": "C"},
            state="input-available",
        ),
    ]
    assert reply.metadata is not None
    assert reply.metadata["usage"]["cached_input_tokens"] == 64
    assert reply.metadata["usage"]["reasoning_tokens"] == 30

    answered = finish(reply, {"call_9": "sunny"})
    # The reasoning stored twice (a retried save, a copied message) is still sent once.
    items = to_openai_responses(
        [
            question,
            answered,
            answered.model_copy(update={"id": "again", "parts": answered.parts[:2]}),
        ]
    )
    await client.responses.create(model="gpt-test", input=items)
    sent = valid_responses(transport.bodies[1]["input"])
    reasoning, text, call, output = sent[1:]
    original = RESPONSE["output"]
    assert reasoning == {
        key: original[0][key] for key in ("type", "id", "summary", "encrypted_content")
    }
    assert text == {"role": "assistant", "content": "Checking Paris."}
    assert {k: call[k] for k in ("type", "call_id", "name")} == {
        k: original[2][k] for k in ("type", "call_id", "name")
    }
    assert json.loads(call["arguments"]) == json.loads(original[2]["arguments"])
    assert output == {"type": "function_call_output", "call_id": "call_9", "output": "sunny"}
    assert len(sent) == 5


def test_output_items_with_their_outputs_make_finished_calls() -> None:
    items = [
        *RESPONSE["output"],
        {"type": "function_call_output", "call_id": "call_9", "output": "sunny"},
    ]
    message = from_openai(items, id="m1")
    assert message.id == "m1"
    [call] = [p for p in message.parts if isinstance(p, ToolPart)]
    assert call.state == "output-available" and call.output == "sunny"
    with pytest.raises(InvalidInputError, match="function_call_output"):
        from_openai([{"type": "function_call_output", "call_id": "nope", "output": "x"}])


def test_replies_that_are_not_replies_are_refused() -> None:
    with pytest.raises(InvalidInputError, match="from_openai"):
        Message.from_openai({"role": "user", "content": "hi"})
    with pytest.raises(InvalidInputError, match="no choices"):
        Message.from_openai({**CHAT_REPLY, "choices": []})
    with pytest.raises(InvalidInputError):
        Message.from_openai(42)


def test_reasoning_without_an_item_id_is_not_sent_and_chat_drops_all_reasoning() -> None:
    message = Message(
        id="a",
        role="assistant",
        parts=[
            ReasoningPart(text="private"),
            ReasoningPart(text="r", item_id="rs_2"),
            TextPart(text="Hi"),
        ],
    )
    items = valid_responses(to_openai_responses([message]))
    assert items == [
        {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "r"}]},
        {"role": "assistant", "content": "Hi"},
    ]
    assert valid_openai(to_openai("", [message])) == [{"role": "assistant", "content": "Hi"}]


def test_user_files_and_system_messages_go_to_the_responses_api() -> None:
    from agentcontext import FilePart

    messages = [
        Message(id="s", role="system", parts=[TextPart(text="Be brief.")]),
        Message(
            id="u",
            role="user",
            parts=[
                TextPart(text="What is in these?"),
                FilePart(media_type="image/png", data="iVBORw0KGgo="),
                FilePart(media_type="application/pdf", data="JVBERi0=", filename="a.pdf"),
                FilePart(media_type="application/pdf", url="https://example.com/b.pdf"),
                FilePart(media_type="text/csv", url="https://example.com/c.csv"),
            ],
        ),
    ]
    items = valid_responses(to_openai_responses(messages))
    assert items == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What is in these?"},
                {
                    "type": "input_image",
                    "image_url": "data:image/png;base64,iVBORw0KGgo=",
                    "detail": "auto",
                },
                {
                    "type": "input_file",
                    "file_data": "data:application/pdf;base64,JVBERi0=",
                    "filename": "a.pdf",
                },
                {"type": "input_file", "file_url": "https://example.com/b.pdf"},
                {
                    "type": "input_text",
                    "text": "[file https://example.com/c.csv (text/csv) at https://example.com/c.csv]",
                },
            ],
        },
    ]
