"""update_chat() and track_usage() — on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
from pydantic import BaseModel

from agentcontext import InvalidTypeError, SerializationError
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


async def test_track_usage_sums_numbers_key_by_key(make_engine: EngineFactory) -> None:
    engine = make_engine(metadata={"topic": "x"})
    await engine.track_usage({"input_tokens": 10, "output_tokens": 5, "model": "a"})
    chat = await engine.track_usage(
        {
            "input_tokens": 7,
            "output_tokens": 0.5,
            "details": {"cached": 3},
            "model": "b",
            "skipped": None,
        }
    )
    assert chat.metadata == {
        "topic": "x",
        "usage": {
            "input_tokens": 17,
            "output_tokens": 5.5,
            "details": {"cached": 3},
            "model": "b",
        },
    }
    chat = await engine.track_usage({"details": {"cached": 2, "audio": 1}})
    assert chat.metadata["usage"]["details"] == {"cached": 5, "audio": 1}


async def test_track_usage_accepts_sdk_objects(make_engine: EngineFactory) -> None:
    class Usage(BaseModel):
        prompt_tokens: int
        completion_tokens: int

    class Plain:
        def __init__(self) -> None:
            self.input_tokens = 4
            self._private = 99

    engine = make_engine()
    await engine.track_usage(Usage(prompt_tokens=3, completion_tokens=1))
    await engine.track_usage(Usage(prompt_tokens=2, completion_tokens=2))
    chat = await engine.track_usage(Plain())
    assert chat.metadata["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "input_tokens": 4}
    with pytest.raises(InvalidTypeError, match="usage"):
        await engine.track_usage(42)
    with pytest.raises(SerializationError):
        await engine.track_usage({"input_tokens": math.inf})
    assert (await engine.update_chat()).metadata["usage"]["input_tokens"] == 4


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
    assert chat.metadata["usage"] == {
        "input_tokens": 3 * 20 + 20,
        "output_tokens": 2 * 20,
        "total": {"calls": 20},
    }
