"""How the views, the command line and the viewer show a tool call in one line."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["tool_line"]


def _compact_json(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)
    except (TypeError, ValueError, RecursionError):
        return str(value)


def tool_line(part: Mapping[str, Any]) -> str:
    """A tool call as one line: ``tool get_weather({"city": "Paris"}) → sunny``.

    A call still running ends after its arguments; a failed one is marked ``✗``:
    ``tool get_weather({"city": "Paris"}) ✗ timeout``.
    """
    name = part.get("tool_name")
    args = part.get("input")
    line = f"tool {name if isinstance(name, str) and name else '?'}"
    line += f"({_compact_json(args) if args not in (None, {}, '') else ''})"
    if part.get("state") == "output-error" or part.get("error"):
        error = part.get("error")
        return f"{line} ✗ {_compact_json(error) if error else 'failed'}"
    if "output" in part and part.get("output") is not None:
        return f"{line} → {_compact_json(part.get('output'))}"
    return line
