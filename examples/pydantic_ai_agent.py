"""A pydantic-ai agent whose message history is kept in agentcontext.

pydantic-ai takes a conversation's history as ``ModelMessage`` objects (``message_history=``)
and hands back what a run added (``result.new_messages()``). Here that history lives in an
agentcontext chat: before each run the chat is loaded from the store and converted to
pydantic-ai messages; after it, the run's new messages are converted back and saved. Each run
opens a fresh engine, as a web request handler would, so nothing is kept in memory between
runs. The system prompt is rendered from fragments and passed as the run's ``instructions``.

It runs offline with pydantic-ai's ``TestModel`` (the default, ``--model test``)::

    python examples/pydantic_ai_agent.py "What's the weather in Paris?"
    python examples/pydantic_ai_agent.py "Thanks!"          # continues the stored chat
    python examples/pydantic_ai_agent.py --model openai:gpt-5-mini "And in Tokyo?"
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid
from collections.abc import Sequence
from typing import Any

from pydantic_ai import Agent
from pydantic_ai import messages as ai
from pydantic_ai.exceptions import UserError
from pydantic_ai.models import Model
from pydantic_core import to_jsonable_python

from agentcontext import (
    ContextEngine,
    ContextFragment,
    ContextStore,
    Message,
    Part,
    ReasoningPart,
    SqlContextStore,
    TextPart,
    ToolPart,
    guardrail,
    hint,
    message,
    role,
)

DEFAULT_URL = "sqlite+aiosqlite:///agentcontext.db"  # the command line's default database too


# --- agentcontext messages <-> pydantic-ai messages ----------------------------------------


def to_model_messages(messages: Sequence[Message]) -> list[ai.ModelMessage]:
    """Stored messages as a pydantic-ai history (for ``message_history=``)."""
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
    """An assistant message as model responses, each followed by its tool results.

    A text after tool results starts a new step, as in the AI SDK. Unfinished tool calls
    (no result yet) are left out: a model refuses a call without a result.
    """
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
            response.append(ai.ThinkingPart(part.text))
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

    Each user prompt becomes a user message; what the model did until the next prompt (its
    text, its reasoning, its tool calls with their results) becomes one assistant message,
    the way the AI SDK stores a turn. Files in prompts are left out (only text is kept).
    """
    out: list[Message] = []
    answer: list[Part] = []  # the assistant message being built

    def close_answer() -> None:
        if answer:
            out.append(Message(id=uuid.uuid4().hex, role="assistant", parts=list(answer)))
            answer.clear()

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
                answer.append(ReasoningPart(text=part.content))
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
                answer[:] = [_with_result(p, part) for p in answer]
    close_answer()
    return out


def _with_result(part: Part, result: ai.ToolReturnPart) -> Part:
    """``part`` completed by ``result`` if it is the call that ``result`` answers."""
    if not isinstance(part, ToolPart) or part.tool_call_id != result.tool_call_id:
        return part
    if result.outcome == "success":
        output = to_jsonable_python(result.content)  # stored as JSON
        return part.model_copy(update={"state": "output-available", "output": output})
    error = result.model_response_str(wrap_if_error=False)  # pydantic-ai wraps it when sending
    return part.model_copy(update={"state": "output-error", "error": error})


# --- the agent -----------------------------------------------------------------------------


def get_weather(city: str) -> dict[str, Any]:
    """Get the current weather of a city (canned data: the example needs no weather service)."""
    sky, celsius = {"paris": ("sunny", 24), "tokyo": ("rainy", 18)}.get(
        city.strip().lower(), ("cloudy", 15)
    )
    return {"city": city, "sky": sky, "celsius": celsius}


def build_agent(model: Model | str) -> Agent[None, str]:
    """A plain pydantic-ai agent: any model, one tool, no instructions of its own."""
    return Agent(model, tools=[get_weather])


def system_prompt() -> list[ContextFragment]:
    """The fragments that render into the run's instructions."""
    return [
        role("You are a travel assistant."),
        hint("Answer in one or two sentences."),
        guardrail("Never guess the weather.", reason="Call get_weather instead."),
    ]


async def ask(
    agent: Agent[None, str], store: ContextStore, prompt: str, *, chat_id: str, user_id: str
) -> str:
    """One run: load the history from the store, run the agent, save what the run added."""
    context = ContextEngine(store=store, chat_id=chat_id, user_id=user_id)
    context.set(*system_prompt())
    resolved = await context.resolve()
    result = await agent.run(
        prompt,
        instructions=resolved.system_prompt,
        message_history=to_model_messages(resolved.messages),
    )
    context.set(*(message(msg) for msg in from_model_messages(result.new_messages())))
    await context.save()
    await context.track_usage(result.usage)  # tokens, requests and tool calls, summed
    return result.output


async def run(
    agent: Agent[None, str],
    store_url: str,
    prompts: Sequence[str],
    *,
    chat_id: str = "pydantic-ai-demo",
    user_id: str = "demo-user",
) -> list[str]:
    """Run the agent once per prompt in the chat ``chat_id``; return the outputs."""
    async with SqlContextStore(store_url) as store:
        return [await ask(agent, store, p, chat_id=chat_id, user_id=user_id) for p in prompts]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A pydantic-ai agent whose history is stored.")
    parser.add_argument("prompts", nargs="*", default=["What's the weather in Paris?"])
    parser.add_argument("--url", default=os.environ.get("AGENTCONTEXT_URL", DEFAULT_URL))
    parser.add_argument("--chat", default="pydantic-ai-demo", help="the chat to continue")
    parser.add_argument(
        "--model", default="test", help="a pydantic-ai model name; 'test' runs offline"
    )
    args = parser.parse_args(argv)
    try:
        agent = build_agent(args.model)
        outputs = asyncio.run(run(agent, args.url, args.prompts, chat_id=args.chat))
    except UserError as exc:  # e.g. a provider's API key is missing
        print(exc, file=sys.stderr)
        return 2
    for prompt, output in zip(args.prompts, outputs, strict=True):
        print(f"> {prompt}\n{output}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
