"""What the model is sent of a message, and what that costs in tokens.

Shared by `estimate_context` (the report) and the context window (the fit), so both count
the same thing: the texts of a message as the OpenAI adapter sends it, plus the framing every
message and every request adds. Counts are cached per tokenizer and message, keyed by a
fingerprint of the message's content.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

from pydantic import BaseModel, ConfigDict

from agentcontext.errors import InvalidTypeError
from agentcontext.messages import Message

__all__ = [
    "MESSAGE_OVERHEAD_TOKENS",
    "REPLY_PRIMING_TOKENS",
    "CACHE_LIMIT",
    "MessageEstimate",
    "cached_tokens",
    "clear_token_cache",
    "message_tokens_of",
]

MESSAGE_OVERHEAD_TOKENS = 4
"""Tokens added per message (and for the system prompt) for the role and message framing."""
REPLY_PRIMING_TOKENS = 3
"""Tokens added once per request to prime the reply."""


class MessageEstimate(BaseModel):
    """The tokens of one message's content, as the model is sent it (framing excluded)."""

    model_config = ConfigDict(frozen=True)

    id: str
    role: str
    tokens: int
    sent: bool = True
    """False when nothing of the message is sent (only reasoning, data or unfinished calls)."""


CACHE_LIMIT = 500_000
_tokens_cache: dict[str, dict[str, tuple[int, int]]] = {}
"""``tokenizer -> message id -> (content fingerprint, tokens with framing)``."""


def clear_token_cache() -> None:
    """Forget the counted messages (a tokenizer was registered or removed)."""
    _tokens_cache.clear()


def _get(item: Any, *names: str) -> Any:
    for name in names:
        if isinstance(item, Mapping):
            if name in item:
                return item[name]
        elif hasattr(item, name):
            return getattr(item, name)
    return None


def _jsonable(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    return value


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(
        _jsonable(value),
        ensure_ascii=False,
        separators=(",", ":"),
        default=lambda item: _jsonable(item) if hasattr(item, "model_dump") else str(item),
    )


_FINISHED_TOOL_STATES = ("output-available", "output-error")


def _part_texts(part: Any, role: str) -> Iterable[str]:
    """The texts of a part the model is sent (the rules of ``ResolveResult.to_openai()``)."""
    kind = _get(part, "type")
    kind = kind if isinstance(kind, str) else ""
    if kind == "reasoning" or kind == "data" or kind.startswith("data-"):
        return  # reasoning and application data are never sent
    if kind in ("tool", "dynamic-tool") or kind.startswith("tool-"):
        state = _get(part, "state")
        if role != "assistant" or (state is not None and state not in _FINISHED_TOOL_STATES):
            return  # only an assistant's finished calls are sent, with their results
        name = _get(part, "tool_name", "toolName")
        yield _as_text(name if name is not None else kind.removeprefix("tool-"))
        tool_input = _get(part, "input")
        yield _as_text(tool_input) if tool_input is not None else "{}"
        output = _get(part, "output")
        if state == "output-error":
            yield _as_text(_get(part, "error", "errorText")) or "error"
        elif output is not None or state == "output-available":
            yield _as_text(output) if output is not None else "null"
        return
    if kind == "file":
        if role != "user":
            return  # files are only sent in user messages
        # The file's content (an image, a PDF) is priced by each provider in its own way and
        # is not estimated; what is counted is the reference the model is given.
        yield _as_text(_get(part, "filename"))
        yield _as_text(_get(part, "media_type", "mediaType"))
        url = _get(part, "url")
        if isinstance(url, str) and not url.startswith("data:"):
            yield url
        return
    text = _get(part, "text")  # text parts, and any other part that carries text
    if isinstance(text, str) and text.strip():
        yield text


def _sent_texts(message: Message) -> list[str]:
    """The texts of a message as the OpenAI adapter sends it (`ResolveResult.to_openai`):
    the content of every request message it becomes, the name and arguments of each tool
    call, each result. Of a file, what is counted is the reference the model is given (an
    image's URL, a file's name); its content is priced by each provider in its own way."""
    from agentcontext.adapters.openai import to_openai

    texts: list[str] = []
    for item in cast("list[dict[str, Any]]", to_openai("", [message])):
        content = item.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            for part in content:
                kind = part.get("type")
                if kind == "text":
                    texts.append(part["text"])
                elif kind == "image_url":
                    url = part["image_url"]["url"]
                    texts.append("" if url.startswith("data:") else url)
                elif kind == "file":
                    texts.append(part["file"].get("filename") or "")
        for call in item.get("tool_calls") or ():
            texts.append(call["function"]["name"])
            texts.append(call["function"]["arguments"])
    return [text for text in texts if text]


def message_tokens_of(message: Any, index: int, count: Callable[[str], int]) -> MessageEstimate:
    if isinstance(message, Message):
        sent = _sent_texts(message)
        return MessageEstimate(
            id=message.id,
            role=message.role,
            tokens=sum(count(text) for text in sent),
            sent=bool(sent),
        )
    if isinstance(message, str | bytes) or (
        not isinstance(message, Mapping) and not hasattr(message, "parts")
    ):
        raise InvalidTypeError(
            f"messages[{index}] must be a Message or a dict with 'id', 'role' and 'parts'; "
            f"got {type(message).__name__}"
        )
    parts = _get(message, "parts")
    if parts is None:
        parts = []
    if isinstance(parts, str | bytes | Mapping) or not isinstance(parts, Iterable):
        raise InvalidTypeError(f"messages[{index}].parts must be a list of parts")
    message_id = _get(message, "id")
    role = _get(message, "role")
    role = "" if role is None else str(role)
    texts = [text for part in parts for text in _part_texts(part, role) if text]
    return MessageEstimate(
        id="" if message_id is None else str(message_id),
        role=role,
        tokens=sum(count(text) for text in texts),
        sent=bool(texts),
    )


# --- the estimate ---------------------------------------------------------------------------------


def cached_tokens(tokenizer: str) -> dict[str, tuple[int, int]]:
    """The cache of one tokenizer's counts: message id -> (fingerprint, tokens with framing)."""
    return _tokens_cache.setdefault(tokenizer, {})
