"""OpenAI Chat Completions: a conversation as ``messages``, and a reply back as a `Message`.

`to_openai` returns ``list[ChatCompletionMessageParam]`` (the SDK's own ``TypedDict``), so the
result passes ``client.chat.completions.create(messages=...)`` under ``mypy --strict``.
`from_openai` reads a Chat Completions reply, a Responses API response or its output items.

Rules of `to_openai`:

* Text parts whose text is empty or only whitespace are left out; a message left with
  nothing to send is dropped.
* A message with one text part and nothing else is sent with a plain string ``content``;
  otherwise ``content`` is a list of parts, in the order of the message's parts.
* An assistant message is cut into *steps*, the way the AI SDK does it: a text part that
  follows a tool call starts a new step. Each step becomes one assistant message carrying
  its text and its tool calls, followed by the results of those calls.
* Only finished tool calls are sent (``"output-available"`` and ``"output-error"``).
* Reasoning parts are dropped (Chat Completions takes no reasoning input), and so are data
  parts and files in assistant messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from agentcontext.adapters.shared import (
    assistant_steps,
    file_label,
    file_source,
    has_text,
    media_type,
    new_id,
    parse_arguments,
    plain,
    reply_metadata,
    to_json,
    tool_result_text,
)
from agentcontext.errors import InvalidInputError
from agentcontext.messages import FilePart, Message, Part, ReasoningPart, TextPart, ToolPart

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

__all__ = ["from_openai", "to_openai"]

_OPENAI_AUDIO = {
    "audio/wav": "wav",
    "audio/x-wav": "wav",
    "audio/wave": "wav",
    "audio/vnd.wave": "wav",
    "audio/mpeg": "mp3",
    "audio/mp3": "mp3",
}


def _text_content(texts: list[str]) -> str | list[dict[str, Any]]:
    if len(texts) == 1:
        return texts[0]
    return [{"type": "text", "text": text} for text in texts]


def _openai_file(part: FilePart) -> dict[str, Any]:
    """One user content part for a file.

    * ``image/*`` → ``image_url`` (the URL as given, or a ``data:`` URL built from ``data``);
    * ``audio/wav`` and ``audio/mpeg`` with base64 content → ``input_audio``;
    * any other file with base64 content → ``file`` with ``file_data`` as a ``data:`` URL and
      ``filename`` (``"attachment"`` when the part has none);
    * anything else (a non-image file known only by an ``https:`` URL, which Chat Completions
      cannot fetch) → a text part naming the file and its URL.
    """
    kind = media_type(part)
    data, url = file_source(part)
    if kind.startswith("image/") and (data or url):
        image_url = url if url is not None else f"data:{kind};base64,{data}"
        return {"type": "image_url", "image_url": {"url": image_url}}
    if data is not None and kind in _OPENAI_AUDIO:
        return {"type": "input_audio", "input_audio": {"data": data, "format": _OPENAI_AUDIO[kind]}}
    if data is not None:
        return {
            "type": "file",
            "file": {
                "file_data": f"data:{kind};base64,{data}",
                "filename": part.filename or "attachment",
            },
        }
    return {"type": "text", "text": file_label(part)}


def _openai_user_or_system(message: Message) -> dict[str, Any] | None:
    parts: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, TextPart) and has_text(part):
            parts.append({"type": "text", "text": part.text})
        elif isinstance(part, FilePart) and message.role == "user":
            parts.append(_openai_file(part))
    if not parts:
        return None
    if message.role == "system":
        texts = [p["text"] for p in parts]
        return {"role": "system", "content": _text_content(texts)}
    if len(parts) == 1 and parts[0]["type"] == "text":
        return {"role": "user", "content": parts[0]["text"]}
    return {"role": "user", "content": parts}


def _openai_assistant(message: Message) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for step in assistant_steps(message):
        entry: dict[str, Any] = {"role": "assistant"}
        entry["content"] = _text_content(step.texts) if step.texts else None
        if step.calls:
            entry["tool_calls"] = [
                {
                    "id": call.tool_call_id,
                    "type": "function",
                    "function": {
                        "name": call.tool_name,
                        "arguments": to_json(call.input if call.input is not None else {}),
                    },
                }
                for call in step.calls
            ]
        out.append(entry)
        out.extend(
            {"role": "tool", "tool_call_id": call.tool_call_id, "content": tool_result_text(call)}
            for call in step.calls
        )
    return out


def to_openai(system_prompt: str, messages: Sequence[Message]) -> list[ChatCompletionMessageParam]:
    """Map a system prompt and messages to OpenAI Chat Completions ``messages``.

    Args:
        system_prompt: Sent first as ``{"role": "system", ...}``; left out when blank.
        messages: The conversation.

    Returns:
        The request's ``messages``. ``system`` messages keep their place; ``user`` messages
        carry text and files; ``assistant`` messages are cut into steps, each an assistant
        message with ``content`` (``None`` when the step only calls tools) and ``tool_calls``
        (``arguments`` is the JSON text of the input, ``{}`` for none), each call answered by
        a ``{"role": "tool", "tool_call_id", "content"}`` message holding the output (strings
        as they are, anything else as JSON) or the error text. Reasoning, data parts and
        assistant files are dropped.
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
    return cast("list[ChatCompletionMessageParam]", out)


# --- replies -------------------------------------------------------------------------------


def _chat_message_parts(message: dict[str, Any]) -> list[Part]:
    parts: list[Part] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        parts.append(ReasoningPart(text=reasoning))
    content = message.get("content")
    if isinstance(content, str) and content:
        parts.append(TextPart(text=content))
    elif isinstance(content, list):
        parts.extend(
            TextPart(text=item["text"])
            for item in content
            if isinstance(item, dict) and isinstance(item.get("text"), str)
        )
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal:
        parts.append(TextPart(text=refusal))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        parts.append(
            ToolPart(
                tool_call_id=str(call.get("id")),
                tool_name=str(function.get("name")),
                input=parse_arguments(function.get("arguments")),
                state="input-available",
            )
        )
    return parts


def from_openai(reply: Any, *, id: str | None = None) -> Message:
    """An assistant `Message` from an OpenAI reply.

    Args:
        reply: One of: a Chat Completions ``ChatCompletion`` (its first choice is read), a
            ``ChatCompletionMessage``, a Responses API ``Response``, or a list of Responses
            output items; SDK objects or their dict form.
        id: The message id; by default the reply's id (a random one for a bare message).

    Returns:
        The assistant message: text (a refusal as text too), tool calls in state
        ``"input-available"``, reasoning. For Responses items see
        `agentcontext.adapters.from_openai_responses`. ``metadata`` holds ``provider``,
        ``model``, ``response_id``, ``finish_reason`` and ``usage`` (see
        `agentcontext.usage.normalize_usage`) when the reply has them.

    Raises:
        InvalidInputError: The value is none of the shapes above.
    """
    from agentcontext.adapters.responses import from_openai_responses

    data = plain(reply, "from_openai")
    if isinstance(data, list) or (isinstance(data, dict) and "output" in data):
        return from_openai_responses(data, id=id)
    if not isinstance(data, dict):
        raise InvalidInputError(
            "from_openai() takes a ChatCompletion, a ChatCompletionMessage, a Responses API "
            "Response or a list of its output items"
        )
    metadata: dict[str, Any] = {"provider": "openai"}
    if "choices" in data:
        choices = data.get("choices") or []
        if not choices:
            raise InvalidInputError("the ChatCompletion has no choices: nothing to store")
        choice = choices[0]
        message = choice.get("message") or {}
        metadata = reply_metadata("openai", data, ("finish_reason", choice.get("finish_reason")))
        message_id = id or str(data.get("id") or new_id())
    elif data.get("role") == "assistant":
        message = data
        message_id = id or new_id()
    else:
        raise InvalidInputError(
            "from_openai() takes a ChatCompletion, a ChatCompletionMessage (role 'assistant'), "
            "a Responses API Response or a list of its output items"
        )
    return Message(
        id=message_id, role="assistant", parts=_chat_message_parts(message), metadata=metadata
    )
