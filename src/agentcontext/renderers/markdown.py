"""The Markdown renderer: a ``##`` section per fragment, nested data as bullet lists.

Rules (following the original package, with its defects fixed):

* Each top-level fragment is a section ``## Title`` (the name in title case: ``style_guide``
  and ``styleGuide`` both give ``Style Guide``), followed by its content; sections are
  separated by a blank line.
* A top-level scalar is written as it is under its heading (several lines stay several
  lines). A top-level dict, list or fragment is written as a bullet list.
* Inside bullets, a key and its scalar value are ``- **key**: value``; a dict, a list or a
  nested fragment is ``- **key**:`` followed by its content one level (2 spaces) deeper.
* A list renders its items in order: a scalar as ``- value``, a nested fragment as
  ``- **name**: ...``, and a dict or list item as ``- **item**:`` with its content below,
  where *item* is the singular of the list's name (``queries`` → ``query``; see
  `singular`), so that the items of a list of objects
  stay apart.
* A value with several lines continues on the next lines, indented to stay inside its
  bullet.
* ``None`` values are skipped; an empty string, dict or list leaves its key or heading
  with nothing after it.
* Fragments sharing a name render as repeated bullets (repeated sections at the top
  level). With ``group_fragments=True`` they are gathered, where the first of them stands,
  under ``- **Plurals**:`` (a ``## Plurals`` section at the top level); a name that appears
  once is not gathered.
* Keys and names are written on one line (line breaks in them become spaces).
* Scalars are ``true``/``false``, integers as digits, floats by ``repr``: a Python repr of a
  dict, a list, ``True`` or ``None`` is never printed. Text is not escaped, so Markdown in
  the content (``**``, backticks) keeps its meaning.
"""

from __future__ import annotations

from collections.abc import Sequence

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
    title_case,
)

__all__ = ["MarkdownRenderer"]


def _scalar_text(value: str | int | float | bool, depth: int) -> str:
    """A scalar after ``- **key**: ``; extra lines are indented to stay in the bullet."""
    text = format_scalar(value)
    if "\n" in text:
        pad = "  " * (depth + 1)
        text = "\n".join(
            [text.split("\n", 1)[0]]
            + [f"{pad}{line}" if line else "" for line in text.split("\n")[1:]]
        )
    return text


class MarkdownRenderer(ContextRenderer):
    """Render fragments as Markdown sections and bullet lists (see the module docs).

    For example:

    ```python
    MarkdownRenderer().render([term("LTV", "Lifetime Value")])
    # ## Term
    # - **name**: LTV
    # - **definition**: Lifetime Value
    ```

    Args:
        group_fragments: Gather same-named sibling fragments under a plural heading.
    """

    def __init__(self, group_fragments: bool = False) -> None:
        self.group_fragments = group_fragments

    def __repr__(self) -> str:
        return f"MarkdownRenderer(group_fragments={self.group_fragments!r})"

    def render(self, fragments: Sequence[ContextFragment]) -> str:
        """Render the fragments as Markdown (a blank line between sections)."""
        nodes = normalize_fragments(fragments)
        sections: list[str] = []
        if self.group_fragments:
            for slot in group_by_name(nodes):
                assert isinstance(slot, Group)  # the top level holds fragments only
                if len(slot.nodes) == 1:
                    sections.append(self._section(slot.nodes[0]))
                else:
                    lines = [f"## {title_case(plural(slot.name))}"]
                    for node in slot.nodes:
                        self._bullet(node.name, node.value, 0, lines)
                    sections.append("\n".join(lines))
        else:
            sections.extend(self._section(node) for node in nodes)
        return "\n\n".join(sections)

    def _section(self, node: Node) -> str:
        heading = f"## {title_case(node.name)}"
        value = node.value
        if isinstance(value, (str, int, float)):
            return f"{heading}\n{format_scalar(value)}"
        lines: list[str] = [heading]
        self._content(node.name, value, 0, lines)
        if len(lines) == 1:
            return f"{heading}\n"
        return "\n".join(lines)

    def _content(self, name: str, value: Value, depth: int, out: list[str]) -> None:
        """The bullets of a dict, list or fragment, at ``depth``."""
        if isinstance(value, Node):
            self._bullet(value.name, value.value, depth, out)
        elif isinstance(value, dict):
            for key, item in value.items():
                self._bullet(key, item, depth, out)
        elif isinstance(value, list):
            self._items(name, value, depth, out)

    def _bullet(self, label: str, value: Value, depth: int, out: list[str]) -> None:
        pad = "  " * depth
        if "\n" in label or "\r" in label:
            label = " ".join(label.split())  # a label stays on its bullet's line
        if isinstance(value, (str, int, float)):
            text = _scalar_text(value, depth)
            out.append(f"{pad}- **{label}**: {text}" if text else f"{pad}- **{label}**:")
            return
        out.append(f"{pad}- **{label}**:")
        self._content(label, value, depth + 1, out)

    def _items(self, name: str, items: list[Value], depth: int, out: list[str]) -> None:
        item_label = singular(name)
        pad = "  " * depth
        slots: Sequence[Value | Group] = group_by_name(items) if self.group_fragments else items
        for slot in slots:
            if isinstance(slot, Group):
                if len(slot.nodes) == 1 or plural(slot.name) == name:
                    for node in slot.nodes:
                        self._bullet(node.name, node.value, depth, out)
                else:
                    out.append(f"{pad}- **{title_case(plural(slot.name))}**:")
                    for node in slot.nodes:
                        self._bullet(node.name, node.value, depth + 1, out)
            elif isinstance(slot, Node):
                self._bullet(slot.name, slot.value, depth, out)
            elif isinstance(slot, (str, int, float)):
                out.append(f"{pad}- {_scalar_text(slot, depth)}".rstrip(" "))
            else:
                self._bullet(item_label, slot, depth, out)
