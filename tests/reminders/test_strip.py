"""Inserting reminder text into a message and taking it out again."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentcontext import Message, ReminderError, TextPart, ToolPart, strip_reminders
from agentcontext.messages import DataPart
from agentcontext.reminders._core import append_to_message, append_to_tool_output
from tests.reminders._util import answer, ask, tool

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)
REMINDER = TEXT.filter(lambda t: t.strip() != "")


def test_reminders_are_appended_with_their_ranges() -> None:
    message = append_to_message(ask("hello"), ["first", "second"])
    text = message.parts[0].text  # type: ignore[union-attr]
    assert text == (
        "hello\n\n<system-reminder>first</system-reminder>"
        "\n\n<system-reminder>second</system-reminder>"
    )
    ranges = message.metadata["reminders"]  # type: ignore[index]
    assert [text[r["start"] : r["end"]] for r in ranges] == [
        "\n\n<system-reminder>first</system-reminder>",
        "\n\n<system-reminder>second</system-reminder>",
    ]
    assert all(set(r) == {"start", "end", "part"} and r["part"] == 0 for r in ranges)


def test_the_last_text_part_takes_the_reminder() -> None:
    message = Message(
        id="u",
        role="user",
        parts=[TextPart(text="a"), DataPart(name="x", data=1), TextPart(text="b")],
    )
    amended = append_to_message(message, ["r"])
    assert amended.parts[2] == TextPart(text="b\n\n<system-reminder>r</system-reminder>")
    assert amended.metadata == {"reminders": [{"start": 1, "end": 39, "part": 2}]}


def test_a_message_without_text_gets_a_text_part_that_strip_removes() -> None:
    message = Message(id="u", role="user", parts=[DataPart(name="x", data=1)])
    amended = append_to_message(message, ["r"])
    assert amended.parts[1] == TextPart(text="<system-reminder>r</system-reminder>")
    assert strip_reminders(amended) == message


def test_strip_keeps_other_metadata() -> None:
    message = ask("hi").model_copy(update={"metadata": {"locale": "fr"}})
    amended = append_to_message(message, ["r"])
    assert amended.metadata == {
        "locale": "fr",
        "reminders": [{"start": 2, "end": 40, "part": 0}],
    }
    assert strip_reminders(amended) == message


def test_strip_leaves_a_message_without_reminders_alone() -> None:
    message = ask("plain <system-reminder>typed by the user</system-reminder>")
    assert strip_reminders(message) is message


@given(
    texts=st.lists(TEXT, min_size=1, max_size=3),
    batches=st.lists(st.lists(REMINDER, min_size=1, max_size=3), min_size=1, max_size=3),
    metadata=st.none() | st.fixed_dictionaries({"k": TEXT}),
)
def test_strip_undoes_any_sequence_of_insertions(
    texts: list[str], batches: list[list[str]], metadata: dict[str, Any] | None
) -> None:
    original = Message(
        id="u", role="user", parts=[TextPart(text=t) for t in texts], metadata=metadata
    )
    if not original.parts[-1].text:  # type: ignore[union-attr]
        original = original.model_copy(update={"parts": [*original.parts[:-1], TextPart(text="x")]})
    amended = original
    for batch in batches:
        amended = append_to_message(amended, batch)
    for batch in batches:
        for text in batch:
            assert f"<system-reminder>{text}</system-reminder>" in amended.text
    assert strip_reminders(amended) == original


def test_a_string_tool_result_gets_the_reminder_appended() -> None:
    message = answer(tool("bash", output="ok"))
    amended = append_to_tool_output(message, 0, ["careful", "again"])
    part = amended.parts[0]
    assert isinstance(part, ToolPart)
    assert part.output == (
        "ok\n\n<system-reminder>careful</system-reminder>\n<system-reminder>again</system-reminder>"
    )
    assert amended.metadata == {
        "reminders": [{"part": 0, "field": "output", "start": 2, "end": len(part.output)}]
    }
    assert strip_reminders(amended) == message


def test_a_tool_error_gets_the_reminder_appended() -> None:
    message = answer(tool("bash", "output-error", error="exit 1"))
    amended = append_to_tool_output(message, 0, ["try --help"])
    part = amended.parts[0]
    assert isinstance(part, ToolPart)
    assert part.error == "exit 1\n\n<system-reminder>try --help</system-reminder>"
    assert part.output is None
    assert strip_reminders(amended) == message


@pytest.mark.parametrize("output", [{"rows": [1, 2]}, [1, 2], 3, None, True])
def test_a_structured_tool_result_is_wrapped_and_unwrapped(output: Any) -> None:
    message = answer("thinking", tool("sql", output=output))
    amended = append_to_tool_output(message, 1, ["check the row count"])
    part = amended.parts[1]
    assert isinstance(part, ToolPart)
    assert part.output == {
        "result": output,
        "system_reminder": "<system-reminder>check the row count</system-reminder>",
    }
    assert amended.metadata == {"reminders": [{"part": 1, "field": "output", "wrapped": True}]}
    assert strip_reminders(amended) == message


@pytest.mark.parametrize(
    "records",
    [
        "not a list",
        [None, 3, "x"],
        [{"part": 9, "start": 0, "end": 3}],
        [{"part": 0, "start": "0", "end": 3}],
        [{"part": True, "start": 0, "end": 3}],
        [{"part": 0, "start": 5, "end": 2}],
    ],
)
def test_malformed_ranges_are_ignored(records: Any) -> None:
    message = ask("hello").model_copy(update={"metadata": {"reminders": records}})
    assert strip_reminders(message) == ask("hello")


def test_out_of_range_and_overlapping_ranges_are_clamped() -> None:
    message = ask("hello world").model_copy(
        update={
            "metadata": {
                "reminders": [
                    {"part": 0, "start": 5, "end": 8},
                    {"part": 0, "start": 6, "end": 99},
                ]
            }
        }
    )
    assert strip_reminders(message).text == "hello"


def test_strip_refuses_what_is_not_a_message() -> None:
    with pytest.raises(ReminderError):
        strip_reminders({"id": "m"})  # type: ignore[arg-type]


# --- records stored by the original package ---------------------------------------------------


def _original_record(text: str, start: int, end: int, part: int = 0, mode: str = "inline") -> Any:
    return {
        "id": "r1",
        "text": text,
        "target": "user",
        "partIndex": part,
        "start": start,
        "end": end,
        "mode": mode,
    }


def _utf16(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


@pytest.mark.parametrize("before", ["plain question", "ünïcode", "weather 🌦 and 🚀 launch"])
def test_strip_reads_the_original_packages_records(before: str) -> None:
    inserted = "<system-reminder>be brief</system-reminder>"
    start, end = _utf16(before), _utf16(before) + _utf16(inserted)
    message = Message(
        id="u1",
        role="user",
        parts=[TextPart(text=before + inserted)],
        metadata={"reminders": [_original_record("be brief", start, end)], "k": 1},
    )
    assert strip_reminders(message) == Message(
        id="u1", role="user", parts=[TextPart(text=before)], metadata={"k": 1}
    )


def test_strip_drops_a_part_the_original_added_for_a_reminder() -> None:
    inserted = "<system-reminder>note</system-reminder>"
    message = Message(
        id="u1",
        role="user",
        parts=[TextPart(text="question 🙂"), TextPart(text=inserted)],
        metadata={"reminders": [_original_record("note", 0, _utf16(inserted), 1, "part")]},
    )
    assert strip_reminders(message) == Message(
        id="u1", role="user", parts=[TextPart(text="question 🙂")]
    )


def test_strip_empties_a_synthetic_reminder_message_of_the_original() -> None:
    message = Message(
        id="s1",
        role="user",
        parts=[TextPart(text="<system-reminder>steer</system-reminder>")],
        metadata={"synthetic": {"source": "reminder", "firedAt": 1}},
    )
    assert strip_reminders(message) == Message(id="s1", role="user", parts=[])
