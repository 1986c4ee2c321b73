"""Conversation messages: a parts-based model in the shape of the Vercel AI SDK's ``UIMessage``.

A `Message` has an ``id``, a ``role`` and a list of typed parts. The parts are
discriminated by their ``type`` field, so a stored message (``message.model_dump(mode="json")``)
validates back into the same classes with ``Message.model_validate(data)``.

`ResolveResult` is what ``ContextEngine.resolve()`` returns: the rendered system prompt
and the conversation, with adapters to the request shapes of the official OpenAI and Anthropic
SDKs (see `agentcontext._adapters` for every mapping rule).

Messages and parts are frozen: change one with ``model_copy(update=...)``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "DataPart",
    "FilePart",
    "Message",
    "Part",
    "ReasoningPart",
    "ResolveResult",
    "Role",
    "TextPart",
    "ToolPart",
    "ToolState",
]

Role = Literal["system", "user", "assistant"]
"""The role of a message's author."""

ToolState = Literal["input-streaming", "input-available", "output-available", "output-error"]
"""The life cycle of a tool call, as in the AI SDK.

``input-streaming``: the model is still writing the input; ``input-available``: the call is
complete but has no result yet; ``output-available``: ``output`` holds the result;
``output-error``: ``error`` holds the error text.
"""


class _Part(BaseModel):
    model_config = ConfigDict(frozen=True)


class TextPart(_Part):
    """Plain text written by the user or the model."""

    type: Literal["text"] = "text"
    text: str


class ReasoningPart(_Part):
    """The model's reasoning (its "thinking") as text."""

    type: Literal["reasoning"] = "reasoning"
    text: str


class ToolPart(_Part):
    """A tool call and, once it ran, its result or its error."""

    type: Literal["tool"] = "tool"
    tool_call_id: str
    tool_name: str
    input: Any = None
    """The arguments of the call (JSON-able; usually a dict)."""
    state: ToolState
    output: Any = None
    """The result, when ``state`` is ``"output-available"``."""
    error: str | None = None
    """The error text, when ``state`` is ``"output-error"``."""


class FilePart(_Part):
    """A file or an image, given by URL (``https:`` or ``data:``) or by base64 ``data``."""

    type: Literal["file"] = "file"
    media_type: str
    """The IANA media type, such as ``image/png`` or ``application/pdf``."""
    url: str | None = None
    data: str | None = None
    """The content, base64-encoded."""
    filename: str | None = None


class DataPart(_Part):
    """Application data attached to a message (not sent to the model by the adapters)."""

    type: Literal["data"] = "data"
    name: str
    data: Any = None


Part = Annotated[
    TextPart | ReasoningPart | ToolPart | FilePart | DataPart,
    Field(discriminator="type"),
]
"""Any message part, discriminated by its ``type`` field."""


class Message(BaseModel):
    """One message of a conversation.

    Example::

        Message(id="m1", role="user", parts=[TextPart(text="Hello!")])
    """

    model_config = ConfigDict(frozen=True)

    id: str
    role: Role
    parts: list[Part] = Field(default_factory=list)
    metadata: dict[str, Any] | None = None

    @property
    def text(self) -> str:
        """The text of the message: its text parts joined with blank lines."""
        return "\n\n".join(part.text for part in self.parts if isinstance(part, TextPart))


class ResolveResult(BaseModel):
    """What ``ContextEngine.resolve()`` returns: the system prompt and the conversation.

    ``record_id`` is set when the engine recorded what the model was shown
    (``resolve(record=True)``), so that ``replay(record_id)`` can give it back.
    """

    system_prompt: str
    messages: list[Message] = Field(default_factory=list)
    record_id: str | None = None

    def to_openai(self) -> list[dict[str, Any]]:
        """The conversation as the ``messages`` of an OpenAI Chat Completions request.

        The system prompt comes first as a ``system`` message (left out when empty), text,
        images, files and tool calls with their results are mapped, reasoning and data parts
        are dropped. See `agentcontext._adapters.to_openai` for every rule.
        """
        from agentcontext._adapters import to_openai

        return to_openai(self.system_prompt, self.messages)

    def to_anthropic(self) -> dict[str, Any]:
        """The conversation as ``{"system": ..., "messages": [...]}`` for Anthropic's Messages API.

        ``system`` is left out when there is no system text; consecutive messages of one role
        are merged, tool calls become ``tool_use`` blocks answered by ``tool_result`` blocks in
        the next user message, reasoning and data parts are dropped. See
        `agentcontext._adapters.to_anthropic` for every rule.
        """
        from agentcontext._adapters import to_anthropic

        return to_anthropic(self.system_prompt, self.messages)
