"""Map a resolved conversation onto the request shapes of the OpenAI and Anthropic SDKs.

Both adapters return plain ``dict``/``list`` values that validate against the official SDKs'
``TypedDict`` parameter types (``openai.types.chat.ChatCompletionMessageParam`` and
``anthropic.types.MessageParam``), so the result can be passed straight to
``client.chat.completions.create(messages=...)`` or ``client.messages.create(**...)``.

Rules shared by both adapters
-----------------------------
* Text parts whose text is empty or only whitespace are left out (Anthropic refuses such
  blocks and they carry nothing for the model). A message left with nothing to send is
  dropped.
* A message with one text part and nothing else is sent with a plain string ``content``;
  otherwise ``content`` is a list of parts, in the order of the message's parts.
* An assistant message is cut into *steps*, the way the AI SDK does it: a text part that
  follows a tool call starts a new step. Each step becomes one assistant message carrying
  its text and its tool calls, followed by the results of those calls. So
  ``[text, tool call, text]`` becomes assistant (text + call), tool result, assistant (text).
* Only finished tool calls are sent: state ``"output-available"`` (the result is ``output``)
  and ``"output-error"`` (the result is ``error``, flagged as an error where the provider
  has a flag). Calls still ``"input-streaming"`` or ``"input-available"`` have no result,
  and both providers reject a call without a result, so they are left out.
* Reasoning parts are dropped: OpenAI Chat Completions takes no reasoning input, and
  Anthropic ``thinking`` blocks must carry the provider's signature, which a stored
  `ReasoningPart` does not have.
* Data parts are application data and are never sent.
* Files in assistant messages are dropped (neither API accepts them there).
* A file is taken from ``data`` (base64) when present, else from ``url``; a ``data:`` URL
  is unpacked into its media type and base64 content.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote_to_bytes

from agentcontext.messages import (
    FilePart,
    Message,
    TextPart,
    ToolPart,
)

__all__ = ["to_anthropic", "to_openai"]

_FINISHED = ("output-available", "output-error")
_ANTHROPIC_IMAGES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
_OPENAI_AUDIO = {
    "audio/wav": "wav",
    "audio/x-wav": "wav",
    "audio/wave": "wav",
    "audio/vnd.wave": "wav",
    "audio/mpeg": "mp3",
    "audio/mp3": "mp3",
}


# --- shared helpers ------------------------------------------------------------------------


def _has_text(part: TextPart) -> bool:
    return bool(part.text.strip())


def _json(value: Any) -> str:
    """JSON text of a tool input or output (strings are passed through unchanged)."""
    if isinstance(value, str):
        return value
    # Keys sorted: the text must not depend on the backend (PostgreSQL's JSONB reorders keys),
    # so a reloaded conversation sends the same bytes and provider prompt caches keep hitting.
    return json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)


def _parse_data_url(url: str) -> tuple[str, str] | None:
    """Return ``(media_type, base64_data)`` of a ``data:`` URL, or None if it is not one."""
    if not url.startswith("data:") or "," not in url:
        return None
    header, payload = url[5:].split(",", 1)
    params = header.split(";")
    media_type = params[0] or "text/plain"
    if "base64" in params[1:]:
        return media_type, payload
    return media_type, base64.b64encode(unquote_to_bytes(payload)).decode("ascii")


def _file_source(part: FilePart) -> tuple[str | None, str | None]:
    """Return ``(base64_data, url)`` for a file part; exactly one is set, or neither."""
    if part.data:
        return part.data, None
    if part.url:
        parsed = _parse_data_url(part.url)
        if parsed is not None:
            return parsed[1], None
        return None, part.url
    return None, None


def _file_label(part: FilePart) -> str:
    name = part.filename or (part.url if part.url and not part.url.startswith("data:") else None)
    where = f" at {part.url}" if part.url and not part.url.startswith("data:") else ""
    return f"[file {name or 'attachment'} ({part.media_type}){where}]"


def _media_type(part: FilePart) -> str:
    media_type = part.media_type.split(";")[0].strip().lower()
    if part.url and part.url.startswith("data:") and not media_type:
        parsed = _parse_data_url(part.url)
        if parsed is not None:
            return parsed[0].lower()
    return media_type


class _Step:
    """Text and finished tool calls of one assistant step."""

    __slots__ = ("calls", "texts")

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.calls: list[ToolPart] = []

    def empty(self) -> bool:
        return not self.texts and not self.calls


def _assistant_steps(message: Message) -> list[_Step]:
    """Cut an assistant message into steps (a text after a tool call starts a new step)."""
    steps: list[_Step] = []
    current = _Step()
    for part in message.parts:
        if isinstance(part, TextPart):
            if not _has_text(part):
                continue
            if current.calls:
                steps.append(current)
                current = _Step()
            current.texts.append(part.text)
        elif isinstance(part, ToolPart) and part.state in _FINISHED:
            current.calls.append(part)
        # reasoning, files and data parts are not sent for assistant messages
    if not current.empty():
        steps.append(current)
    return steps


def _text_content(texts: list[str]) -> str | list[dict[str, Any]]:
    if len(texts) == 1:
        return texts[0]
    return [{"type": "text", "text": text} for text in texts]


# --- OpenAI --------------------------------------------------------------------------------


def _openai_file(part: FilePart) -> dict[str, Any]:
    """One user content part for a file.

    * ``image/*`` → ``image_url`` (the URL as given, or a ``data:`` URL built from ``data``);
    * ``audio/wav`` and ``audio/mpeg`` with base64 content → ``input_audio``;
    * any other file with base64 content → ``file`` with ``file_data`` as a ``data:`` URL and
      ``filename`` (``"attachment"`` when the part has none);
    * anything else (a non-image file known only by an ``https:`` URL, which Chat Completions
      cannot fetch) → a text part naming the file and its URL.
    """
    media_type = _media_type(part)
    data, url = _file_source(part)
    if media_type.startswith("image/") and (data or url):
        image_url = url if url is not None else f"data:{media_type};base64,{data}"
        return {"type": "image_url", "image_url": {"url": image_url}}
    if data is not None and media_type in _OPENAI_AUDIO:
        return {
            "type": "input_audio",
            "input_audio": {"data": data, "format": _OPENAI_AUDIO[media_type]},
        }
    if data is not None:
        return {
            "type": "file",
            "file": {
                "file_data": f"data:{media_type};base64,{data}",
                "filename": part.filename or "attachment",
            },
        }
    return {"type": "text", "text": _file_label(part)}


def _openai_user_or_system(message: Message) -> dict[str, Any] | None:
    parts: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, TextPart) and _has_text(part):
            parts.append({"type": "text", "text": part.text})
        elif isinstance(part, FilePart) and message.role == "user":
            parts.append(_openai_file(part))
    if not parts:
        return None
    if message.role == "system":
        # system messages take text only
        texts = [p["text"] for p in parts]
        return {"role": "system", "content": _text_content(texts)}
    if len(parts) == 1 and parts[0]["type"] == "text":
        return {"role": "user", "content": parts[0]["text"]}
    return {"role": "user", "content": parts}


def _openai_assistant(message: Message) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for step in _assistant_steps(message):
        entry: dict[str, Any] = {"role": "assistant"}
        entry["content"] = _text_content(step.texts) if step.texts else None
        if step.calls:
            entry["tool_calls"] = [
                {
                    "id": call.tool_call_id,
                    "type": "function",
                    "function": {
                        "name": call.tool_name,
                        "arguments": _json(call.input if call.input is not None else {}),
                    },
                }
                for call in step.calls
            ]
        out.append(entry)
        for call in step.calls:
            content = (
                _json(call.output) if call.state == "output-available" else (call.error or "error")
            )
            out.append({"role": "tool", "tool_call_id": call.tool_call_id, "content": content})
    return out


def to_openai(system_prompt: str, messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Map a system prompt and messages to OpenAI Chat Completions ``messages``.

    * The system prompt becomes the first message, ``{"role": "system", "content": ...}``;
      it is left out when empty or only whitespace.
    * ``system`` messages keep their place and carry their text.
    * ``user`` messages carry text and files (see `_openai_file`).
    * ``assistant`` messages are cut into steps (see the module docs); each step is an
      assistant message with ``content`` (a string, a list of text parts, or ``None`` when
      the step only calls tools) and ``tool_calls`` (``{"id", "type": "function",
      "function": {"name", "arguments"}}``, ``arguments`` being the JSON text of the input;
      no input is sent as ``{}``). Each call is answered by a ``{"role": "tool",
      "tool_call_id", "content"}`` message whose content is the output (strings as they
      are, anything else as JSON text) or the error text.
    * Reasoning, data parts and assistant files are dropped.
    """
    out: list[dict[str, Any]] = []
    if system_prompt.strip():
        out.append({"role": "system", "content": system_prompt})
    for message in messages:
        if message.role == "assistant":
            out.extend(_openai_assistant(message))
        else:
            entry = _openai_user_or_system(message)
            if entry is not None:
                out.append(entry)
    return out


# --- Anthropic -----------------------------------------------------------------------------


def _anthropic_file(part: FilePart) -> dict[str, Any]:
    """One user content block for a file.

    * JPEG, PNG, GIF and WebP images → ``image`` with a ``base64`` or ``url`` source;
    * ``application/pdf`` → ``document`` with a ``base64`` or ``url`` source;
    * ``text/*`` with base64 content that decodes as UTF-8 → ``document`` with a plain
      ``text`` source;
    * the file name, when known, becomes the document ``title``;
    * anything else → a text block naming the file (and its URL when it has one).
    """
    media_type = _media_type(part)
    data, url = _file_source(part)
    if media_type in _ANTHROPIC_IMAGES and (data or url):
        source: dict[str, Any] = (
            {"type": "base64", "media_type": media_type, "data": data}
            if data is not None
            else {"type": "url", "url": url}
        )
        return {"type": "image", "source": source}
    document: dict[str, Any] | None = None
    if media_type == "application/pdf" and (data or url):
        document = {
            "type": "document",
            "source": (
                {"type": "base64", "media_type": "application/pdf", "data": data}
                if data is not None
                else {"type": "url", "url": url}
            ),
        }
    elif media_type.startswith("text/") and data is not None:
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
    return {"type": "text", "text": _file_label(part)}


def _anthropic_tool_input(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    return {"input": value}


def _anthropic_assistant(message: Message) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for step in _assistant_steps(message):
        blocks: list[dict[str, Any]] = [{"type": "text", "text": text} for text in step.texts]
        blocks.extend(
            {
                "type": "tool_use",
                "id": call.tool_call_id,
                "name": call.tool_name,
                "input": _anthropic_tool_input(call.input),
            }
            for call in step.calls
        )
        out.append({"role": "assistant", "content": blocks})
        if step.calls:
            results: list[dict[str, Any]] = []
            for call in step.calls:
                result: dict[str, Any] = {"type": "tool_result", "tool_use_id": call.tool_call_id}
                if call.state == "output-available":
                    result["content"] = _json(call.output)
                else:
                    result["content"] = call.error or "error"
                    result["is_error"] = True
                results.append(result)
            out.append({"role": "user", "content": results})
    return out


def _anthropic_user(message: Message) -> dict[str, Any] | None:
    blocks: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, TextPart) and _has_text(part):
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
    if len(content) == 1 and content[0]["type"] == "text":
        return {"role": entry["role"], "content": content[0]["text"]}
    return entry


def to_anthropic(system_prompt: str, messages: Sequence[Message]) -> dict[str, Any]:
    """Map a system prompt and messages to ``{"system": ..., "messages": [...]}``.

    * ``system`` is the system prompt followed by the text of every ``system`` message
      (the Messages API has no system role inside ``messages``), joined with blank lines;
      the key is left out when there is no system text.
    * ``user`` messages carry text blocks and file blocks (see `_anthropic_file`).
    * ``assistant`` messages are cut into steps (see the module docs); each step is an
      assistant message with text blocks and ``tool_use`` blocks (``input`` must be an
      object: a non-dict input is sent as ``{"input": value}``, no input as ``{}``), and
      its results follow in a user message of ``tool_result`` blocks (``content`` is the
      output, as JSON text unless it is a string, or the error text with
      ``"is_error": true``).
    * Consecutive messages of one role are merged into one, as the API requires roles to
      alternate; the tool results of a step therefore come first in the next user message.
    * Reasoning, data parts and assistant files are dropped.
    """
    system_texts: list[str] = [system_prompt] if system_prompt.strip() else []
    entries: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            system_texts.extend(
                part.text
                for part in message.parts
                if isinstance(part, TextPart) and _has_text(part)
            )
        elif message.role == "assistant":
            entries.extend(_anthropic_assistant(message))
        else:
            entry = _anthropic_user(message)
            if entry is not None:
                entries.append(entry)
    result: dict[str, Any] = {}
    if system_texts:
        result["system"] = "\n\n".join(system_texts)
    result["messages"] = [_simplify(entry) for entry in _merge_same_role(entries)]
    return result
