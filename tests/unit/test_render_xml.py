"""XmlRenderer: the original's rules, its defects fixed, and well-formed output."""

from __future__ import annotations

from typing import Any

import pytest

from agentcontext.errors import InvalidInputError, InvalidTypeError
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
from agentcontext.renderers import XmlRenderer
from agentcontext.renderers.xml import xml_name
from tests.unit.conftest import parse_xml


def render(*fragments: ContextFragment, group: bool = False) -> str:
    out = XmlRenderer(group_fragments=group).render(list(fragments))
    parse_xml(out)  # every output is well-formed
    return out


def lines(text: str) -> list[str]:
    return text.split("\n")


# --- primitives ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ("Use CTEs", "<hint>Use CTEs</hint>"),
        (42, "<hint>42</hint>"),
        (0, "<hint>0</hint>"),
        (-7, "<hint>-7</hint>"),
        (3.14159, "<hint>3.14159</hint>"),
        (1.0, "<hint>1.0</hint>"),
        (True, "<hint>true</hint>"),
        (False, "<hint>false</hint>"),
        (float("inf"), "<hint>Infinity</hint>"),
    ],
)
def test_primitives(data: Any, expected: str) -> None:
    assert render(ContextFragment(name="hint", data=data)) == expected


def test_top_level_fragments_are_separated_by_newlines() -> None:
    assert render(role("r"), hint("h")) == "<role>r</role>\n<hint>h</hint>"
    assert render() == ""


# --- escaping ------------------------------------------------------------------------------


def test_text_escapes_only_what_xml_requires() -> None:
    out = render(ContextFragment(name="test", data={"content": "<tag> & \"quote\" 'it'"}))
    assert "<content>&lt;tag> &amp; \"quote\" 'it'</content>" in out
    assert parse_xml(out).find("test/content").text == "<tag> & \"quote\" 'it'"  # type: ignore[union-attr]


def test_characters_xml_cannot_carry_become_replacement_characters() -> None:
    out = render(hint("bell\x07 nul\x00 ok\ttab \ufffe"))
    assert parse_xml(out).find("hint").text == "bell\ufffd nul\ufffd ok\ttab \ufffd"  # type: ignore[union-attr]


def test_quotes_reach_the_model_as_written() -> None:
    assert render(hint('the customer\'s "VIP" plan')) == ('<hint>the customer\'s "VIP" plan</hint>')


def test_carriage_returns_survive_parsing() -> None:
    out = render(hint("a\rb"))
    assert out == "<hint>a&#13;b</hint>"
    assert parse_xml(out).find("hint").text == "a\rb"  # type: ignore[union-attr]


def test_cdata_terminator_and_lone_surrogates_are_harmless() -> None:
    out = render(hint("]]> and \ud800"))
    assert out == "<hint>]]&gt; and \ufffd</hint>"
    assert parse_xml(out).find("hint").text == "]]> and \ufffd"  # type: ignore[union-attr]


# --- multi-line text -----------------------------------------------------------------------


def test_multiline_text_is_indented_inside_its_tag() -> None:
    assert lines(render(hint("line 1\n\nline 3"))) == [
        "<hint>",
        "  line 1",
        "",
        "  line 3",
        "</hint>",
    ]
    nested = render(fragment("outer", {"text": "a\nb"}))
    assert lines(nested) == [
        "<outer>",
        "  <text>",
        "    a",
        "    b",
        "  </text>",
        "</outer>",
    ]


# --- a single child ------------------------------------------------------------------------


def test_a_fragment_with_one_child_is_not_nested_twice() -> None:
    assert render(fragment("x", "text")) == "<x>text</x>"
    assert render(fragment("x", 3)) == "<x>3</x>"
    assert render(fragment("x", {"a": "1"})) == "<x>\n  <a>1</a>\n</x>"
    assert render(fragment("x", hint("h"))) == "<x>\n  <hint>h</hint>\n</x>"
    assert render(glossary({"revenue": "SUM(x)"})) == (
        "<glossary>\n  <term>revenue</term>\n  <expression>SUM(x)</expression>\n</glossary>"
    )


