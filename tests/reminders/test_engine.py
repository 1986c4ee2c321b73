"""Reminders through the engine, on SQLite and PostgreSQL (the original's engine tests for
conditional reminders, translated, plus what the Python contract adds: what is saved is what
was sent, tool-output reminders, errors)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from agentcontext import (
    Message,
    ReminderContext,
    ReminderError,
    TextPart,
    ToolPart,
    XmlRenderer,
    after_turn,
    all_of,
    assistant,
    assistant_text,
    elapsed,
    every_n_turns,
    first_turn,
    fragment,
    hint,
    message_matches,
    reminder,
    role,
    strip_reminders,
    tokens_over,
    tool_failed,
    user,
    workflow,
)
from agentcontext.reminders import engine as reminders_engine
from agentcontext.reminders._core import append_to_message
from agentcontext.store import SqlContextStore
from tests.engine.conftest import EngineFactory
from tests.reminders._util import tool


async def last_text(engine: Any) -> str:
    messages = (await engine.resolve()).messages
    return str(messages[-1].text)


async def stored_users(store: SqlContextStore, chat_id: str = "c1") -> list[Message]:
    records = await store.get_messages(chat_id)
    return [Message.model_validate(r.data) for r in records if r.name == "user"]


# --- when reminders fire --------------------------------------------------------------------


async def test_every_n_turns_applies_on_a_matching_turn(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(user("turn 1"), assistant_text("reply 1"))
    await engine.save()
    engine.set(user("turn 2"), assistant_text("reply 2"))
    await engine.save()
    engine.set(reminder("every-third", when=every_n_turns(3)), user("turn 3"))
    await engine.save()
    assert "every-third" in await last_text(engine)


async def test_every_n_turns_skips_a_non_matching_turn(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(user("turn 1"), assistant_text("reply 1"))
    await engine.save()
    engine.set(reminder("every-third", when=every_n_turns(3)), user("turn 2"))
    await engine.save()
    assert await last_text(engine) == "turn 2"


async def test_first_turn_applies_on_the_first_turn_only(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(reminder("welcome", when=first_turn()), user("first message"))
    assert "welcome" in await last_text(engine)
    engine.set(assistant_text("reply"))
    await engine.save()
    engine.set(user("turn 2"))
    assert await last_text(engine) == "turn 2"


async def test_after_turn_applies_only_after_the_given_turn(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(reminder("late-hint", when=after_turn(2)))
    for turn in (1, 2, 3):
        engine.set(user(f"turn {turn}"))
        text = await last_text(engine)
        assert ("late-hint" in text) is (turn == 3), text
        engine.set(assistant_text("reply"))
        await engine.save()


async def test_a_text_function_receives_the_context(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(user("turn 1"), assistant_text("reply"))
    await engine.save()
    seen: list[ReminderContext] = []

    def text(ctx: ReminderContext) -> str:
        seen.append(ctx)
        return f"turn={ctx.turn} branch={ctx.branch}"

    engine.set(reminder(text, when=every_n_turns(2)), user("turn 2"))
    await engine.save()
    assert "turn=2 branch=main" in await last_text(engine)
    (ctx,) = seen
    assert ctx.content == "turn 2"
    assert [m.text for m in ctx.messages] == ["turn 1", "reply", "turn 2"]
    assert ctx.last_message is not None and ctx.last_message.text == "reply"
    assert ctx.chat.id == "c1" and ctx.target == "user"
    assert ctx.last_message_at is not None and ctx.elapsed is not None and ctx.elapsed >= 0


async def test_async_predicates_and_text_functions(make_engine: EngineFactory) -> None:
    engine = make_engine()

    async def yes(ctx: ReminderContext) -> bool:
        return True

    async def no(ctx: ReminderContext) -> bool:
        return False

    async def text(ctx: ReminderContext) -> str:
        return f"async turn {ctx.turn}"

    engine.set(
        reminder("async-yes", when=yes),
        reminder("async-no", when=no),
        reminder(text),
        reminder("mixed", when=all_of(yes, every_n_turns(1))),
        user("hello"),
    )
    text_sent = await last_text(engine)
    assert "async-yes" in text_sent and "async turn 1" in text_sent and "mixed" in text_sent
    assert "async-no" not in text_sent


async def test_several_reminders_fire_in_the_order_they_were_set(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()
    engine.set(reminder("r1", when=every_n_turns(1)), reminder("r2"), user("hello"))
    await engine.save()
    message = (await engine.resolve()).messages[0]
    assert message.text == (
        "hello\n\n<system-reminder>r1</system-reminder>\n\n<system-reminder>r2</system-reminder>"
    )
    assert len(message.metadata["reminders"]) == 2  # type: ignore[index]


async def test_a_text_function_returning_empty_skips_the_reminder(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()
    engine.set(reminder(lambda ctx: "", when=every_n_turns(1)), user("hello"))
    await engine.save()
    message = (await engine.resolve()).messages[0]
    assert message.text == "hello" and message.metadata is None


async def test_the_set_order_does_not_matter(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(user("hello"), reminder("after-user", when=every_n_turns(1)))
    await engine.save()
    assert "after-user" in await last_text(engine)


async def test_only_the_last_pending_user_message_is_amended(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(user("persisted-msg"), assistant_text("reply"))
    await engine.save()
    engine.set(reminder("targeted"), user("pending 1"), assistant_text("r"), user("pending 2"))
    await engine.save()
    texts = [m.text for m in (await engine.resolve()).messages]
    assert texts == [
        "persisted-msg",
        "reply",
        "pending 1",
        "r",
        "pending 2\n\n<system-reminder>targeted</system-reminder>",
    ]


async def test_nothing_happens_without_a_user_message(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(reminder("hint", when=every_n_turns(1)), assistant_text("no user here"))
    await engine.save()
    messages = (await engine.resolve()).messages
    assert [(m.role, m.text) for m in messages] == [("assistant", "no user here")]


async def test_reminders_never_reach_the_system_prompt(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(role("You help."), reminder("secret-hint"), hint("Be brief."), user("hello"))
    result = await engine.resolve()
    assert "secret-hint" not in result.system_prompt
    assert result.system_prompt == XmlRenderer().render([role("You help."), hint("Be brief.")])
    inspected = await engine.inspect()
    assert [f["name"] for f in inspected.fragments.context] == ["role", "hint"]


async def test_message_matches_reads_the_outgoing_message(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(reminder("use CTEs", when=message_matches(r"(?i)\bsql\b")))
    engine.set(user("write some SQL"))
    assert "use CTEs" in await last_text(engine)
    engine.set(assistant_text("done"))
    await engine.save()
    engine.set(user("now a poem"))
    assert await last_text(engine) == "now a poem"


# --- what is saved is what was sent ----------------------------------------------------------


async def test_save_stores_exactly_what_resolve_sent(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    clock = iter(range(1000))
    engine.set(reminder(lambda ctx: f"call {next(clock)}"), user("hello"))
    sent = (await engine.resolve()).messages
    again = (await engine.resolve()).messages  # evaluated once: the same text
    assert sent == again
    engine.set(assistant_text("hi"))
    await engine.save()
    stored = await engine.get_messages()
    assert stored[0] == sent[0]
    assert stored[0].text == "hello\n\n<system-reminder>call 0</system-reminder>"
    record = await store.get_message(sent[0].id)
    assert record is not None
    assert Message.model_validate(record.data) == sent[0]
    assert strip_reminders(stored[0]).text == "hello"


async def test_save_without_resolve_applies_the_reminders(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(reminder("persisted-hint", when=every_n_turns(1)), user("hello"))
    await engine.save()
    (stored,) = await stored_users(store)
    assert stored.text == "hello\n\n<system-reminder>persisted-hint</system-reminder>"
    assert stored.metadata == {"reminders": [{"start": 5, "end": 56, "part": 0}]}


async def test_save_then_resolve_does_not_apply_twice(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(reminder("once-only", when=every_n_turns(1)), user("hello"))
    await engine.save()
    for _ in range(2):
        assert (await last_text(engine)).count("once-only") == 1


async def test_a_new_engine_does_not_apply_stored_reminders_again(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()
    engine.set(reminder("baked-in", when=every_n_turns(1)), user("turn 1"))
    await engine.save()
    fresh = make_engine()
    fresh.set(reminder("baked-in", when=every_n_turns(1)))
    assert (await last_text(fresh)).count("baked-in") == 1


async def test_begin_turn_applies_the_reminders(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(reminder("streaming hint"))
    await engine.begin_turn(user("question"))
    await engine.complete_turn(assistant_text("answer"))
    assert [m.text for m in await engine.get_messages()] == [
        "question\n\n<system-reminder>streaming hint</system-reminder>",
        "answer",
    ]


async def test_elapsed_is_known_once_the_branch_has_a_stored_message(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()
    engine.set(reminder(lambda ctx: f"elapsed known: {ctx.elapsed is not None}"))
    question = user("question")
    engine.set(question)
    sent = (await engine.resolve()).messages[-1]
    engine.clear_pending()
    engine.set(assistant_text("unrelated"))
    await engine.save()
    engine.set(user("next"))
    assert "elapsed known: True" in await last_text(engine)
    assert "elapsed known: False" in sent.text


async def test_a_forked_save_keeps_the_reminder_under_the_new_id(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(user("warmup"), assistant_text("ack"), user("hello", id="q1"), assistant_text("r"))
    await engine.save()
    engine.set(reminder("branch-hint"), user("updated", id="q1"))
    await engine.save()
    assert engine.branch == "main-v2"
    forked = (await engine.get_messages())[-1]
    assert forked.id != "q1"
    assert forked.text == "updated\n\n<system-reminder>branch-hint</system-reminder>"
    record = await store.get_message(forked.id)
    assert record is not None and record.data["id"] == forked.id
    original = await store.get_message("q1")
    assert original is not None and original.data["parts"][0]["text"] == "hello"


async def test_strip_reminders_gives_back_what_the_user_wrote(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(
        reminder("strippable"),
        reminder(workflow("review", ["read", "check"])),
        user("hello"),
    )
    await engine.save()
    message = (await engine.resolve()).messages[0]
    assert "strippable" in message.text and "<workflow>" in message.text
    assert strip_reminders(message) == Message(
        id=message.id, role="user", parts=[TextPart(text="hello")]
    )


# --- fragments as reminder text ----------------------------------------------------------------


async def test_a_fragment_reminder_is_rendered_as_xml(make_engine: EngineFactory) -> None:
    engine = make_engine()
    steps = workflow("deploy", ["test", "ship"])
    engine.set(reminder(steps, when=message_matches("deploy")), user("deploy it"))
    text = await last_text(engine)
    assert f"<system-reminder>{XmlRenderer().render([steps])}</system-reminder>" in text
    engine.clear_pending()
    engine.set(user("something else"))
    assert await last_text(engine) == "something else"


# --- usage and time --------------------------------------------------------------------------


async def test_tokens_over_reads_the_tracked_usage(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(reminder("over-budget", when=tokens_over(10_000)))
    engine.set(user("turn 1"), assistant_text("reply"))
    await engine.save()
    await engine.track_usage({"input_tokens": 6000, "output_tokens": 3999})
    engine.set(user("turn 2"))
    assert await last_text(engine) == "turn 2"
    engine.set(assistant_text("reply"))
    await engine.save()
    await engine.track_usage({"input_tokens": 1})  # 10 000: the threshold counts
    engine.set(user("turn 3"))
    assert "over-budget" in await last_text(engine)


async def test_a_message_listing_reminders_still_gets_this_turns(
    make_engine: EngineFactory,
) -> None:
    earlier = append_to_message(
        Message(id="u1", role="user", parts=[TextPart(text="question")]), ["from before"]
    )
    engine = make_engine()
    engine.set(reminder("stay on task"), user(earlier))
    sent = (await engine.resolve()).messages[-1]
    assert sent.text.count("<system-reminder>from before</system-reminder>") == 1
    assert sent.text.count("<system-reminder>stay on task</system-reminder>") == 1
    assert strip_reminders(sent).text == "question"


async def test_a_copy_of_an_amended_message_is_not_amended_twice(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()
    engine.set(reminder("stay on task"), user("question", id="u1"))
    sent = (await engine.resolve()).messages[-1]
    again = make_engine()
    again.set(reminder("stay on task"), user(sent))
    resent = (await again.resolve()).messages[-1]
    assert resent.text.count("<system-reminder>stay on task</system-reminder>") == 1
    assert resent == sent


async def test_tokens_over_fires_on_the_original_packages_usage_shape(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()
    engine.set(reminder("over-budget", when=tokens_over(700)))
    engine.set(user("turn 1"), assistant_text("reply"))
    await engine.save()
    await engine.track_usage({"inputTokens": 500, "outputTokens": 200, "totalTokens": 700})
    engine.set(user("turn 2"))
    assert "over-budget" in await last_text(engine)


async def test_elapsed_counts_from_the_last_stored_message(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine()
    engine.set(reminder("welcome back", when=elapsed(60)))
    engine.set(user("turn 1"))
    assert await last_text(engine) == "turn 1"  # nothing stored yet: no elapsed time
    engine.set(assistant_text("reply"))
    await engine.save()
    head = await engine.store.get_message(engine.head_message_id or "")
    assert head is not None
    for seconds, fires in ((59.999, False), (60, True), (3600, True)):
        moment = head.created_at + timedelta(seconds=seconds)
        monkeypatch.setattr(reminders_engine, "_now", lambda moment=moment: moment)
        engine.clear_pending()
        engine.set(user("turn 2"))
        assert ("welcome back" in await last_text(engine)) is fires, seconds


# --- tool output -----------------------------------------------------------------------------


def tool_call(name: str, state: str, **fields: Any) -> Message:
    return Message(
        id=f"a-{name}-{state}-{len(fields)}", role="assistant", parts=[tool(name, state, **fields)]
    )


async def test_a_tool_output_reminder_goes_into_the_latest_tool_result(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()
    engine.set(
        reminder("user side"),
        reminder("check the exit code", target="tool-output", when=tool_failed("bash")),
    )
    engine.set(user("list files"))
    first = (await engine.resolve()).messages
    assert "user side" in first[-1].text
    call = Message(
        id="a1",
        role="assistant",
        parts=[
            tool("bash", call_id="c1", output="a.txt"),
            tool("bash", "output-error", call_id="c2", error="exit 2"),
        ],
    )
    engine.set(assistant(call))
    sent = (await engine.resolve()).messages
    assert sent[0].text.count("user side") == 1  # the user message is not amended again
    amended = sent[-1]
    assert amended.parts[0] == call.parts[0]
    part = amended.parts[1]
    assert isinstance(part, ToolPart)
    assert part.error == "exit 2\n\n<system-reminder>check the exit code</system-reminder>"
    assert amended.metadata == {
        "reminders": [{"part": 1, "field": "error", "start": 6, "end": len(part.error)}]
    }
    assert strip_reminders(amended) == call
    engine.set(assistant_text("the listing failed", id="a2"))
    await engine.save()
    assert (await engine.get_messages())[1] == amended


async def test_a_tool_output_reminder_wraps_a_structured_result(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(reminder("mind the row count", target="tool-output"))
    engine.set(user("query"), assistant(tool_call("sql", "output-available", output={"rows": 3})))
    sent = (await engine.resolve()).messages[-1]
    part = sent.parts[0]
    assert isinstance(part, ToolPart)
    assert part.output == {
        "result": {"rows": 3},
        "system_reminder": "<system-reminder>mind the row count</system-reminder>",
    }
    openai = (await engine.resolve()).to_openai()
    assert "mind the row count" in str(openai)


async def test_tool_output_reminders_skip_calls_without_results(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()
    engine.set(reminder("never", target="tool-output"))
    engine.set(user("go"), assistant(tool_call("bash", "input-available")))
    sent = (await engine.resolve()).messages[-1]
    assert sent.metadata is None


async def test_a_failure_streak_escalates_and_resets_on_success(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()
    engine.set(
        reminder("bash failed", target="tool-output", when=tool_failed("bash")),
        reminder(
            "bash failed 3 times in a row", target="tool-output", when=tool_failed("bash", streak=3)
        ),
    )
    engine.set(user("do the thing"))
    await engine.resolve()
    seen: list[str] = []
    for step, state in enumerate(["output-error"] * 3 + ["output-available", "output-error"]):
        fields = {"error": "boom"} if state == "output-error" else {"output": "ok"}
        engine.set(
            assistant(
                Message(
                    id=f"s{step}",
                    role="assistant",
                    parts=[tool("bash", state, call_id=f"c{step}", **fields)],
                )
            )
        )
        part = (await engine.resolve()).messages[-1].parts[0]
        assert isinstance(part, ToolPart)
        seen.append(str(part.error if state == "output-error" else part.output))
    assert ["3 times" in s for s in seen] == [False, False, True, False, False]
    assert ["bash failed" in s for s in seen] == [True, True, True, False, True]


# --- errors ----------------------------------------------------------------------------------


async def test_a_raising_predicate_raises_and_leaves_the_queue_alone(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()

    def broken(ctx: ReminderContext) -> bool:
        raise RuntimeError("bug in my predicate")

    bad = reminder("x", when=broken)
    engine.set(bad, user("hello"))
    with pytest.raises(ReminderError, match="bug in my predicate"):
        await engine.resolve()
    with pytest.raises(ReminderError):
        await engine.save()
    assert [m.text for m in await engine.get_messages()] == ["hello"]  # still pending
    engine.unset("reminder")
    await engine.save()
    assert [m.text for m in await engine.get_messages()] == ["hello"]


class NoTruth:
    """An answer without a truth value, as a numpy array or a pandas Series has."""

    def __bool__(self) -> bool:
        raise ValueError("The truth value of an array with more than one element is ambiguous")


@pytest.mark.parametrize("once", [None, "nudge"])
async def test_a_predicate_answer_without_a_truth_value_names_the_reminder(
    make_engine: EngineFactory, once: str | None
) -> None:
    engine = make_engine()
    engine.set(reminder("check the units", when=lambda ctx: NoTruth(), once=once), user("hi"))
    name = "once='nudge'" if once else "'check the units'"
    for call in (engine.resolve, engine.save):
        with pytest.raises(ReminderError, match="no truth value") as info:
            await call()
        assert name in str(info.value) and "NoTruth" in str(info.value)
    assert [f.name for f in engine.pending] == ["user"]  # still pending, nothing stored
    nested = make_engine("c2")
    nested.set(reminder("x", when=all_of(lambda ctx: NoTruth())), user("hi"))
    with pytest.raises(ReminderError, match="no truth value"):
        await nested.resolve()


async def test_a_text_function_must_return_a_string(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.set(reminder(lambda ctx: 42), user("hello"))  # type: ignore[arg-type,return-value]
    with pytest.raises(ReminderError, match="str"):
        await engine.resolve()


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("",), {}),
        (("  \n",), {}),
        ((fragment("empty"),), {}),
        ((user("a message"),), {}),
        ((3,), {}),
        (("x",), {"target": "steer"}),
        (("x",), {"when": True}),
        (("x",), {"once": ""}),
        (("x",), {"once": "x" * 256}),
    ],
)
def test_bad_reminder_arguments_are_refused(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    with pytest.raises(ReminderError):
        reminder(*args, **kwargs)


async def test_the_context_names_the_latest_tool_outcome(make_engine: EngineFactory) -> None:
    engine = make_engine()
    outcomes: list[tuple[str, ToolPart | None]] = []

    def record(ctx: ReminderContext) -> bool:
        outcomes.append((ctx.target, ctx.tool_outcome))
        return False

    engine.set(reminder("u", when=record), reminder("t", target="tool-output", when=record))
    engine.set(user("go"))
    await engine.resolve()
    call = tool("sql", "output-error", call_id="c9", error="syntax error")
    engine.set(
        assistant(Message(id="a9", role="assistant", parts=[call, tool("x", "input-available")]))
    )
    await engine.resolve()
    engine.set(assistant_text("done"))
    await engine.save()
    engine.set(user("next"))
    await engine.resolve()
    assert outcomes == [("user", None), ("tool-output", call), ("user", call)]


async def test_usage_tracked_by_another_engine_is_seen(
    make_engine: EngineFactory, other_store: SqlContextStore
) -> None:
    engine = make_engine()
    engine.set(reminder("over-budget", when=tokens_over(50)), user("turn 1"))
    assert await last_text(engine) == "turn 1"
    engine.clear_pending()
    await make_engine(on=other_store).track_usage({"total_tokens": 50})
    engine.set(user("turn 1 again"))
    assert "over-budget" in await last_text(engine)
