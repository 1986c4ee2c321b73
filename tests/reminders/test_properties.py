"""Random sequences of set / resolve / save / begin_turn with reminders: whatever the order,
a message is amended at most once, what is saved is what was last sent, and stripping gives
back what was written."""

from __future__ import annotations

import asyncio
import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentcontext import (
    ContextEngine,
    InMemoryContextStore,
    Message,
    ToolPart,
    after_turn,
    assistant,
    assistant_text,
    every_n_turns,
    reminder,
    strip_reminders,
    tool_failed,
    user,
)

STEPS = st.lists(
    st.sampled_from(["user", "assistant", "tool-error", "tool-ok", "resolve", "save", "begin"]),
    max_size=14,
)


def tags(message: Message) -> int:
    text = message.text + "".join(
        str(part.output) + str(part.error) for part in message.parts if isinstance(part, ToolPart)
    )
    return text.count("<system-reminder>")


async def run(steps: list[str], every: int) -> None:
    async with InMemoryContextStore() as store:
        engine = ContextEngine(store=store, chat_id="c", user_id="u")
        flips = itertools.cycle([False, True])
        engine.set(
            reminder("cadence", when=every_n_turns(every)),
            reminder("welcome", when=after_turn(1), once="welcome"),
            reminder("tool broke", target="tool-output", when=tool_failed()),
            # Holds on every other evaluation: evaluating a message twice would show.
            reminder("flip", when=lambda ctx: next(flips)),
        )
        written: dict[str, Message] = {}  # id -> the message as the caller wrote it
        sent: dict[str, Message] = {}  # id -> as the last resolve sent it
        for index, step in enumerate(steps):
            if step in ("user", "begin"):
                fragment = user(f"q{index}", id=f"m{index}")
            elif step == "assistant":
                fragment = assistant_text(f"a{index}", id=f"m{index}")
            elif step.startswith("tool"):
                state = "output-error" if step == "tool-error" else "output-available"
                part = ToolPart(
                    tool_call_id=f"c{index}",
                    tool_name="bash",
                    state=state,
                    output=None if state == "output-error" else f"out{index}",
                    error="boom" if state == "output-error" else None,
                )
                fragment = assistant(Message(id=f"m{index}", role="assistant", parts=[part]))
            if step == "resolve":
                for message in (await engine.resolve()).messages:
                    sent[message.id] = message
            elif step == "save":
                await engine.save()
            elif step == "begin":
                written[fragment.id or ""] = Message.model_validate(
                    fragment.codec.encode()  # type: ignore[union-attr]
                )
                await engine.begin_turn(fragment)
            else:
                written[fragment.id or ""] = Message.model_validate(
                    fragment.codec.encode()  # type: ignore[union-attr]
                )
                engine.set(fragment)
        await engine.save()
        stored = {m.id: m for m in await engine.get_messages()}
        welcomes = 0
        for message_id, message in stored.items():
            if message_id not in written:
                continue  # a begin_turn placeholder
            assert strip_reminders(message) == written[message_id]
            ranges = (message.metadata or {}).get("reminders", [])
            assert tags(message) == sum(
                1
                if "field" not in r
                else message.parts[r["part"]].model_dump_json().count("<system-reminder>")
                for r in ranges
            )
            assert tags(message) <= 4  # each reminder at most once
            welcomes += message.text.count("welcome")
            if message_id in sent:
                assert message == sent[message_id]  # saved exactly as last sent
        assert welcomes <= 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=STEPS, every=st.integers(2, 3))
def test_reminders_are_applied_once_and_saved_as_sent(steps: list[str], every: int) -> None:
    asyncio.run(run(steps, every))