def test_several_children_keep_one_element_each() -> None:
    assert lines(render(glossary({"a": "1", "b": "2"}))) == [
        "<glossary>",
        "  <glossary>",
        "    <term>a</term>",
        "    <expression>1</expression>",
        "  </glossary>",
        "  <glossary>",
        "    <term>b</term>",
        "    <expression>2</expression>",
        "  </glossary>",
        "</glossary>",
    ]
    assert render(fragment("x", "a", "b")) == "<x>\n  <x>a</x>\n  <x>b</x>\n</x>"


def test_a_list_under_a_key_stays_a_list_with_one_item() -> None:
    out = render(ContextFragment(name="workflow", data={"steps": ["only"]}))
    assert out == "<workflow>\n  <steps>\n    <step>only</step>\n  </steps>\n</workflow>"


# --- None and empty values -----------------------------------------------------------------


def test_none_values_are_skipped() -> None:
    out = render(ContextFragment(name="config", data={"enabled": True, "disabled": None}))
    assert out == "<config>\n  <enabled>true</enabled>\n</config>"
    assert render(fragment("items", "one", None, "three")) == (
        "<items>\n  <item>one</item>\n  <item>three</item>\n</items>"
    )
    assert render(ContextFragment(name="nothing", data=None), hint("x")) == "<hint>x</hint>"
    assert render(fragment("outer", ContextFragment(name="gone", data=None), "kept")) == (
        "<outer>kept</outer>"
    )


def test_empty_values() -> None:
    assert render(hint("")) == "<hint></hint>"
    assert render(ContextFragment(name="empty", data={})) == ""
    assert render(fragment("empty")) == ""
    assert render(ContextFragment(name="x", data={"a": [], "b": {}, "c": [None, {}]})) == ""
    assert render(identity()) == ""


# --- nesting -------------------------------------------------------------------------------


def test_nesting_three_deep() -> None:
    data = {"level1": {"level2": {"level3": "deep"}}}
    assert lines(render(ContextFragment(name="config", data=data))) == [
        "<config>",
        "  <level1>",
        "    <level2>",
        "      <level3>deep</level3>",
        "    </level2>",
        "  </level1>",
        "</config>",
    ]
    deep = fragment("level1", fragment("level2", fragment("level3", "deep value")))
    assert lines(render(deep)) == [
        "<level1>",
        "  <level2>",
        "    <level3>deep value</level3>",
        "  </level2>",
        "</level1>",
    ]


def test_a_fragment_as_data_and_as_a_dict_value() -> None:
    assert render(ContextFragment(name="wrapper", data=hint("x"))) == (
        "<wrapper>\n  <hint>x</hint>\n</wrapper>"
    )
    assert lines(render(ContextFragment(name="outer", data={"key": hint("x")}))) == [
        "<outer>",
        "  <key>",
        "    <hint>x</hint>",
        "  </key>",
        "</outer>",
    ]


def test_a_single_child_fragment_is_not_wrapped_twice() -> None:
    assert render(fragment("container", hint("Use CTEs"))) == (
        "<container>\n  <hint>Use CTEs</hint>\n</container>"
    )
    assert render(fragment("container", hint("Use CTEs")), group=True) == (
        "<container>\n  <hint>Use CTEs</hint>\n</container>"
    )


# --- arrays --------------------------------------------------------------------------------


def test_arrays_of_primitives_use_singular_tags() -> None:
    out = render(
        ContextFragment(
            name="x",
            data={"queries": ["a"], "categories": ["b"], "status": ["c"], "steps": [1, True]},
        )
    )
    assert lines(out) == [
        "<x>",
        "  <queries>",
        "    <query>a</query>",
        "  </queries>",
        "  <categories>",
        "    <category>b</category>",
        "  </categories>",
        "  <status>",
        "    <status>c</status>",
        "  </status>",
        "  <steps>",
        "    <step>1</step>",
        "    <step>true</step>",
        "  </steps>",
        "</x>",
    ]


def test_arrays_of_objects_and_nested_arrays() -> None:
    out = render(fragment("users", {"id": 1, "name": "Ada"}, {"id": 2, "tags": ["x", "y"]}, [1, 2]))
    assert lines(out) == [
        "<users>",
        "  <user>",
        "    <id>1</id>",
        "    <name>Ada</name>",
        "  </user>",
        "  <user>",
        "    <id>2</id>",
        "    <tags>",
        "      <tag>x</tag>",
        "      <tag>y</tag>",
        "    </tags>",
        "  </user>",
        "  <user>",
        "    <user>1</user>",
        "    <user>2</user>",
        "  </user>",
        "</users>",
    ]


