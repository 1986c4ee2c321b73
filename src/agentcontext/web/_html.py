"""HTML building blocks: every value that reaches a page goes through `esc` or `text_html`."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

__all__ = [
    "esc",
    "href",
    "json_html",
    "page",
    "preview_text",
    "snippet_html",
    "table",
    "text_html",
    "when",
]

# Bidirectional controls and other invisible formatting characters: shown as visible markers
# so an RTL override in a message cannot reorder the text around it.
_CONTROLS = re.compile("[\u061c\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")
_C0 = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def esc(value: object) -> str:
    """HTML-escape any value (quotes included), for text and attribute values alike."""
    return html.escape(str(value), quote=True)


def _marker(match: re.Match[str]) -> str:
    return f'<span class="ctl">U+{ord(match.group()):04X}</span>'


def text_html(text: str) -> str:
    """Escaped text with bidirectional and control characters shown as visible markers."""
    escaped = esc(text)
    escaped = _C0.sub(_marker, escaped)
    return _CONTROLS.sub(_marker, escaped)


def preview_text(text: str, limit: int = 60) -> str:
    """One line of plain text for labels: controls replaced, whitespace collapsed, cut short."""
    clean = _CONTROLS.sub("\ufffd", _C0.sub("\ufffd", text))
    clean = " ".join(clean.split())
    return clean if len(clean) <= limit else clean[: limit - 1] + "\u2026"


_MARK = re.compile(r"(</?mark>)")


def snippet_html(snippet: str) -> str:
    """A search snippet: escaped, with the store's ``<mark>`` tags kept as highlights."""
    out: list[str] = []
    depth = 0
    for piece in _MARK.split(snippet):
        if piece == "<mark>":
            if depth == 0:
                out.append("<mark>")
            depth += 1
        elif piece == "</mark>":
            if depth == 1:
                out.append("</mark>")
            depth = max(0, depth - 1)
        else:
            out.append(text_html(piece))
    if depth:
        out.append("</mark>")
    return "".join(out)


def json_html(value: Any) -> str:
    """A JSON value, indented and escaped, inside a ``<pre>``."""
    try:
        text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return f'<pre class="json">{text_html(text)}</pre>'


def when(value: datetime | None) -> str:
    """A timestamp as shown on pages (UTC, seconds)."""
    if value is None:
        return ""
    return esc(value.strftime("%Y-%m-%d %H:%M:%S UTC"))


def href(path: str, params: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None) -> str:
    """A URL to one of the viewer's pages with its query string, escaped for an attribute."""
    if not params:
        return esc(path)
    items = params.items() if isinstance(params, Mapping) else params
    pairs = [(k, str(v)) for k, v in items if v is not None and v != ""]
    return esc(f"{path}?{urlencode(pairs)}" if pairs else path)


def table(headers: list[str], rows: Iterable[list[str]], *, css: str = "grid") -> str:
    """A table; headers are escaped here, cells must be HTML already."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{esc(css)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def page(title: str, body: str, *, crumbs: list[tuple[str, str | None]] | None = None) -> str:
    """A whole page: the shared head (own stylesheet and script only), breadcrumbs, body."""
    trail = ""
    if crumbs:
        parts = [
            f'<a href="{link}">{esc(label)}</a>' if link else f"<span>{esc(label)}</span>"
            for label, link in crumbs
        ]
        trail = '<nav class="crumbs">' + " / ".join(parts) + "</nav>"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} \u00b7 agentcontext</title>"
        '<link rel="stylesheet" href="/static/viewer.css">'
        '<script src="/static/viewer.js" defer></script>'
        '<link rel="icon" href="data:,">'
        "</head><body>"
        '<header><a class="brand" href="/">agentcontext</a>'
        f"{trail}</header>"
        f"<main>{body}</main></body></html>"
    )
