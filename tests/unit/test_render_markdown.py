"""MarkdownRenderer: sections and bullets, never a Python repr."""

from __future__ import annotations

import re
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
from agentcontext.renderers import MarkdownRenderer
from agentcontext.renderers.base import title_case

_REPR = re.compile(r"\{'|\['|\bTrue\b|\bFalse\b|\bNone\b|ContextFragment|Node\(")


def render(*fragments: ContextFragment, group: bool = False) -> str:
    out = MarkdownRenderer(group_fragments=group).render(list(fragments))
    assert not _REPR.search(out), out
    return out


def lines(text: str) -> list[str]:
    return text.split("\n")


# --- primitives ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "body"),
    [
        ("Use CTEs for complex queries", "Use CTEs for complex queries"),
        (42, "42"),
        (2.5, "2.5"),
        (True, "true"),
        (False, "false"),
        ("", ""),
    ],
)
def test_primitives(data: Any, body: str) -> None:
    assert render(ContextFragment(name="hint", data=data)) == f"## Hint\n{body}"


@pytest.mark.parametrize(
    ("name", "title"),
    [
        ("hint", "Hint"),
        ("styleGuide", "Style Guide"),
        ("style_guide", "Style Guide"),
        ("userAPIKey", "User API Key"),
        ("level1", "Level1"),
        ("my-name", "My Name"),
    ],
)
def test_titles(name: str, title: str) -> None:
    assert title_case(name) == title
    assert render(ContextFragment(name=name, data="x")).startswith(f"## {title}\n")


def test_sections_are_separated_by_a_blank_line() -> None:
    assert render(
        ContextFragment(name="first", data="one"), ContextFragment(name="second", data="two")
    ).split("\n\n") == ["## First\none", "## Second\ntwo"]
    assert render() == ""


# --- escaping: content is kept as it is ----------------------------------------------------


def test_markdown_in_content_is_kept() -> None:
    out = render(hint("Use `backticks` and SELECT * FROM t"), hint("你好世界 🌍 émojis <b>&"))
    assert "Use `backticks` and SELECT * FROM t" in out
    assert "你好世界 🌍 émojis <b>&" in out


# --- multi-line ----------------------------------------------------------------------------


def test_multiline_values_stay_inside_their_bullet() -> None:
    assert render(hint("a\nb")) == "## Hint\na\nb"
    out = render(ContextFragment(name="ex", data={"answer": "SELECT 1\nFROM t", "list": ["x\ny"]}))
    assert lines(out) == [
        "## Ex",
        "- **answer**: SELECT 1",
        "  FROM t",
        "- **list**:",
        "  - x",
        "    y",
    ]


# --- None and empty ------------------------------------------------------------------------


def test_none_values_are_skipped() -> None:
    out = render(ContextFragment(name="item", data={"a": "value", "b": None, "c": "other"}))
    assert lines(out) == ["## Item", "- **a**: value", "- **c**: other"]
    assert render(fragment("items", "one", None, "three")) == "## Items\n- one\n- three"
    assert render(ContextFragment(name="gone", data=None)) == ""


def test_empty_values() -> None:
    assert render(fragment("items")) == "## Items\n"
    assert render(ContextFragment(name="empty", data={})) == "## Empty\n"
    out = render(ContextFragment(name="x", data={"s": "", "l": [], "d": {}}))
    assert lines(out) == ["## X", "- **s**:", "- **l**:", "- **d**:"]


# --- nesting -------------------------------------------------------------------------------


def test_nesting_three_deep() -> None:
    out = render(ContextFragment(name="config", data={"level1": {"level2": {"level3": "deep"}}}))
    assert lines(out) == [
        "## Config",
        "- **level1**:",
        "  - **level2**:",
        "    - **level3**: deep",
    ]
    deep = fragment("level1", fragment("level2", fragment("level3", "deep value")))
    assert lines(render(deep)) == [
        "## Level1",
        "- **level2**:",
        "  - **level3**:",
        "    - deep value",
    ]


def test_fragment_as_data_and_as_dict_value() -> None:
    assert render(ContextFragment(name="wrapper", data=hint("x"))) == "## Wrapper\n- **hint**: x"
    assert lines(render(ContextFragment(name="outer", data={"key": hint("x")}))) == [
        "## Outer",
        "- **key**:",
        "  - **hint**: x",
    ]


# --- arrays --------------------------------------------------------------------------------


def test_arrays_of_primitives() -> None:
    assert lines(render(fragment("items", "one", 2, False))) == [
        "## Items",
        "- one",
        "- 2",
        "- false",
    ]
    wf = ContextFragment(name="workflow", data={"task": "Analysis", "steps": ["step1", "step2"]})
    assert render(wf) == "## Workflow\n- **task**: Analysis\n- **steps**:\n  - step1\n  - step2"


