"""unset, render, fork, turn_count, first_user_message, head_message (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest

from agentcontext import (
    ContextEngine,
    InMemoryContextStore,
    InvalidInputError,
    MarkdownRenderer,
    XmlRenderer,
    assistant,
    assistant_text,
    fragment,
    hint,
    reminder,
    role,
    user,
)
from agentcontext.messages import Message
from agentcontext.store import SqlContextStore
from tests.engine.conftest import EngineFactory


def test_unset_drops_fragments_by_name_and_chains(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(role("r"), hint("a"), hint("b"), reminder("x"), user("pending"))
    assert engine.unset("hint") is engine
    assert [f.name for f in engine.fragments] == ["role", "reminder"]
    engine.unset("reminder").unset("nothing-by-that-name")
    assert [f.name for f in engine.fragments] == ["role"]
    assert len(engine.pending) == 1  # messages are not fragments of the prompt


def test_unset_refuses_a_non_name(make_engine: EngineFactory) -> None:
    with pytest.raises(InvalidInputError):
        make_engine().unset(3)  # type: ignore[arg-type]


async def test_unset_changes_what_resolve_renders(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(role("r"), hint("old"))
    assert "old" in (await engine.resolve()).system_prompt
    engine.unset("hint").set(hint("new"))
    assert (await engine.resolve()).system_prompt == XmlRenderer().render([role("r"), hint("new")])


def test_render_gives_the_system_prompt_without_reminders(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(role("You help."), reminder("hidden"), hint("Be brief."))
    expected = [role("You help."), hint("Be brief.")]
    assert engine.render() == XmlRenderer().render(expected)
    assert engine.render(MarkdownRenderer()) == MarkdownRenderer().render(expected)
    assert "hidden" not in engine.render()


async def test_render_matches_resolve(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(role("r"), fragment("db", hint("PostgreSQL 15")))
    assert engine.render() == (await engine.resolve()).system_prompt


def test_render_refuses_lazy_data_with_a_way_out(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(fragment("live", lambda: "loaded"))
    with pytest.raises(InvalidInputError, match="resolve"):
        engine.render()


def test_render_refuses_a_non_renderer(make_engine: EngineFactory) -> None:
    with pytest.raises(InvalidInputError):
        make_engine().render("xml")  # type: ignore[arg-type]


async def test_fork_copies_fragments_into_a_fresh_in_memory_chat(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(role("r"), hint("h"), user("hello"), assistant_text("hi"))
    await engine.save()
    engine.set(reminder("stay focused"), user("pending, not copied"))
    child = engine.fork()
    try:
        assert isinstance(child, ContextEngine)
        assert isinstance(child.store, InMemoryContextStore)
        assert child.chat_id != engine.chat_id and child.user_id == engine.user_id
        assert child.fragments == engine.fragments
        assert child.pending == []
        child.set(user("sub-task"))
        result = await child.resolve()
        assert result.system_prompt == engine.render()
        assert [m.text for m in result.messages] == [
            "sub-task\n\n<system-reminder>stay focused</system-reminder>"
        ]
        await child.save()
        child.unset("hint")
        assert [f.name for f in engine.fragments] == ["role", "hint", "reminder"]
    finally:
        await child.store.close()
    assert [m.text for m in await engine.get_messages()] == ["hello", "hi", "pending, not copied"]
    assert len(await store.get_messages("c1")) == 2  # nothing of the fork reached this store


async def test_turn_count_counts_stored_and_pending_user_messages(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()
    assert await engine.turn_count() == 0
    engine.set(user("msg 1"), assistant_text("reply 1"))
    await engine.save()
    engine.set(user("msg 2"), assistant_text("reply 2"))
    await engine.save()
    engine.set(user("msg 3"))
    assert await engine.turn_count() == 3
    assert await make_engine().turn_count() == 2  # another engine: the stored turns


async def test_turn_count_follows_the_branch(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(user("1", id="u1"), assistant_text("a", id="a1"), user("2"), assistant_text("b"))
    await engine.save()
    await engine.rewind("a1")
    assert await engine.turn_count() == 1


async def test_first_user_message(make_engine: EngineFactory) -> None:
    engine = make_engine()
    assert await engine.first_user_message() is None
    engine.set(assistant_text("greeting"), user("pending question"))
    first = await engine.first_user_message()
    assert first is not None and first.text == "pending question"
    await engine.save()
    engine.set(user("later"))
    first = await engine.first_user_message()
    assert first is not None and first.text == "pending question"


async def test_head_message(make_engine: EngineFactory) -> None:
    engine = make_engine()
    assert await engine.head_message() is None
    engine.set(user("q", id="q1"))
    head = await engine.head_message()
    assert head is not None and head.id == "q1"  # pending first
    await engine.save()
    head = await make_engine().head_message()
    assert head is not None and head.id == "q1"
    placeholder = await engine.begin_turn(user("q2"))
    head = await engine.head_message()
    assert head is not None and head.id == placeholder and head.parts == []
    engine.set(assistant(Message(id="x", role="assistant", parts=[])))
    head = await engine.head_message()
    assert head is not None and head.id == "x"
