"""pydantic-ai: ``ModelMessage`` converters both ways, a history processor and a save helper.

pydantic-ai takes a conversation's history as ``ModelMessage`` objects and hands back what a
run added (``result.new_messages()``). `to_model_messages` turns stored messages into such a
history, `from_model_messages` turns a run's new messages back into agentcontext messages
(one user message per prompt, one assistant message per answer with its text, reasoning and
finished tool calls). `history_processor` gives an agent the stored chat as its history on
every model request, and `save_run` stores what a run added and sums its usage.

For example:

```python
context = ContextEngine(store=store, chat_id="chat-1", user_id="user-1")
processor = ProcessHistory(history_processor(context))  # pydantic_ai.capabilities
agent = Agent(model, tools=[get_weather], capabilities=[processor])
result = await agent.run("What's the weather in Paris?")
await save_run(context, result)
```

Reasoning keeps what providers need back: a ``ThinkingPart``'s ``id`` is the reasoning's
``item_id`` and its ``signature`` the Anthropic ``signature`` (or, for OpenAI, the
``encrypted_content``).
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from agentcontext._extras import require_extra
from agentcontext.engine import ContextEngine
from agentcontext.fragments import message as message_fragment
from agentcontext.messages import Message, Part, ReasoningPart, TextPart, ToolPart

if TYPE_CHECKING:
    from pydantic_ai import RunContext
    from pydantic_ai import messages as ai
    from pydantic_ai.run import AgentRunResult

__all__ = ["from_model_messages", "history_processor", "save_run", "to_model_messages"]

require_extra("pydantic_ai", "pydantic-ai", "agentcontext.integrations.pydantic_ai")


def _thinking(part: ReasoningPart) -> ai.ThinkingPart:
    from pydantic_ai import messages as ai

    if part.encrypted_content is not None or (part.item_id and not part.signature):
        return ai.ThinkingPart(
            part.text,
            id=part.item_id,
            signature=part.encrypted_content,
            provider_name="openai" if part.item_id else None,
        )
    if part.redacted_data is not None:
        return ai.ThinkingPart(
            "", id="redacted_thinking", signature=part.redacted_data, provider_name="anthropic"
        )
    return ai.ThinkingPart(
        part.text,
        id=part.item_id,
        signature=part.signature,
        provider_name="anthropic" if part.signature else None,
    )


def _reasoning(part: ai.ThinkingPart) -> ReasoningPart:
    provider = part.provider_name or ""
    if part.id == "redacted_thinking" and part.signature:
        return ReasoningPart(text="", redacted_data=part.signature)
    if provider.startswith("openai"):
        return ReasoningPart(text=part.content, item_id=part.id, encrypted_content=part.signature)
    return ReasoningPart(text=part.content, item_id=part.id, signature=part.signature)


def to_model_messages(messages: Sequence[Message]) -> list[ai.ModelMessage]:
    """Stored messages as a pydantic-ai history (for ``message_history=``).

    Args:
        messages: The conversation, e.g. ``(await context.resolve()).messages``.

    Returns:
        A ``ModelRequest`` per user or system message (its text), and per assistant message
        ``ModelResponse``s of its text, reasoning and finished tool calls, each followed by a
        ``ModelRequest`` of their ``ToolReturnPart``s (a text after tool results starts a new
        step). Unfinished tool calls are left out: a model refuses a call without a result.
    """
    from pydantic_ai import messages as ai

    history: list[ai.ModelMessage] = []
    for msg in messages:
        if msg.role == "assistant":
            history.extend(_assistant_steps(msg))
        elif msg.text:
            prompt = (
                ai.UserPromptPart(msg.text) if msg.role == "user" else ai.SystemPromptPart(msg.text)
            )
            history.append(ai.ModelRequest(parts=[prompt]))
    return history


def _assistant_steps(msg: Message) -> list[ai.ModelMessage]:
    from pydantic_ai import messages as ai

    steps: list[ai.ModelMessage] = []
    response: list[ai.ModelResponsePart] = []
    results: list[ai.ModelRequestPart] = []
    for part in msg.parts:
        if isinstance(part, TextPart | ReasoningPart) and results:
            steps += [ai.ModelResponse(parts=response), ai.ModelRequest(parts=results)]
            response, results = [], []
        if isinstance(part, TextPart):
            response.append(ai.TextPart(part.text))
        elif isinstance(part, ReasoningPart):
            response.append(_thinking(part))
        elif isinstance(part, ToolPart) and part.state in ("output-available", "output-error"):
            ok = part.state == "output-available"
            response.append(ai.ToolCallPart(part.tool_name, part.input, part.tool_call_id))
            results.append(
                ai.ToolReturnPart(
                    part.tool_name,
                    part.output if ok else part.error,
                    part.tool_call_id,
                    outcome="success" if ok else "failed",
                )
            )
    if response:
        steps.append(ai.ModelResponse(parts=response))
    if results:
        steps.append(ai.ModelRequest(parts=results))
    return steps


def from_model_messages(messages: Sequence[ai.ModelMessage]) -> list[Message]:
    """A run's new pydantic-ai messages as agentcontext messages.

    Args:
        messages: Typically ``result.new_messages()``.

    Returns:
        One user message per user prompt (its text; files are left out) and one assistant
        message for what the model did until the next prompt: its text, reasoning (with id
        and signature) and tool calls, completed by their ``ToolReturnPart`` (a failed
        return becomes ``"output-error"``) or ``RetryPromptPart`` (an error).
    """
    from pydantic_ai import messages as ai
    from pydantic_core import to_jsonable_python

    out: list[Message] = []
    answer: list[Part] = []

    def close_answer() -> None:
        if answer:
            out.append(Message(id=uuid.uuid4().hex, role="assistant", parts=list(answer)))
            answer.clear()

    def complete(call_id: str, update: dict[str, Any]) -> None:
        for index, part in enumerate(answer):
            if isinstance(part, ToolPart) and part.tool_call_id == call_id:
                answer[index] = part.model_copy(update=update)

    for model_message in messages:
        for part in model_message.parts:
            if isinstance(part, ai.UserPromptPart):
                close_answer()
                content = [part.content] if isinstance(part.content, str) else part.content
                texts = [TextPart(text=item) for item in content if isinstance(item, str)]
                out.append(Message(id=uuid.uuid4().hex, role="user", parts=texts))
            elif isinstance(part, ai.TextPart):
                answer.append(TextPart(text=part.content))
            elif isinstance(part, ai.ThinkingPart):
                answer.append(_reasoning(part))
            elif isinstance(part, ai.ToolCallPart):
                answer.append(
                    ToolPart(
                        tool_call_id=part.tool_call_id,
                        tool_name=part.tool_name,
                        input=part.args_as_dict(),
                        state="input-available",
                    )
                )
            elif isinstance(part, ai.ToolReturnPart):
                if part.outcome == "success":
                    output = to_jsonable_python(part.content)
                    complete(part.tool_call_id, {"state": "output-available", "output": output})
                else:
                    error = part.model_response_str(wrap_if_error=False)
                    complete(part.tool_call_id, {"state": "output-error", "error": error})
            elif isinstance(part, ai.RetryPromptPart) and part.tool_name is not None:
                complete(
                    part.tool_call_id, {"state": "output-error", "error": part.model_response()}
                )
    close_answer()
    return out


def history_processor(
    engine: ContextEngine,
) -> Callable[[RunContext[Any], list[ai.ModelMessage]], Awaitable[list[ai.ModelMessage]]]:
    """A pydantic-ai history processor that gives the agent the stored chat as its history.

    Args:
        engine: The chat's engine; its messages (pending ones included) are read once per
            run, at the run's first model request.

    Returns:
        A processor for ``Agent(capabilities=[ProcessHistory(processor)])`` (pydantic-ai
        2; ``Agent(history_processors=[processor])`` in 1.x): on every model request it
        sends the stored conversation followed by the current run's own messages (any
        ``message_history`` passed to the run is replaced by the stored one).
        ``result.new_messages()`` still holds only what the run added; store it with
        `save_run`.
    """
    cache: dict[str, list[ai.ModelMessage]] = {}

    async def process(
        ctx: RunContext[Any], messages: list[ai.ModelMessage]
    ) -> list[ai.ModelMessage]:
        run_id = ctx.run_id or ""
        if run_id not in cache:
            cache.clear()
            cache[run_id] = to_model_messages(await engine.get_messages())
        own = [m for m in messages if getattr(m, "run_id", None) == ctx.run_id]
        return [*cache[run_id], *own]

    # pydantic-ai reads the signature at run time to pass the context: give it real types.
    from pydantic_ai import RunContext
    from pydantic_ai.messages import ModelMessage

    process.__annotations__ = {
        "ctx": RunContext[Any],
        "messages": list[ModelMessage],
        "return": list[ModelMessage],
    }
    return process


async def save_run(engine: ContextEngine, result: AgentRunResult[Any]) -> list[Message]:
    """Store what a run added (``result.new_messages()``) and add its usage to the chat.

    Args:
        engine: The chat's engine.
        result: What ``agent.run(...)`` returned.

    Returns:
        The messages saved.
    """
    messages = from_model_messages(result.new_messages())
    if messages:
        engine.set(*(message_fragment(m) for m in messages))
        await engine.save()
    usage: Any = getattr(result, "usage", None)
    if inspect.ismethod(usage):  # a method in older pydantic-ai releases
        usage = usage()
    if usage is not None:
        await engine.track_usage(usage)
    return messages
