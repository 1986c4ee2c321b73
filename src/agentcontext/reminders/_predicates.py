"""Predicates that say when a reminder fires, and combinators of them."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from agentcontext.errors import ReminderError
from agentcontext.messages import ToolPart
from agentcontext.reminders._core import Predicate, ReminderContext, evaluate

__all__ = [
    "after_turn",
    "all_of",
    "any_of",
    "every_n_turns",
    "elapsed",
    "first_n_turns",
    "first_turn",
    "message_matches",
    "not_",
    "tokens_over",
    "tool_failed",
    "total_tokens",
    "tool_failure_streak",
]


class _Named:
    """A predicate with a readable repr (``every_n_turns(3)``)."""

    __slots__ = ("_func", "_label")

    def __init__(self, func: Callable[[ReminderContext], Any], label: str) -> None:
        self._func = func
        self._label = label

    def __call__(self, context: ReminderContext) -> Any:
        return self._func(context)

    def __repr__(self) -> str:
        return self._label


def _count(value: object, what: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ReminderError(f"{what} takes an int, got {type(value).__name__}")
    if value < minimum:
        raise ReminderError(f"{what} takes an int of at least {minimum}, got {value}")
    return value


def every_n_turns(n: int) -> Predicate:
    """Fires on turns ``n``, ``2n``, ``3n``, ... (the turn number is a multiple of ``n``).

    Raises:
        ReminderError: ``n`` is not an int of at least 1.
    """
    n = _count(n, "every_n_turns(n)", minimum=1)
    return _Named(lambda ctx: ctx.turn % n == 0, f"every_n_turns({n})")


def first_turn() -> Predicate:
    """Fires on the first turn only (the conversation's first user message)."""
    return _Named(lambda ctx: ctx.turn == 1, "first_turn()")


def first_n_turns(n: int) -> Predicate:
    """Fires on turns 1 to ``n``.

    Raises:
        ReminderError: ``n`` is not an int of at least 1.
    """
    n = _count(n, "first_n_turns(n)", minimum=1)
    return _Named(lambda ctx: ctx.turn <= n, f"first_n_turns({n})")


def after_turn(n: int) -> Predicate:
    """Fires on every turn after turn ``n`` (``n + 1`` onwards).

    Raises:
        ReminderError: ``n`` is not an int of at least 0.
    """
    n = _count(n, "after_turn(n)", minimum=0)
    return _Named(lambda ctx: ctx.turn > n, f"after_turn({n})")


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def total_tokens(usage: Mapping[str, Any]) -> float:
    """The total tokens of a tracked usage dict, whatever SDK it came from.

    ``total_tokens`` (OpenAI) or ``totalTokens`` (AI SDK) when present, else input plus
    output tokens (``input_tokens``/``output_tokens`` as Anthropic and OpenAI's Responses
    API name them, or ``prompt_tokens``/``completion_tokens``); 0 for an empty usage.
    """
    for key in ("total_tokens", "totalTokens"):
        found = _number(usage.get(key))
        if found is not None:
            return found
    for first, second in (
        ("input_tokens", "output_tokens"),
        ("prompt_tokens", "completion_tokens"),
        ("inputTokens", "outputTokens"),
    ):
        a, b = _number(usage.get(first)), _number(usage.get(second))
        if a is not None or b is not None:
            return (a or 0.0) + (b or 0.0)
    return 0.0


def tokens_over(n: int) -> Predicate:
    """Fires once the chat's tracked usage (`ContextEngine.track_usage`) reaches ``n`` total
    tokens (the threshold itself counts). See `total_tokens` for the keys read.

    Raises:
        ReminderError: ``n`` is not an int of at least 0.
    """
    n = _count(n, "tokens_over(n)", minimum=0)
    return _Named(lambda ctx: total_tokens(ctx.usage) >= n, f"tokens_over({n})")


def elapsed(seconds: float | timedelta) -> Predicate:
    """Fires when at least ``seconds`` passed since the branch's newest stored message
    (never on an empty branch).

    Raises:
        ReminderError: ``seconds`` is not a non-negative number or a timedelta.
    """
    if isinstance(seconds, timedelta):
        limit = seconds.total_seconds()
    else:
        found = _number(seconds)
        if found is None:
            raise ReminderError(
                f"elapsed(seconds) takes a number or a timedelta, got {type(seconds).__name__}"
            )
        limit = found
    if not limit >= 0 or limit == float("inf"):
        raise ReminderError(f"elapsed(seconds) takes a finite number of at least 0, got {limit}")
    return _Named(
        lambda ctx: ctx.elapsed is not None and ctx.elapsed >= limit, f"elapsed({limit:g})"
    )


def message_matches(pattern: str | re.Pattern[str]) -> Predicate:
    """Fires when the regular expression ``pattern`` is found (``re.search``) in the text of
    the message being amended. Compile it with flags (``re.compile(..., re.I)``) to change
    how it matches.

    Raises:
        ReminderError: ``pattern`` is not a str or compiled pattern, or does not compile.
    """
    if isinstance(pattern, str):
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise ReminderError(f"message_matches() pattern {pattern!r} is invalid: {exc}") from exc
    elif isinstance(pattern, re.Pattern) and isinstance(pattern.pattern, str):
        compiled = pattern
    else:
        raise ReminderError(
            "message_matches() takes a str pattern or a compiled str pattern, "
            f"got {type(pattern).__name__}"
        )
    return _Named(
        lambda ctx: compiled.search(ctx.content) is not None,
        f"message_matches({compiled.pattern!r})",
    )


def tool_failure_streak(context: ReminderContext, name: str | None = None) -> int:
    """How many results of tool ``name`` (any tool when None) failed in a row, counting back
    from the newest result in ``context.messages``; a success ends the run."""
    streak = 0
    for message in reversed(context.messages):
        for part in reversed(message.parts):
            if not isinstance(part, ToolPart):
                continue
            if name is not None and part.tool_name != name:
                continue
            if part.state == "output-error":
                streak += 1
            elif part.state == "output-available":
                return streak
    return streak


def tool_failed(name: str | None = None, *, streak: int = 1) -> Predicate:
    """Fires when tool ``name`` (any tool when None) failed at least ``streak`` times in a
    row (results in state ``"output-error"``, newest first, until a success).

    Raises:
        ReminderError: ``name`` is not a non-empty str or None, or ``streak`` is not an int
            of at least 1.
    """
    if name is not None and (not isinstance(name, str) or not name):
        raise ReminderError(f"tool_failed(name) takes a tool name or None, got {name!r}")
    streak = _count(streak, "tool_failed(streak=...)", minimum=1)
    label = f"tool_failed({name!r}, streak={streak})"
    return _Named(lambda ctx: tool_failure_streak(ctx, name) >= streak, label)


def _predicates(predicates: tuple[Any, ...], what: str) -> tuple[Predicate, ...]:
    if not predicates:
        raise ReminderError(f"{what} takes at least one predicate")
    for index, predicate in enumerate(predicates):
        if not callable(predicate):
            raise ReminderError(
                f"{what} argument {index} is a {type(predicate).__name__}, not a predicate"
            )
    return predicates


def all_of(*predicates: Predicate) -> Predicate:
    """Fires when every predicate holds (checked in order; stops at the first that does not).

    Raises:
        ReminderError: no predicate, or an argument that is not callable.
    """
    checked = _predicates(predicates, "all_of()")

    async def check(ctx: ReminderContext) -> bool:
        for predicate in checked:
            if not await evaluate(predicate, ctx, what="predicate"):
                return False
        return True

    return _Named(check, f"all_of({', '.join(map(repr, checked))})")


def any_of(*predicates: Predicate) -> Predicate:
    """Fires when at least one predicate holds (checked in order; stops at the first that
    does).

    Raises:
        ReminderError: no predicate, or an argument that is not callable.
    """
    checked = _predicates(predicates, "any_of()")

    async def check(ctx: ReminderContext) -> bool:
        for predicate in checked:
            if await evaluate(predicate, ctx, what="predicate"):
                return True
        return False

    return _Named(check, f"any_of({', '.join(map(repr, checked))})")


def not_(predicate: Predicate) -> Predicate:
    """Fires when ``predicate`` does not hold.

    Raises:
        ReminderError: ``predicate`` is not callable.
    """
    (checked,) = _predicates((predicate,), "not_()")

    async def check(ctx: ReminderContext) -> bool:
        return not await evaluate(checked, ctx, what="predicate")

    return _Named(check, f"not_({checked!r})")
