"""Anthropic Messages API: a conversation as ``{"system", "messages"}``, and a reply back.

`to_anthropic` returns an `AnthropicRequest` whose values are the SDK's own ``TypedDict``
types, so ``client.messages.create(model=..., max_tokens=..., **request)`` type-checks under
``mypy --strict``.

Rules of `to_anthropic`:

* ``system`` is the system prompt followed by the text of every ``system`` message, joined
  with blank lines; the key is left out when there is no system text.
* ``user`` messages carry text blocks and file blocks.
* ``assistant`` messages are cut into steps (a text or signed reasoning after a tool call
  starts a new step); each step is an assistant message with, in the order of its parts,
  ``thinking`` / ``redacted_thinking`` blocks (reasoning that has a ``signature`` or
  ``redacted_data``; other reasoning is dropped), text blocks and ``tool_use`` blocks, and
  its results follow in a user message of ``tool_result`` blocks.
* Consecutive messages of one role are merged, as the API requires roles to alternate.
* ``cache=True`` puts ``cache_control: {"type": "ephemeral"}`` on the system prompt (sent as
  one text block), on the last block of the last message (so the next request reads the whole
  conversation from the cache) and on the last block of the message before it (the previous
  request's breakpoint): at most three of the four breakpoints Anthropic allows, leaving one
  for the caller's tools.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Required, TypedDict, cast

from agentcontext.adapters.shared import (
    assistant_steps,
    file_label,
    file_source,
    has_text,
    media_type,
    new_id,
    plain,
    reply_metadata,
    tool_result_text,
)
from agentcontext.errors import InvalidInputError
from agentcontext.messages import FilePart, Message, Part, ReasoningPart, TextPart, ToolPart

if TYPE_CHECKING:
    from anthropic.types import MessageParam, TextBlockParam

__all__ = ["AnthropicRequest", "from_anthropic", "to_anthropic"]

_IMAGES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
_EPHEMERAL = {"type": "ephemeral"}


class AnthropicRequest(TypedDict, total=False):
    """What `to_anthropic` returns: spread it into ``client.messages.create(**request)``."""

    system: str | list[TextBlockParam]
    messages: Required[list[MessageParam]]


def _anthropic_file(part: FilePart) -> dict[str, Any]:
    """One user content block for a file.

    * JPEG, PNG, GIF and WebP images → ``image`` with a ``base64`` or ``url`` source;
    * ``application/pdf`` → ``document`` with a ``base64`` or ``url`` source;
    * ``text/*`` with base64 content that decodes as UTF-8 → ``document`` with a plain
      ``text`` source;
    * the file name, when known, becomes the document ``title``;
    * anything else → a text block naming the file (and its URL when it has one).
    """
    kind = media_type(part)
    data, url = file_source(part)
    if kind in _IMAGES and (data or url):
        source: dict[str, Any] = (
            {"type": "base64", "media_type": kind, "data": data}
            if data is not None
            else {"type": "url", "url": url}
        )
        return {"type": "image", "source": source}
    document: dict[str, Any] | None = None
    if kind == "application/pdf" and (data or url):
        document = {
            "type": "document",
            "source": (
                {"type": "base64", "media_type": "application/pdf", "data": data}
                if data is not None
                else {"type": "url", "url": url}
            ),
        }
    elif kind.startswith("text/") and data is not None:
        try:
            text = base64.b64decode(data, validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            text = None
        if text is not None:
            document = {
                "type": "document",
                "source": {"type": "text", "media_type": "text/plain", "data": text},
            }
    if document is not None:
        if part.filename:
            document["title"] = part.filename
        return document
    return {"type": "text", "text": file_label(part)}


def _tool_input(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    return {"input": value}


def _signed(part: ReasoningPart) -> bool:
    return bool(part.signature or part.redacted_data)


def _assistant(message: Message) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for step in assistant_steps(message, _signed):
        blocks: list[dict[str, Any]] = []
        for part in step.parts:
            if isinstance(part, TextPart):
                blocks.append({"type": "text", "text": part.text})
            elif isinstance(part, ReasoningPart):
                if part.redacted_data:
                    blocks.append({"type": "redacted_thinking", "data": part.redacted_data})
                else:
                    blocks.append(
                        {"type": "thinking", "thinking": part.text, "signature": part.signature}
                    )
            else:
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": part.tool_call_id,
                        "name": part.tool_name,
                        "input": _tool_input(part.input),
                    }
                )
        out.append({"role": "assistant", "content": blocks})
        if step.calls:
            results: list[dict[str, Any]] = []
            for call in step.calls:
                result: dict[str, Any] = {
                    "type": "tool_result",
                    "tool_use_id": call.tool_call_id,
                    "content": tool_result_text(call),
                }
                if call.state != "output-available":
                    result["is_error"] = True
                results.append(result)
            out.append({"role": "user", "content": results})
    return out


def _user(message: Message) -> dict[str, Any] | None:
    blocks: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, TextPart) and has_text(part):
            blocks.append({"type": "text", "text": part.text})
        elif isinstance(part, FilePart):
            blocks.append(_anthropic_file(part))
    if not blocks:
        return None
    return {"role": "user", "content": blocks}


def _merge_same_role(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    merged: list[dict[str, Any]] = []
    for entry in entries:
        if merged and merged[-1]["role"] == entry["role"]:
            merged[-1]["content"].extend(entry["content"])
        else:
            merged.append({"role": entry["role"], "content": list(entry["content"])})
    return merged


def _simplify(entry: dict[str, Any]) -> dict[str, Any]:
    content = entry["content"]
    if len(content) == 1 and content[0]["type"] == "text" and "cache_control" not in content[0]:
        return {"role": entry["role"], "content": content[0]["text"]}
    return entry


def _mark(entry: dict[str, Any]) -> None:
    content = entry["content"]
    last = content[-1]
    if last["type"] in ("thinking", "redacted_thinking"):
        return  # thinking blocks take no cache_control
    content[-1] = {**last, "cache_control": dict(_EPHEMERAL)}


def to_anthropic(
    system_prompt: str, messages: Sequence[Message], *, cache: bool = False
) -> AnthropicRequest:
    """Map a system prompt and messages to ``{"system": ..., "messages": [...]}``.

    Args:
        system_prompt: The start of ``system`` (``system`` messages follow it).
        messages: The conversation.
        cache: Mark the system prompt and the end of the conversation with
            ``cache_control`` breakpoints (at most three; see the module docs).

    Returns:
        The request's ``system`` (left out when empty; a list of one text block when
        ``cache`` is set) and ``messages``: tool calls as ``tool_use`` blocks (a non-dict
        input is sent as ``{"input": value}``, none as ``{}``) answered by ``tool_result``
        blocks (the error text with ``"is_error": true``), signed reasoning as ``thinking``
        blocks, consecutive messages of one role merged. Unsigned reasoning, data parts and
        assistant files are dropped.
    """
    system_texts: list[str] = [system_prompt] if system_prompt.strip() else []
    entries: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            system_texts.extend(
                part.text for part in message.parts if isinstance(part, TextPart) and has_text(part)
            )
        elif message.role == "assistant":
            entries.extend(_assistant(message))
        else:
            entry = _user(message)
            if entry is not None:
                entries.append(entry)
    merged = _merge_same_role(entries)
    if cache:
        for entry in merged[-2:]:
            _mark(entry)
    result: dict[str, Any] = {}
    if system_texts:
        system = "\n\n".join(system_texts)
        result["system"] = (
            [{"type": "text", "text": system, "cache_control": dict(_EPHEMERAL)}]
            if cache
            else system
        )
    result["messages"] = [_simplify(entry) for entry in merged]
    return cast("AnthropicRequest", result)


# --- replies -------------------------------------------------------------------------------


def from_anthropic(reply: Any, *, id: str | None = None) -> Message:
    """An assistant `Message` from an Anthropic Messages API response.

    Args:
        reply: An ``anthropic.types.Message`` or its dict form.
        id: The message id; by default the response's ``id``.

    Returns:
        Text blocks as text, ``tool_use`` blocks as tool calls (state
        ``"input-available"``), ``thinking`` blocks as reasoning with their ``signature``
        and ``redacted_thinking`` blocks as reasoning with empty text and their
        ``redacted_data``, in order. ``metadata`` holds ``provider``, ``model``,
        ``response_id``, ``stop_reason`` and normalised ``usage``.

    Raises:
        InvalidInputError: The value is not a Messages API response.
    """
    data = plain(reply, "from_anthropic")
    if not isinstance(data, dict) or not isinstance(data.get("content"), list):
        raise InvalidInputError(
            "from_anthropic() takes a Messages API response (anthropic.types.Message) "
            "with a content list"
        )
    parts: list[Part] = []
    for block in data["content"]:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append(TextPart(text=block["text"]))
        elif kind == "thinking":
            parts.append(ReasoningPart(text=block["thinking"], signature=block.get("signature")))
        elif kind == "redacted_thinking":
            parts.append(ReasoningPart(text="", redacted_data=block["data"]))
        elif kind == "tool_use":
            parts.append(
                ToolPart(
                    tool_call_id=block["id"],
                    tool_name=block["name"],
                    input=block.get("input"),
                    state="input-available",
                )
            )
    metadata = reply_metadata("anthropic", data, ("stop_reason", data.get("stop_reason")))
    return Message(
        id=id or str(data.get("id") or new_id()), role="assistant", parts=parts, metadata=metadata
    )
