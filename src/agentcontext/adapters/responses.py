"""OpenAI Responses API: a conversation as ``input`` items, and output items back.

`to_openai_responses` returns ``list[ResponseInputItemParam]`` (the SDK's own ``TypedDict``),
to pass as ``client.responses.create(input=..., instructions=result.system_prompt)``.

Rules of `to_openai_responses`:

* ``user`` and ``system`` messages become ``{"role", "content"}`` messages (user files as
  ``input_image`` / ``input_file`` parts); blank text is left out.
* An ``assistant`` message becomes, in the order of its parts: reasoning items, assistant
  text messages, ``function_call`` items each followed by its ``function_call_output``.
* Reasoning goes back only when it has the ``item_id`` of a Responses reasoning item; the
  parts of one item (one per summary text) become one item with its ``encrypted_content``,
  and an item id is sent once however often it is stored (de-duplicated).
* Only finished tool calls are sent; an error is sent as the output text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from agentcontext.adapters.shared import (
    FINISHED,
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
    from openai.types.responses import ResponseInputItemParam

__all__ = ["from_openai_responses", "to_openai_responses"]


def _input_file(part: FilePart) -> dict[str, Any]:
    kind = media_type(part)
    data, url = file_source(part)
    if kind.startswith("image/") and (data or url):
        image_url = url if url is not None else f"data:{kind};base64,{data}"
        return {"type": "input_image", "image_url": image_url, "detail": "auto"}
    if data is not None:
        return {
            "type": "input_file",
            "file_data": f"data:{kind};base64,{data}",
            "filename": part.filename or "attachment",
        }
    if url is not None and kind == "application/pdf":
        return {"type": "input_file", "file_url": url}
    return {"type": "input_text", "text": file_label(part)}


def _user_or_system(message: Message) -> dict[str, Any] | None:
    content: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, TextPart) and has_text(part):
            content.append({"type": "input_text", "text": part.text})
        elif isinstance(part, FilePart) and message.role == "user":
            content.append(_input_file(part))
    if not content:
        return None
    if len(content) == 1 and content[0]["type"] == "input_text":
        return {"role": message.role, "content": content[0]["text"]}
    return {"role": message.role, "content": content}


def _reasoning_item(parts: list[ReasoningPart]) -> dict[str, Any]:
    first = parts[0]
    item: dict[str, Any] = {
        "type": "reasoning",
        "id": first.item_id,
        "summary": [{"type": "summary_text", "text": p.text} for p in parts if p.text],
    }
    encrypted = next((p.encrypted_content for p in parts if p.encrypted_content), None)
    if encrypted is not None:
        item["encrypted_content"] = encrypted
    return item


def _assistant(message: Message, sent_reasoning: set[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    reasoning: list[ReasoningPart] = []

    def flush_text() -> None:
        if texts:
            out.append({"role": "assistant", "content": "\n\n".join(texts)})
            texts.clear()

    def flush_reasoning() -> None:
        if reasoning:
            out.append(_reasoning_item(list(reasoning)))
            reasoning.clear()

    for part in message.parts:
        if isinstance(part, ReasoningPart) and part.item_id:
            if reasoning and reasoning[0].item_id == part.item_id:
                reasoning.append(part)
                continue
            flush_reasoning()
            if part.item_id in sent_reasoning:
                continue  # stored twice: the API takes an item once
            flush_text()
            sent_reasoning.add(part.item_id)
            reasoning.append(part)
            continue
        flush_reasoning()
        if isinstance(part, TextPart) and has_text(part):
            texts.append(part.text)
        elif isinstance(part, ToolPart) and part.state in FINISHED:
            flush_text()
            out.append(
                {
                    "type": "function_call",
                    "call_id": part.tool_call_id,
                    "name": part.tool_name,
                    "arguments": to_json(part.input if part.input is not None else {}),
                }
            )
            out.append(
                {
                    "type": "function_call_output",
                    "call_id": part.tool_call_id,
                    "output": tool_result_text(part),
                }
            )
    flush_reasoning()
    flush_text()
    return out


def to_openai_responses(messages: Sequence[Message]) -> list[ResponseInputItemParam]:
    """Map messages to OpenAI Responses API ``input`` items.

    Args:
        messages: The conversation (pass the system prompt as ``instructions=``).

    Returns:
        The ``input`` items: role messages, reasoning items (by item id, with encrypted
        content, each id once), ``function_call`` items followed by their
        ``function_call_output``. Unfinished tool calls, reasoning without an item id and
        data parts are left out.
    """
    out: list[dict[str, Any]] = []
    sent_reasoning: set[str] = set()
    for message in messages:
        if message.role == "assistant":
            out.extend(_assistant(message, sent_reasoning))
        else:
            entry = _user_or_system(message)
            if entry is not None:
                out.append(entry)
    return cast("list[ResponseInputItemParam]", out)


# --- output items back into a message --------------------------------------------------------


def _complete(parts: list[Part], call_id: str, output: Any) -> None:
    for index, part in enumerate(parts):
        if isinstance(part, ToolPart) and part.tool_call_id == call_id:
            if isinstance(output, list):  # content parts: keep their text
                output = "".join(
                    str(item.get("text", "")) for item in output if isinstance(item, dict)
                )
            parts[index] = part.model_copy(update={"state": "output-available", "output": output})
            return
    raise InvalidInputError(
        f"function_call_output for call {call_id!r} has no function_call before it in the items"
    )


def items_to_parts(items: Sequence[Any]) -> list[Part]:
    """The parts of Responses output (or input) items of the assistant side."""
    parts: list[Part] = []
    for raw in items:
        if not isinstance(raw, dict):
            raise InvalidInputError(f"a Responses item must be an object, got {raw!r}")
        kind = raw.get("type")
        if kind == "message" or (kind is None and raw.get("role") == "assistant"):
            content = raw.get("content")
            if isinstance(content, str):
                parts.append(TextPart(text=content))
                continue
            for item in content or []:
                text = item.get("text") if item.get("type") != "refusal" else item.get("refusal")
                if isinstance(text, str):
                    parts.append(TextPart(text=text))
        elif kind == "reasoning":
            item_id = raw.get("id")
            encrypted = raw.get("encrypted_content")
            texts = [s.get("text", "") for s in raw.get("summary") or []] or [""]
            parts.extend(
                ReasoningPart(
                    text=text,
                    item_id=item_id,
                    encrypted_content=encrypted if index == 0 else None,
                )
                for index, text in enumerate(texts)
            )
        elif kind == "function_call":
            parts.append(
                ToolPart(
                    tool_call_id=str(raw.get("call_id")),
                    tool_name=str(raw.get("name")),
                    input=parse_arguments(raw.get("arguments")),
                    state="input-available",
                )
            )
        elif kind == "function_call_output":
            _complete(parts, str(raw.get("call_id")), raw.get("output"))
        # other item kinds (hosted tools) carry nothing the graph stores
    return parts


def from_openai_responses(reply: Any, *, id: str | None = None) -> Message:
    """An assistant `Message` from a Responses API ``Response`` or a list of items.

    Args:
        reply: A ``Response`` (its ``output`` is read) or a list of output items (SDK
            objects or dicts); ``function_call_output`` items in the list complete the
            calls before them.
        id: The message id; by default the response id (a random one for a list).

    Returns:
        Text (refusals as text), function calls (state ``"input-available"`` unless their
        output follows), and one reasoning part per summary text of each reasoning item,
        carrying its ``item_id`` (the first one also its ``encrypted_content``).
        ``metadata`` holds ``provider``, ``model``, ``response_id`` and ``usage``.
    """
    data = plain(reply, "from_openai")
    metadata: dict[str, Any] = {"provider": "openai"}
    if isinstance(data, dict):
        items = data.get("output")
        if not isinstance(items, list):
            raise InvalidInputError("the Responses API Response has no output list")
        metadata = reply_metadata("openai", data)
        message_id = id or str(data.get("id") or new_id())
    else:
        items = data
        message_id = id or new_id()
    return Message(id=message_id, role="assistant", parts=items_to_parts(items), metadata=metadata)
