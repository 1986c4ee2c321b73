"""ToonRenderer: the original's rules, decoded by the official toon-format package."""

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
from agentcontext.renderers import ToonRenderer
from tests.unit.conftest import expected_toon, parse_toon


def render(*fragments: ContextFragment) -> str:
    out = ToonRenderer().render(list(fragments))
    assert parse_toon(out) == expected_toon(fragments)
    return out


def one(name: str, data: Any) -> str:
    return render(ContextFragment(name=name, data=data))


# --- primitives and numbers ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ("Use CTEs", "hint: Use CTEs"),
        (42, "hint: 42"),
        (0, "hint: 0"),
        (-42, "hint: -42"),
        (3.14159, "hint: 3.14159"),
        (True, "hint: true"),
        (False, "hint: false"),
        (-0.0, "hint: 0"),
        (1.0, "hint: 1"),
        (1e-7, "hint: 1e-7"),
        (1.5e-5, "hint: 0.000015"),
        (1e21, "hint: 1e+21"),
        (2.5e16, "hint: 25000000000000000"),
        (2**70, f"hint: {2**70}"),
        (math.nan, "hint: null"),
        (math.inf, "hint: null"),
        (-math.inf, "hint: null"),
    ],
)
def test_primitives_and_canonical_numbers(data: Any, expected: str) -> None:
    assert one("hint", data) == expected


# --- quoting and escaping ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", '""'),
        ("  hello", '"  hello"'),
        ("hello  ", '"hello  "'),
        ("true", '"true"'),
        ("false", '"false"'),
        ("null", '"null"'),
        ("123", '"123"'),
        ("-1.5e3", '"-1.5e3"'),
        ("05", '"05"'),
        ("key: value", '"key: value"'),
        ("a,b,c", '"a,b,c"'),
        ("-flag", '"-flag"'),
        ("# not a comment", '"# not a comment"'),
        ("[x]", '"[x]"'),
        ("{x}", '"{x}"'),
        ("hello world", "hello world"),
        ("True", "True"),
        ("C:\\Users\\test", '"C:\\\\Users\\\\test"'),
        ('say "hello"', '"say \\"hello\\""'),
        ("line1\nline2", '"line1\\nline2"'),
        ("col1\tcol2", '"col1\\tcol2"'),
        ("cr\r", '"cr\\r"'),
        ("bell\x07", '"bell\\u0007"'),
        ("你好 🌍", "你好 🌍"),
    ],
)
def test_string_quoting(text: str, expected: str) -> None:
    assert one("text", text) == f"text: {expected}"


def test_keys_are_quoted_when_needed() -> None:
    out = one("config", {"名前": "t", "a b": 1, "x.y": 2, "_ok1": 3, "": 4, "1st": 5, "-k": 6})
    assert out.split("\n") == [
        "config:",
        '  "名前": t',
        '  "a b": 1',
        "  x.y: 2",
        "  _ok1: 3",
        '  "": 4',
        '  "1st": 5',
        '  "-k": 6',
    ]


# --- objects -------------------------------------------------------------------------------


def test_objects() -> None:
    assert (
        one("context", {"task": "hikes", "location": "Boulder"})
        == "context:\n  task: hikes\n  location: Boulder"
    )
    assert one("config", {"database": {"host": "localhost", "port": 5432}}) == (
        "config:\n  database:\n    host: localhost\n    port: 5432"
    )
    assert one("item", {"a": "value", "b": None, "c": "other"}) == "item:\n  a: value\n  c: other"
    assert one("empty", {}) == "empty:"


def test_nesting_three_deep() -> None:
    out = one("config", {"level1": {"level2": {"level3": "deep"}}})
    assert out.split("\n") == ["config:", "  level1:", "    level2:", "      level3: deep"]


# --- arrays --------------------------------------------------------------------------------


def test_primitive_arrays() -> None:
    assert one("tags", ["admin", "ops", "dev"]) == "tags[3]: admin,ops,dev"
    assert one("numbers", [1, 2.5, -3]) == "numbers[3]: 1,2.5,-3"
    assert one("flags", [True, False]) == "flags[2]: true,false"
    assert one("items", ["hello", "a,b", "world"]) == 'items[3]: hello,"a,b",world'
    assert one("items", ["text", 42, True]) == "items[3]: text,42,true"
    assert one("items", ["one", None, "three"]) == "items[2]: one,three"
    assert one("items", []) == "items[0]:"
    assert one("items", [""]) == 'items[1]: ""'


