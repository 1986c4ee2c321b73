"""Helpers shared by the provider adapters and the framework integrations (package-internal:
used by `agentcontext.adapters` and `agentcontext.integrations`, no stability promise)."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import unquote_to_bytes

from agentcontext.errors import InvalidTypeError
from agentcontext.messages import FilePart, Message, ReasoningPart, TextPart, ToolPart

FINISHED = ("output-available", "output-error")


def has_text(part: TextPart) -> bool:
    return bool(part.text.strip())


def to_json(value: Any) -> str:
    """JSON text of a tool input or output (strings are passed through unchanged)."""
    if isinstance(value, str):
        return value
    # Keys sorted: the text must not depend on the backend (PostgreSQL's JSONB reorders keys),
    # so a reloaded conversation sends the same bytes and provider prompt caches keep hitting.
    return json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)


def parse_arguments(text: Any) -> Any:
    """Tool arguments sent as JSON text, parsed (kept as text when they are not JSON)."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def plain(obj: Any, what: str) -> Any:
    """An SDK object (pydantic model) or a mapping as plain JSON-like data."""
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if isinstance(obj, Mapping):
        return {key: plain(value, what) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return [plain(item, what) for item in obj]
    if obj is None or isinstance(obj, str | int | float | bool):
        return obj
    raise InvalidTypeError(
        f"{what}: expected an SDK object or a dict, got {type(obj).__name__}; pass the "
        "response the SDK returned (or its model_dump())"
    )


def new_id() -> str:
    return uuid.uuid4().hex


def reply_metadata(
    provider: str, data: Mapping[str, Any], *extra: tuple[str, Any]
) -> dict[str, Any]:
    """The metadata of a provider's reply: ``provider``, then ``model``, ``response_id`` and
    the ``extra`` pairs that are set, then the normalised ``usage`` when the reply has one."""
    metadata: dict[str, Any] = {"provider": provider}
    for key, value in (("model", data.get("model")), ("response_id", data.get("id")), *extra):
        if value is not None:
            metadata[key] = value
    if data.get("usage"):
        from agentcontext.usage import normalize_usage

        metadata["usage"] = normalize_usage(data["usage"])
    return metadata


def parse_data_url(url: str) -> tuple[str, str] | None:
    """Return ``(media_type, base64_data)`` of a ``data:`` URL, or None if it is not one."""
    if not url.startswith("data:") or "," not in url:
        return None
    header, payload = url[5:].split(",", 1)
    params = header.split(";")
    media_type = params[0] or "text/plain"
    if "base64" in params[1:]:
        return media_type, payload
    return media_type, base64.b64encode(unquote_to_bytes(payload)).decode("ascii")


def file_source(part: FilePart) -> tuple[str | None, str | None]:
    """Return ``(base64_data, url)`` for a file part; exactly one is set, or neither."""
    if part.data:
        return part.data, None
    if part.url:
        parsed = parse_data_url(part.url)
        if parsed is not None:
            return parsed[1], None
        return None, part.url
    return None, None


def file_label(part: FilePart) -> str:
    name = part.filename or (part.url if part.url and not part.url.startswith("data:") else None)
    where = f" at {part.url}" if part.url and not part.url.startswith("data:") else ""
    return f"[file {name or 'attachment'} ({part.media_type}){where}]"


def media_type(part: FilePart) -> str:
    found = part.media_type.split(";")[0].strip().lower()
    if part.url and part.url.startswith("data:") and not found:
        parsed = parse_data_url(part.url)
        if parsed is not None:
            return parsed[0].lower()
    return found


class Step:
    """Text, sendable reasoning and finished tool calls of one assistant step."""

    __slots__ = ("calls", "parts", "reasoning", "texts")

    def __init__(self) -> None:
        self.reasoning: list[ReasoningPart] = []
        self.texts: list[str] = []
        self.calls: list[ToolPart] = []
        self.parts: list[TextPart | ReasoningPart | ToolPart] = []  # all of them, in order

    def empty(self) -> bool:
        return not self.texts and not self.calls and not self.reasoning


def assistant_steps(
    message: Message, sendable: Callable[[ReasoningPart], bool] | None = None
) -> list[Step]:
    """Cut an assistant message into steps (a text or sendable reasoning after a tool call
    starts a new step). ``sendable`` says which reasoning parts the provider takes back."""
    steps: list[Step] = []
    current = Step()
    for part in message.parts:
        if isinstance(part, TextPart):
            if not has_text(part):
                continue
            if current.calls:
                steps.append(current)
                current = Step()
            current.texts.append(part.text)
            current.parts.append(part)
        elif isinstance(part, ReasoningPart) and sendable is not None and sendable(part):
            if current.calls:
                steps.append(current)
                current = Step()
            current.reasoning.append(part)
            current.parts.append(part)
        elif isinstance(part, ToolPart) and part.state in FINISHED:
            current.calls.append(part)
            current.parts.append(part)
        # files and data parts are not sent for assistant messages
    if not current.empty():
        steps.append(current)
    return steps


def tool_result_text(call: ToolPart) -> str:
    return to_json(call.output) if call.state == "output-available" else (call.error or "error")
