"""resolve(window=...): fitting a request into a model's input limit.

The fitting rules are checked as properties over random conversations with tool calls; the
engine side on SQLite and PostgreSQL.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentcontext import (
    ContextWindow,
    ContextWindowError,
    InvalidInputError,
    InvalidTypeError,
    Message,
    TextPart,
    ToolPart,
    assistant,
    estimate_context,
    register_model,
    user,
)
from agentcontext._window import fit
from agentcontext.estimate import default_counter, unregister_model
from tests.engine.conftest import EngineFactory

WORDS = ["ledger", "balance", "fox", "query", "tokens", "reply", "tool", "cache", "ünïcode", "数据"]


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    """User turns, each answered by assistant messages that may call tools (a call and its
    result in one part), some messages pinned."""
    messages: list[Message] = []
    for turn in range(draw(st.integers(1, 14))):
        words = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=40))
        pinned = draw(st.integers(0, 12)) == 0
        messages.append(
            Message(
                id=f"u{turn}",
                role="user",
                parts=[TextPart(text=" ".join(words))],
                metadata={"pinned": True} if pinned else None,
            )
        )
        for reply in range(draw(st.integers(0, 3))):
            parts: list[TextPart | ToolPart] = []
            if draw(st.booleans()):
                parts.append(
                    ToolPart(
                        tool_call_id=f"call-{turn}-{reply}",
                        tool_name="lookup",
                        input={"q": draw(st.sampled_from(WORDS))},
                        state="output-available",
                        output={"rows": draw(st.lists(st.sampled_from(WORDS), max_size=20))},
                    )
                )
            text = " ".join(draw(st.lists(st.sampled_from(WORDS), max_size=30)))
            parts.append(TextPart(text=text or "ok"))
            messages.append(Message(id=f"a{turn}-{reply}", role="assistant", parts=parts))
    return messages


def _estimate(system: str, messages: list[Message]) -> int:
    register_model("window-test-model", context_window=10**9, tokenizer=default_counter().count)
    try:
        return estimate_context(
            "window-test-model", system_prompt=system, fragments=[], messages=messages
        ).input_tokens
    finally:
        unregister_model("window-test-model")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=conversations(),
    limit=st.integers(40, 3000),
    reserve=st.integers(0, 30),
    low_water=st.sampled_from([0.5, 0.75, 1.0]),
)
def test_a_fitted_request_keeps_every_promise(
    messages: list[Message], limit: int, reserve: int, low_water: float
) -> None:
    window = ContextWindow(limit, reserve_output=reserve, low_water=low_water)
    system = "You are a careful assistant."
    last = max(i for i, m in enumerate(messages) if m.role == "user")
    must = [m for i, m in enumerate(messages) if i >= last or (m.metadata or {}).get("pinned")]
    if _estimate(system, must) > limit - reserve:
        # Refused only when the system prompt, the pinned messages and the newest turn
        # cannot fit by themselves.
        with pytest.raises(ContextWindowError, match="too long") as caught:
            fit(window, system, messages)
        assert caught.value.required > caught.value.allowed == limit - reserve
        return
    fitted = fit(window, system, messages)
    sent = fitted.messages
    # Never over the limit, by the estimate's own count, which the fit reports exactly.
    assert fitted.tokens == _estimate(system, sent) <= limit - reserve
    # The newest user turn and the pinned messages are always there.
    assert [m.id for m in sent[-(len(messages) - last) :]] == [m.id for m in messages[last:]]
    sent_ids = {m.id for m in sent}
    assert all(m.id in sent_ids for m in messages if (m.metadata or {}).get("pinned"))
    # Order kept; what is left out is listed; nothing else is.
    assert [m.id for m in messages if m.id in sent_ids] == [m.id for m in sent]
    assert sorted(fitted.omitted) == sorted(m.id for m in messages if m.id not in sent_ids)
    # Whole turns go: an unpinned message is sent if and only if its user message is.
    turn_of: dict[str, str] = {}
    current = messages[0].id
    for m in messages:
        if m.role == "user":
            current = m.id
        turn_of[m.id] = current
    for m in messages:
        if not (m.metadata or {}).get("pinned") and m.role != "user":
            user_sent = turn_of[m.id] in sent_ids or turn_of[m.id] == m.id
            if not (messages[0].role != "user" and turn_of[m.id] == messages[0].id):
                user_pinned = next((x for x in messages if x.id == turn_of[m.id]), m).metadata or {}
                if not user_pinned.get("pinned"):
                    assert (m.id in sent_ids) == user_sent
    # Tool calls always travel with their results (one part holds both).
    for m in sent:
        for part in m.parts:
            if isinstance(part, ToolPart):
                assert part.state == "output-available" and part.output is not None


def _conversation(turns: int, size: int = 60) -> list[Message]:
    out: list[Message] = []
    for i in range(turns):
        out.append(
            Message(id=f"u{i}", role="user", parts=[TextPart(text=f"q{i} " + "word " * size)])
        )
        out.append(
            Message(id=f"a{i}", role="assistant", parts=[TextPart(text=f"a{i} " + "word " * size)])
        )
    return out


def test_the_prefix_stays_the_same_for_most_turns() -> None:
    window = ContextWindow(8_000, reserve_output=500)
    conversation = _conversation(300)
    previous: list[str] | None = None
    stable = total = 0
    for turn in range(1, 301):
        sent = [m.id for m in fit(window, "system", conversation[: 2 * turn]).messages]
        if previous is not None:
            total += 1
            stable += sent[: len(previous)] == previous
        previous = sent
    assert stable / total >= 0.9, (stable, total)


def test_low_water_one_cuts_only_what_must_go() -> None:
    conversation = _conversation(30)
    tight = fit(ContextWindow(2_000, low_water=1.0), "s", conversation)
    loose = fit(ContextWindow(2_000, low_water=0.5), "s", conversation)
    assert len(tight.messages) > len(loose.messages)
    assert loose.tokens <= 2_000 * 0.5 + 200 and tight.tokens <= 2_000


def test_window_arguments_are_checked() -> None:
    with pytest.raises(InvalidInputError, match="max_tokens or model_id"):
        ContextWindow()
    with pytest.raises(InvalidInputError):
        ContextWindow(0)
    with pytest.raises(InvalidTypeError):
        ContextWindow("big")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="low_water"):
        ContextWindow(100, low_water=0.0)
    with pytest.raises(InvalidInputError):
        ContextWindow(100, reserve_output=-1)


async def test_resolve_with_a_window(make_engine: EngineFactory) -> None:
    engine = make_engine()
    for i in range(12):
        engine.set(user(f"question {i} " + "lorem ipsum dolor " * 20))
        engine.set(assistant(f"answer {i} " + "sit amet " * 20))
        await engine.save()
    pinned = Message(
        id="rules",
        role="user",
        parts=[TextPart(text="always answer in French")],
        metadata={"pinned": True},
    )
    await engine.resolve()
    full = await engine.resolve()
    assert full.omitted == [] and full.estimate is None
    engine.set(user(pinned), assistant("d'accord"))
    await engine.save()
    engine.set(user("the newest question"))
    result = await engine.resolve(window=ContextWindow(700, reserve_output=50))
    assert result.messages[-1].text == "the newest question"
    assert "rules" in [m.id for m in result.messages]
    assert result.omitted and result.omitted[0] == full.messages[0].id
    assert result.estimate is not None and result.estimate <= 650
    assert result.estimate == _estimate(result.system_prompt, result.messages)
    with pytest.raises(ContextWindowError, match="too long") as caught:
        await engine.resolve(window=ContextWindow(12))
    assert caught.value.allowed == 12
    with pytest.raises(InvalidTypeError, match="ContextWindow"):
        await engine.resolve(window=700)  # type: ignore[arg-type]


async def test_a_window_from_the_model_catalogue(make_engine: EngineFactory) -> None:
    register_model("tiny-model", context_window=400, tokenizer=default_counter().count)
    try:
        engine = make_engine()
        for i in range(10):
            engine.set(user(f"q{i} " + "word " * 30), assistant(f"a{i} " + "word " * 30))
            await engine.save()
        result = await engine.resolve(window=ContextWindow(model_id="tiny-model"))
        assert result.estimate is not None and result.estimate <= 400
        assert result.omitted
    finally:
        unregister_model("tiny-model")
