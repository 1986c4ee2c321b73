"""The Message model, ResolveResult and its OpenAI and Anthropic adapters.

Adapter output is validated against the official SDKs' TypedDict parameter types with
pydantic (unknown keys forbidden, lazily validated iterables consumed), and compared with
the validated value, so nothing is silently dropped or coerced. No network is used.
"""

from __future__ import annotations

import base64
import itertools
from typing import Any

import pytest
from anthropic.types import MessageParam
from openai.types.chat import ChatCompletionMessageParam
from pydantic import ConfigDict, TypeAdapter, ValidationError

from agentcontext.messages import (
    DataPart,
    FilePart,
    Message,
    ReasoningPart,
    ResolveResult,
    TextPart,
    ToolPart,
)

_STRICT = ConfigDict(extra="forbid")
_OPENAI = TypeAdapter(list[ChatCompletionMessageParam], config=_STRICT)
_ANTHROPIC = TypeAdapter(list[MessageParam], config=_STRICT)
_PNG = base64.b64encode(b"\x89PNG fake").decode()
_PDF = base64.b64encode(b"%PDF-1.4 fake").decode()
_TXT = base64.b64encode("héllo".encode()).decode()


def _consume(value: Any) -> Any:
    """Walk a validated value, consuming pydantic's lazy iterators (which validates them)."""
    if isinstance(value, dict):
        return {key: _consume(item) for key, item in value.items()}
    if value is None or isinstance(value, (str, bytes, int, float, bool)):
        return value
    if hasattr(value, "__iter__"):
        return [_consume(item) for item in value]
    return value


def valid_openai(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    assert _consume(_OPENAI.validate_python(messages)) == messages
    return messages


def valid_anthropic(request: dict[str, Any]) -> dict[str, Any]:
    assert set(request) <= {"system", "messages"}
    if "system" in request:
        assert isinstance(request["system"], str) and request["system"]
    assert _consume(_ANTHROPIC.validate_python(request["messages"])) == request["messages"]
    roles = [m["role"] for m in request["messages"]]
    assert all(a != b for a, b in itertools.pairwise(roles)), roles
    return request


def msg(role: str, *parts: Any, id: str = "m") -> Message:
    return Message(id=id, role=role, parts=list(parts))  # type: ignore[arg-type]


def call(
    call_id: str,
    *,
    state: str = "output-available",
    output: Any = None,
    error: str | None = None,
    input: Any = None,
) -> ToolPart:
    return ToolPart(
        tool_call_id=call_id,
        tool_name="run_sql",
        input={"sql": "select 1"} if input is None else input,
        state=state,  # type: ignore[arg-type]
        output=output,
        error=error,
    )


# --- the model -----------------------------------------------------------------------------


def test_parts_are_discriminated_by_type() -> None:
    data = {
        "id": "m1",
        "role": "assistant",
        "parts": [
            {"type": "text", "text": "a"},
            {"type": "reasoning", "text": "b"},
            {
                "type": "tool",
                "tool_call_id": "c",
                "tool_name": "t",
                "input": {},
                "state": "input-available",
            },
            {"type": "file", "media_type": "image/png", "url": "https://x/y.png"},
            {"type": "data", "name": "n", "data": [1]},
        ],
    }
    m = Message.model_validate(data)
    assert [type(p) for p in m.parts] == [TextPart, ReasoningPart, ToolPart, FilePart, DataPart]
    assert m.model_dump(mode="json", exclude_none=True) == data
    assert m.metadata is None


def test_invalid_messages_are_rejected() -> None:
    with pytest.raises(ValidationError):
        Message.model_validate({"id": "m", "role": "tool", "parts": []})
    with pytest.raises(ValidationError):
        Message.model_validate({"id": "m", "role": "user", "parts": [{"type": "image"}]})
    with pytest.raises(ValidationError):
        ToolPart(tool_call_id="c", tool_name="t", state="done")  # type: ignore[arg-type]


def test_messages_are_frozen_and_text_joins_text_parts() -> None:
    m = msg("user", TextPart(text="a"), ReasoningPart(text="r"), TextPart(text="b"))
    assert m.text == "a\n\nb"
    with pytest.raises(ValidationError):
        m.id = "x"  # type: ignore[misc]
    assert m.model_copy(update={"id": "x"}).id == "x"


def test_resolve_result_defaults() -> None:
    r = ResolveResult(system_prompt="s")
    assert r.messages == [] and r.record_id is None


# --- OpenAI --------------------------------------------------------------------------------


def test_openai_text_conversation() -> None:
    result = ResolveResult(
        system_prompt="<role>Helpful</role>",
        messages=[
            msg("user", TextPart(text="Hello"), id="u1"),
            msg("assistant", TextPart(text="Hi!"), id="a1"),
            msg("system", TextPart(text="Be brief"), id="s1"),
            msg("user", TextPart(text="one"), TextPart(text="two"), id="u2"),
        ],
    )
    assert valid_openai(result.to_openai()) == [
        {"role": "system", "content": "<role>Helpful</role>"},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi!"},
        {"role": "system", "content": "Be brief"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
        },
    ]


def test_openai_omits_empty_system_prompt_and_empty_messages() -> None:
    result = ResolveResult(
        system_prompt="  ",
        messages=[
            msg("user", TextPart(text="")),
            msg("assistant"),
            msg("user", TextPart(text="x")),
        ],
    )
    assert valid_openai(result.to_openai()) == [{"role": "user", "content": "x"}]


def test_openai_drops_reasoning_and_data() -> None:
    result = ResolveResult(
        system_prompt="",
        messages=[
            msg("user", TextPart(text="q"), DataPart(name="ui", data={"x": 1})),
            msg("assistant", ReasoningPart(text="secret thoughts"), TextPart(text="answer")),
        ],
    )
    out = valid_openai(result.to_openai())
    assert out == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "answer"}]
    assert "secret" not in repr(out)


