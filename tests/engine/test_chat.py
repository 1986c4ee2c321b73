"""update_chat() and track_usage() — on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from agentcontext import InvalidInputError, InvalidTypeError, SerializationError
from agentcontext.store import SqlContextStore
from tests.engine.conftest import EngineFactory


async def test_update_chat_sets_the_title_and_merges_metadata(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine(metadata={"a": 1})
    chat = await engine.update_chat(title="Trip planning", metadata={"b": 2})
    assert chat.title == "Trip planning"
    assert chat.metadata == {"a": 1, "b": 2}
    assert engine.chat == chat == await store.get_chat("c1")

    chat = await engine.update_chat(metadata={"a": 10, "c": [1, 2]})
    assert chat.title == "Trip planning"  # untouched when not given
    assert chat.metadata == {"a": 10, "b": 2, "c": [1, 2]}

    # Another writer's keys survive the merge.
    other = make_engine()
    await other.update_chat(metadata={"from_other": True})
    chat = await engine.update_chat(title="Renamed")
    assert chat.metadata == {"a": 10, "b": 2, "c": [1, 2], "from_other": True}


async def test_update_chat_counts_as_activity(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    await make_engine("c1").update_chat(title="one")
    await make_engine("c2").update_chat(title="two")
    assert [c.id for c in await store.list_chats()] == ["c2", "c1"]
    await make_engine("c1").update_chat(metadata={"x": 1})
    assert [c.id for c in await store.list_chats()] == ["c1", "c2"]


async def test_update_chat_refuses_bad_metadata(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    await engine.update_chat(metadata={"ok": True})
    with pytest.raises(SerializationError):
        await engine.update_chat(metadata={"bad": math.nan})
    with pytest.raises(InvalidTypeError):
        await engine.update_chat(metadata=["not", "a", "dict"])  # type: ignore[arg-type]
    chat = await store.get_chat("c1")
    assert chat is not None and chat.metadata == {"ok": True}


async def test_concurrent_metadata_merges_lose_nothing(
    store: SqlContextStore, other_store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engines = [make_engine(on=store if i % 2 else other_store) for i in range(10)]
    await asyncio.gather(*(e.update_chat(metadata={f"k{i}": i}) for i, e in enumerate(engines)))
    chat = await store.get_chat("c1")
    assert chat is not None and chat.metadata == {f"k{i}": i for i in range(10)}


def normalised(**counts: int) -> dict[str, int]:
    keys = ("input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens")
    out = {key: counts.get(key, 0) for key in keys}
    out["total_tokens"] = counts.get("total_tokens", out["input_tokens"] + out["output_tokens"])
    out["requests"] = counts.get("requests", 1)
    return out


async def test_track_usage_keeps_normalised_totals(make_engine: EngineFactory) -> None:
    engine = make_engine(metadata={"topic": "x"})
    await engine.track_usage({"input_tokens": 10, "output_tokens": 5, "model": "a"})
    chat = await engine.track_usage(
        {"input_tokens": 7, "output_tokens": 2, "model": "b", "skipped": None}
    )
    # Provider keys are not kept side by side: only the normalised counts, summed.
    assert chat.metadata == {
        "topic": "x",
        "usage": normalised(input_tokens=17, output_tokens=7, requests=2),
    }


async def test_track_usage_sums_every_sdk_into_one_shape(make_engine: EngineFactory) -> None:
    from anthropic.types import Usage as AnthropicUsage
    from openai.types.completion_usage import (
        CompletionTokensDetails,
        CompletionUsage,
        PromptTokensDetails,
    )
    from openai.types.responses import ResponseUsage
    from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

    class Plain:
        def __init__(self) -> None:
            self.input_tokens = 4
            self._private = 99

    engine = make_engine()
    await engine.track_usage(
        CompletionUsage(
            prompt_tokens=30,
            completion_tokens=10,
            total_tokens=40,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=20),
            completion_tokens_details=CompletionTokensDetails(reasoning_tokens=6),
        )
    )
    await engine.track_usage(
        ResponseUsage(
            input_tokens=100,
            output_tokens=50,
            total_tokens=150,
            input_tokens_details=InputTokensDetails(cached_tokens=64, cache_write_tokens=0),
            output_tokens_details=OutputTokensDetails(reasoning_tokens=32),
        )
    )
    await engine.track_usage(
        AnthropicUsage(
            input_tokens=5,
            output_tokens=7,
            cache_read_input_tokens=1000,
            cache_creation_input_tokens=200,
        )
    )
    from agents.usage import Usage as AgentsUsage

    agents_usage = AgentsUsage(requests=2, input_tokens=9, output_tokens=1, total_tokens=10)
    agents_usage.add(AgentsUsage(requests=1, input_tokens=1, output_tokens=1, total_tokens=2))
    await engine.track_usage(agents_usage)  # a dataclass holding per-request entries
    chat = await engine.track_usage(Plain())
    assert chat.metadata["usage"] == {
        "input_tokens": 30 + 100 + 1205 + 10 + 4,
        "output_tokens": 10 + 50 + 7 + 2,
        "cached_input_tokens": 20 + 64 + 1000,
        "reasoning_tokens": 6 + 32,
        "total_tokens": 40 + 150 + 1212 + 12 + 4,
        "requests": 1 + 1 + 1 + 3 + 1,
    }
    with pytest.raises(InvalidTypeError, match="usage"):
        await engine.track_usage(42)
    with pytest.raises(SerializationError):
        await engine.track_usage({"input_tokens": math.inf})
    with pytest.raises(InvalidInputError, match="input_tokens"):
        await engine.track_usage({"input_tokens": "many"})
    assert (await engine.update_chat()).metadata["usage"]["input_tokens"] == 1349


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        (  # the AI SDK 4 LanguageModelUsage (what the original package tracks)
            {"inputTokens": 500, "outputTokens": 200, "totalTokens": 700},
            normalised(input_tokens=500, output_tokens=200),
        ),
        (
            {
                "inputTokens": 500,
                "outputTokens": 200,
                "totalTokens": 700,
                "reasoningTokens": 50,
                "cachedInputTokens": 100,
            },
            normalised(
                input_tokens=500, output_tokens=200, reasoning_tokens=50, cached_input_tokens=100
            ),
        ),
        (  # AI SDK 5 and later: token details
            {
                "inputTokens": 500,
                "inputTokenDetails": {
                    "noCacheTokens": 400,
                    "cacheReadTokens": 100,
                    "cacheWriteTokens": 0,
                },
                "outputTokens": 200,
                "outputTokenDetails": {"textTokens": 150, "reasoningTokens": 50},
                "totalTokens": 700,
            },
            normalised(
                input_tokens=500, output_tokens=200, reasoning_tokens=50, cached_input_tokens=100
            ),
        ),
        (  # pydantic-ai before 1.0
            {"requests": 2, "request_tokens": 30, "response_tokens": 10, "total_tokens": 40},
            normalised(input_tokens=30, output_tokens=10, requests=2),
        ),
    ],
)
async def test_track_usage_reads_the_ai_sdk_and_older_shapes(
    make_engine: EngineFactory, usage: dict[str, Any], expected: dict[str, int]
) -> None:
    chat = await make_engine().track_usage(usage)
    assert chat.metadata["usage"] == expected


async def test_track_usage_adds_to_a_total_the_original_package_stored(
    make_engine: EngineFactory,
) -> None:
    stored = {"inputTokens": 500, "outputTokens": 200, "totalTokens": 700}
    engine = make_engine(metadata={"usage": stored})
    await engine.update_chat(metadata={"usage": stored})
    chat = await engine.track_usage({"input_tokens": 10, "output_tokens": 5})
    assert chat.metadata["usage"] == normalised(
        input_tokens=510, output_tokens=205, total_tokens=715, requests=2
    )


async def test_twenty_concurrent_track_usage_calls_lose_nothing(
    store: SqlContextStore, other_store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engines = [make_engine(on=store if i % 2 else other_store) for i in range(20)]
    usage: dict[str, Any] = {"input_tokens": 3, "output_tokens": 2, "total": {"calls": 1}}
    await asyncio.gather(*(engine.track_usage(usage) for engine in engines))
    # And one engine used concurrently with itself.
    shared = make_engine()
    await asyncio.gather(*(shared.track_usage({"input_tokens": 1}) for _ in range(20)))
    chat = await store.get_chat("c1")
    assert chat is not None
    assert chat.metadata["usage"] == normalised(
        input_tokens=3 * 20 + 20, output_tokens=2 * 20, requests=40
    )
