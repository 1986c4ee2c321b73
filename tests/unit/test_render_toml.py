"""TomlRenderer: valid TOML that tomllib parses back to the rendered data."""

from __future__ import annotations

import math
from typing import Any

import pytest

from agentcontext.errors import InvalidInputError
from agentcontext.fragments import (
    ContextFragment,
    alias,
    analogy,
    clarification,
    correction,
    example,
    explain,
    fragment,
    glossary,
    guardrail,
    hint,
    identity,
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
from agentcontext.renderers import TomlRenderer
from agentcontext.renderers.toml import toml_data
from tests.unit.conftest import expected_toml, parse_toml


def render(*fragments: ContextFragment) -> str:
    out = TomlRenderer().render(list(fragments))
    parsed = parse_toml(out)
    assert parsed == expected_toml(fragments)
    assert parsed == toml_data(list(fragments))
    return out


# --- primitives ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ("Use CTEs", 'hint = "Use CTEs"'),
        (42, "hint = 42"),
        (0, "hint = 0"),
        (-42, "hint = -42"),
        (3.14159, "hint = 3.14159"),
        (1.0, "hint = 1.0"),
        (1e-7, "hint = 1e-07"),
        (True, "hint = true"),
        (False, "hint = false"),
        ("", 'hint = ""'),
        ("你好世界 🌍 émojis", 'hint = "你好世界 🌍 émojis"'),
    ],
)
def test_primitives(data: Any, expected: str) -> None:
    assert render(ContextFragment(name="hint", data=data)) == expected


def test_non_finite_floats() -> None:
    out = TomlRenderer().render(
        [ContextFragment(name="x", data={"a": math.inf, "b": -math.inf, "c": math.nan})]
    )
    parsed = parse_toml(out)
    assert (
        parsed["x"]["a"] == math.inf
        and parsed["x"]["b"] == -math.inf
        and math.isnan(parsed["x"]["c"])
    )


def test_integers_outside_64_bits_become_strings() -> None:
    out = render(ContextFragment(name="x", data={"big": 2**63, "max": 2**63 - 1, "min": -(2**63)}))
    assert parse_toml(out)["x"] == {"big": str(2**63), "max": 2**63 - 1, "min": -(2**63)}


# --- escaping and multi-line ---------------------------------------------------------------


def test_escaping() -> None:
    assert (
        render(ContextFragment(name="path", data="C:\\Users\\test"))
        == 'path = "C:\\\\Users\\\\test"'
    )
    assert render(ContextFragment(name="text", data='say "hello"')) == 'text = "say \\"hello\\""'
    assert render(hint("bell\x07 del\x7f nul\x00")) == 'hint = "bell\\u0007 del\\u007F nul\\u0000"'


def test_newlines_are_escaped_so_each_value_stays_on_one_line() -> None:
    out = render(hint("line 1\nline 2\r\n\ttabbed"))
    assert out == 'hint = "line 1\\nline 2\\r\\n\\ttabbed"'
    assert out.count("\n") == 0


def test_keys_are_quoted_when_not_bare() -> None:
    out = render(
        ContextFragment(
            name="config", data={"名前": "test", "a b": 1, "x.y": 2, "ok_key-1": 3, "": 4}
        )
    )
    assert out == '[config]\n"名前" = "test"\n"a b" = 1\n"x.y" = 2\nok_key-1 = 3\n"" = 4'
    assert render(ContextFragment(name="my section", data={"a": 1})) == '["my section"]\na = 1'


# --- None and empty ------------------------------------------------------------------------


def test_none_values_are_skipped() -> None:
    out = render(ContextFragment(name="item", data={"a": "value", "b": None, "c": "other"}))
    assert out == '[item]\na = "value"\nc = "other"'
    assert render(fragment("items", "one", None, "three")) == 'items = ["one", "three"]'
    assert render(ContextFragment(name="gone", data=None)) == ""


def test_empty_values() -> None:
    assert render(fragment("items")) == "items = []"
    assert render(ContextFragment(name="empty", data={})) == "[empty]"
    assert render(hint("")) == 'hint = ""'
    assert render() == ""


# --- tables and nesting --------------------------------------------------------------------


def test_original_examples() -> None:
    assert (
        render(term("LTV", "Lifetime Value"))
        == '[term]\nname = "LTV"\ndefinition = "Lifetime Value"'
    )
    assert render(
        ContextFragment(name="config", data={"database": {"host": "localhost", "port": 5432}})
    ).split("\n") == ["[config]", "", "[config.database]", 'host = "localhost"', "port = 5432"]
    assert render(
        ContextFragment(name="first", data="one"), ContextFragment(name="second", data="two")
    ) == ('first = "one"\n\nsecond = "two"')
    wf = ContextFragment(name="workflow", data={"task": "Analysis", "steps": ["step1", "step2"]})
    assert render(wf) == '[workflow]\ntask = "Analysis"\nsteps = ["step1", "step2"]'


def test_nesting_three_deep() -> None:
    out = render(ContextFragment(name="root", data={"child1": {"child2": {"value": "deep"}}}))
    assert out.split("\n") == [
        "[root]",
        "",
        "[root.child1]",
        "",
        "[root.child1.child2]",
        'value = "deep"',
    ]
    deep = render(fragment("level1", fragment("level2", fragment("level3", "deep value"))))
    assert "[level1.level2]" in deep
    assert 'level3 = ["deep value"]' in deep


