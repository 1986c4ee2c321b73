"""What text of a stored message is searchable and what a graph preview shows.

Message data is the JSON of a :class:`~agentcontext.Message` (``{"id", "role", "parts"}``).
Only what a person would read is indexed: text and reasoning parts and tool names, never JSON
keys. Data of any other shape contributes its string values (not its keys).
"""

from __future__ import annotations

from typing import Any

PREVIEW_LENGTH = 50


def _parts(data: Any) -> list[Any] | None:
    if isinstance(data, dict):
        parts = data.get("parts")
        if isinstance(parts, list):
            return parts
    return None


def _string_values(value: Any, out: list[str]) -> None:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, (list, tuple)):
            stack.extend(reversed(item))


def search_text(data: Any) -> str:
    """The text the full-text index covers for a message with this data."""
    parts = _parts(data)
    if parts is None:
        out: list[str] = []
        _string_values(data, out)
        return "\n".join(out)
    pieces: list[str] = []
    for part in parts:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind in ("text", "reasoning"):
            value = part.get("text")
            if isinstance(value, str) and value:
                pieces.append(value)
        elif kind == "tool":
            value = part.get("tool_name")
            if isinstance(value, str) and value:
                pieces.append(value)
    return "\n".join(pieces)


def preview(data: Any) -> str:
    """The text parts of a message, whitespace collapsed, cut to 50 characters plus ``…``."""
    parts = _parts(data)
    if parts is None:
        out: list[str] = []
        _string_values(data, out)
        raw = " ".join(out)
    else:
        raw = " ".join(
            part["text"]
            for part in parts
            if isinstance(part, dict)
            and part.get("type") == "text"
            and isinstance(part.get("text"), str)
        )
    flat = " ".join(raw.split())
    if len(flat) > PREVIEW_LENGTH:
        return flat[:PREVIEW_LENGTH] + "…"
    return flat
