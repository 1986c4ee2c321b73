"""set() routing, resolve(), get_messages(), estimate() and inspect() — on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import tomllib
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from agentcontext import (
    ContextEngine,
    ContextFragment,
    FragmentLoadError,
    InvalidTypeError,
    MarkdownRenderer,
    Message,
    TextPart,
    TomlRenderer,
    ToolPart,
    ToonRenderer,
    XmlRenderer,
    assistant,
    assistant_text,
    hint,
    last_assistant_message,
    message,
    role,
    user,
)
from agentcontext.lazy import LoadContext
from agentcontext.store import SqlContextStore
from tests.engine._util import ids, texts
from tests.engine.conftest import EngineFactory


def test_set_routes_messages_to_pending_and_the_rest_to_the_prompt(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()
    greeting = user("hi")
    returned = engine.set(role("R"), greeting, hint("H"), assistant_text("yo"))
    assert returned is engine
    assert [f.name for f in engine.fragments] == ["role", "hint"]
    assert [f.name for f in engine.pending] == ["user", "assistant"]
    assert engine.pending[0] is greeting
    engine.set(hint("H2")).set(user("again"))
    assert [f.name for f in engine.fragments] == ["role", "hint", "hint"]
    assert len(engine.pending) == 3
    # The properties are copies.
    engine.pending.clear()
    engine.fragments.clear()
    assert len(engine.pending) == 3 and len(engine.fragments) == 3


def test_set_refuses_what_is_not_a_fragment(make_engine: EngineFactory) -> None:
    engine = make_engine()
    with pytest.raises(InvalidTypeError, match="argument 1"):
        engine.set(hint("ok"), "not a fragment")  # type: ignore[arg-type]
    assert engine.fragments == [] and engine.pending == []  # all or nothing


async def test_resolve_renders_the_prompt_with_lazy_data_materialised(
    make_engine: EngineFactory,
) -> None:
    calls: list[str] = []

    async def tables(ctx: LoadContext) -> list[str]:
        calls.append(ctx.path)
        assert isinstance(ctx.engine, ContextEngine)
        await asyncio.sleep(0)
        return ["users", "orders"]

    def owner() -> str:
        calls.append("owner")
        return "data team"

    engine = make_engine()
    engine.set(
        role("You answer SQL questions."),
        ContextFragment(name="database", data={"tables": tables}),
    )
    engine.set(ContextFragment(name="owner", data=owner))
    first = await engine.resolve()
    root = ET.fromstring(f"<root>{first.system_prompt}</root>")
    assert root.findtext("role") == "You answer SQL questions."
    assert [t.text for t in root.iter("table")] == ["users", "orders"]
    assert root.findtext("owner") == "data team"
    assert "<function" not in first.system_prompt and "coroutine" not in first.system_prompt

    second = await engine.resolve()
    assert second.system_prompt == first.system_prompt
    assert sorted(calls) == ["database", "owner"]  # loaded once per engine


async def test_a_failing_loader_names_its_fragment(make_engine: EngineFactory) -> None:
    def broken() -> str:
        raise RuntimeError("backend down")

    engine = make_engine()
    engine.set(ContextFragment(name="catalog", data={"items": broken}))
    with pytest.raises(FragmentLoadError, match=r"'catalog'.*items") as info:
        await engine.resolve()
    assert isinstance(info.value.__cause__, RuntimeError)


async def test_resolve_gives_the_stored_chain_then_pending(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(user("q1", id="m1"), assistant_text("a1", id="m2"))
    await engine.save()
    engine.set(user("q2", id="m3"))
    result = await engine.resolve()
    assert ids(result.messages) == ["m1", "m2", "m3"]
    assert texts(result.messages) == ["q1", "a1", "q2"]
    assert [m.role for m in result.messages] == ["user", "assistant", "user"]
    assert all(isinstance(m, Message) for m in result.messages)
    assert len(engine.pending) == 1  # resolve does not save


async def test_stored_messages_come_back_exactly(make_engine: EngineFactory) -> None:
    rich = Message(
        id="a1",
        role="assistant",
        parts=[
            TextPart(text="Looking it up… «ü» 🚀"),
            ToolPart(
                tool_call_id="call-1",
                tool_name="lookup",
                input={"q": "weather", "n": [1, 2.5, None, True]},
                state="output-available",
                output={"temp": -3.25, "unit": "°C"},
            ),
        ],
        metadata={"model": "m", "nested": {"k": [1, {"x": None}]}},
    )
    engine = make_engine()
    engine.set(user("weather?", id="u1"), assistant(rich))
    before = (await engine.resolve()).messages
    await engine.save()
    after_warm = (await engine.resolve()).messages
    after_cold = (await make_engine().resolve()).messages
    assert before == after_warm == after_cold
    assert after_cold[1] == rich


async def test_a_pending_message_with_a_stored_id_replaces_it_in_place(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()
    engine.set(user("q1", id="m1"), assistant_text("draft", id="m2"), user("q2", id="m3"))
    await engine.save()
    engine.set(assistant_text("final", id="m2"), user("q3", id="m4"))
    result = await engine.resolve()
    assert ids(result.messages) == ["m1", "m2", "m3", "m4"]
    assert texts(result.messages) == ["q1", "final", "q2", "q3"]


async def test_empty_assistant_placeholders_are_dropped(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(user("q1", id="u1"), assistant(Message(id="p1", role="assistant", parts=[])))
    await engine.save()
    engine.set(
        user("q2", id="u2"),
        assistant(Message(id="p2", role="assistant", parts=[TextPart(text="  \n ")])),
        user("q3", id="u3"),
        assistant_text("real", id="a3"),
    )
    assert ids((await engine.resolve()).messages) == ["u1", "u2", "u3", "a3"]
    assert ids(await engine.get_messages()) == ["u1", "u2", "u3", "a3"]
    # A placeholder with a non-text part is a real message.
    engine.set(
        assistant(
            Message(
                id="t1",
                role="assistant",
                parts=[ToolPart(tool_call_id="c", tool_name="t", state="input-available")],
            )
        )
    )
    assert ids((await engine.resolve()).messages)[-1] == "t1"


async def test_last_assistant_message_resolves_to_the_latest_assistant(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()
    engine.set(user("q", id="u1"), assistant_text("first", id="a1"))
    await engine.save()
    engine.set(last_assistant_message("retry"))
    result = await engine.resolve()
    assert ids(result.messages) == ["u1", "a1"]
    assert texts(result.messages) == ["q", "retry"]


async def test_default_renderer_is_xml_and_others_apply(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(role("Be kind & brief"), hint("one"), hint("two"))
    default = await engine.resolve()
    assert default.system_prompt == (await engine.resolve(renderer=XmlRenderer())).system_prompt
    parsed = ET.fromstring(f"<root>{default.system_prompt}</root>")
    assert parsed.findtext("role") == "Be kind & brief"
    assert [h.text for h in parsed.findall("hint")] == ["one", "two"]

    markdown = (await engine.resolve(renderer=MarkdownRenderer())).system_prompt
    assert "Be kind & brief" in markdown and "<role>" not in markdown
    toml = (await engine.resolve(renderer=TomlRenderer())).system_prompt
    assert tomllib.loads(toml) == {"role": "Be kind & brief", "hint": ["one", "two"]}
    toon = (await engine.resolve(renderer=ToonRenderer())).system_prompt
    assert "Be kind & brief" in toon and toon != markdown

    with pytest.raises(InvalidTypeError, match="renderer"):
        await engine.resolve(renderer="xml")  # type: ignore[arg-type]


async def test_resolve_feeds_the_provider_adapters(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(role("R"), user("q", id="u1"), assistant_text("a", id="a1"))
    await engine.save()
    result = await engine.resolve()
    openai = result.to_openai()
    assert [m["role"] for m in openai] == ["system", "user", "assistant"]
    anthropic = result.to_anthropic()
    assert [m["role"] for m in anthropic["messages"]] == ["user", "assistant"]
    assert "R" in json.dumps(anthropic["system"])


async def test_get_messages_matches_resolve(make_engine: EngineFactory) -> None:
    engine = make_engine()
    assert await engine.get_messages() == []
    engine.set(user("q", id="u1"), message("sys note", role="system", id="s1"))
    await engine.save()
    engine.set(user("pending", id="u2"))
    assert await engine.get_messages() == (await engine.resolve()).messages
    assert ids(await engine.get_messages()) == ["u1", "s1", "u2"]


async def test_estimate_counts_prompt_and_messages(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(role("You are a careful assistant."), user("hello " * 50, id="u1"))
    await engine.save()
    engine.set(assistant_text("pending answer"))
    estimate = await engine.estimate("gpt-4o")
    assert estimate.model_id == "gpt-4o"
    assert len(estimate.messages) == 2
    assert estimate.system_prompt_tokens > 0
    assert estimate.input_tokens >= estimate.system_prompt_tokens + sum(
        m.tokens for m in estimate.messages
    )
    assert [f.name for f in estimate.fragments] == ["role"]


async def test_inspect_is_json_serialisable_and_complete(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    def lazy_rules() -> list[str]:
        return ["no guessing"]

    engine = make_engine()
    engine.set(role("R"), ContextFragment(name="rules", data=lazy_rules), user("q", id="u1"))
    await engine.save()
    await engine.rewind("u1")
    engine.set(assistant_text("draft", id="a9"))

    inspected = await engine.inspect(model_id="gpt-4o")
    dumped: dict[str, Any] = inspected.model_dump(mode="json")
    round_trip = json.loads(json.dumps(dumped))
    assert round_trip["meta"]["chat_id"] == "c1"
    assert round_trip["meta"]["branch"] == "main-v2"
    assert round_trip["meta"]["timestamp"].endswith(("Z", "+00:00"))
    assert round_trip["estimate"]["model_id"] == "gpt-4o"
    assert [f["name"] for f in round_trip["fragments"]["context"]] == ["role", "rules"]
    assert round_trip["fragments"]["context"][1]["data"] == ["no guessing"]
    assert [p["id"] for p in round_trip["fragments"]["pending"]] == ["a9"]
    assert [p["id"] for p in round_trip["fragments"]["persisted"]] == ["u1"]
    assert {b["name"] for b in round_trip["graph"]["branches"]} == {"main", "main-v2"}
    assert "<role>R</role>" in round_trip["rendered"]

    plain = await engine.inspect()
    assert plain.estimate is None
    assert plain.graph == await store.get_graph("c1")