def test_arrays_of_objects_keep_items_apart() -> None:
    out = render(
        ContextFragment(
            name="x", data={"users": [{"id": 1, "name": "Ada"}, {"id": 2}], "rows": [[1, 2]]}
        )
    )
    assert lines(out) == [
        "## X",
        "- **users**:",
        "  - **user**:",
        "    - **id**: 1",
        "    - **name**: Ada",
        "  - **user**:",
        "    - **id**: 2",
        "- **rows**:",
        "  - **row**:",
        "    - 1",
        "    - 2",
    ]


def test_arrays_of_fragments_keep_their_order() -> None:
    out = render(
        fragment(
            "teachings", hint("First hint"), "loose", term("LTV", "Lifetime Value"), hint("Second")
        )
    )
    assert lines(out) == [
        "## Teachings",
        "- **hint**: First hint",
        "- loose",
        "- **term**:",
        "  - **name**: LTV",
        "  - **definition**: Lifetime Value",
        "- **hint**: Second",
    ]


# --- grouping ------------------------------------------------------------------------------


def test_grouping() -> None:
    teachings = fragment(
        "teachings", hint("First"), hint("Second"), hint("Third"), policy("only one")
    )
    assert lines(render(teachings, group=True)) == [
        "## Teachings",
        "- **Hints**:",
        "  - **hint**: First",
        "  - **hint**: Second",
        "  - **hint**: Third",
        "- **policy**:",
        "  - **rule**: only one",
    ]
    assert "**Hints**" not in render(teachings)


def test_grouping_multiple_types_and_top_level() -> None:
    out = render(
        fragment(
            "teachings",
            hint("H1"),
            ContextFragment(name="rule", data="R1"),
            hint("H2"),
            ContextFragment(name="rule", data="R2"),
        ),
        group=True,
    )
    assert "**Hints**:" in out and "**Rules**:" in out
    assert out.index("**Hints**") < out.index("**Rules**")
    top = render(role("r"), hint("a"), hint("b"), group=True)
    assert top == "## Role\nr\n\n## Hints\n- **hint**: a\n- **hint**: b"
    assert render(role("r"), hint("a"), hint("b")) == "## Role\nr\n\n## Hint\na\n\n## Hint\nb"


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
    assert out == EVERY_BUILDER


EVERY_BUILDER = """\
## Role
You are helpful.

## Hint
Use CTEs

## Term
- **name**: NPL
- **definition**: non-performing loan

## Guardrail
- **rule**: No PII
- **reason**: GDPR
- **action**: Refuse

## Explain
- **concept**: DAU
- **explanation**: daily users
- **therefore**: divide

## Example
- **question**: q?
- **answer**: SELECT 1;
- **note**: n

## Clarification
- **when**: w
- **ask**: a?
- **reason**: r

## Workflow
- **task**: Cohorts
- **steps**:
  - s1
  - s2
- **triggers**:
  - cohort
- **notes**: n

## Quirk
- **issue**: cents
- **workaround**: divide

## Style Guide
- **prefer**: CTEs
- **never**: SELECT *
- **always**: alias

## Analogy
- **concepts**:
  - a
  - b
- **relationship**: rel
- **insight**: i
- **therefore**: t
- **pitfall**: p

## Glossary
- **glossary**:
  - **term**: revenue
  - **expression**: SUM(x)

## Principle
- **title**: P
- **description**: D
- **policies**:
  - **policy**:
    - **rule**: r
    - **before**: b
    - **reason**: why
    - **policies**:
      - **policy**:
        - **rule**: inner

## Identity
- **name**: Sam
- **role**: VP

## Persona
- **name**: Freya
- **role**: assistant
- **objective**: help
- **tone**: calm

## Alias
- **term**: big
- **meaning**: orders

## Preference
- **aspect**: dates
- **value**: ISO

## Correction
- **subject**: status
- **clarification**: 1 = on"""


# --- codecs and refusals -------------------------------------------------------------------


def test_keys_with_line_breaks_stay_on_their_line() -> None:
    out = render(ContextFragment(name="multi\nline", data={"a\nb": "v"}))
    assert out == "## Multi Line\n- **a b**: v"


def test_never_a_python_repr() -> None:
    data = {"flag": True, "none": None, "nested": [{"a": [1, [2, {"b": False}]]}], "f": hint("x")}
    out = render(ContextFragment(name="x", data=data))
    assert "true" in out and "false" in out


def test_a_codec_renders_its_decoded_value() -> None:
    class Codec:
        def encode(self) -> str:
            return "stored"

        def decode(self) -> list[str]:
            return ["fresh"]

    assert render(ContextFragment(name="x", data="stale", codec=Codec())) == "## X\n- fresh"


def test_refusals() -> None:
    with pytest.raises(InvalidInputError, match="conversation"):
        MarkdownRenderer().render([user("hi")])
    with pytest.raises(InvalidInputError, match="lazy"):
        MarkdownRenderer().render([fragment("x", (i for i in range(2)))])
