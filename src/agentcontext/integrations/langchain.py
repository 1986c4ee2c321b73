"""LangChain: agentcontext messages as langchain-core messages, and back.

`to_langchain` turns a conversation into ``SystemMessage`` / ``HumanMessage`` / ``AIMessage``
/ ``ToolMessage`` objects (tool calls as ``AIMessage.tool_calls``, each answered by a
``ToolMessage``), ready for ``chat_model.invoke(...)``. `from_langchain` turns such a list
(for example the messages a LangGraph agent returns) back into messages for the graph: one
user message per ``HumanMessage`` and one assistant message for everything the model did
until the next one.

For example:

```python
resolved = await context.resolve()
reply = await chat_model.ainvoke(to_langchain(resolved.messages, resolved.system_prompt))
context.set(*(message(m) for m in from_langchain([reply])))
```
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agentcontext._extras import require_extra
from agentcontext.adapters.shared import (
    FINISHED,
    file_source,
    has_text,
    media_type,
    parse_arguments,
    to_json,
)
from agentcontext.errors import InvalidTypeError
from agentcontext.messages import FilePart, Message, Part, ReasoningPart, TextPart, ToolPart

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

__all__ = ["from_langchain", "to_langchain"]

require_extra("langchain_core", "langchain", "agentcontext.integrations.langchain")


def _user_content(message: Message) -> str | list[str | dict[str, Any]]:
    blocks: list[str | dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, TextPart) and has_text(part):
            blocks.append({"type": "text", "text": part.text})
        elif isinstance(part, FilePart):
            kind = media_type(part)
            data, url = file_source(part)
            if kind.startswith("image/") and (data or url):
                image_url = url if url is not None else f"data:{kind};base64,{data}"
                blocks.append({"type": "image_url", "image_url": {"url": image_url}})
    if len(blocks) == 1 and isinstance(blocks[0], dict) and blocks[0]["type"] == "text":
        return str(blocks[0]["text"])
    return blocks


def _assistant(message: Message) -> list[BaseMessage]:
    from langchain_core.messages import AIMessage, ToolMessage

    out: list[BaseMessage] = []
    texts: list[str] = []
    calls: list[ToolPart] = []

    def flush() -> None:
        if not texts and not calls:
            return
        out.append(
            AIMessage(
                content="\n\n".join(texts),
                tool_calls=[
                    {
                        "id": call.tool_call_id,
                        "name": call.tool_name,
                        "args": call.input if isinstance(call.input, dict) else {},
                    }
                    for call in calls
                ],
            )
        )
        out.extend(
            ToolMessage(
                content=to_json(call.output) if call.state == "output-available" else call.error,
                tool_call_id=call.tool_call_id,
                name=call.tool_name,
                status="success" if call.state == "output-available" else "error",
            )
            for call in calls
        )
        texts.clear()
        calls.clear()

    for part in message.parts:
        if isinstance(part, TextPart) and has_text(part):
            if calls:
                flush()
            texts.append(part.text)
        elif isinstance(part, ToolPart) and part.state in FINISHED:
            calls.append(part)
    flush()
    return out


def to_langchain(messages: Sequence[Message], system_prompt: str = "") -> list[BaseMessage]:
    """Messages as langchain-core messages.

    Args:
        messages: The conversation.
        system_prompt: Sent first as a ``SystemMessage`` when not blank.

    Returns:
        ``SystemMessage`` for the system prompt and system messages, ``HumanMessage`` for user
        messages (text, and images as ``image_url`` blocks), and per assistant step an
        ``AIMessage`` (its text and ``tool_calls``; a non-dict input is sent as ``{}``)
        followed by one ``ToolMessage`` per finished call (the output as JSON text unless it
        is a string, or the error with ``status="error"``). Reasoning, data parts and
        unfinished calls are left out.
    """
    from langchain_core.messages import HumanMessage, SystemMessage

    out: list[BaseMessage] = []
    if system_prompt.strip():
        out.append(SystemMessage(content=system_prompt))
    for message in messages:
        if message.role == "assistant":
            out.extend(_assistant(message))
        elif message.role == "system":
            if message.text.strip():
                out.append(SystemMessage(content=message.text))
        else:
            content = _user_content(message)
            if content:
                out.append(HumanMessage(content=content))
    return out


def _text_of(content: Any) -> list[Part]:
    if isinstance(content, str):
        return [TextPart(text=content)] if content else []
    parts: list[Part] = []
    for block in content or []:
        if isinstance(block, str):
            parts.append(TextPart(text=block))
        elif isinstance(block, dict):
            kind = block.get("type")
            if kind == "text" and isinstance(block.get("text"), str):
                parts.append(TextPart(text=block["text"]))
            elif kind == "thinking":
                parts.append(
                    ReasoningPart(text=block.get("thinking", ""), signature=block.get("signature"))
                )
            elif kind == "reasoning" and isinstance(block.get("reasoning"), str):
                parts.append(ReasoningPart(text=block["reasoning"]))
    return parts


def from_langchain(messages: Sequence[BaseMessage]) -> list[Message]:
    """langchain-core messages as agentcontext messages.

    Args:
        messages: ``HumanMessage``, ``SystemMessage``, ``AIMessage`` and ``ToolMessage``
            objects, e.g. what a LangGraph agent returns.

    Returns:
        A user (or system) message per human (or system) message, and one assistant
        message per run of AI and tool messages: text, reasoning blocks, tool calls
        completed by their ``ToolMessage`` (``status="error"`` gives ``"output-error"``).
        The ``usage_metadata`` of its AI messages is summed, normalised, in the assistant message's
        ``metadata["usage"]``.
    """
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    from agentcontext.usage import add_usage, normalize_usage

    out: list[Message] = []
    answer: list[Part] = []
    usage: dict[str, Any] = {}

    def close() -> None:
        if answer:
            metadata = {"usage": dict(usage)} if usage else None
            out.append(
                Message(
                    id=uuid.uuid4().hex, role="assistant", parts=list(answer), metadata=metadata
                )
            )
            answer.clear()
            usage.clear()

    for item in messages:
        if isinstance(item, HumanMessage | SystemMessage):
            close()
            role = "user" if isinstance(item, HumanMessage) else "system"
            out.append(Message(id=uuid.uuid4().hex, role=role, parts=_text_of(item.content)))
        elif isinstance(item, AIMessage):
            answer.extend(_text_of(item.content))
            answer.extend(
                ToolPart(
                    tool_call_id=str(call.get("id")),
                    tool_name=call["name"],
                    input=call.get("args"),
                    state="input-available",
                )
                for call in item.tool_calls
            )
            if item.usage_metadata:
                usage.update(add_usage(usage, normalize_usage(dict(item.usage_metadata))))
        elif isinstance(item, ToolMessage):
            ok = item.status != "error"
            content = item.content if isinstance(item.content, str) else to_json(item.content)
            for index, part in enumerate(answer):
                if isinstance(part, ToolPart) and part.tool_call_id == item.tool_call_id:
                    update: dict[str, Any] = (
                        {"state": "output-available", "output": parse_arguments(content)}
                        if ok
                        else {"state": "output-error", "error": content}
                    )
                    answer[index] = part.model_copy(update=update)
        else:
            raise InvalidTypeError(
                f"from_langchain() takes langchain-core messages, got {type(item).__name__}"
            )
    close()
    return out
