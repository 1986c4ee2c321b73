"""Messages as HTML: text (reminders marked), reasoning, tool calls and results, files, data."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from agentcontext._display import tool_line
from agentcontext.messages import (
    DataPart,
    FilePart,
    Message,
    ReasoningPart,
    TextPart,
    ToolPart,
)
from agentcontext.reminders import part_ranges
from agentcontext.store.records import MessageRecord
from agentcontext.web._html import esc, json_html, text_html, when

__all__ = [
    "message_body",
    "message_of_record",
    "message_panel",
    "reminder_ranges",
    "text_with_reminders",
]


def message_of_record(record: MessageRecord) -> Message | None:
    """The record's data as a `Message`, or None when it is not in the message shape."""
    data = record.data
    if isinstance(data, Message):
        return data
    try:
        return Message.model_validate(data)
    except ValidationError:
        return None


def reminder_ranges(metadata: Any, part: int, text: str) -> list[tuple[int, int]]:
    """The valid, non-overlapping reminder ranges of one text part, in order.

    Records of this library and of the original package are read (`part_ranges`); anything
    malformed (not a list, not dicts, non-int bounds, out of range, overlapping) is ignored
    rather than trusted.
    """
    ranges = sorted(
        (start, end)
        for start, end in part_ranges(metadata, part, text)
        if 0 <= start < end <= len(text)
    )
    kept: list[tuple[int, int]] = []
    for start, end in ranges:
        if kept and start < kept[-1][1]:
            continue
        kept.append((start, end))
    return kept


def text_with_reminders(text: str, ranges: list[tuple[int, int]]) -> str:
    """Escaped text with the reminder ranges wrapped in ``<mark class="reminder">``."""
    out: list[str] = []
    at = 0
    for start, end in ranges:
        out.append(text_html(text[at:start]))
        out.append(
            '<mark class="reminder" title="inserted as a system reminder">'
            '<span class="reminder-tag">[reminder]</span> '
            f"{text_html(text[start:end])}</mark>"
        )
        at = end
    out.append(text_html(text[at:]))
    return "".join(out)


def _part(kind: str, body: str, extra: str = "") -> str:
    label = f'<span class="kind">{esc(kind)}</span>' + (
        f' \u00b7 <span class="extra">{extra}</span>' if extra else ""
    )
    return f'<div class="part part-{esc(kind)}"><div class="part-kind">{label}</div>{body}</div>'


def message_body(message: Message) -> str:
    """The parts of a message as HTML."""
    out: list[str] = []
    for index, part in enumerate(message.parts):
        if isinstance(part, TextPart):
            ranges = reminder_ranges(message.metadata, index, part.text)
            out.append(_part("text", f"<pre>{text_with_reminders(part.text, ranges)}</pre>"))
        elif isinstance(part, ReasoningPart):
            out.append(
                _part(
                    "reasoning",
                    f"<details><summary>{len(part.text)} characters</summary>"
                    f"<pre>{text_html(part.text)}</pre></details>",
                )
            )
        elif isinstance(part, ToolPart):
            failed = part.state == "output-error" or part.error is not None
            call = tool_line(part.model_dump(mode="json"))
            mark = ' <span class="tag failed">failed</span>' if failed else ""
            body = (
                f'<p class="tool-call{" failed" if failed else ""}"><code>{text_html(call)}'
                f"</code>{mark}</p><div>input</div>{json_html(part.input)}"
            )
            if part.output is not None:
                body += f"<div>output</div>{json_html(part.output)}"
            if part.error is not None:
                body += f"<div>error</div><pre>{text_html(part.error)}</pre>"
            extra = (
                f"{esc(part.tool_name)} \u00b7 {esc(part.tool_call_id)} \u00b7 {esc(part.state)}"
            )
            out.append(_part("tool", body, extra))
        elif isinstance(part, FilePart):
            rows = [
                f"media type: {esc(part.media_type)}",
                f"file name: {text_html(part.filename or '')}",
                f"url (not followed): {text_html(part.url or '')}",
                f"inline data: {len(part.data or '')} characters",
            ]
            out.append(_part("file", "<pre>" + "\n".join(rows) + "</pre>"))
        elif isinstance(part, DataPart):
            out.append(_part("data", json_html(part.data), esc(part.name)))
    if not message.parts:
        out.append('<p class="muted">(no parts)</p>')
    return "".join(out)


def message_panel(record: MessageRecord, *, links: str = "") -> str:
    """A message's full content, as shown on selection."""
    message = message_of_record(record)
    parent = f" \u00b7 parent {text_html(record.parent_id)}" if record.parent_id else " \u00b7 root"
    head = (
        f'<div><span class="role {esc(record.name)}">{esc(record.name)}</span> '
        f'<span class="tag">{esc(record.type)}</span> '
        f'<code class="msg-id">{text_html(record.id)}</code></div>'
        f'<div class="muted">{when(record.created_at)}{parent}</div>{links}'
    )
    if message is None:
        body = json_html(record.data)
        return f'<section class="message" data-id="{esc(record.id)}">{head}{body}</section>'
    body = ""
    if record.type == "compaction":
        meta = (message.metadata or {}).get("compaction")
        if isinstance(meta, dict):
            body += (
                '<p class="notice">compaction summary: folds '
                f"{esc(meta.get('folded', '?'))} messages through "
                f"<code>{esc(meta.get('through', '?'))}</code></p>"
            )
    body += message_body(message)
    if message.metadata:
        body += f"<details><summary>metadata</summary>{json_html(message.metadata)}</details>"
    return f'<section class="message" data-id="{esc(record.id)}">{head}{body}</section>'