def test_openai_tool_calls_and_results() -> None:
    result = ResolveResult(
        system_prompt="",
        messages=[
            msg("user", TextPart(text="How many users?")),
            msg(
                "assistant",
                TextPart(text="Let me check."),
                call("c1", output={"count": 3}),
                call("c2", state="output-error", error="relation does not exist"),
                call("c3", state="input-streaming"),
                call("c4", state="input-available"),
                TextPart(text="There are 3 users."),
                call("c5", output="plain text result", input=["not", "a", "dict"]),
            ),
        ],
    )
    assert valid_openai(result.to_openai()) == [
        {"role": "user", "content": "How many users?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "run_sql", "arguments": '{"sql": "select 1"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "run_sql", "arguments": '{"sql": "select 1"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"count": 3}'},
        {"role": "tool", "tool_call_id": "c2", "content": "relation does not exist"},
        {
            "role": "assistant",
            "content": "There are 3 users.",
            "tool_calls": [
                {
                    "id": "c5",
                    "type": "function",
                    "function": {"name": "run_sql", "arguments": '["not", "a", "dict"]'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c5", "content": "plain text result"},
    ]


def test_openai_tool_only_step_has_null_content() -> None:
    result = ResolveResult(system_prompt="", messages=[msg("assistant", call("c1", output=None))])
    out = valid_openai(result.to_openai())
    assert out[0]["content"] is None
    assert out[1] == {"role": "tool", "tool_call_id": "c1", "content": "null"}


def test_openai_files() -> None:
    result = ResolveResult(
        system_prompt="",
        messages=[
            msg(
                "user",
                TextPart(text="Look"),
                FilePart(media_type="image/png", url="https://example.com/a.png"),
                FilePart(media_type="image/png", data=_PNG),
                FilePart(media_type="image/jpeg", url=f"data:image/jpeg;base64,{_PNG}"),
                FilePart(media_type="application/pdf", data=_PDF, filename="report.pdf"),
                FilePart(media_type="audio/wav", data=_PNG),
                FilePart(
                    media_type="application/pdf", url="https://example.com/r.pdf", filename="r.pdf"
                ),
            ),
            msg("assistant", FilePart(media_type="image/png", data=_PNG), TextPart(text="ok")),
        ],
    )
    out = valid_openai(result.to_openai())
    assert out[0]["content"] == [
        {"type": "text", "text": "Look"},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{_PNG}"}},
        {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{_PNG}"}},
        {
            "type": "file",
            "file": {"file_data": f"data:application/pdf;base64,{_PDF}", "filename": "report.pdf"},
        },
        {"type": "input_audio", "input_audio": {"data": _PNG, "format": "wav"}},
        {"type": "text", "text": "[file r.pdf (application/pdf) at https://example.com/r.pdf]"},
    ]
    assert out[1] == {"role": "assistant", "content": "ok"}  # assistant files are dropped


# --- Anthropic -----------------------------------------------------------------------------


def test_anthropic_text_conversation_and_system_messages() -> None:
    result = ResolveResult(
        system_prompt="<role>Helpful</role>",
        messages=[
            msg("user", TextPart(text="Hello")),
            msg("assistant", TextPart(text="Hi!")),
            msg("system", TextPart(text="Be brief")),
            msg("user", TextPart(text="one"), TextPart(text="two")),
        ],
    )
    assert valid_anthropic(result.to_anthropic()) == {
        "system": "<role>Helpful</role>\n\nBe brief",
        "messages": [
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi!"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
            },
        ],
    }


def test_anthropic_omits_system_when_empty() -> None:
    result = ResolveResult(system_prompt="", messages=[msg("user", TextPart(text="x"))])
    assert valid_anthropic(result.to_anthropic()) == {
        "messages": [{"role": "user", "content": "x"}]
    }


def test_anthropic_merges_consecutive_roles() -> None:
    result = ResolveResult(
        system_prompt="",
        messages=[
            msg("user", TextPart(text="a")),
            msg("user", TextPart(text="b")),
            msg("assistant", TextPart(text="c")),
            msg("assistant", ReasoningPart(text="only reasoning")),
            msg("assistant", TextPart(text="d")),
        ],
    )
    assert valid_anthropic(result.to_anthropic())["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "c"}, {"type": "text", "text": "d"}],
        },
    ]


def test_anthropic_tool_use_and_results() -> None:
    result = ResolveResult(
        system_prompt="",
        messages=[
            msg("user", TextPart(text="How many users?")),
            msg(
                "assistant",
                ReasoningPart(text="thinking"),
                TextPart(text="Let me check."),
                call("c1", output={"count": 3}),
                call("c2", state="output-error", error="boom"),
                call("c3", state="input-available"),
                TextPart(text="There are 3."),
                call("c4", output="done", input="scalar input"),
            ),
            msg("user", TextPart(text="Thanks")),
        ],
    )
    assert valid_anthropic(result.to_anthropic())["messages"] == [
        {"role": "user", "content": "How many users?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "c1", "name": "run_sql", "input": {"sql": "select 1"}},
                {"type": "tool_use", "id": "c2", "name": "run_sql", "input": {"sql": "select 1"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": '{"count": 3}'},
                {"type": "tool_result", "tool_use_id": "c2", "content": "boom", "is_error": True},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "There are 3."},
                {
                    "type": "tool_use",
                    "id": "c4",
                    "name": "run_sql",
                    "input": {"input": "scalar input"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c4", "content": "done"},
                {"type": "text", "text": "Thanks"},
            ],
        },
    ]


def test_anthropic_files() -> None:
    result = ResolveResult(
        system_prompt="",
        messages=[
            msg(
                "user",
                FilePart(media_type="image/png", data=_PNG),
                FilePart(media_type="image/jpeg", url="https://example.com/a.jpg"),
                FilePart(media_type="image/webp", url=f"data:image/webp;base64,{_PNG}"),
                FilePart(media_type="application/pdf", data=_PDF, filename="report.pdf"),
                FilePart(media_type="application/pdf", url="https://example.com/r.pdf"),
                FilePart(media_type="text/plain", data=_TXT, filename="notes.txt"),
                FilePart(media_type="image/bmp", data=_PNG, filename="old.bmp"),
                FilePart(media_type="application/zip", url="https://example.com/x.zip"),
                TextPart(text="What is in these?"),
            )
        ],
    )
    content = valid_anthropic(result.to_anthropic())["messages"][0]["content"]
    assert content == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": _PNG}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.jpg"}},
        {"type": "image", "source": {"type": "base64", "media_type": "image/webp", "data": _PNG}},
        {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": _PDF},
            "title": "report.pdf",
        },
        {"type": "document", "source": {"type": "url", "url": "https://example.com/r.pdf"}},
        {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": "héllo"},
            "title": "notes.txt",
        },
        {"type": "text", "text": "[file old.bmp (image/bmp)]"},
        {
            "type": "text",
            "text": "[file https://example.com/x.zip (application/zip) at https://example.com/x.zip]",
        },
        {"type": "text", "text": "What is in these?"},
    ]


def test_percent_encoded_data_url_is_unpacked() -> None:
    result = ResolveResult(
        system_prompt="",
        messages=[msg("user", FilePart(media_type="text/plain", url="data:text/plain,hi%20there"))],
    )
    content = valid_anthropic(result.to_anthropic())["messages"][0]["content"]
    assert content == [
        {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": "hi there"},
        }
    ]


def test_both_adapters_accept_a_long_mixed_conversation() -> None:
    messages: list[Message] = []
    for i in range(30):
        messages.append(msg("user", TextPart(text=f"q{i}"), id=f"u{i}"))
        messages.append(
            msg(
                "assistant",
                ReasoningPart(text="r"),
                call(f"c{i}", output={"rows": i}),
                TextPart(text=f"a{i}"),
                id=f"a{i}",
            )
        )
    result = ResolveResult(system_prompt="sys", messages=messages)
    openai = valid_openai(result.to_openai())
    assert len(openai) == 1 + 30 * 4
    anthropic = valid_anthropic(result.to_anthropic())
    # user, assistant (tool_use), user (tool_result), assistant (text) for every turn
    assert len(anthropic["messages"]) == 30 * 4
    assert anthropic["system"] == "sys"
