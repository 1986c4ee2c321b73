"""What text of a stored message is searchable and what a graph preview shows.

Message data is the JSON of a `Message` (``{"id", "role", "parts"}``).
Only what a person would read is indexed: text and reasoning parts and tool names, never JSON
keys. Data of any other shape contributes its string values (not its keys).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from itertools import compress
from typing import Any

from agentcontext._display import tool_line
from agentcontext.store._rows.tokenizer import tokens, word_hits

PREVIEW_LENGTH = 50
_REMINDER = re.compile(r"<system-reminder>.*?</system-reminder>", re.DOTALL)
"""Text a reminder appended (see `agentcontext.reminder`): not what the author wrote."""
SNIPPET_WORDS = 16
MARK_OPEN = "<mark>"
MARK_CLOSE = "</mark>"


def snippet(text: str, query: Sequence[str], *, words: int = SNIPPET_WORDS) -> str:
    """About ``words`` words of ``text`` around the hits, hits in ``<mark>``.

    A hit is a word of the text that gives one of the query's tokens (so ``İstanbul`` is
    marked for the query ``istanbul``). The window starts a little before the stretch that
    holds the most hits (the earliest on ties). The same function makes the snippets on every
    backend. Only the text up to a little after the first hit is looked at, so long messages
    cost no more.
    """
    if not text:
        return ""
    wanted = set(query)
    # Per word of the text (a run giving several tokens, CJK or ``½``, is one word): where it
    # starts and ends, and whether it is a hit; a piece of the text at a time.
    starts: list[int] = []
    ends: list[int] = []
    hit: list[bool] = []
    first_hit = -1
    complete = True
    for at, to, flags in word_hits(text, wanted):
        if not at:
            continue
        if first_hit >= 0 and len(starts) > first_hit + 4 * words:  # past the window's reach
            complete = False
            break
        starts += at
        ends += to
        hit += flags
        if first_hit < 0 and True in flags:
            first_hit = hit.index(True)
        reach = first_hit + 4 * words + 1
        if first_hit >= 0 and len(starts) > reach:
            del starts[reach:], ends[reach:], hit[reach:]
            complete = False
            break
    if not starts:
        return " ".join(text[: words * 8].split())
    size = len(starts)
    begin = 0
    hits: list[int] = []
    if first_hit >= 0:
        hits = list(compress(range(size), hit))
        best, best_count = hits[0], 0
        for index, start in enumerate(hits):
            count = bisect.bisect_left(hits, start + words) - index
            if count > best_count:
                best, best_count = start, count
        begin = max(0, min(best - words // 4, size - words))
    last = min(size, begin + words) - 1
    at_end = complete and last == size - 1
    pieces: list[str] = []
    cursor = starts[begin]
    for i in hits[bisect.bisect_left(hits, begin) : bisect.bisect_right(hits, last)]:
        pieces += (text[cursor : starts[i]], MARK_OPEN, text[starts[i] : ends[i]], MARK_CLOSE)
        cursor = ends[i]
    pieces.append(text[cursor:] if at_end else text[cursor : ends[last]])
    body = " ".join("".join(pieces).split())
    prefix = "…" if text[: starts[begin]].strip() else ""
    return f"{prefix}{body}{'' if at_end else '…'}"


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


INDEXED_BYTES = 256 * 1024
"""How much of a message's searchable text the full-text index holds: its first 256 KiB
(UTF-8). Longer messages are stored whole; search finds them by the words of that prefix."""

_TRAILING_WORD = re.compile(r"[^\W_]+$")


def indexed_text(data: Any) -> str:
    """The part of a message's searchable text the index holds: `search_text`, cut to its
    first `INDEXED_BYTES` (never in the middle of a character or a word). Computed here, in
    Python, for every backend alike, so a search has one meaning everywhere."""
    text = search_text(data)
    if len(text) <= INDEXED_BYTES // 4:
        return text  # at most 4 bytes per character: short enough
    encoded = text.encode("utf-8")
    if len(encoded) <= INDEXED_BYTES:
        return text
    prefix = encoded[:INDEXED_BYTES].decode("utf-8", "ignore")
    if text[len(prefix)].isalnum():
        prefix = _TRAILING_WORD.sub("", prefix)  # the word goes on after the cut: drop it
    return prefix


def preview(data: Any) -> str:
    """What a message says, on one line, cut to 50 characters plus ``…``.

    Text parts give their text, without the ``<system-reminder>`` text reminders appended;
    a tool call reads ``tool name(args) → result`` (``✗ error``
    when it failed), so a message that only calls a tool is never shown empty.
    """
    parts = _parts(data)
    if parts is None:
        out: list[str] = []
        _string_values(data, out)
        raw = " ".join(out)
    else:
        pieces: list[str] = []
        for part in parts:
            if not isinstance(part, dict):
                continue
            if part.get("type") == "text" and isinstance(part.get("text"), str):
                pieces.append(_REMINDER.sub(" ", part["text"]))
            elif part.get("type") == "tool":
                pieces.append(tool_line(part))
        if not pieces:  # nothing to read: say what the message holds
            kinds = [p.get("type") for p in parts if isinstance(p, dict)]
            names = [
                str(p.get("name")) for p in parts if isinstance(p, dict) and p.get("type") == "data"
            ]
            if "reasoning" in kinds:
                pieces.append("(reasoning)")
            if "file" in kinds:
                pieces.append("(file)")
            pieces.extend(f"(data {name})" for name in names)
        raw = " ".join(pieces)
    flat = " ".join(raw.split())
    if len(flat) > PREVIEW_LENGTH:
        return flat[:PREVIEW_LENGTH].rstrip() + "…"
    return flat


def index_tokens(data: Any) -> list[str]:
    """The tokens the search index holds for a stored message's data (those of
    `indexed_text`)."""
    return tokens(indexed_text(data)) if data is not None else []
