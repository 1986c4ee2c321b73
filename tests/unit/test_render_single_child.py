"""A fragment whose only child is a fragment whose data is a list.

The original package renders the child's items straight under the parent, each named after
the child, instead of the child's element holding one element per item (which doubled the
tag for names whose singular is themselves: ``<glossary><glossary>``). The rule is the
XML renderer's; the other formats keep the data as it is.
"""

from __future__ import annotations

from agentcontext.fragments import (
    ContextFragment,
    fragment,
    glossary,
    hint,
    policy,
    term,
)
from agentcontext.renderers import MarkdownRenderer, TomlRenderer, ToonRenderer, XmlRenderer
from tests.unit.conftest import expected_toml, expected_toon, parse_toml, parse_toon, parse_xml


def render(*fragments: ContextFragment, group: bool = False) -> str:
    out = XmlRenderer(group_fragments=group).render(list(fragments))
    parse_xml(out)  # every output is well-formed
    return out


def lines(text: str) -> list[str]:
    return text.split("\n")


def flags_glossary() -> ContextFragment:
    return glossary(
        {
            "is_active": "Indicates whether a user is currently active (1) or not (0)",
            "Analyst": "finance_level = 1",
        }
    )


def sql_flags() -> ContextFragment:
    return fragment("sql_flags", flags_glossary())


SQL_FLAGS_XML = [
    "<sql_flags>",
    "  <glossary>",
    "    <term>is_active</term>",
    "    <expression>Indicates whether a user is currently active (1) or not (0)</expression>",
    "  </glossary>",
    "  <glossary>",
    "    <term>Analyst</term>",
    "    <expression>finance_level = 1</expression>",
    "  </glossary>",
    "</sql_flags>",
]


# --- the original's regression tests -------------------------------------------------------


def test_a_single_fragment_child_is_not_wrapped_twice() -> None:
    out = render(sql_flags())
    assert "<glossary>\n    <glossary>" not in out
    assert lines(out) == SQL_FLAGS_XML


def test_the_rule_holds_with_grouping() -> None:
    assert lines(render(sql_flags(), group=True)) == SQL_FLAGS_XML


def test_a_single_string_child_is_not_singularised_and_nested() -> None:
    out = render(
        fragment("available_sections", "The available sections found in /sections directory.")
    )
    assert out == (
        "<available_sections>The available sections found in /sections directory."
        "</available_sections>"
    )


def test_several_children_keep_one_element_each() -> None:
    out = render(
        fragment(
            "proposal_context",
            hint('Current proposal: "New Test" for client "Gavi"'),
            hint("No team members selected yet for this proposal."),
        )
    )
    assert lines(out) == [
        "<proposal_context>",
        '  <hint>Current proposal: "New Test" for client "Gavi"</hint>',
        "  <hint>No team members selected yet for this proposal.</hint>",
        "</proposal_context>",
    ]


# --- where the rule applies ----------------------------------------------------------------


def test_the_parsed_xml_has_the_shape_of_the_data() -> None:
    """Repeated ``<glossary>`` under ``<sql_flags>`` is the list TOML gives back."""
    element = parse_xml(render(sql_flags())).find("sql_flags")
    assert element is not None
    parsed = [{child.tag: child.text for child in item} for item in element]
    assert parse_toml(TomlRenderer().render([sql_flags()])) == {"sql_flags": {"glossary": parsed}}


def test_a_fragment_as_data_follows_the_same_rule() -> None:
    direct = ContextFragment(name="sql_flags", data=flags_glossary())
    assert lines(render(direct)) == SQL_FLAGS_XML
    one_entry = ContextFragment(name="sql_flags", data=glossary({"revenue": "SUM(x)"}))
    assert lines(render(one_entry)) == [
        "<sql_flags>",
        "  <glossary>",
        "    <term>revenue</term>",
        "    <expression>SUM(x)</expression>",
        "  </glossary>",
        "</sql_flags>",
    ]


def test_items_are_named_after_the_child_and_keep_their_order() -> None:
    out = render(fragment("workflow", fragment("steps", "Build the cohort", hint("h"), "Compare")))
    assert lines(out) == [
        "<workflow>",
        "  <steps>Build the cohort</steps>",
        "  <hint>h</hint>",
        "  <steps>Compare</steps>",
        "</workflow>",
    ]