def test_arrays_of_fragments_keep_their_order_with_primitives() -> None:
    out = render(fragment("database", hint("PG"), "loose", hint("Tables"), term("a", "b")))
    assert lines(out) == [
        "<database>",
        "  <hint>PG</hint>",
        "  <database>loose</database>",
        "  <hint>Tables</hint>",
        "  <term>",
        "    <name>a</name>",
        "    <definition>b</definition>",
        "  </term>",
        "</database>",
    ]


def test_fragments_in_a_dict_value_list_render_as_elements() -> None:
    out = render(ContextFragment(name="x", data={"policies": [policy("a"), "plain"]}))
    assert "[object Object]" not in out and "ContextFragment" not in out
    assert lines(out) == [
        "<x>",
        "  <policies>",
        "    <policy>",
        "      <rule>a</rule>",
        "    </policy>",
        "    <policy>plain</policy>",
        "  </policies>",
        "</x>",
    ]


# --- grouping ------------------------------------------------------------------------------


def test_grouping_gathers_same_named_fragments_where_the_first_stands() -> None:
    teachings = fragment(
        "teachings", hint("H1"), "loose", policy("R1"), hint("H2"), policy("R2"), term("t", "d")
    )
    assert lines(render(teachings, group=True)) == [
        "<teachings>",
        "  <hints>",
        "    <hint>H1</hint>",
        "    <hint>H2</hint>",
        "  </hints>",
        "  <teaching>loose</teaching>",
        "  <policies>",
        "    <policy>",
        "      <rule>R1</rule>",
        "    </policy>",
        "    <policy>",
        "      <rule>R2</rule>",
        "    </policy>",
        "  </policies>",
        "  <term>",
        "    <name>t</name>",
        "    <definition>d</definition>",
        "  </term>",
        "</teachings>",
    ]
    ungrouped = render(teachings)
    assert "<hints>" not in ungrouped and ungrouped.count("<hint>") == 2


def test_grouping_applies_at_the_top_level() -> None:
    assert lines(render(role("r"), hint("a"), hint("b"), group=True)) == [
        "<role>r</role>",
        "<hints>",
        "  <hint>a</hint>",
        "  <hint>b</hint>",
        "</hints>",
    ]
    assert (
        render(role("r"), hint("a"), hint("b")) == "<role>r</role>\n<hint>a</hint>\n<hint>b</hint>"
    )


def test_grouping_does_not_repeat_the_enclosing_plural() -> None:
    p = principle("t", "d", policies=[policy("a"), policy("b")])
    out = render(p, group=True)
    assert out.count("<policies>") == 1
    assert render(p, group=True) == render(p)


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
<role>You are helpful.</role>
<hint>Use CTEs</hint>
<term>
  <name>NPL</name>
  <definition>non-performing loan</definition>
</term>
<guardrail>
  <rule>No PII</rule>
  <reason>GDPR</reason>
  <action>Refuse</action>
</guardrail>
<explain>
  <concept>DAU</concept>
  <explanation>daily users</explanation>
  <therefore>divide</therefore>
</explain>
<example>
  <question>q?</question>
  <answer>SELECT 1;</answer>
  <note>n</note>
</example>
<clarification>
  <when>w</when>
  <ask>a?</ask>
  <reason>r</reason>
</clarification>
<workflow>
  <task>Cohorts</task>
  <steps>
    <step>s1</step>
    <step>s2</step>
  </steps>
  <triggers>
    <trigger>cohort</trigger>
  </triggers>
  <notes>n</notes>
</workflow>
<quirk>
  <issue>cents</issue>
  <workaround>divide</workaround>
</quirk>
<style_guide>
  <prefer>CTEs</prefer>
  <never>SELECT *</never>
  <always>alias</always>
</style_guide>
<analogy>
  <concepts>
    <concept>a</concept>
    <concept>b</concept>
  </concepts>
  <relationship>rel</relationship>
  <insight>i</insight>
  <therefore>t</therefore>
  <pitfall>p</pitfall>
</analogy>
<glossary>
  <term>revenue</term>
  <expression>SUM(x)</expression>
