"""Conversation messages: a parts-based model in the shape of the Vercel AI SDK's ``UIMessage``.

A `Message` has an ``id``, a ``role`` and a list of typed parts. The parts are
discriminated by their ``type`` field, so a stored message (``message.model_dump(mode="json")``)
validates back into the same classes with ``Message.model_validate(data)``.

`ResolveResult` is what ``ContextEngine.resolve()`` returns: the rendered system prompt
and the conversation, with adapters to the request shapes of the official OpenAI and Anthropic
SDKs (see the `agentcontext.adapters` package for every mapping rule).

Messages and parts are frozen: change one with ``model_copy(update=...)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam
    from openai.types.responses import ResponseInputItemParam

    from agentcontext.adapters.anthropic import AnthropicRequest

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
    """The model's reasoning (its "thinking") as text, with what its provider needs back.

    Providers that take reasoning back verbatim need more than its text: Anthropic thinking
    blocks carry a ``signature`` (redacted thinking carries only ``redacted_data``), OpenAI
    Responses reasoning items an ``item_id`` and, without server-side storage, their
    ``encrypted_content``. The adapters fill these in when a reply is read and send them back
    unchanged; reasoning without them is not sent to Anthropic or the Responses API.
    """

    type: Literal["reasoning"] = "reasoning"
    text: str
    signature: str | None = None
    """Anthropic: the signature of a ``thinking`` block."""
    redacted_data: str | None = None
    """Anthropic: the opaque data of a ``redacted_thinking`` block (``text`` is empty)."""
    item_id: str | None = None
    """OpenAI Responses: the id of the reasoning item this text belongs to."""
    encrypted_content: str | None = None
    """OpenAI Responses: the item's encrypted reasoning, sent back as it came."""


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

    For example:

    ```python
    Message(id="m1", role="user", parts=[TextPart(text="Hello!")])
    ```
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

    @classmethod
    def from_openai(cls, reply: Any, *, id: str | None = None) -> Message:
        """An assistant message from an OpenAI reply.

        Args:
            reply: A Chat Completions ``ChatCompletion`` or its ``message``, a Responses API
                ``Response``, or a list of Responses output items (SDK objects or dicts).
            id: The message id; by default the reply's own id (or a random one).

        Returns:
            The reply's text, tool calls (state ``"input-available"``, or finished when the
            items hold their ``function_call_output``) and reasoning (with item id and
            encrypted content), with ``metadata`` holding the provider, model, response id
            and normalised usage. See `agentcontext.adapters.from_openai`.
        """
        from agentcontext.adapters.openai import from_openai

        return from_openai(reply, id=id)

    @classmethod
    def from_anthropic(cls, reply: Any, *, id: str | None = None) -> Message:
        """An assistant message from an Anthropic Messages API response.

        Args:
            reply: An ``anthropic.types.Message`` (or its dict form).
            id: The message id; by default the response's id.

        Returns:
            Text, ``tool_use`` calls (state ``"input-available"``), thinking with its
            signature and redacted thinking, with ``metadata`` holding the provider, model,
            response id, stop reason and normalised usage. See
            `agentcontext.adapters.from_anthropic`.
        """
        from agentcontext.adapters.anthropic import from_anthropic

        return from_anthropic(reply, id=id)


class ResolveResult(BaseModel):
    """What ``ContextEngine.resolve()`` returns: the system prompt and the conversation.

    ``record_id`` is set when the engine recorded what the model was shown
    (``resolve(record=True)``), so that ``replay(record_id)`` can give it back.
    """

    system_prompt: str
    messages: list[Message] = Field(default_factory=list)
    record_id: str | None = None
    omitted: list[str] = Field(default_factory=list)
    """Ids of the messages left out to fit ``resolve(window=...)`` (oldest turns first)."""
    estimate: int | None = None
    """The input tokens of the request as sent, counted for ``resolve(window=...)`` (None
    without a window)."""

    def to_openai(self) -> list[ChatCompletionMessageParam]:
        """The conversation as the ``messages`` of an OpenAI Chat Completions request.

        The system prompt comes first as a ``system`` message (left out when empty), text,
        images, files and tool calls with their results are mapped, reasoning and data parts
        are dropped. See `agentcontext.adapters.to_openai` for every rule.
        """
        from agentcontext.adapters.openai import to_openai

        return to_openai(self.system_prompt, self.messages)

    def to_openai_responses(self) -> list[ResponseInputItemParam]:
        """The conversation as the ``input`` items of an OpenAI Responses API request.

        Use ``instructions=result.system_prompt`` for the system prompt. Function calls and
        their outputs, and reasoning items (by id, with encrypted content) are mapped. See
        `agentcontext.adapters.to_openai_responses` for every rule.
        """
        from agentcontext.adapters.responses import to_openai_responses

        return to_openai_responses(self.messages)

    def to_anthropic(self, *, cache: bool = False) -> AnthropicRequest:
        """The conversation as ``{"system": ..., "messages": [...]}`` for Anthropic's Messages API.

        ``system`` is left out when there is no system text; consecutive messages of one role
        are merged, tool calls become ``tool_use`` blocks answered by ``tool_result`` blocks in
        the next user message, signed thinking goes back as ``thinking`` blocks, data parts
        are dropped. With ``cache=True`` the system prompt and the end of the conversation
        carry ``cache_control`` breakpoints (at most three). See
        `agentcontext.adapters.to_anthropic` for every rule.
        """
        from agentcontext.adapters.anthropic import to_anthropic

        return to_anthropic(self.system_prompt, self.messages, cache=cache)
