"""The predicates and combinators on their own (the original's predicate tests, translated)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentcontext import (
    ReminderContext,
    ReminderError,
    after_turn,
    all_of,
    any_of,
    elapsed,
    every_n_turns,
    first_n_turns,
    first_turn,
    message_matches,
    not_,
    tokens_over,
    tool_failed,
)
from agentcontext.reminders import Predicate, tool_failure_streak, total_tokens
from agentcontext.reminders._core import evaluate
from tests.reminders._util import answer, ask, context, tool


async def holds(predicate: Predicate, ctx: ReminderContext) -> bool:
    return await evaluate(predicate, ctx, what="predicate")


# --- turns ----------------------------------------------------------------------------------


def test_every_n_turns_fires_on_turns_divisible_by_n() -> None:
    predicate = every_n_turns(3)
    assert [predicate(context(turn=t)) for t in (1, 2, 3, 6, 7)] == [
        False,
        False,
        True,
        True,
        False,
    ]


def test_first_turn_fires_only_on_turn_1() -> None:
    predicate = first_turn()
    assert [predicate(context(turn=t)) for t in (1, 2, 10)] == [True, False, False]


def test_first_n_turns_fires_on_the_first_n_turns() -> None:
    predicate = first_n_turns(3)
    assert [predicate(context(turn=t)) for t in (1, 3, 4)] == [True, True, False]


def test_after_turn_fires_only_after_turn_n() -> None:
    predicate = after_turn(5)
    assert [predicate(context(turn=t)) for t in (5, 6, 10)] == [False, True, True]


@given(n=st.integers(1, 50), turn=st.integers(1, 500))
def test_turn_predicates_agree_with_their_definition(n: int, turn: int) -> None:
    ctx = context(turn=turn)
    assert every_n_turns(n)(ctx) is (turn % n == 0)
    assert first_n_turns(n)(ctx) is (turn <= n)
    assert after_turn(n)(ctx) is (turn > n)
    assert first_turn()(ctx) is (turn == 1)


def test_a_plain_function_is_a_predicate() -> None:
    def fourth(ctx: ReminderContext) -> bool:
        return ctx.turn == 4

    assert [fourth(context(turn=t)) for t in (3, 4, 5)] == [False, True, False]


@pytest.mark.parametrize(
    ("build", "bad"),
    [
        (every_n_turns, 0),
        (every_n_turns, -3),
        (every_n_turns, True),
        (every_n_turns, 2.0),
        (first_n_turns, 0),
        (after_turn, -1),
        (after_turn, "2"),
        (tokens_over, -1),
    ],
)
def test_bad_counts_are_refused_when_built(build: Any, bad: Any) -> None:
    with pytest.raises(ReminderError):
        build(bad)


# --- combinators ----------------------------------------------------------------------------


async def test_all_of_combines_with_and_logic() -> None:
    predicate = all_of(every_n_turns(3), after_turn(5))
    assert [await holds(predicate, context(turn=t)) for t in (3, 6, 7, 9)] == [
        False,
        True,
        False,
        True,
    ]


async def test_any_of_combines_with_or_logic() -> None:
    predicate = any_of(first_turn(), every_n_turns(5))
    assert [await holds(predicate, context(turn=t)) for t in (1, 2, 5, 10)] == [
        True,
        False,
        True,
        True,
    ]


async def test_not_inverts_a_predicate() -> None:
    predicate = not_(first_n_turns(2))
    assert [await holds(predicate, context(turn=t)) for t in (1, 2, 3)] == [False, False, True]


async def test_combinators_mix_async_and_plain_predicates() -> None:
    async def late(ctx: ReminderContext) -> bool:
        return ctx.turn > 2

    predicate = all_of(late, not_(every_n_turns(2)))
    assert [await holds(predicate, context(turn=t)) for t in (1, 3, 4, 5)] == [
        False,
        True,
        False,
        True,
    ]


async def test_combinators_stop_at_the_first_decisive_predicate() -> None:
    calls: list[str] = []

    def spy(name: str, value: bool) -> Predicate:
        def check(ctx: ReminderContext) -> bool:
            calls.append(name)
            return value

        return check

    assert not await holds(all_of(spy("a", False), spy("b", True)), context())
    assert await holds(any_of(spy("c", True), spy("d", False)), context())
    assert calls == ["a", "c"]


@given(values=st.lists(st.booleans(), min_size=1, max_size=6))
async def test_combinators_agree_with_all_and_any(values: list[bool]) -> None:
    predicates = [(lambda ctx, v=v: v) for v in values]
    ctx = context()
    assert await holds(all_of(*predicates), ctx) is all(values)
    assert await holds(any_of(*predicates), ctx) is any(values)
    assert await holds(not_(any_of(*predicates)), ctx) is (not any(values))


def test_combinators_refuse_no_predicate_or_a_non_callable() -> None:
    for build in (all_of, any_of):
        with pytest.raises(ReminderError, match="at least one"):
            build()
        with pytest.raises(ReminderError, match="not a predicate"):
            build(first_turn(), "turn 1")  # type: ignore[arg-type]
    with pytest.raises(ReminderError):
        not_(3)  # type: ignore[arg-type]


async def test_a_raising_predicate_is_named_in_a_reminder_error() -> None:
    def broken(ctx: ReminderContext) -> bool:
        raise KeyError("oops")

    with pytest.raises(ReminderError, match="KeyError") as info:
        await holds(all_of(first_turn(), broken), context())
    assert isinstance(info.value.__cause__, KeyError)


def test_predicates_have_readable_reprs() -> None:
    predicate = all_of(every_n_turns(3), not_(tool_failed("bash", streak=2)))
    assert repr(predicate) == "all_of(every_n_turns(3), not_(tool_failed('bash', streak=2)))"


# --- content --------------------------------------------------------------------------------


def test_message_matches_fires_when_the_pattern_is_found() -> None:
    predicate = message_matches(r"\bdeploy(ment)?\b")
    assert predicate(context(content="please start the deployment"))
    assert not predicate(context(content="deployed already"))


def test_message_matches_honours_compiled_flags() -> None:
    assert message_matches(re.compile("urgent", re.IGNORECASE))(context(content="URGENT fix"))
    assert not message_matches("urgent")(context(content="URGENT fix"))


def test_message_matches_gives_the_same_answer_every_time() -> None:
    predicate = message_matches(re.compile("a"))
    ctx = context(content="banana")
    assert [predicate(ctx) for _ in range(4)] == [True] * 4  # no stateful global matching


def test_message_matches_refuses_bad_patterns() -> None:
    with pytest.raises(ReminderError, match="invalid"):
        message_matches("(unclosed")
    with pytest.raises(ReminderError):
        message_matches(42)  # type: ignore[arg-type]
    with pytest.raises(ReminderError):
        message_matches(re.compile(b"bytes"))  # type: ignore[arg-type]


async def test_content_and_turn_predicates_compose() -> None:
    predicate = all_of(message_matches("(?i)sql"), after_turn(2))
    assert await holds(predicate, context(turn=3, content="write SQL"))
    assert not await holds(predicate, context(turn=2, content="write SQL"))
    assert not await holds(predicate, context(turn=3, content="write prose"))
    excluded = not_(message_matches("secret"))
    assert not await holds(excluded, context(content="the secret plan"))


# --- tools ----------------------------------------------------------------------------------


def test_tool_failed_fires_only_on_errors() -> None:
    failed = context(messages=[ask("go", "u0"), answer(tool("bash", "output-error"))])
    worked = context(messages=[ask("go", "u0"), answer(tool("bash"))])
    assert tool_failed("bash")(failed)
    assert not tool_failed("bash")(worked)
    assert not tool_failed("sql")(failed)
    assert tool_failed()(failed)  # any tool


def test_tool_failed_streak_counts_back_until_a_success() -> None:
    history = [
        answer(tool("bash", "output-error", call_id="1"), message_id="a1"),
        answer(tool("bash", call_id="2"), message_id="a2"),
        answer(
            tool("bash", "output-error", call_id="3"),
            tool("sql", call_id="s"),
            tool("bash", "output-error", call_id="4"),
            message_id="a3",
        ),
    ]
    ctx = context(messages=history)
    assert tool_failure_streak(ctx, "bash") == 2
    assert tool_failed("bash", streak=2)(ctx)
    assert not tool_failed("bash", streak=3)(ctx)
    assert tool_failure_streak(ctx) == 1  # any tool: the newest result (bash) failed once
    assert tool_failure_streak(ctx, "sql") == 0


def test_tool_failed_ignores_calls_without_a_result() -> None:
    ctx = context(
        messages=[
            answer(tool("bash", "output-error", call_id="1"), tool("bash", "input-available"))
        ]
    )
    assert tool_failed("bash")(ctx)


def test_tool_failed_is_false_without_tool_history() -> None:
    assert not tool_failed()(context())


def test_tool_failed_refuses_bad_arguments() -> None:
    with pytest.raises(ReminderError):
        tool_failed("")
    with pytest.raises(ReminderError):
        tool_failed("bash", streak=0)
    with pytest.raises(ReminderError):
        tool_failed(3)  # type: ignore[arg-type]


# --- usage and time -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("usage", "total"),
    [
        ({"total_tokens": 10_001}, 10_001),
        ({"totalTokens": 7}, 7),
        ({"input_tokens": 6000, "output_tokens": 4001}, 10_001),
        ({"prompt_tokens": 5, "completion_tokens": 6}, 11),
        ({"input_tokens": 12}, 12),
        ({}, 0),
        ({"total_tokens": "many"}, 0),
    ],
)
def test_total_tokens_reads_every_sdks_keys(usage: dict[str, Any], total: int) -> None:
    assert total_tokens(usage) == total


def test_tokens_over_fires_at_and_above_the_threshold() -> None:
    predicate = tokens_over(10_000)
    assert predicate(context(usage={"input_tokens": 6000, "output_tokens": 4001}))
    assert predicate(context(usage={"total_tokens": 10_000}))  # the threshold counts
    assert not predicate(context(usage={"total_tokens": 9_999}))
    assert not predicate(context())


def test_elapsed_fires_at_and_after_the_threshold_never_on_an_empty_branch() -> None:
    predicate = elapsed(60)
    assert predicate(context(elapsed=60.001))
    assert predicate(context(elapsed=60.0))
    assert not predicate(context(elapsed=30.0))
    assert not predicate(context(elapsed=None))
    assert elapsed(timedelta(minutes=1))(context(elapsed=60.0))


def test_elapsed_refuses_bad_durations() -> None:
    for bad in (-1, float("nan"), float("inf"), "60", None):
        with pytest.raises(ReminderError):
            elapsed(bad)  # type: ignore[arg-type]
