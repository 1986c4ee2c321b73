"""examples/openai_agent.py, run offline with a fake AsyncOpenAI client.

The fake client answers with real ``openai.types.chat.ChatCompletion`` objects and records
every request, which is validated against the SDK's parameter types.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from openai.types import CompletionUsage
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionMessage,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageParam,
    ChatCompletionToolUnionParam,
)
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_message_function_tool_call import Function
from openai.types.responses import Response, ResponseInputItemParam

from agentcontext import ContextEngine, ReasoningPart, SqlContextStore, TextPart, ToolPart
from tests.examples.helpers import EXAMPLES, assert_valid, load_example

example = load_example("openai_agent")

PARIS = "What's the weather in Paris?"


def completion(
    content: str | None = None,
    calls: Sequence[tuple[str, str, str]] = (),
    *,
    prompt_tokens: int = 100,
    completion_tokens: int = 10,
) -> ChatCompletion:
    """A ChatCompletion as the API returns it; ``calls`` are (id, function name, arguments)."""
    tool_calls = [
        ChatCompletionMessageFunctionToolCall(
            id=call_id, type="function", function=Function(name=name, arguments=arguments)
        )
        for call_id, name, arguments in calls
    ]
    return ChatCompletion(
        id="chatcmpl-test",
        object="chat.completion",
        created=1_760_000_000,
        model="gpt-5-mini",
        choices=[
            Choice(
                index=0,
                finish_reason="tool_calls" if tool_calls else "stop",
                message=ChatCompletionMessage(
                    role="assistant", content=content, tool_calls=tool_calls or None
                ),
            )
        ],
        usage=CompletionUsage(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        ),
    )


class FakeOpenAI:
    """Stands in for AsyncOpenAI: ``chat.completions.create`` returns the scripted replies."""

    def __init__(self, *replies: ChatCompletion | Response) -> None:
        self.replies = deque(replies)
        self.requests: list[dict[str, Any]] = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))
        self.responses = SimpleNamespace(create=self._create)

    async def _create(self, **kwargs: Any) -> Any:
        self.requests.append(copy.deepcopy(kwargs))
        return self.replies.popleft()


def assert_valid_request(request: dict[str, Any]) -> list[dict[str, Any]]:
    assert set(request) == {"model", "messages", "tools"}
    assert request["model"] == example.DEFAULT_MODEL
    assert_valid(list[ChatCompletionMessageParam], request["messages"])
    assert_valid(list[ChatCompletionToolUnionParam], request["tools"])
    return request["messages"]  # type: ignore[no-any-return]


async def test_a_turn_with_a_tool_call_is_sent_and_stored(store_url: str) -> None:
    answer = "It is sunny and 24 °C in Paris."
    client = FakeOpenAI(
        completion(calls=[("call_1", "get_weather", '{"city": "Paris"}')], prompt_tokens=120),
        completion(answer, prompt_tokens=180, completion_tokens=12),
    )

    assert await example.run(client, store_url, [PARIS]) == [answer]

    # 1st request: the system prompt rendered from the fragments, then the user message.
    first, second = (assert_valid_request(r) for r in client.requests)
    system, question = first
    assert system["role"] == "system"
    for text in ("You are a travel assistant.", "one or two sentences", "Never guess the weather"):
        assert text in system["content"]
    assert question == {"role": "user", "content": PARIS}

    # 2nd request: the same, then the tool call and its result.
    assert second[:2] == first
    call, result = second[2:]
    assert call == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    }
    assert result["role"] == "tool" and result["tool_call_id"] == "call_1"
    assert json.loads(result["content"]) == {"city": "Paris", "sky": "sunny", "celsius": 24}

    # A fresh engine on the same chat reads the turn back: the call is a ToolPart with its
    # output, and the request it would send is the last one plus the answer.
    async with SqlContextStore(store_url) as store:
        context = ContextEngine(store=store, chat_id="openai-demo", user_id="demo-user")
        context.set(*example.system_prompt())
        resolved = await context.resolve()
        user_message, assistant_message = resolved.messages
        assert user_message.role == "user" and user_message.text == PARIS
        assert assistant_message.parts == [
            ToolPart(
                tool_call_id="call_1",
                tool_name="get_weather",
                input={"city": "Paris"},
                state="output-available",
                output=result["content"],  # the JSON text the model read
            ),
            TextPart(text=answer),
        ]
        assert resolved.to_openai() == [*second, {"role": "assistant", "content": answer}]
        # Usage of both calls, summed in the chat's metadata.
        assert context.chat is not None
        usage = context.chat.metadata["usage"]
        assert usage["input_tokens"] == 300
        assert usage["output_tokens"] == 22
        assert usage["total_tokens"] == 322


async def test_the_next_run_continues_the_stored_conversation(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'chat.db'}"
    first = FakeOpenAI(
        completion(calls=[("call_1", "get_weather", '{"city": "Paris"}')]),
        completion("Sunny, 24 °C."),
    )
    await example.run(first, url, [PARIS])

    second = FakeOpenAI(
        completion(calls=[("call_2", "get_weather", '{"city": "Tokyo"}')]),
        completion("Rainy, 18 °C."),
        completion("Paris: warmer by 6 °C."),
    )
    answers = await example.run(second, url, ["And in Tokyo?", "Which one is warmer?"])
    assert answers == ["Rainy, 18 °C.", "Paris: warmer by 6 °C."]

    requests = [assert_valid_request(r) for r in second.requests]
    # The new process starts from the stored history: the first run's last request, its
    # answer, and the new question.
    assert requests[0] == [
        *first.requests[-1]["messages"],
        {"role": "assistant", "content": "Sunny, 24 °C."},
        {"role": "user", "content": "And in Tokyo?"},
    ]
    # The third question carries both tool results.
    tool_results = [json.loads(m["content"]) for m in requests[2] if m["role"] == "tool"]
    assert [r["city"] for r in tool_results] == ["Paris", "Tokyo"]
    assert requests[2][-1] == {"role": "user", "content": "Which one is warmer?"}

    async with SqlContextStore(url) as store:
        context = ContextEngine(store=store, chat_id="openai-demo", user_id="demo-user")
        messages = await context.get_messages()
        assert [m.role for m in messages] == ["user", "assistant"] * 3
        assert messages[-1].text == "Paris: warmer by 6 °C."


async def test_tool_errors_are_sent_back_and_stored(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'chat.db'}"
    client = FakeOpenAI(
        completion(
            "Let me check.",
            calls=[
                ("call_1", "get_weather", '{"city": '),  # truncated JSON
                ("call_2", "book_flight", '{"to": "Paris"}'),  # no such tool
                ("call_3", "get_weather", '{"town": "Paris"}'),  # wrong argument
            ],
        ),
        completion("Sorry, I could not get the weather."),
    )
    await example.run(client, url, [PARIS])

    messages = assert_valid_request(client.requests[1])
    assert messages[2]["content"] == "Let me check."
    errors = {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}
    assert set(errors) == {"call_1", "call_2", "call_3"}
    assert "Expecting value" in errors["call_1"]
    assert "unknown tool 'book_flight'" in errors["call_2"]
    assert "town" in errors["call_3"]

    async with SqlContextStore(url) as store:
        context = ContextEngine(store=store, chat_id="openai-demo", user_id="demo-user")
        answer = (await context.get_messages())[1]
    calls = [p for p in answer.parts if isinstance(p, ToolPart)]
    assert [c.state for c in calls] == ["output-error"] * 3
    assert calls[0].input == '{"city": '  # unparsable arguments are kept as they came
    assert answer.text == "Let me check.\n\nSorry, I could not get the weather."


def run_script(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGENTCONTEXT"))}
    return subprocess.run(
        [sys.executable, str(EXAMPLES / "openai_agent.py"), PARIS],
        cwd=tmp_path,
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_script_without_a_key_explains_how_to_set_it(tmp_path: Path) -> None:
    done = run_script(tmp_path)
    assert done.returncode == 2
    assert "export OPENAI_API_KEY=" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "agentcontext.db").exists()  # it stopped before touching anything


async def test_the_script_reports_an_unreachable_api_and_stores_nothing(tmp_path: Path) -> None:
    started = time.monotonic()
    done = run_script(tmp_path, OPENAI_API_KEY="sk-test", OPENAI_BASE_URL="http://127.0.0.1:9/v1")
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("OpenAI API error: Connection error")
    assert "Traceback" not in done.stderr
    assert time.monotonic() - started < 60

    async with SqlContextStore(f"sqlite+aiosqlite:///{tmp_path / 'agentcontext.db'}") as store:
        context = ContextEngine(store=store, chat_id="openai-demo", user_id="demo-user")
        assert await context.get_messages() == []  # the failed turn left no half-saved message


def response(*output: dict[str, Any]) -> Response:
    """A Responses API reply as the API returns it."""
    return Response.model_validate(
        {
            "id": "resp_test",
            "object": "response",
            "created_at": 1_760_000_000,
            "model": "gpt-5-mini",
            "status": "completed",
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "output": list(output),
            "usage": {
                "input_tokens": 100,
                "output_tokens": 20,
                "total_tokens": 120,
                "input_tokens_details": {"cached_tokens": 80, "cache_write_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 12},
            },
        }
    )


REASONING = {
    "type": "reasoning",
    "id": "rs_1",
    "summary": [{"type": "summary_text", "text": "Look the weather up."}],
    "encrypted_content": "gAAAA-opaque",
}


async def test_the_responses_api_gets_its_reasoning_back_by_id(store_url: str) -> None:
    answer = "It is sunny and 24 °C in Paris."
    call = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
        "status": "completed",
    }
    text = {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": answer, "annotations": []}],
    }
    client = FakeOpenAI(response(REASONING, call), response(text))
    assert await example.run(client, store_url, [PARIS], api="responses") == [answer]

    first, second = client.requests
    for request in client.requests:
        assert_valid(list[ResponseInputItemParam], request["input"])
        assert "You are a travel assistant." in request["instructions"]
        assert request["store"] is False
    assert first["input"] == [{"role": "user", "content": PARIS}]
    assert second["input"][0] == first["input"][0]
    assert second["input"][1] == REASONING  # verbatim: id, summary, encrypted content
    assert second["input"][2] == {
        "type": "function_call",
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
    }
    assert second["input"][3]["type"] == "function_call_output"
    assert json.loads(second["input"][3]["output"])["sky"] == "sunny"

    async with SqlContextStore(store_url) as store:
        context = ContextEngine(store=store, chat_id="openai-demo", user_id="demo-user")
        _, stored = await context.get_messages()
        assert stored.parts[0] == ReasoningPart(
            text="Look the weather up.", item_id="rs_1", encrypted_content="gAAAA-opaque"
        )
        assert stored.text == answer
        assert context.chat is not None
        usage = context.chat.metadata["usage"]
        assert usage["cached_input_tokens"] == 160 and usage["reasoning_tokens"] == 24
