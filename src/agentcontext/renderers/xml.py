"""The XML renderer: one element per fragment, the default renderer of the engine.

Rules (following the original package, with its defects fixed so that the output is always
well-formed):

* A fragment is an element named after it. Text is escaped as little as XML allows, so the
  model reads what was written: ``&`` and ``<`` become ``&amp;`` and ``&lt;``, ``>`` only in
  ``]]>``, and a carriage return ``&#13;`` (a parser would turn it into a newline); quotes stay
  as they are (they only matter inside attributes, which the renderer never writes). Top-level
  elements are separated by a newline: the output is a well-formed XML *fragment* (several
  root elements), so parse it inside a wrapper, ``ET.fromstring(f"<root>{xml}</root>")``.
* Children are indented by 2 spaces per level. Text with a newline is put on its own lines,
  indented one level deeper than its tag.
* A dict renders one child element per key; a nested fragment renders as its own element.
* A fragment whose data is a list of exactly one text, number, dict or fragment renders as if
  its data were that item, as in the original package: ``fragment("x", "text")`` is
  ``<x>text</x>`` and a one-entry `glossary` holds its ``<term>`` and ``<expression>``
  directly (a list of several keeps one element per item).
* An element whose whole content is one fragment (the fragment's data is that fragment, or a
  list of just it, or a dict value is a fragment) does not repeat that fragment's element
  when its data is a list holding anything but fragments: the list's items go straight
  under the element, each named after the fragment, as in the original package.
  ``fragment("sql_flags", glossary({...}))`` gives ``<sql_flags>`` holding one
  ``<glossary>`` per entry, not ``<glossary>`` inside ``<glossary>``. A fragment whose list
  holds only fragments keeps its element. The original does this for top-level fragments
  only; here it applies at every level.
* A list renders its items in order: a nested fragment as its own element, any other item
  in an element named after the singular of the list's name (``steps`` → ``<step>``,
  ``queries`` → ``<query>``, ``status`` → ``<status>``; see
  `singular`). A dict or list item holds its entries or
  items inside that element.
* A fragment that is the value of a dict key is wrapped in an element named after the key.
* ``None`` values are skipped; an empty dict or list (or one holding only empty things)
  renders nothing; an empty string renders an empty element (``<hint></hint>``).
* Fragments that share a name at one level render as repeated elements. With
  ``group_fragments=True`` they are gathered, where the first of them stands, in an element
  named after the plural of the name (``<hints><hint>…</hint><hint>…</hint></hints>``); a
  name that appears once is not wrapped, and neither is a group inside a list whose own name
  is already that plural (``policies=[policy(...), policy(...)]`` gives ``<policies>`` once).
* Names that are not valid XML names are made valid: invalid characters become ``_`` and a
  name that cannot start an element gets a ``_`` in front (``"my key"`` → ``<my_key>``,
  ``"1st"`` → ``<_1st>``). ``:`` is replaced too (it would declare a namespace prefix).
* Characters XML 1.0 cannot carry at all (C0 control characters other than tab, newline and
  carriage return, U+FFFE, U+FFFF) become U+FFFD.
* Scalars: ``true``/``false``, integers as digits, floats by ``repr``.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from functools import lru_cache

from agentcontext.fragments import ContextFragment
from agentcontext.renderers.base import (
    ContextRenderer,
    Group,
    Node,
    Value,
    format_scalar,
    group_by_name,
    normalize_fragments,
    plural,
    singular,
)

__all__ = ["XmlRenderer", "xml_name"]

_ASCII_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*\Z")
_ASCII_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_ASCII_CHAR = _ASCII_START | frozenset("0123456789.-")
_INVALID_CHARS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
_SPECIAL = re.compile("[&<\r]|]]>")
_NEEDS_ESCAPE = re.compile("[&<\r\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]|]]>")


@lru_cache(maxsize=4096)
def _parses(document: str) -> bool:
    try:
        ET.fromstring(document)
    except ET.ParseError:
        return False
    return True


def _start_ok(char: str) -> bool:
    if char.isascii():
        return char in _ASCII_START
    return _parses(f"<{char}/>")


def _char_ok(char: str) -> bool:
    if char.isascii():
        return char in _ASCII_CHAR
    return _parses(f"<a{char}/>")


@lru_cache(maxsize=4096)
def xml_name(name: str) -> str:
    """``name`` made into a valid XML element name (see the module docs for the rule).

    Validity is checked against the standard library's XML parser for non-ASCII names.
    """
    if _ASCII_NAME.match(name):
        return name
    chars: list[str] = []
    for index, char in enumerate(name):
        if index == 0 and not _start_ok(char):
            chars.append("_")
            if _char_ok(char):
                chars.append(char)
            continue
        chars.append(char if _char_ok(char) else "_")
    return "".join(chars) or "_"


def _escape(text: str) -> str:
    if _INVALID_CHARS.search(text):
        text = _INVALID_CHARS.sub("\ufffd", text)
    if _SPECIAL.search(text):
        text = (
            text.replace("&", "&amp;")
            .replace("<", "&lt;")
            .replace("]]>", "]]&gt;")
            .replace("\r", "&#13;")
        )
    return text


class XmlRenderer(ContextRenderer):
    """Render fragments as XML elements (see the module docs for every rule).

    For example:

    ```python
    XmlRenderer().render([role("You are a SQL expert."), hint("Use CTEs.")])
    # <role>You are a SQL expert.</role>
    # <hint>Use CTEs.</hint>
    ```

    Args:
        group_fragments: Gather same-named sibling fragments under a plural element.
    """

    def __init__(self, group_fragments: bool = False) -> None:
        self.group_fragments = group_fragments

    def __repr__(self) -> str:
        return f"XmlRenderer(group_fragments={self.group_fragments!r})"

    def render(self, fragments: Sequence[ContextFragment]) -> str:
        """Render the fragments as XML (a newline between top-level elements)."""
        out: list[str] = []
        self._siblings(normalize_fragments(fragments), "item", None, 0, out)
        return "\n".join(out)

    # --- walking -----------------------------------------------------------------------------

    def _siblings(
        self,
        items: Sequence[Value],
        item_tag: str,
        enclosing: str | None,
        depth: int,
        out: list[str],
    ) -> None:
        """List items inside the element ``enclosing`` (None at the top level).

        Fragments render as their own elements, other items as ``item_tag`` elements.
        """
        if not self.group_fragments:
            for item in items:
                if isinstance(item, Node):
                    self._fragment(item, depth, out)
                else:
                    self._element(item_tag, item, depth, out)
            return
        for slot in group_by_name(items):
            if not isinstance(slot, Group):
                self._element(item_tag, slot, depth, out)
                continue
            tag = xml_name(plural(slot.name))
            if len(slot.nodes) == 1 or tag == enclosing:
                for node in slot.nodes:
                    self._fragment(node, depth, out)
                continue
            mark = len(out)
            pad = "  " * depth
            out.append(f"{pad}<{tag}>")
            for node in slot.nodes:
                self._fragment(node, depth + 1, out)
            if len(out) == mark + 1:
                out.pop()
            else:
                out.append(f"{pad}</{tag}>")

    def _fragment(self, node: Node, depth: int, out: list[str]) -> None:
        """A fragment's element; a list of one item that is not a list renders as that item."""
        value = node.value
        if type(value) is list and len(value) == 1 and type(value[0]) is not list:
            value = value[0]
        self._element(xml_name(node.name), value, depth, out)

    def _only_child(self, node: Node, parent: str, depth: int, out: list[str]) -> None:
        """The one fragment an element holds, inside the element ``parent``.

        When its data is a list holding anything but fragments, the items go straight
        under ``parent``, each named after the fragment, instead of repeating its element
        (``<sql_flags><glossary>…</glossary><glossary>…</glossary></sql_flags>``).
        """
        items = node.value
        if type(items) is list and not all(isinstance(item, Node) for item in items):
            self._siblings(items, xml_name(node.name), parent, depth, out)
        else:
            self._fragment(node, depth, out)

    def _element(self, tag: str, value: Value, depth: int, out: list[str]) -> None:
        pad = "  " * depth
        if type(value) is str or isinstance(value, (int, float)):
            text = value if type(value) is str else format_scalar(value)
            if _NEEDS_ESCAPE.search(text):
                text = _escape(text)
            if "\n" in text:
                inner = "  " * (depth + 1)
                body = "\n".join(f"{inner}{line}" if line else "" for line in text.split("\n"))
                out.append(f"{pad}<{tag}>\n{body}\n{pad}</{tag}>")
            else:
                out.append(f"{pad}<{tag}>{text}</{tag}>")
            return
        mark = len(out)
        out.append(f"{pad}<{tag}>")
        if isinstance(value, Node):
            self._only_child(value, tag, depth + 1, out)
        elif isinstance(value, dict):
            for key, item in value.items():
                self._element(xml_name(key), item, depth + 1, out)
        else:
            self._siblings(value, xml_name(singular(tag)), tag, depth + 1, out)
        if len(out) == mark + 1:
            out.pop()  # nothing inside: render nothing
        else:
            out.append(f"{pad}</{tag}>")