def test_tabular_arrays() -> None:
    users = [{"id": 1, "name": "Ada", "role": "admin"}, {"id": 2, "name": "Bob", "role": "user"}]
    assert one("users", users) == "users[2]{id,name,role}:\n  1,Ada,admin\n  2,Bob,user"
    quoted = [{"name": "hello", "desc": "a,b"}, {"name": "world", "desc": "c:d"}]
    assert one("items", quoted) == 'items[2]{name,desc}:\n  hello,"a,b"\n  world,"c:d"'


def test_rows_with_missing_values_are_not_tables() -> None:
    # The original wrote an empty cell for None, which decodes as "", not as a missing key.
    out = one("items", [{"a": 1, "b": None}, {"a": 2, "b": 3}])
    assert out == "items[2]:\n  - a: 1\n  - a: 2\n    b: 3"


def test_non_uniform_objects_are_list_items() -> None:
    assert one("items", [{"a": 1}, {"b": 2}]) == "items[2]:\n  - a: 1\n  - b: 2"
    assert one("items", [{"name": "test", "nested": {"x": 1}}]) == (
        "items[1]:\n  - name: test\n    nested:\n      x: 1"
    )
    assert one("items", [{}, {"a": 1}]) == "items[2]:\n  -\n  - a: 1"


def test_arrays_and_tables_nested_in_list_items_keep_their_headers() -> None:
    data = [
        {"rows": [{"a": 1}, {"a": 2}], "tags": ["x", "y"]},
        [1, 2],
        [[3], {"k": "v"}],
        [],
    ]
    assert one("items", data).split("\n") == [
        "items[4]:",
        "  - rows[2]{a}:",
        "      1",
        "      2",
        "    tags[2]: x,y",
        "  - [2]: 1,2",
        "  - [2]:",
        "    - [1]: 3",
        "    - k: v",
        "  - [0]:",
    ]


def test_object_with_arrays() -> None:
    assert (
        one("config", {"name": "test", "tags": ["a", "b", "c"]})
        == "config:\n  name: test\n  tags[3]: a,b,c"
    )
    data = {"title": "Report", "items": [{"id": 1, "value": 10}, {"id": 2, "value": 20}]}
    assert one("data", data) == "data:\n  title: Report\n  items[2]{id,value}:\n    1,10\n    2,20"


# --- fragments -----------------------------------------------------------------------------


def test_nested_fragments_are_list_items() -> None:
    assert render(fragment("container", hint("Use CTEs"))) == "container[1]:\n  - hint: Use CTEs"
    assert render(fragment("teachings", hint("First hint"), hint("Second hint"))) == (
        "teachings[2]:\n  - hint: First hint\n  - hint: Second hint"
    )
    assert render(fragment("level1", fragment("level2", fragment("level3", "deep value")))).split(
        "\n"
    ) == [
        "level1[1]:",
        "  - level2[1]:",
        "      - level3[1]: deep value",
    ]
    assert render(
        ContextFragment(name="level1", data=[ContextFragment(name="level2", data=[hint("deep")])])
    ).split("\n") == ["level1[1]:", "  - level2[1]:", "      - hint: deep"]


def test_a_fragment_with_object_data_in_a_list() -> None:
    assert render(fragment("terms", term("LTV", "Lifetime Value"))).split("\n") == [
        "terms[1]:",
        "  - term:",
        "      name: LTV",
        "      definition: Lifetime Value",
    ]


def test_fragment_as_data_and_as_dict_value() -> None:
    assert render(ContextFragment(name="wrapper", data=hint("x"))) == "wrapper:\n  hint: x"
    assert (
        render(ContextFragment(name="outer", data={"key": hint("x")}))
        == "outer:\n  key:\n    hint: x"
    )


def test_same_named_top_level_fragments_become_one_array() -> None:
    assert render(hint("a"), role("r"), hint("b")) == "hint[2]: a,b\nrole: r"
    out = render(term("a", "one"), term("b", "2"))
    assert out == 'term[2]{name,definition}:\n  a,one\n  b,"2"'


