"""Property tests: random nested fragment data, checked with the real parsers.

* XML parses with ``xml.etree`` (wrapped in a root element), with and without grouping, has
  one top-level element per non-empty fragment, and every single-line string comes back as
  element text; any text, at any depth, comes back exactly (indentation of multi-line text
  aside), with quotes left as written.
* TOML parses with ``tomllib`` to exactly the data the fragments describe.
* TOON decodes with ``toon_format`` (strict) to exactly the data the fragments describe.
* Markdown never contains a Python repr, keeps every string, and nests bullets one level at
  a time.

Each property runs ``EXAMPLES`` generated cases: 1000 by default (4000 in all), more with
``AGENTCONTEXT_PROPERTY_EXAMPLES=<n>``.
"""

from __future__ import annotations

import os
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agentcontext.fragments import ContextFragment
from agentcontext.renderers import (
    MarkdownRenderer,
    TomlRenderer,
    ToonRenderer,
    XmlRenderer,
    plural,
    singular,
)
from tests.unit.conftest import (
    expected_toml,
    expected_toon,
    parse_toml,
    parse_toon,
    parse_xml,
    renders_xml_element,
    scalar_texts,
)

EXAMPLES = int(os.environ.get("AGENTCONTEXT_PROPERTY_EXAMPLES", "1000"))
_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_NASTY_CHARS = st.sampled_from(
    [
        *"&<>\"':,-#[]{}\\ \t\n\r|=.*`_",
        *["\x00", "\x07", "\x1f", "\x7f", "\u2028", "é", "名", "🌍"],
        *["\ud800", "\udfff", "\ufffe", "\uffff"],
    ]
)
_NASTY_TOKENS = st.sampled_from(["true", "null", "12", "-3.5e2", "]]>", "<!--", "- ", "  ", "05"])
_TEXT = st.text(st.characters() | _NASTY_CHARS, max_size=10) | st.lists(
    _NASTY_CHARS | _NASTY_TOKENS, max_size=4
).map("".join)
_NAMES = (
    st.sampled_from(
        ["hint", "term", "steps", "queries", "categories", "status", "policy", "policies", "data"]
    )
    | st.sampled_from(["a b", "1st", "", "x.y", "名前", "xml", "-", "a:b", "glossary", "items"])
    | st.text(max_size=6)
)
_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _TEXT


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return (
        st.lists(children, max_size=5)
        | st.dictionaries(_NAMES, children, max_size=5)
        | st.builds(lambda name, data: ContextFragment(name=name, data=data), _NAMES, children)
        | st.lists(children, max_size=3).map(tuple)
        # uniform lists of flat dicts, so that TOON tables are exercised
        | st.integers(1, 4).flatmap(
            lambda n: st.lists(
                st.fixed_dictionaries({"a": _SCALARS, "b": _TEXT}), min_size=n, max_size=n
            )
        )
    )


_DATA = st.recursive(_SCALARS, _containers, max_leaves=25)
_FRAGMENTS = st.lists(
    st.builds(lambda name, data: ContextFragment(name=name, data=data), _NAMES, _DATA),
    max_size=6,
)

_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")


def _xml_texts(element: Any) -> list[str]:
    return [node.text or "" for node in element.iter()]


def _xml_leaves(element: Any) -> list[str]:
    """Leaf texts, with the indentation of multi-line text removed."""
    return sorted(
        "\n".join(line.lstrip(" ") for line in (node.text or "").split("\n"))
        for node in element.iter()
        if len(node) == 0
    )


@_SETTINGS
@given(_FRAGMENTS)
def test_xml_is_well_formed(fragments: list[ContextFragment]) -> None:
    out = XmlRenderer().render(fragments)
    root = parse_xml(out)
    assert len(root) == sum(renders_xml_element(f) for f in fragments)
    texts = set(_xml_texts(root))
    for value in scalar_texts(fragments):
        if "\n" in value or "\r" in value:
            continue
        assert _XML_INVALID.sub("\ufffd", value) in texts
    grouped = XmlRenderer(group_fragments=True).render(fragments)
    # grouping only adds wrapper elements: the same leaves, in another order
    assert _xml_leaves(parse_xml(grouped)) == _xml_leaves(root)


_DEPTH_NAMES = st.lists(st.sampled_from(["outer", "rules", "x", "policy"]), max_size=3)


def _element_text(node: Any, depth: int) -> str:
    """The text written into ``node``, without the indentation the renderer added."""
    raw = node.text or ""
    if not raw.startswith("\n"):
        return raw
    pad = "  " * depth
    inner = pad + "  "
    assert raw.endswith("\n" + pad), repr(raw)
    body = raw[1 : len(raw) - len(pad) - 1]
    lines = body.split("\n")
    assert all(line == "" or line.startswith(inner) for line in lines), repr(raw)
    return "\n".join(line[len(inner) :] for line in lines)


