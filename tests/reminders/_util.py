"""Helpers for the reminder tests."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from agentcontext import Chat, Message, ReminderContext, TextPart, ToolPart
from agentcontext.reminders._core import ReminderTarget

NOW = datetime(2026, 5, 6, 10, 0, tzinfo=UTC)


def tool(name: str, state: str = "output-available", **fields: Any) -> ToolPart:
    """A tool part: a result by default, an error with ``state="output-error"``."""
    if state == "output-error":
        fields.setdefault("error", "failed")
    return ToolPart(
        tool_call_id=fields.pop("call_id", f"{name}-call"),
        tool_name=name,
        input=fields.pop("input", {}),
        state=state,  # type: ignore[arg-type]
        **fields,
    )


def ask(text: str, message_id: str = "u") -> Message:
    return Message(id=message_id, role="user", parts=[TextPart(text=text)])


def answer(*parts: Any, message_id: str = "a") -> Message:
    return Message(
        id=message_id,
        role="assistant",
        parts=[TextPart(text=p) if isinstance(p, str) else p for p in parts],
    )


def context(
    *,
    turn: int = 1,
    content: str = "hello",
    messages: list[Message] | None = None,
    usage: dict[str, Any] | None = None,
    elapsed: float | None = None,
    target: ReminderTarget = "user",
    tool_outcome: ToolPart | None = None,
) -> ReminderContext:
    """A ReminderContext for predicate unit tests."""
    current = ask(content)
    history = [*(messages or []), current]
    return ReminderContext(
        turn=turn,
        target=target,
        message=current,
        content=content,
        messages=tuple(history),
        last_message=history[-2] if len(history) > 1 else None,
        chat=Chat(
            id="c",
            user_id="u",
            title=None,
            metadata={"usage": usage or {}},
            created_at=NOW,
            updated_at=NOW,
        ),
        usage=usage or {},
        branch="main",
        now=NOW,
        last_message_at=None,
        elapsed=elapsed,
        tool_outcome=tool_outcome,
    )


def text_of(message: Message) -> str:
    return message.text
