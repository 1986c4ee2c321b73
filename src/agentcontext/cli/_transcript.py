"""``show CHAT --branch B [--full]``: one branch as a transcript, oldest message first.

Each message gets a header line (its position, id, role and time) and its parts: texts (cut to
one line unless ``--full``), reasoning, tool calls as ``tool name(args) → result`` (a failed one
reads ``✗ error`` and ends with ``[failed]``), files and data.
Text a reminder inserted (the ranges in a user message's `metadata["reminders"]`) is wrapped in
``[reminder]`` … ``[/reminder]``; compaction summaries stored beside the branch appear after the
last message they fold, marked as such.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agentcontext._display import tool_line
from agentcontext.cli._output import Output, count, one_line
from agentcontext.errors import BranchNotFoundError
from agentcontext.reminders import part_ranges
from agentcontext.store import Branch, Chat, MessageRecord, SqlContextStore

__all__ = ["Transcript", "load_transcript", "mark_reminders", "print_transcript"]

PREVIEW = 100
REMINDER_OPEN = "[reminder]"
REMINDER_CLOSE = "[/reminder]"


@dataclass(frozen=True)
class Transcript:
    """A branch's messages in order, with the compaction summaries that fold some of them."""

    chat: Chat
    branch: Branch
    records: list[MessageRecord]
    """The chain from the root to the head, then compaction summaries after their parent."""

    def to_json(self) -> dict[str, Any]:
        """The transcript as JSON-ready data (full ids, every field of every record)."""
        return {
            "chat": self.chat.model_dump(mode="json"),
            "branch": self.branch.model_dump(mode="json"),
            "messages": [record.model_dump(mode="json") for record in self.records],
        }


async def load_transcript(
    store: SqlContextStore, chat: Chat, branch_name: str | None
) -> Transcript:
    """The transcript of `branch_name` (the active branch when None)."""
    if branch_name is None:
        branch = await store.get_active_branch(chat.id)
    else:
        branch = await store.get_branch(chat.id, branch_name)
    if branch is None:
        names = [b.name for b in await store.list_branches(chat.id)]
        known = ", ".join(names) if names else "none"
        raise BranchNotFoundError(
            f"chat {chat.id!r} has no branch {branch_name!r} (branches: {known})"
        )
    chain: list[MessageRecord] = []
    if branch.head_message_id is not None:
        chain = await store.get_message_chain(branch.head_message_id)
    on_chain = {record.id for record in chain}
    graph = await store.get_graph(chat.id)
    summaries: dict[str, list[MessageRecord]] = {}
    for node in graph.nodes:
        if node.type == "compaction" and node.parent_id in on_chain:
            record = await store.get_message(node.id)
            if record is not None:
                summaries.setdefault(node.parent_id, []).append(record)
    records: list[MessageRecord] = []
    for record in chain:
        records.append(record)
        records.extend(summaries.get(record.id, []))
    return Transcript(chat=chat, branch=branch, records=records)


def mark_reminders(text: str, ranges: list[tuple[int, int]]) -> str:
    """`text` with each ``(start, end)`` range wrapped in reminder markers (bad ranges skipped)."""
    out: list[str] = []
    last = 0
    for start, end in sorted(ranges):
        if not 0 <= start < end <= len(text) or start < last:
            continue
        out.extend((text[last:start], REMINDER_OPEN, text[start:end], REMINDER_CLOSE))
        last = end
    out.append(text[last:])
    return "".join(out)


def _short(text: str, full: bool) -> str:
    if full:
        return text
    flat = one_line(text)
    return flat if len(flat) <= PREVIEW else flat[: PREVIEW - 1] + "…"


def _value(value: object, full: bool) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return _short(text, full)


def _part_lines(part: dict[str, Any], metadata: object, index: int, full: bool) -> list[str]:
    kind = part.get("type")
    if kind == "text":
        text = str(part.get("text", ""))
        ranges = part_ranges(metadata, index, text)
        if ranges:
            text = mark_reminders(text, ranges)
        return [_short(text, full)]
    if kind == "reasoning":
        return [f"(reasoning) {_short(str(part.get('text', '')), full)}"]
    if kind == "tool":
        line = _short(tool_line(part), full)
        failed = part.get("state") == "output-error" or bool(part.get("error"))
        return [f"{line}{'  [failed]' if failed else ''}  ({part.get('tool_call_id')})"]
    if kind == "file":
        name = part.get("filename") or part.get("url") or "(inline data)"
        return [f"file {name} ({part.get('media_type')})"]
    if kind == "data":
        return [f"data {part.get('name')}: {_value(part.get('data'), full)}"]
    return [f"({kind} part) {_value(part, full)}"]


def _body(record: MessageRecord, full: bool) -> list[str]:
    data = record.data
    if not isinstance(data, dict) or not isinstance(data.get("parts"), list):
        return [_value(data, full)]
    metadata = data.get("metadata")
    lines: list[str] = []
    for index, part in enumerate(data["parts"]):
        if isinstance(part, dict):
            lines.extend(_part_lines(part, metadata, index, full))
    return lines or ["(no content)"]


def print_transcript(out: Output, transcript: Transcript, *, full: bool) -> None:
    """Write the transcript: whole texts with `full`, else one shortened line per part."""
    chat, branch = transcript.chat, transcript.branch
    messages = sum(1 for r in transcript.records if r.type != "compaction")
    state = " (active)" if branch.is_active else ""
    out.line(
        f"chat {chat.id} · user {chat.user_id} · branch {branch.name}{state} · "
        f"{count(messages, 'message')}",
        style="bold",
    )
    number = 0
    for record in transcript.records:
        out.line()
        when = record.created_at.isoformat()
        if record.type == "compaction":
            out.line(
                f"--- compaction {record.id} · summary of the messages up to "
                f"{record.parent_id} · {when} ---",
                style="bold yellow",
            )
        else:
            number += 1
            out.line(f"[{number}] {record.id} · {record.name} · {when}", style="bold cyan")
        for line in _body(record, full):
            out.line(line if full else one_line(line))
