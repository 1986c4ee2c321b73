"""`check_json`'s shortcut for plain text messages gives the same answer as its full walk.

The shortcut sizes the usual stored message (str values, text parts, no metadata) without
walking it; anything else, and any string it cannot vouch for (NUL, lone surrogates), goes to
the walk. Property: for message-shaped values, close to the shortcut's edge, `check_json`
accepts, sizes and refuses exactly as `json_size` does.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from agentcontext._validate import _plain_message_size, check_json, json_size, too_big
from agentcontext.errors import ContextError, SerializationError

TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=40) | st.sampled_from(
    ["", "plain", "café 東京 🚀", "nul\x00here", "lone \ud800 surrogate", "\udc00", "x" * 50]
)
VALUE = TEXT | st.none() | st.integers() | st.floats() | st.booleans() | st.lists(TEXT, max_size=2)
PART = st.dictionaries(
    st.sampled_from(["type", "text", "extra"]) | TEXT, VALUE | TEXT, max_size=3
) | st.fixed_dictionaries({"type": st.just("text"), "text": TEXT})
MESSAGE = st.fixed_dictionaries(
    {"id": TEXT, "role": st.sampled_from(["user", "assistant"]) | VALUE},
    optional={
        "parts": st.lists(PART, max_size=3) | VALUE,
        "metadata": st.none() | st.dictionaries(TEXT, VALUE, max_size=2),
        "other": VALUE,
    },
)


WHAT = "message 'm'"


def outcome(check: Any, value: Any) -> tuple[str, Any]:
    try:
        return ("ok", check(value))
    except ContextError as exc:
        return (type(exc).__name__, str(exc))


@given(MESSAGE, st.sampled_from([None, 0, 10, 60, 10_000]))
@example({"id": "m", "role": "user", "parts": [{"type": "text", "text": "a\x00b"}]}, None)
@example({"id": "m", "role": "user", "parts": [{"type": "text", "text": "\ud800"}]}, None)
@example({"id": "m", "role": "user", "parts": [{"type": "text", "text": "é" * 20}]}, 30)
def test_the_shortcut_answers_as_the_walk(value: dict[str, Any], max_bytes: int | None) -> None:
    def walked(item: Any) -> None:
        size = json_size(item, WHAT)
        if max_bytes is not None and size > max_bytes:
            raise too_big(size, WHAT)

    assert outcome(lambda item: check_json(item, WHAT, max_bytes=max_bytes), value) == outcome(
        walked, value
    )
    shortcut = _plain_message_size(value)
    if shortcut is not None:
        assert shortcut == json_size(value, WHAT)


def test_the_shortcut_takes_the_usual_message() -> None:
    value = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "héllo"}]}
    assert (
        _plain_message_size(value)
        == json_size(value, "m")
        == len("idrolepartstypetext") + 2 + 4 + 4 + 6
    )


@pytest.mark.parametrize(
    "value",
    [
        {"id": "m", "parts": [{"type": "text", "text": "a\x00"}]},
        {"id": "m", "parts": [{"type": "text", "text": "\udfff"}]},
        {"id": "m", "metadata": {"k": float("nan")}},
        {"id": "m", "parts": [{"type": "text", "text": 1}], "metadata": {1: "x"}},
    ],
)
def test_what_the_shortcut_declines_the_walk_refuses(value: dict[str, Any]) -> None:
    assert _plain_message_size(value) is None
    with pytest.raises(SerializationError):
        check_json(value, "m")
