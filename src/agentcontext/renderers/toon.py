"""The TOON renderer: Token-Oriented Object Notation, the most compact format for prompts.

TOON writes the JSON data model with YAML-like indentation and CSV-like tables. The output
decodes with the official ``toon-format`` package (strict mode) to the rendered data:

* The document is an object whose keys are the top-level fragment names. Fragments that
  share a name at one level become one array (TOON forbids duplicate keys).
* ``key: value`` for a scalar; ``key:`` followed by the fields, indented 2 spaces, for a
  dict (``key:`` alone for an empty one) and for a fragment whose data is a fragment
  (``{child_name: child_data}``).
* Arrays declare their length: ``key[N]: a,b,c`` when every item is a scalar;
  ``key[N]{f1,f2}:`` followed by one row per item when every item is a non-empty dict with
  the same keys and only scalar values (a table); otherwise ``key[N]:`` followed by list
  items ``- ...``. An empty array is ``key[0]:``.
* A list item is ``- value`` for a scalar, ``- name: ...`` for a fragment (an object with
  one field), an object with its first field on the hyphen line and the others below it,
  ``-`` for an empty object, and ``- [N]: ...`` for a nested array. Arrays and tables
  nested in list items keep their headers.
* Strings are quoted only when TOON requires it: empty, leading or trailing spaces, a
  leading ``-`` or ``#``, ``true``/``false``/``null``, numeric-looking, or holding one of
  ``: " \\ [ ] { } ,`` or a control character. Quoted strings escape ``\\ " \\n \\r \\t`` and
  other control characters as ``\\uXXXX``. Keys are unquoted when they match
  ``[A-Za-z_][A-Za-z0-9_.]*``, quoted otherwise.
* Numbers are canonical: no exponent between 1e-6 and 1e21, ``-0`` is ``0``, integral
  floats are written as integers; ``NaN`` and infinities become ``null`` (TOON has no
  such numbers).
* ``None`` values are skipped. Top-level fragments are separated by a newline.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from agentcontext.fragments import ContextFragment
from agentcontext.renderers.base import ContextRenderer, Node, Value, normalize_fragments

__all__ = ["ToonRenderer"]

_UNQUOTED_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")
_STRUCTURAL = re.compile(r'[:"\\\[\]{},\x00-\x1f]')
_NUMERIC_LIKE = re.compile(r"[+-]?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?\Z")
_NEEDS_ESCAPE = re.compile('[\\\\"\x00-\x1f]')
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(match: re.Match[str]) -> str:
    char = match.group()
    return _ESCAPES.get(char) or f"\\u{ord(char):04x}"


def _quote(text: str) -> str:
    return '"' + _NEEDS_ESCAPE.sub(_escape_char, text) + '"'


def _string(text: str) -> str:
    if (
        not text
        or text[0] in " \t-#"
        or text[-1] in " \t"
        or text in ("true", "false", "null")
        or _STRUCTURAL.search(text)
        or _NUMERIC_LIKE.match(text)
    ):
        return _quote(text)
    return text


def _key(key: str) -> str:
    return key if _UNQUOTED_KEY.match(key) else _quote(key)


def _number(value: float) -> str:
    """A float in TOON's canonical number form."""
    if not math.isfinite(value):
        return "null"
    if value == 0:
        return "0"
    if value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    text = repr(value)
    if "e" not in text:
        return text
    if 1e-6 <= abs(value) < 1e21:
        plain = f"{Decimal(text):f}"
        return plain.rstrip("0").rstrip(".") if "." in plain else plain
    mantissa, exponent = text.split("e")
    power = int(exponent)
    return f"{mantissa}e{'+' if power >= 0 else '-'}{abs(power)}"


def _scalar(value: str | int | float | bool) -> str:
    if type(value) is str:
        return _string(value)
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, float):
        return _number(value)
    return str(value)