@_SETTINGS
@given(_TEXT, _DEPTH_NAMES, st.booleans())
@example('customer\'s "plan"', [], False)
@example("a\r\nb", ["outer"], False)
@example("\n  indented\n\n", ["outer", "x"], True)
@example("]]>&<>", [], False)
def test_xml_text_content_equals_the_input(text: str, names: list[str], listed: bool) -> None:
    """Every text comes back from a standard XML parser exactly as it went in."""
    node: Any = ContextFragment(name="leaf", data=[text] if listed else text)
    for name in reversed(names):
        node = ContextFragment(name=name, data=node)
    out = XmlRenderer().render([node])
    element = parse_xml(out)[0]
    for _ in names:
        element = element[0]
    expected = _XML_INVALID.sub("\ufffd", text)
    assert _element_text(element, len(names)) == expected
    assert "&apos;" not in out and "&quot;" not in out


@_SETTINGS
@given(_FRAGMENTS)
def test_toml_parses_back_to_the_data(fragments: list[ContextFragment]) -> None:
    out = TomlRenderer().render(fragments)
    assert parse_toml(out) == expected_toml(fragments)


@_SETTINGS
@given(_FRAGMENTS)
def test_toon_decodes_to_the_same_data(fragments: list[ContextFragment]) -> None:
    out = ToonRenderer().render(fragments)
    assert parse_toon(out) == expected_toon(fragments)


_REPR = re.compile(
    r"\{'|\['|\(\'|\bTrue\b|\bFalse\b|\bNone\b|ContextFragment|Node\(|\bnan\b|\binf\b"
)
_PLAIN_TEXT = st.text(
    st.characters(categories=["L", "N"]) | st.sampled_from(list(" .,;:!?-*_`#&<>/")), max_size=10
).filter(lambda text: not _REPR.search(text))
_PLAIN_DATA = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _PLAIN_TEXT,
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(
            st.sampled_from(["a", "b", "steps", "items", "note"]), children, max_size=4
        )
        | st.builds(
            lambda n, d: ContextFragment(name=n, data=d),
            st.sampled_from(["hint", "rule", "x"]),
            children,
        )
    ),
    max_leaves=25,
)
_BULLET = re.compile(r"^( *)- ")


@_SETTINGS
@given(
    st.lists(
        st.builds(
            lambda n, d: ContextFragment(name=n, data=d),
            st.sampled_from(["hint", "term", "rule"]),
            _PLAIN_DATA,
        ),
        max_size=5,
    ),
    st.booleans(),
)
def test_markdown_never_prints_a_repr(fragments: list[ContextFragment], group: bool) -> None:
    out = MarkdownRenderer(group_fragments=group).render(fragments)
    assert not _REPR.search(out), out
    for value in scalar_texts(fragments):
        assert value.strip() in out
    level = -1
    for line in out.split("\n"):
        if line.startswith("## "):
            level = -1
            continue
        match = _BULLET.match(line)
        if match is None:
            continue
        indent = len(match.group(1))
        assert indent % 2 == 0, line
        assert indent // 2 <= level + 1, out
        level = indent // 2


# --- naming --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("single", "many"),
    [
        ("query", "queries"),
        ("category", "categories"),
        ("policy", "policies"),
        ("status", "statuses"),
        ("hint", "hints"),
        ("step", "steps"),
        ("class", "classes"),
        ("match", "matches"),
        ("box", "boxes"),
        ("key", "keys"),
        ("person", "people"),
        ("child", "children"),
        ("criterion", "criteria"),
        ("analysis", "analyses"),
        ("leaf", "leaves"),
        ("cache", "caches"),
        ("alias", "aliases"),
        ("movie", "movies"),
        ("hero", "heroes"),
        ("example", "examples"),
        ("glossary", "glossaries"),
        ("tool_call", "tool_calls"),
        ("userQuery", "userQueries"),
        ("Query", "Queries"),
    ],
)
def test_singular_and_plural_are_inverse(single: str, many: str) -> None:
    assert plural(single) == many
    assert singular(many) == single


@pytest.mark.parametrize(
    "word",
    [
        "status",
        "series",
        "news",
        "data",
        "analysis",
        "always",
        "process",
        "hint",
        "名前",
        "países",
        "",
    ],
)
def test_words_that_stay_singular(word: str) -> None:
    assert singular(word) == word