def test_multiple_top_level_fragments() -> None:
    assert render(
        ContextFragment(name="first", data="one"), ContextFragment(name="second", data="two")
    ) == ("first: one\nsecond: two")
    assert render() == ""
    assert render(ContextFragment(name="gone", data=None)) == ""


# --- every builder -------------------------------------------------------------------------


def test_every_builder() -> None:
    out = render(
        role("You are helpful."),
        hint("Use CTEs"),
        term("NPL", "non-performing loan"),
        guardrail("No PII", reason="GDPR", action="Refuse"),
        explain("DAU", "daily users", therefore="divide"),
        example("q?", "SELECT 1;", note="n"),
        clarification("w", "a?", "r"),
        workflow("Cohorts", ["s1", "s2"], triggers=["cohort"], notes="n"),
        quirk("cents", "divide"),
        style_guide("CTEs", never="SELECT *", always="alias"),
        analogy(["a", "b"], "rel", insight="i", therefore="t", pitfall="p"),
        glossary({"revenue": "SUM(x)", "aov": "AVG(x)"}),
        principle(
            "P", "D", policies=[policy("r", before="b", reason="why", policies=[policy("inner")])]
        ),
        identity(name="Sam", role="VP"),
        persona("Freya", role="assistant", objective="help", tone="calm"),
        alias("big", "orders"),
        preference("dates", "ISO"),
        correction("status", "1 = on"),
    )
    assert out == EVERY_BUILDER


EVERY_BUILDER = """\
role: You are helpful.
hint: Use CTEs
term:
  name: NPL
  definition: non-performing loan
guardrail:
  rule: No PII
  reason: GDPR
  action: Refuse
explain:
  concept: DAU
  explanation: daily users
  therefore: divide
example:
  question: q?
  answer: SELECT 1;
  note: n
clarification:
  when: w
  ask: a?
  reason: r
workflow:
  task: Cohorts
  steps[2]: s1,s2
  triggers[1]: cohort
  notes: n
quirk:
  issue: cents
  workaround: divide
style_guide:
  prefer: CTEs
  never: SELECT *
  always: alias
analogy:
  concepts[2]: a,b
  relationship: rel
  insight: i
  therefore: t
  pitfall: p
glossary[2]{term,expression}:
  revenue,SUM(x)
  aov,AVG(x)
principle:
  title: P
  description: D
  policies[1]:
    - policy:
        rule: r
        before: b
        reason: why
        policies[1]:
          - policy:
              rule: inner
identity:
  name: Sam
  role: VP
persona:
  name: Freya
  role: assistant
  objective: help
  tone: calm
alias:
  term: big
  meaning: orders
preference:
  aspect: dates
  value: ISO
correction:
  subject: status
  clarification: 1 = on"""


def test_real_world_hikes_example() -> None:
    hikes = [
        {
            "id": 1,
            "name": "Blue Lake Trail",
            "distanceKm": 7.5,
            "companion": "ana",
            "wasSunny": True,
        },
        {
            "id": 2,
            "name": "Ridge Overlook",
            "distanceKm": 9.2,
            "companion": "luis",
            "wasSunny": False,
        },
    ]
    assert one("hikes", hikes).split("\n") == [
        "hikes[2]{id,name,distanceKm,companion,wasSunny}:",
        "  1,Blue Lake Trail,7.5,ana,true",
        "  2,Ridge Overlook,9.2,luis,false",
    ]


# --- codecs and refusals -------------------------------------------------------------------


def test_a_codec_renders_its_decoded_value() -> None:
    class Codec:
        def encode(self) -> str:
            return "stored"

        def decode(self) -> list[int]:
            return [1, 2]

    assert (
        ToonRenderer().render([ContextFragment(name="x", data="stale", codec=Codec())])
        == "x[2]: 1,2"
    )


def test_group_fragments_is_accepted_and_changes_nothing() -> None:
    fragments = [fragment("teachings", hint("First"), hint("Second")), hint("a"), hint("b")]
    grouped = ToonRenderer(group_fragments=True).render(fragments)
    assert grouped == ToonRenderer().render(fragments)
    assert grouped.endswith("hint[2]: a,b")


def test_refusals() -> None:
    with pytest.raises(InvalidInputError):
        ToonRenderer().render([user("hi")])
    with pytest.raises(InvalidInputError, match="lazy"):
        ToonRenderer().render([ContextFragment(name="x", data=iter([1]))])