def test_keys_after_tables_are_moved_before_them() -> None:
    data = {"first": {"x": 1}, "after": "kept in config"}
    out = render(ContextFragment(name="config", data=data))
    assert out == '[config]\nafter = "kept in config"\n\n[config.first]\nx = 1'
    assert parse_toml(out)["config"]["after"] == "kept in config"
    top = render(term("a", "b"), hint("after a table"))
    assert top.startswith('hint = "after a table"')


def test_lists_of_fragments_are_tables_keyed_by_name() -> None:
    out = render(fragment("container", hint("Use CTEs"), term("LTV", "Lifetime Value")))
    assert out.split("\n") == [
        "[container]",
        'hint = "Use CTEs"',
        "",
        "[container.term]",
        'name = "LTV"',
        'definition = "Lifetime Value"',
    ]


def test_same_named_fragments_become_one_array() -> None:
    assert render(hint("a"), hint("b"), hint("c")) == 'hint = ["a", "b", "c"]'
    out = render(fragment("teachings", hint("First"), hint("Second")))
    assert out == '[teachings]\nhint = ["First", "Second"]'
    terms = render(term("a", "1"), term("b", "2"))
    assert parse_toml(terms) == {
        "term": [{"name": "a", "definition": "1"}, {"name": "b", "definition": "2"}]
    }


def test_mixed_lists_keep_every_item_in_order() -> None:
    out = render(fragment("mixed", "text", hint("h"), 42, {"a": [1, 2]}, [True]))
    assert out == (
        'mixed = [\n  "text",\n  { hint = "h" },\n  42,\n  { a = [1, 2] },\n  [true],\n]'
    )


def test_arrays_of_objects_and_fragments_are_never_json_dumped() -> None:
    out = render(
        ContextFragment(
            name="x", data={"items": [{"a": 1}, {"b": {"c": 2}}], "policies": [policy("p")]}
        ),
        glossary({"revenue": "SUM(x)", "aov": "AVG(x)"}),
    )
    assert '{"' not in out  # no JSON object text
    assert "items = [\n  { a = 1 },\n  { b = { c = 2 } },\n]" in out
    assert "[x.policies.policy]" in out
    assert 'glossary = [\n  { term = "revenue", expression = "SUM(x)" },' in out


def test_a_fragment_as_dict_value_and_as_data() -> None:
    assert (
        render(ContextFragment(name="outer", data={"key": hint("x")}))
        == '[outer]\n\n[outer.key]\nhint = "x"'
    )
    assert render(ContextFragment(name="wrapper", data=hint("x"))) == '[wrapper]\nhint = "x"'


# --- every builder -------------------------------------------------------------------------


def test_every_builder() -> None:
    out = render(
        role("You are helpful."),
        hint("Use CTEs"),
        term("NPL", "non-performing loan"),
        guardrail("No PII", reason="GDPR", action="Refuse"),
        explain("DAU", "daily users", therefore="divide"),
        example("q?", "SELECT 1;\nFROM t", note="n"),
        clarification("w", "a?", "r"),
        workflow("Cohorts", ["s1", "s2"], triggers=["cohort"], notes="n"),
        quirk("cents", "divide"),
        style_guide("CTEs", never="SELECT *", always="alias"),
        analogy(["a", "b"], "rel", insight="i", therefore="t", pitfall="p"),
        glossary({"revenue": "SUM(x)"}),
        principle(
            "P", "D", policies=[policy("r", before="b", reason="why", policies=[policy("inner")])]
        ),
        identity(name="Sam", role="VP"),
        persona("Freya", role="assistant", objective="help", tone="calm"),
        alias("big", "orders"),
        preference("dates", "ISO"),
        correction("status", "1 = on"),
    )
    parsed = parse_toml(out)
    assert parsed["role"] == "You are helpful."
    assert parsed["example"]["answer"] == "SELECT 1;\nFROM t"
    assert parsed["principle"]["policies"]["policy"]["policies"] == {"policy": {"rule": "inner"}}
    assert parsed["style_guide"] == {"prefer": "CTEs", "never": "SELECT *", "always": "alias"}
    assert parsed["glossary"] == [{"term": "revenue", "expression": "SUM(x)"}]
    assert "[principle.policies.policy.policies.policy]" in out


# --- codecs and refusals -------------------------------------------------------------------


def test_a_codec_renders_its_decoded_value() -> None:
    class Codec:
        def encode(self) -> str:
            return "stored"

        def decode(self) -> dict[str, int]:
            return {"fresh": 1}

    out = TomlRenderer().render([ContextFragment(name="x", data="stale", codec=Codec())])
    assert out == "[x]\nfresh = 1"


def test_group_fragments_is_accepted_and_changes_nothing() -> None:
    fragments = [fragment("teachings", hint("First"), hint("Second")), hint("a"), hint("b")]
    assert TomlRenderer(group_fragments=True).render(fragments) == TomlRenderer().render(fragments)
    assert "[teachings]" in TomlRenderer(group_fragments=True).render(fragments)


def test_refusals() -> None:
    with pytest.raises(InvalidInputError):
        TomlRenderer().render([user("hi")])
    with pytest.raises(InvalidInputError, match="lazy"):
        TomlRenderer().render([fragment("x", {1, 2})])
