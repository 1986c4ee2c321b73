"""The store's JSON parser reads back exactly what the standard library would."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agentcontext._validate import MAX_JSON_DEPTH, dumps, loads

TEXT = st.text(st.characters(exclude_categories=["Cs"]))
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**20, max_value=10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda children: st.lists(children) | st.dictionaries(TEXT, children),
    max_leaves=40,
)


def same(a: Any, b: Any) -> bool:
    # repr tells 1 from 1.0 and -0.0 from 0.0, which == does not.
    return repr(a) == repr(b)


@settings(max_examples=2000)
@given(JSON_VALUES)
def test_what_dumps_writes_reads_back_as_the_standard_library_reads_it(value: Any) -> None:
    text = dumps(value)
    assert same(loads(text), json.loads(text))
    assert same(loads(text.encode()), json.loads(text))


@settings(max_examples=2000)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_floats_in_postgresql_plain_decimal_form(number: float) -> None:
    # jsonb prints numbers without an exponent (1e-300 as 0.000...1).
    text = format(Decimal(repr(number)), "f")
    assert same(loads(text), json.loads(text))


def test_deep_documents_fall_back_to_the_standard_library() -> None:
    for depth in (MAX_JSON_DEPTH, 250, 900):
        text = "[" * depth + "]" * depth
        assert loads(text) == json.loads(text)


@settings(max_examples=2000)
@given(JSON_VALUES)
def test_dumps_means_what_the_standard_library_writes(value: Any) -> None:
    # The store's serializer may spell a number differently (0.00001 for 1e-05), never mean
    # something else: its text reads back to what the standard library's text reads back to.
    text = dumps(value)
    standard = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    assert same(json.loads(text), json.loads(standard))


def test_dumps_falls_back_past_the_serializers_depth() -> None:
    value: list[Any] = []
    inner = value
    for _ in range(400):
        inner.append([])
        inner = inner[0]
    assert dumps(value) == json.dumps(value, separators=(",", ":"))