def test_a_dict_value_that_is_such_a_fragment() -> None:
    out = render(ContextFragment(name="config", data={"flags": fragment("flag", "a", "b")}))
    assert lines(out) == [
        "<config>",
        "  <flags>",
        "    <flag>a</flag>",
        "    <flag>b</flag>",
        "  </flags>",
        "</config>",
    ]


def test_grouping_among_the_lifted_items() -> None:
    out = render(fragment("rules", fragment("rule", "plain", policy("a"), policy("b"))), group=True)
    assert lines(out) == [
        "<rules>",
        "  <rule>plain</rule>",
        "  <policies>",
        "    <policy>",
        "      <rule>a</rule>",
        "    </policy>",
        "    <policy>",
        "      <rule>b</rule>",
        "    </policy>",
        "  </policies>",
        "</rules>",
    ]


# --- where it does not ---------------------------------------------------------------------


def test_a_single_child_whose_data_is_not_a_list_is_unchanged() -> None:
    assert lines(render(fragment("container", hint("Use CTEs")))) == [
        "<container>",
        "  <hint>Use CTEs</hint>",
        "</container>",
    ]
    assert lines(render(fragment("database", term("NPL", "non-performing loan")))) == [
        "<database>",
        "  <term>",
        "    <name>NPL</name>",
        "    <definition>non-performing loan</definition>",
        "  </term>",
        "</database>",
    ]
    assert lines(render(fragment("db", ContextFragment(name="tables", data={"list": ["a"]})))) == [
        "<db>",
        "  <tables>",
        "    <list>",
        "      <list>a</list>",
        "    </list>",
        "  </tables>",
        "</db>",
    ]


def test_a_single_child_holding_only_fragments_keeps_its_element() -> None:
    out = render(
        fragment("database", fragment("constraints", hint("No DELETE"), hint("Read-only")))
    )
    assert lines(out) == [
        "<database>",
        "  <constraints>",
        "    <hint>No DELETE</hint>",
        "    <hint>Read-only</hint>",
        "  </constraints>",
        "</database>",
    ]


def test_a_child_among_siblings_keeps_its_element() -> None:
    out = render(fragment("db", fragment("steps", "a", "b"), hint("h")))
    assert lines(out) == [
        "<db>",
        "  <steps>",
        "    <step>a</step>",
        "    <step>b</step>",
        "  </steps>",
        "  <hint>h</hint>",
        "</db>",
    ]


# --- nesting -------------------------------------------------------------------------------


def test_nested_single_children() -> None:
    """Each level applies the rule to its own only child."""
    out = render(fragment("outer", sql_flags()))
    assert lines(out) == ["<outer>", *(f"  {line}" for line in SQL_FLAGS_XML), "</outer>"]
    inner = fragment("outer", fragment("middle", sql_flags(), hint("h")))
    assert lines(render(inner)) == [
        "<outer>",
        "  <middle>",
        *(f"    {line}" for line in SQL_FLAGS_XML),
        "    <hint>h</hint>",
        "  </middle>",
        "</outer>",
    ]


def test_a_list_item_of_the_lifted_list_is_rendered_as_before() -> None:
    out = render(fragment("x", fragment("c", ["a", "b"], "d")))
    assert lines(out) == [
        "<x>",
        "  <c>",
        "    <c>a</c>",
        "    <c>b</c>",
        "  </c>",
        "  <c>d</c>",
        "</x>",
    ]


# --- the other formats ---------------------------------------------------------------------


def test_the_other_formats_keep_the_data_as_it_is() -> None:
    fragments = [sql_flags()]
    toml = TomlRenderer().render(fragments)
    assert parse_toml(toml) == expected_toml(fragments)
    assert parse_toml(toml)["sql_flags"]["glossary"][1] == {
        "term": "Analyst",
        "expression": "finance_level = 1",
    }
    assert parse_toon(ToonRenderer().render(fragments)) == expected_toon(fragments)
    assert lines(MarkdownRenderer().render(fragments)) == [
        "## Sql Flags",
        "- **glossary**:",
        "  - **glossary**:",
        "    - **term**: is_active",
        "    - **expression**: Indicates whether a user is currently active (1) or not (0)",
        "  - **glossary**:",
        "    - **term**: Analyst",
        "    - **expression**: finance_level = 1",
    ]
