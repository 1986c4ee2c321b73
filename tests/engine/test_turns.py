"""Streaming turns (begin_turn / complete_turn), overlapping turns — on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import math

import pytest

from agentcontext import (
    ContextEngine,
    EmptyConversationError,
    InvalidInputError,
    InvalidTypeError,
    Message,
    ReasoningPart,
    SerializationError,
    TextPart,
    assistant,
    assistant_text,
    hint,
    message,
    user,
)
from agentcontext.store import SqlContextStore
from tests.engine._util import ids, texts
from tests.engine.conftest import EngineFactory


async def test_begin_turn_saves_user_and_placeholder(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    placeholder = await engine.begin_turn(user("What is 2+2?", id="u1"))
    assert engine.head_message_id == placeholder
    assert engine.pending == []
    assert [r.id for r in await store.get_messages("c1")] == ["u1", placeholder]
    stored = await store.get_message(placeholder)
    assert stored is not None and stored.name == "assistant" and stored.data["parts"] == []
    # The placeholder never shows.
    assert ids((await engine.resolve()).messages) == ["u1"]
    assert ids(await make_engine().get_messages()) == ["u1"]
    assert ids((await make_engine().resolve()).messages) == ["u1"]

    result = await engine.complete_turn(assistant_text("4"))
    assert result.head_message_id == placeholder
    messages = await engine.get_messages()
    assert ids(messages) == ["u1", placeholder]
    assert texts(messages) == ["What is 2+2?", "4"]
    assert texts(await make_engine().get_messages()) == ["What is 2+2?", "4"]
    assert len(await store.list_branches("c1")) == 1
    assert (await store.get_message(placeholder)).parent_id == "u1"  # type: ignore[union-attr]


async def test_turns_follow_each_other(make_engine: EngineFactory) -> None:
    engine = make_engine()
    for n in range(3):
        await engine.begin_turn(user(f"q{n}"))
        await engine.complete_turn(assistant_text(f"a{n}"))
    assert texts(await engine.get_messages()) == ["q0", "a0", "q1", "a1", "q2", "a2"]


async def test_complete_turn_on_a_fresh_engine_fills_the_head_placeholder(
    make_engine: EngineFactory,
) -> None:
    starter = make_engine()
    placeholder = await starter.begin_turn(user("q", id="u1"))
    finisher = make_engine()  # e.g. another request handler
    result = await finisher.complete_turn(assistant_text("answer"))
    assert result.head_message_id == placeholder
    assert texts(await finisher.get_messages()) == ["q", "answer"]
    assert texts(await starter.get_messages()) == ["q", "answer"]


async def test_complete_turn_without_a_turn_raises(make_engine: EngineFactory) -> None:
    empty = make_engine()
    with pytest.raises(EmptyConversationError, match="begin_turn"):
        await empty.complete_turn(assistant_text("orphan"))
    assert empty.pending == []

    engine = make_engine("c2")
    engine.set(user("q"), assistant_text("a"))
    await engine.save()
    fresh = make_engine("c2")
    with pytest.raises(EmptyConversationError, match="placeholder"):
        await fresh.complete_turn(assistant_text("orphan"))
    assert fresh.pending == []
    assert texts(await fresh.get_messages()) == ["q", "a"]


async def test_turn_arguments_are_checked(make_engine: EngineFactory) -> None:
    engine = make_engine()
    with pytest.raises(InvalidTypeError):
        await engine.begin_turn(hint("not a message"))
    await engine.begin_turn(user("q"))
    with pytest.raises(InvalidTypeError):
        await engine.complete_turn(hint("not a message"))
    with pytest.raises(InvalidInputError, match="assistant"):
        await engine.complete_turn(user("wrong role"))
    assert engine.pending == []
    await engine.complete_turn(assistant_text("ok"))
    assert texts(await engine.get_messages()) == ["q", "ok"]


@pytest.mark.parametrize("role", ["assistant", "system"])
async def test_begin_turn_takes_only_a_user_message(
    store: SqlContextStore, make_engine: EngineFactory, role: str
) -> None:
    engine = make_engine()
    engine.set(user("q", id="u1"))
    await engine.save()
    engine.set(user("queued", id="u2"))
    with pytest.raises(InvalidInputError, match=rf"needs a user message.*got {role!r}"):
        await engine.begin_turn(message("not a question", role=role, id="x"))  # type: ignore[arg-type]
    assert [f.id for f in engine.pending] == ["u2"]
    assert [r.id for r in await store.get_messages("c1")] == ["u1"]
    assert engine.head_message_id == "u1"


async def test_a_failed_begin_turn_leaves_queue_and_store_as_they_were(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(user("queued", id="u0"))
    bad = user(Message(id="u1", role="user", parts=[TextPart(text="q")], metadata={"x": math.nan}))
    with pytest.raises(SerializationError):
        await engine.begin_turn(bad)
    assert [f.id for f in engine.pending] == ["u0"]
    assert await store.get_messages("c1") == []
    placeholder = await engine.begin_turn(user("q", id="u2"))
    assert [r.id for r in await store.get_messages("c1")] == ["u0", "u2", placeholder]


async def test_a_failed_complete_turn_keeps_the_turn_open(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    placeholder = await engine.begin_turn(user("q"))
    bad = Message(id="x", role="assistant", parts=[TextPart(text="a")], metadata={"s": -math.inf})
    with pytest.raises(SerializationError):
        await engine.complete_turn(assistant(bad))
    assert engine.pending == []
    assert (await store.get_message(placeholder)).data["parts"] == []  # type: ignore[union-attr]
    await engine.complete_turn(assistant_text("a"))
    assert texts(await engine.get_messages()) == ["q", "a"]


async def test_a_turn_started_before_the_previous_one_completed(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()
    first = await engine.begin_turn(user("A"))
    second = await engine.begin_turn(user("B"))
    # The answers name their placeholders, in any order.
    await engine.complete_turn(assistant_text("reply-A", id=first))
    await engine.complete_turn(assistant_text("reply-B", id=second))
    assert texts(await engine.get_messages()) == ["A", "reply-A", "B", "reply-B"]
    assert texts(await make_engine().get_messages()) == ["A", "reply-A", "B", "reply-B"]


async def test_a_turn_retried_with_its_fragment_built_again_is_stored_once(
    make_engine: EngineFactory,
) -> None:
    # A retry loop builds ``user("...")`` again each time, and each build draws a new id: the
    # same words retried while the turn is not heard to be completed are the same turn (it was
    # stored twice). Once completed, the same words are a new turn.
    engine = make_engine()
    first = await engine.begin_turn(user("same words"))
    again = await engine.begin_turn(user("same words"))  # (the first call's answer was lost)
    assert again == first
    await engine.complete_turn(assistant_text("the answer"))
    assert texts(await make_engine().get_messages()) == ["same words", "the answer"]
    later = await engine.begin_turn(user("same words"))
    assert later != first
    await engine.complete_turn(assistant_text("another answer"))
    assert texts(await make_engine().get_messages()) == [
        "same words", "the answer", "same words", "another answer"
    ]  # fmt: skip


async def test_overlapping_turns_first_answer_finishes_last(
    make_engine: EngineFactory,
) -> None:
    first_request, second_request = make_engine(), make_engine()
    a = await first_request.begin_turn(user("A"))
    b = await second_request.begin_turn(user("B"))
    await second_request.complete_turn(assistant_text("reply-B"))
    await first_request.complete_turn(assistant_text("reply-A"))
    for engine in (first_request, second_request, make_engine()):
        messages = await engine.get_messages()
        assert texts(messages) == ["A", "reply-A", "B", "reply-B"]
        assert ids(messages) == [ids(messages)[0], a, ids(messages)[2], b]


async def test_two_requests_racing_on_one_head_both_keep_their_turn(
    make_engine: EngineFactory, other_store: SqlContextStore
) -> None:
    seed = make_engine()
    await seed.begin_turn(user("seed"))
    await seed.complete_turn(assistant_text("reply-seed"))
    first, second = make_engine(), make_engine(on=other_store)
    await asyncio.gather(first.get_messages(), second.get_messages())  # same head
    await asyncio.gather(first.begin_turn(user("A")), second.begin_turn(user("B")))
    await asyncio.gather(
        first.complete_turn(assistant_text("reply-A")),
        second.complete_turn(assistant_text("reply-B")),
    )
    result = texts(await make_engine().get_messages())
    assert result[:2] == ["seed", "reply-seed"]
    turns = [result[2:4], result[4:6]]
    assert sorted(turns) == [["A", "reply-A"], ["B", "reply-B"]]
    messages = await make_engine().get_messages()
    assert len(ids(messages)) == len(set(ids(messages))) == 6


async def test_placeholder_survives_only_until_filled_across_engines(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    streaming: ContextEngine = make_engine()
    placeholder = await streaming.begin_turn(user("long question"))
    reader = make_engine()
    assert texts((await reader.resolve()).messages) == ["long question"]
    await streaming.complete_turn(
        assistant(
            Message(
                id="ignored",
                role="assistant",
                parts=[ReasoningPart(text="thinking"), TextPart(text="answer")],
            )
        )
    )
    messages = (await reader.resolve()).messages
    assert ids(messages)[-1] == placeholder
    assert messages[-1].parts == [ReasoningPart(text="thinking"), TextPart(text="answer")]


async def test_a_turn_retried_after_a_transaction_the_engine_followed_is_stored_once(
    store: SqlContextStore, make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine saved inside a caller's transaction that rolled back; its next ``begin_turn``
    noticed it, and forgot with it the turn it was beginning: a retry with the fragment built
    again (a new id, the same words) stored the question twice."""
    from agentcontext._turns import TurnTracker

    class Undo(Exception):
        pass

    engine = make_engine()
    engine.set(user("first", id="f1"))
    await engine.save()
    with contextlib.suppress(Undo):
        async with store.begin():  # a save inside a caller's transaction, rolled back
            engine.set(user("undone", id="u1"))
            await engine.save()
            raise Undo

    def outcome_lost(*_args: object) -> str:  # the turn is stored; the caller never hears it
        raise asyncio.CancelledError

    with monkeypatch.context() as patch:
        patch.setattr(TurnTracker, "begun", outcome_lost)
        with pytest.raises(asyncio.CancelledError):
            await engine.begin_turn(user("the question"))
    await engine.begin_turn(user("the question"))  # built again: another id
    await engine.complete_turn(assistant_text("the answer"))
    assert texts(await make_engine().get_messages()) == ["first", "the question", "the answer"]
