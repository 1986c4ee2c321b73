"""What text of a stored message is searchable and what a graph preview shows.

Message data is the JSON of a :class:`~agentcontext.Message` (``{"id", "role", "parts"}``).
Only what a person would read is indexed: text and reasoning parts and tool names, never JSON
keys. Data of any other shape contributes its string values (not its keys).
"""

from __future__ import annotations

import bisect
import functools
import re
from typing import Any

PREVIEW_LENGTH = 50
SNIPPET_WORDS = 16
MARK_OPEN = "<mark>"
MARK_CLOSE = "</mark>"

_WORD = re.compile(r"\w+")


def plain_terms(query: str) -> list[str]:
    """The words of plain user text that a search looks for (every one must occur).

    Words are runs of letters, digits and underscores; everything else (quotes, operators,
    ``*``, parentheses, colons) only separates words, so no input is a syntax error.
    """
    return _WORD.findall(query)


@functools.lru_cache(maxsize=256)
def _hit_pattern(terms: tuple[str, ...]) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(term) for term in sorted(terms, key=len, reverse=True))
    return re.compile(rf"(?<!\w)(?:{alternatives})(?!\w)", re.IGNORECASE)


def snippet(text: str, terms: list[str], *, words: int = SNIPPET_WORDS) -> str:
    """A window of about ``words`` words of ``text`` around the hits, hits in ``<mark>``.

    The same function makes the snippets on every backend, so they read the same. Only a
    stretch of text around the first hit is looked at, so long messages cost no more.
    """
    if not text:
        return ""
    pattern = _hit_pattern(tuple(sorted({term.casefold() for term in terms}))) if terms else None
    first = pattern.search(text) if pattern is not None else None
    # Words are at most a few dozen characters: this stretch holds the window and its hits.
    reach = words * 40
    lo = 0 if first is None else max(0, first.start() - reach // 2)
    hi = min(len(text), lo + 2 * reach)
    tokens = list(_WORD.finditer(text, lo, hi))
    if lo > 0 and tokens and tokens[0].start() == lo:
        tokens = tokens[1:]  # may be a word cut in half
    if hi < len(text) and tokens and tokens[-1].end() == hi:
        tokens = tokens[:-1]
    if not tokens:
        return text[: words * 8]
    starts = [token.start() for token in tokens]
    hits = (
        [bisect.bisect_left(starts, hit.start()) for hit in pattern.finditer(text, lo, hi)]
        if pattern is not None
        else []
    )
    begin = 0
    if hits:
        # The window starting at a hit that covers the most hits (the earliest on ties).
        best, best_count = hits[0], 0
        for index, start in enumerate(hits):
            count = bisect.bisect_left(hits, start + words) - index
            if count > best_count:
                best, best_count = start, count
        begin = max(0, min(best - words // 4, len(tokens) - words))
    last = min(len(tokens), begin + words)
    at_end = last == len(tokens) and hi == len(text)
    window = text[tokens[begin].start() : len(text) if at_end else tokens[last - 1].end()]
    if pattern is not None:
        window = pattern.sub(lambda hit: f"{MARK_OPEN}{hit.group()}{MARK_CLOSE}", window)
    body = " ".join(window.split())
    prefix = "…" if text[: tokens[begin].start()].strip() else ""
    suffix = "" if at_end else "…"
    return f"{prefix}{body}{suffix}"


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
        return flat[:PREVIEW_LENGTH].rstrip() + "…"
    return flat