def _table_fields(items: list[Value]) -> list[str] | None:
    """The fields of a uniform list of dicts with scalar values, or None."""
    first = items[0]
    if type(first) is not dict or not first:
        return None
    fields = list(first)
    keys = first.keys()
    for item in items:
        if type(item) is not dict or item.keys() != keys:
            return None
        for value in item.values():
            if not isinstance(value, (str, int, float)):
                return None
    return fields


class ToonRenderer(ContextRenderer):
    """Render fragments as TOON (see the module docs for every rule).

    For example:

    ```python
    ToonRenderer().render([fragment("users", {"id": 1, "name": "Ada"},
                                             {"id": 2, "name": "Bob"})])
    # users[2]{id,name}:
    #   1,Ada
    #   2,Bob
    ```

    Args:
        group_fragments: Accepted so that every renderer takes the same options; it changes
            nothing, since same-named fragments always become one array.
    """

    def __init__(self, group_fragments: bool = False) -> None:
        # Accepted so that every renderer takes the same options; same-named fragments
        # are always merged into one array here, since TOON forbids duplicate keys.
        self.group_fragments = group_fragments

    def __repr__(self) -> str:
        return "ToonRenderer()"

    def render(self, fragments: Sequence[ContextFragment]) -> str:
        """Render the fragments as a TOON document."""
        nodes = normalize_fragments(fragments)
        merged: dict[str, list[Value]] = {}
        for node in nodes:
            merged.setdefault(node.name, []).append(node.value)
        out: list[str] = []
        for name, values in merged.items():
            self._field(_key(name), values[0] if len(values) == 1 else values, 0, out)
        return "\n".join(out)

    def _field(self, key: str, value: Value, depth: int, out: list[str]) -> None:
        """One ``key: ...`` field (``key`` already encoded) at ``depth``."""
        pad = "  " * depth
        if isinstance(value, (str, int, float)):
            out.append(f"{pad}{key}: {_scalar(value)}")
        elif isinstance(value, list):
            self._array(f"{pad}{key}", value, depth, out, tabular=True)
        elif isinstance(value, Node):
            out.append(f"{pad}{key}:")
            self._field(_key(value.name), value.value, depth + 1, out)
        else:
            out.append(f"{pad}{key}:")
            for name, item in value.items():
                self._field(_key(name), item, depth + 1, out)

    def _array(
        self, head: str, items: list[Value], depth: int, out: list[str], *, tabular: bool
    ) -> None:
        """An array whose header starts with ``head`` (indentation included)."""
        count = len(items)
        if not count:
            out.append(f"{head}[0]:")
            return
        if all(isinstance(item, (str, int, float)) for item in items):
            out.append(f"{head}[{count}]: " + ",".join(_scalar(item) for item in items))  # type: ignore[arg-type]
            return
        fields = _table_fields(items) if tabular else None
        if fields is not None:
            out.append(f"{head}[{count}]{{{','.join(_key(f) for f in fields)}}}:")
            row_pad = "  " * (depth + 1)
            for item in items:
                assert isinstance(item, dict)
                out.append(row_pad + ",".join(_scalar(item[f]) for f in fields))  # type: ignore[arg-type]
            return
        out.append(f"{head}[{count}]:")
        for item in items:
            self._item(item, depth + 1, out)

    def _item(self, item: Value, depth: int, out: list[str]) -> None:
        """One list item at ``depth``."""
        pad = "  " * depth
        if isinstance(item, (str, int, float)):
            out.append(f"{pad}- {_scalar(item)}")
        elif isinstance(item, list):
            self._array(f"{pad}- ", item, depth, out, tabular=False)
        else:
            fields: list[tuple[str, Any]] = (
                [(item.name, item.value)] if isinstance(item, Node) else list(item.items())
            )
            if not fields:
                out.append(f"{pad}-")
                return
            # The fields stand at depth + 1; the first one moves onto the hyphen line.
            first = len(out)
            for name, value in fields:
                self._field(_key(name), value, depth + 1, out)
            out[first] = f"{pad}- {out[first][len(pad) + 2 :]}"
