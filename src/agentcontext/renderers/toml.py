"""The TOML renderer: valid TOML 1.0 that ``tomllib`` parses back to the rendered data.

The fragments are first mapped onto TOML's data model, then written out:

* Each top-level fragment is a key of the document: ``name = value`` for a scalar or a list,
  a ``[name]`` table for a dict or a fragment. Fragments that share a name at one level
  become one array (TOML forbids duplicate keys): two ``hint``\\ s give
  ``hint = ["...", "..."]``.
* A dict is a table; a nested dict is a sub-table ``[parent.child]``.
* A fragment whose data is a fragment is a table holding the child under its name.
* A list holding only fragments is a table keyed by their names (``fragment("database",
  hint("a"), term(...))`` gives ``[database]`` with ``hint = "a"`` and ``[database.term]``),
  same-named ones again merged into an array. Any other list is an array, in order;
  fragments inside it become inline tables ``{ name = value }``.
* Arrays of scalars are written inline, ``tags = ["a", "b"]``; arrays holding tables or
  arrays are written one item per line, items as inline tables and inline arrays.
* A fragment that is the value of a dict key is a table holding it under its name.
* Inside a table, plain keys are written before sub-tables (a key written after a
  ``[table]`` header would belong to that table), so keys and sub-tables may appear in a
  different order than in the data; parsing gives the same data.
* Strings are basic strings with every control character escaped (``\\n``, ``\\t``,
  ``\\uXXXX``), so each value stays on its line. Keys are bare when they only use
  ``A-Za-z0-9_-``, quoted otherwise. Floats are written by ``repr`` (``nan``, ``inf`` and
  ``-inf`` are valid TOML). Integers outside TOML's 64-bit range are written as strings.
* ``None`` values are skipped; empty strings, dicts and lists are kept (``x = ""``,
  ``[x]``, ``x = []``).
* Top-level entries are separated by a blank line, like sections.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TypeAlias

from agentcontext.fragments import ContextFragment
from agentcontext.renderers.base import ContextRenderer, Node, Value, normalize_fragments

__all__ = ["TomlRenderer", "toml_data"]

TomlValue: TypeAlias = "str | int | float | bool | list[TomlValue] | dict[str, TomlValue]"

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+\Z")
_NEEDS_ESCAPE = re.compile('[\x00-\x1f"\\\\\x7f]')
_ESCAPES = {
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
    '"': '\\"',
    "\\": "\\\\",
}
_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1


def _merge(nodes: Sequence[Node]) -> dict[str, TomlValue]:
    """Nodes as a table keyed by name; same-named values become one array."""
    table: dict[str, TomlValue] = {}
    repeated: set[str] = set()
    for node in nodes:
        value = _convert(node.value)
        if node.name not in table:
            table[node.name] = value
        elif node.name in repeated:
            existing = table[node.name]
            assert isinstance(existing, list)
            existing.append(value)
        else:
            table[node.name] = [table[node.name], value]
            repeated.add(node.name)
    return table


def _convert(value: Value) -> TomlValue:
    if isinstance(value, Node):
        return {value.name: _convert(value.value)}
    if isinstance(value, dict):
        return {key: _convert(item) for key, item in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(item, Node) for item in value):
            return _merge(value)  # type: ignore[arg-type]
        return [_convert(item) for item in value]
    if type(value) is int and not _INT_MIN <= value <= _INT_MAX:
        return str(value)
    return value


def toml_data(fragments: Sequence[ContextFragment]) -> dict[str, TomlValue]:
    """The data `TomlRenderer` writes for ``fragments`` (what ``tomllib`` gives back)."""
    return _merge(normalize_fragments(fragments))


def _escape_char(match: re.Match[str]) -> str:
    char = match.group()
    return _ESCAPES.get(char) or f"\\u{ord(char):04X}"


def _string(text: str) -> str:
    if _NEEDS_ESCAPE.search(text):
        text = _NEEDS_ESCAPE.sub(_escape_char, text)
    return f'"{text}"'


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else _string(key)


def _inline(value: TomlValue, depth: int, multiline: bool) -> str:
    """A value written inline; arrays of tables or arrays span lines when ``multiline``."""
    if isinstance(value, str):
        return _string(value)
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, dict):
        if not value:
            return "{}"
        entries = ", ".join(f"{_key(k)} = {_inline(v, 0, False)}" for k, v in value.items())
        return f"{{ {entries} }}"
    if isinstance(value, list):
        if not value:
            return "[]"
        if multiline and any(isinstance(item, (dict, list)) for item in value):
            pad = "  " * (depth + 1)
            items = "".join(f"{pad}{_inline(item, 0, False)},\n" for item in value)
            return f"[\n{items}{'  ' * depth}]"
        return "[" + ", ".join(_inline(item, 0, False) for item in value) + "]"
    return repr(value) if isinstance(value, float) else str(value)


def _table(path: str, table: dict[str, TomlValue], out: list[str]) -> None:
    out.append(f"[{path}]")
    subtables: list[tuple[str, dict[str, TomlValue]]] = []
    for key, value in table.items():
        if isinstance(value, dict):
            subtables.append((key, value))
        else:
            out.append(f"{_key(key)} = {_inline(value, 0, True)}")
    for key, value in subtables:
        out.append("")
        _table(f"{path}.{_key(key)}", value, out)


class TomlRenderer(ContextRenderer):
    """Render fragments as a TOML document (see the module docs for every rule).

    For example:

    ```python
    TomlRenderer().render([hint("Use CTEs"), term("LTV", "Lifetime Value")])
    # hint = "Use CTEs"
    #
    # [term]
    # name = "LTV"
    # definition = "Lifetime Value"
    ```

    Args:
        group_fragments: Accepted so that every renderer takes the same options; it changes
            nothing, since same-named fragments always become one array.
    """

    def __init__(self, group_fragments: bool = False) -> None:
        # Accepted so that every renderer takes the same options; same-named fragments
        # are always merged into one array here, since TOML forbids duplicate keys.
        self.group_fragments = group_fragments

    def __repr__(self) -> str:
        return "TomlRenderer()"

    def render(self, fragments: Sequence[ContextFragment]) -> str:
        """Render the fragments as TOML."""
        document = toml_data(fragments)
        blocks: list[str] = []
        tables: list[tuple[str, dict[str, TomlValue]]] = []
        for key, value in document.items():
            if isinstance(value, dict):
                tables.append((key, value))
            else:
                blocks.append(f"{_key(key)} = {_inline(value, 0, True)}")
        for key, value in tables:
            lines: list[str] = []
            _table(_key(key), value, lines)
            blocks.append("\n".join(lines))
        return "\n\n".join(blocks)