</glossary>
<principle>
  <title>P</title>
  <description>D</description>
  <policies>
    <policy>
      <rule>r</rule>
      <before>b</before>
      <reason>why</reason>
      <policies>
        <policy>
          <rule>inner</rule>
        </policy>
      </policies>
    </policy>
  </policies>
</principle>
<identity>
  <name>Sam</name>
  <role>VP</role>
</identity>
<persona>
  <name>Freya</name>
  <role>assistant</role>
  <objective>help</objective>
  <tone>calm</tone>
</persona>
<alias>
  <term>big</term>
  <meaning>orders</meaning>
</alias>
<preference>
  <aspect>dates</aspect>
  <value>ISO</value>
</preference>
<correction>
  <subject>status</subject>
  <clarification>1 = on</clarification>
</correction>"""


def test_original_examples() -> None:
    sg = ContextFragment(name="styleGuide", data={"prefer": "CTEs", "never": "subqueries"})
    assert (
        render(sg)
        == "<styleGuide>\n  <prefer>CTEs</prefer>\n  <never>subqueries</never>\n</styleGuide>"
    )
    wf = ContextFragment(name="workflow", data={"task": "Analysis", "steps": ["step1", "step2"]})
    assert render(wf) == (
        "<workflow>\n  <task>Analysis</task>\n  <steps>\n    <step>step1</step>\n"
        "    <step>step2</step>\n  </steps>\n</workflow>"
    )


# --- names ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "tag"),
    [
        ("hint", "hint"),
        ("my key", "my_key"),
        ("1st", "_1st"),
        ("a:b", "a_b"),
        ("", "_"),
        ("-x", "_-x"),
        ("名前", "名前"),
        ("é", "é"),
        ("<&>", "___"),
    ],
)
def test_invalid_names_are_made_valid(name: str, tag: str) -> None:
    assert xml_name(name) == tag
    out = render(ContextFragment(name=name, data="v"))
    assert parse_xml(out)[0].tag == tag


# --- codecs and refusals -------------------------------------------------------------------


def test_a_codec_renders_its_decoded_value_not_stale_data() -> None:
    class Codec:
        def encode(self) -> str:
            return "stored"

        def decode(self) -> dict[str, str]:
            return {"fresh": "value"}

    f = ContextFragment(name="x", data="stale", codec=Codec())
    assert render(f) == "<x>\n  <fresh>value</fresh>\n</x>"


def test_message_fragments_are_refused() -> None:
    with pytest.raises(InvalidInputError, match=r"ContextEngine\.set"):
        XmlRenderer().render([user("hi")])


def test_lazy_values_are_refused_with_the_path() -> None:
    with pytest.raises(
        InvalidInputError, match=r"'database\.tables' at data\[0\]\['list'\]\[1\].*ContextEngine"
    ):
        XmlRenderer().render([fragment("database", fragment("tables", {"list": [1, lambda: 2]}))])


@pytest.mark.parametrize(
    "data",
    [b"bytes", {1: "int key"}, object(), {"ok": [1, {"bad": {2}}]}],
)
def test_unsupported_values_are_refused(data: Any) -> None:
    with pytest.raises(InvalidInputError):  # InvalidTypeError derives from it
        XmlRenderer().render([ContextFragment(name="x", data=data)])


def test_wrong_types_raise_invalid_type_error() -> None:
    with pytest.raises(InvalidTypeError, match="not fragment data"):
        XmlRenderer().render([ContextFragment(name="x", data=b"bytes")])
    with pytest.raises(InvalidTypeError, match="ContextFragment"):
        XmlRenderer().render(["hint"])  # type: ignore[list-item]


def test_self_containing_data_is_refused() -> None:
    loop: list[Any] = ["x"]
    loop.append(loop)
    with pytest.raises(InvalidInputError, match="contains itself"):
        XmlRenderer().render([ContextFragment(name="x", data=loop)])


def test_rendering_is_pure() -> None:
    data = {"a": [1, None, {"b": None}], "c": None}
    f = ContextFragment(name="x", data=data)
    first = XmlRenderer().render([f])
    assert XmlRenderer().render([f]) == first
    assert data == {"a": [1, None, {"b": None}], "c": None}


def test_tuples_render_like_lists() -> None:
    assert render(ContextFragment(name="steps", data=("a", "b"))) == render(
        fragment("steps", "a", "b")
    )
