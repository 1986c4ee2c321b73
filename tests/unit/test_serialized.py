"""Serialized fragments: exact round trips for every built-in type, registry, refusals."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcontext.errors import SerializationError
from agentcontext.fragments import (
    ContextFragment,
    alias,
    analogy,
    assistant_text,
    clarification,
    correction,
    example,
    explain,
    fragment,
    glossary,
    guardrail,
    hint,
    identity,
    last_assistant_message,
    persona,
    policy,
    preference,
    principle,
    quirk,
    role,
    style_guide,
    term,
    user,
    workflow,
)
from agentcontext.serialized import FragmentRegistry, from_fragment, to_fragment

BUILT = [
    (role("You are helpful."), {"type": "role", "content": "You are helpful."}),
    (hint("Use CTEs"), {"type": "hint", "text": "Use CTEs"}),
    (term("NPL", "loan"), {"type": "term", "name": "NPL", "definition": "loan"}),
    (guardrail("No PII"), {"type": "guardrail", "rule": "No PII"}),
    (
        guardrail("No PII", reason="GDPR", action="Refuse"),
        {"type": "guardrail", "rule": "No PII", "reason": "GDPR", "action": "Refuse"},
    ),
    (explain("c", "e"), {"type": "explain", "concept": "c", "explanation": "e"}),
    (
        explain("c", "e", therefore="t"),
        {"type": "explain", "concept": "c", "explanation": "e", "therefore": "t"},
    ),
    (example("q", "a", note="n"), {"type": "example", "question": "q", "answer": "a", "note": "n"}),
    (example("q", "a"), {"type": "example", "question": "q", "answer": "a"}),
    (
        clarification("w", "a", "r"),
        {"type": "clarification", "when": "w", "ask": "a", "reason": "r"},
    ),
    (workflow("t", ["1", "2"]), {"type": "workflow", "task": "t", "steps": ["1", "2"]}),
    (
        workflow("t", [], triggers=["x"], notes="n"),
        {"type": "workflow", "task": "t", "steps": [], "triggers": ["x"], "notes": "n"},
    ),
    (quirk("i", "w"), {"type": "quirk", "issue": "i", "workaround": "w"}),
    (style_guide("p"), {"type": "style_guide", "prefer": "p"}),
    (
        style_guide("p", never="n", always="a"),
        {"type": "style_guide", "prefer": "p", "never": "n", "always": "a"},
    ),
    (analogy(["a", "b"], "r"), {"type": "analogy", "concepts": ["a", "b"], "relationship": "r"}),
    (
        analogy(["a"], "r", insight="i", therefore="t", pitfall="p"),
        {
            "type": "analogy",
            "concepts": ["a"],
            "relationship": "r",
            "insight": "i",
            "therefore": "t",
            "pitfall": "p",
        },
    ),
    (glossary({"a": "1", "b": "2"}), {"type": "glossary", "entries": {"a": "1", "b": "2"}}),
    (glossary({}), {"type": "glossary", "entries": {}}),
    (principle("t", "d"), {"type": "principle", "title": "t", "description": "d"}),
    (
        principle("t", "d", policies=["plain", policy("r")]),
        {
            "type": "principle",
            "title": "t",
            "description": "d",
            "policies": ["plain", {"type": "policy", "rule": "r"}],
        },
    ),
    (
        policy(
            "r", before="b", reason="why", policies=[policy("inner", policies=[policy("deep")])]
        ),
        {
            "type": "policy",
            "rule": "r",
            "before": "b",
            "reason": "why",
            "policies": [
                {
                    "type": "policy",
                    "rule": "inner",
                    "policies": [{"type": "policy", "rule": "deep"}],
                }
            ],
        },
    ),
    (identity(), {"type": "identity"}),
    (identity(name="n", role="r"), {"type": "identity", "name": "n", "role": "r"}),
    (persona("F"), {"type": "persona", "name": "F"}),
    (
        persona("F", role="r", objective="o", tone="t"),
        {"type": "persona", "name": "F", "role": "r", "objective": "o", "tone": "t"},
    ),
    (alias("t", "m"), {"type": "alias", "term": "t", "meaning": "m"}),
    (preference("a", "v"), {"type": "preference", "aspect": "a", "value": "v"}),
    (correction("s", "c"), {"type": "correction", "subject": "s", "clarification": "c"}),
    (
        fragment("database", hint("PG"), "loose", 3, {"k": [1, None]}, None),
        {
            "type": "fragment",
            "name": "database",
            "children": [{"type": "hint", "text": "PG"}, "loose", 3, {"k": [1, None]}, None],
        },
    ),
    (fragment("empty"), {"type": "fragment", "name": "empty", "children": []}),
]


@pytest.mark.parametrize(("built", "serialized"), BUILT, ids=[s["type"] for _, s in BUILT])
def test_exact_round_trips(built: ContextFragment, serialized: dict[str, Any]) -> None:
    assert from_fragment(built) == serialized
    assert to_fragment(serialized) == built
    assert from_fragment(to_fragment(serialized)) == serialized
    rebuilt = to_fragment(json.loads(json.dumps(serialized)))
    assert rebuilt == built
    if isinstance(built.data, dict):
        assert list(rebuilt.data) == list(built.data)  # type: ignore[arg-type]


def test_every_builtin_type_is_covered() -> None:
    types = {s["type"] for _, s in BUILT}
    assert types == {
        "role", "hint", "term", "guardrail", "explain", "example", "clarification", "workflow",
        "quirk", "style_guide", "analogy", "glossary", "principle", "policy", "identity",
        "persona", "alias", "preference", "correction", "fragment",
    }  # fmt: skip


def test_style_guide_accepts_the_original_type_name() -> None:
    assert to_fragment({"type": "styleGuide", "prefer": "p"}) == style_guide("p")


def test_none_optionals_in_input_are_ignored() -> None:
    assert to_fragment({"type": "guardrail", "rule": "r", "reason": None}) == guardrail("r")


def test_nested_fragment_data_and_dicts_with_a_type_key() -> None:
    f = fragment(
        "outer",
        fragment("inner", term("a", "b"), {"type": "not a fragment", "x": [hint("h")]}),
        {"plain": True},
    )
    s = from_fragment(f)
    assert s["children"][0]["children"][1] == {
        "type": "$object",
        "value": {"type": "not a fragment", "x": [{"type": "hint", "text": "h"}]},
    }
    assert to_fragment(s) == f
    assert from_fragment(to_fragment(s)) == s


def test_fragments_that_differ_from_builders_fall_back_to_generic() -> None:
    cases = [
        ContextFragment(name="hint", data={"not": "text"}),
        ContextFragment(name="term", data={"definition": "d", "name": "n"}),  # other key order
        ContextFragment(name="term", data={"name": "n", "definition": 3}),
        ContextFragment(name="guardrail", data={"rule": "r", "extra": "x"}),
        ContextFragment(name="hint", data="x", id="h1", persist=True, metadata={"source": "db"}),
        ContextFragment(name="glossary", data=[{"term": "a", "expression": "1"}] * 2),
        ContextFragment(name="custom", data={"a": 1.5, "b": [True, None]}),
        ContextFragment(name="nothing", data=None),
        ContextFragment(name="scalar", data=7),
    ]
    for f in cases:
        s = from_fragment(f)
        assert s["type"] == "fragment", f
        assert s["name"] == f.name
        again = to_fragment(s)
        assert again == f
        if isinstance(f.data, dict):
            assert list(again.data) == list(f.data)  # type: ignore[arg-type]
    s = from_fragment(cases[4])
    assert s == {
        "type": "fragment",
        "name": "hint",
        "data": "x",
        "id": "h1",
        "persist": True,
        "metadata": {"source": "db"},
    }


def test_message_fragments_are_refused_both_ways() -> None:
    for f in (user("hi"), assistant_text("x"), last_assistant_message("y")):
        with pytest.raises(SerializationError, match="message"):
            from_fragment(f)
    with pytest.raises(SerializationError, match="message"):
        from_fragment(fragment("wrapper", user("hi")))
    for kind in ("user", "assistant", "system", "message"):
        with pytest.raises(SerializationError, match="message"):
            to_fragment({"type": kind, "text": "x"})


@pytest.mark.parametrize(
    "bad",
    [
        fragment("x", math.nan),
        fragment("x", math.inf),
        ContextFragment(name="x", data={1: "a"}),  # type: ignore[dict-item]
        fragment("x", "nul\x00char"),
        fragment("x", "lone \ud800 surrogate"),
        fragment("x", lambda: 1),
        fragment("x", b"bytes"),
        hint("nul\x00"),
    ],
)
def test_non_json_data_is_refused(bad: ContextFragment) -> None:
    with pytest.raises(SerializationError):
        from_fragment(bad)


def test_self_containing_data_is_refused() -> None:
    items: list[Any] = []
    items.append(items)
    with pytest.raises(SerializationError, match="itself"):
        from_fragment(ContextFragment(name="x", data=items))


@pytest.mark.parametrize(
    ("serialized", "message"),
    [
        ({"type": "nope"}, "unknown serialized fragment type"),
        ({"text": "no type"}, "'type'"),
        ({"type": "hint"}, "missing required field 'text'"),
        ({"type": "hint", "text": "x", "extra": 1}, "unexpected field 'extra'"),
        ({"type": "term", "name": "n", "definition": 3}, "expected a str"),
        ({"type": "workflow", "task": "t", "steps": "one"}, "list of str"),
        (
            {"type": "principle", "title": "t", "description": "d", "policies": "x"},
            "expected a list",
        ),
        ({"type": "glossary", "entries": ["a"]}, "dict of str to str"),
        ({"type": "fragment", "name": "x", "children": [], "data": 1}, "not both"),
        ({"type": "fragment", "name": "x", "data": math.nan}, "not a JSON number"),
        ({"type": "fragment", "name": "x", "data": {"type": "$object"}}, "'value' dict"),
        ({"type": "fragment", "name": "x", "data": {"type": "hint"}}, "missing required"),
        ({"type": "fragment", "name": "x", "persist": "yes"}, "persist"),
    ],
)
def test_invalid_serialized_input(serialized: dict[str, Any], message: str) -> None:
    with pytest.raises(SerializationError, match=message):
        to_fragment(serialized)


def test_to_fragment_refuses_non_dicts() -> None:
    with pytest.raises(SerializationError):
        to_fragment(["hint"])  # type: ignore[arg-type]


# --- registry ------------------------------------------------------------------------------


def _callout_registry() -> FragmentRegistry:
    registry = FragmentRegistry()
    registry.register(
        "callout",
        to_fragment=lambda s: ContextFragment(
            name="callout", data={"level": s["level"], "text": s["text"]}
        ),
        from_fragment=lambda f: (
            {"type": "callout", "level": f.data["level"], "text": f.data["text"]}  # type: ignore[index]
            if f.name == "callout"
            else None
        ),
    )
    return registry


def test_registry_adds_custom_types_also_when_nested() -> None:
    registry = _callout_registry()
    callout = ContextFragment(name="callout", data={"level": "warn", "text": "Careful"})
    assert from_fragment(callout, registry=registry) == {
        "type": "callout",
        "level": "warn",
        "text": "Careful",
    }
    nested = principle("t", "d", policies=[callout])
    s = from_fragment(nested, registry=registry)
    assert s["policies"] == [{"type": "callout", "level": "warn", "text": "Careful"}]
    assert to_fragment(s, registry=registry) == nested
    with pytest.raises(SerializationError, match="unknown"):
        to_fragment(s)  # without the registry the custom type is unknown
    assert "callout" in registry and registry.types == ("callout",)
    registry.unregister("callout")
    assert "callout" not in registry


def test_registry_can_replace_a_builtin_type() -> None:
    registry = FragmentRegistry()
    registry.register("hint", to_fragment=lambda s: hint(s["text"].upper()))
    assert to_fragment({"type": "hint", "text": "x"}, registry=registry) == hint("X")


def test_registry_refuses_reserved_names_and_bad_entries() -> None:
    registry = FragmentRegistry()
    for name in ("user", "assistant", "system", "message", "$object", ""):
        with pytest.raises(SerializationError):
            registry.register(name, to_fragment=lambda s: hint("x"))
    with pytest.raises(SerializationError):
        registry.register("x", to_fragment="nope")  # type: ignore[arg-type]
    registry.register("bad", to_fragment=lambda s: "not a fragment")  # type: ignore[arg-type,return-value]
    with pytest.raises(SerializationError, match="not a ContextFragment"):
        to_fragment({"type": "bad"}, registry=registry)
    registry.register(
        "worse", to_fragment=lambda s: hint("x"), from_fragment=lambda f: {"no": "type"}
    )
    with pytest.raises(SerializationError, match="'type'"):
        from_fragment(hint("x"), registry=registry)


def test_codec_fragments_serialize_through_their_codec() -> None:
    class Codec:
        def encode(self) -> dict[str, Any]:
            return {"type": "hint", "text": "from codec"}

        def decode(self) -> str:
            return "from codec"

    f = ContextFragment(name="hint", data="stale", codec=Codec())
    assert from_fragment(f) == {"type": "hint", "text": "from codec"}

    class Bad(Codec):
        def encode(self) -> Any:
            return "plain"

    with pytest.raises(SerializationError, match="codec"):
        from_fragment(ContextFragment(name="hint", codec=Bad()))


# --- property: any JSON-able fragment tree round-trips --------------------------------------

_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8
)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text
)
_names = st.sampled_from(["hint", "term", "x", "policy", "type", "a b"])


def _trees(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    keys = st.sampled_from(["type", "k", "name", "value"]) | _text
    return (
        st.lists(children, max_size=4)
        | st.dictionaries(keys, children, max_size=4)
        | st.builds(lambda n, d: ContextFragment(name=n, data=d), _names, children)
        | st.builds(hint, _text)
        | st.builds(lambda r, ps: policy(r, policies=ps), _text, st.lists(children, max_size=3))
    )


_data = st.recursive(_scalars, _trees, max_leaves=20)


@settings(max_examples=400, deadline=None)
@given(st.builds(lambda n, d: ContextFragment(name=n, data=d), _names, _data))
def test_property_round_trip(f: ContextFragment) -> None:
    s = from_fragment(f)
    assert json.loads(json.dumps(s)) == s
    assert to_fragment(s) == f
    assert from_fragment(to_fragment(s)) == s
