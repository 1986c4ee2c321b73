"""An agent loop with the official Anthropic SDK, its context kept in agentcontext.

The system prompt is built from fragments; the conversation lives in a database (SQLite by
default, PostgreSQL with ``--url``). Each turn calls the model until it stops asking for tools.
The ``tool_use`` blocks and their results are stored as ``ToolPart`` parts of the assistant's
message; ``resolve().to_anthropic()`` turns them back into ``tool_use`` / ``tool_result``
blocks on every later request.

Run it::

    export ANTHROPIC_API_KEY=sk-ant-...
    python examples/anthropic_agent.py "What's the weather in Paris?" "And in Tokyo?"
    agentcontext show anthropic-demo       # the stored conversation, as a tree

``run()`` takes the client as an argument: the tests pass a fake one and run offline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid
from collections.abc import Sequence
from typing import Any

import anthropic
from anthropic import AsyncAnthropic
from anthropic.types import ToolParam

from agentcontext import (
    ContextEngine,
    ContextFragment,
    Message,
    SqlContextStore,
    ToolPart,
    assistant,
    guardrail,
    hint,
    role,
    user,
)

DEFAULT_URL = "sqlite+aiosqlite:///agentcontext.db"  # the command line's default database too
DEFAULT_MODEL = "claude-haiku-4-5"
MAX_TOKENS = 1024
MAX_STEPS = 8  # model calls per turn: a model that keeps calling tools cannot loop forever


# --- the tool ------------------------------------------------------------------------------


def get_weather(city: str) -> dict[str, Any]:
    """The current weather of a city (canned data: the example needs no weather service)."""
    sky, celsius = {"paris": ("sunny", 24), "tokyo": ("rainy", 18)}.get(
        city.strip().lower(), ("cloudy", 15)
    )
    return {"city": city, "sky": sky, "celsius": celsius}


TOOLS: list[ToolParam] = [
    {
        "name": "get_weather",
        "description": "Get the current weather of a city.",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name."}},
            "required": ["city"],
        },
    }
]


def call_tool(call: ToolPart) -> ToolPart:
    """Run one tool call. A failure becomes an ``output-error`` part (``is_error`` for Claude)."""
    try:
        if call.tool_name != "get_weather":
            raise ValueError(f"unknown tool {call.tool_name!r}")
        # Stored as the JSON text the model reads, so later requests repeat it byte for byte
        # (PostgreSQL's JSONB would not keep the key order of a dict).
        output = json.dumps(get_weather(**call.input))
    except (ValueError, TypeError) as exc:  # unknown tool, wrong arguments
        return call.model_copy(update={"state": "output-error", "error": str(exc)})
    return call.model_copy(update={"state": "output-available", "output": output})


# --- the agent loop ------------------------------------------------------------------------


def system_prompt() -> list[ContextFragment]:
    """The fragments that render into the system prompt."""
    return [
        role("You are a travel assistant."),
        hint("Answer in one or two sentences."),
        guardrail("Never guess the weather.", reason="Call get_weather instead."),
    ]


async def run_turn(
    client: AsyncAnthropic, context: ContextEngine, text: str, *, model: str, cache: bool = False
) -> str:
    """One user turn: call the model until it stops calling tools, then save the turn."""
    context.set(user(text))
    answer = Message(id=uuid.uuid4().hex, role="assistant")
    for _ in range(MAX_STEPS):
        resolved = await context.resolve()
        request = resolved.to_anthropic(cache=cache)  # {"system": ..., "messages": [...]}
        response = await client.messages.create(
            model=model, max_tokens=MAX_TOKENS, tools=TOOLS, **request
        )
        await context.track_usage(response.usage)  # summed in the chat's metadata
        reply = Message.from_anthropic(response)  # text, tool calls, thinking with signatures
        parts = [call_tool(part) if isinstance(part, ToolPart) else part for part in reply.parts]
        answer = answer.model_copy(update={"parts": [*answer.parts, *parts]})
        context.set(assistant(answer))  # same id: replaces the draft queued by the last step
        if response.stop_reason != "tool_use":
            break
    await context.save()  # the user message and the whole answer, in one transaction
    return answer.text


async def run(
    client: AsyncAnthropic,
    store_url: str,
    prompts: Sequence[str],
    *,
    chat_id: str = "anthropic-demo",
    user_id: str = "demo-user",
    model: str = DEFAULT_MODEL,
    cache: bool = False,
) -> list[str]:
    """Run one turn per prompt in the chat ``chat_id``; return the answers."""
    async with SqlContextStore(store_url) as store:
        context = ContextEngine(store=store, chat_id=chat_id, user_id=user_id)
        context.set(*system_prompt())
        return [await run_turn(client, context, p, model=model, cache=cache) for p in prompts]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="An Anthropic agent whose context is stored.")
    parser.add_argument("prompts", nargs="*", default=["What's the weather in Paris?"])
    parser.add_argument("--url", default=os.environ.get("AGENTCONTEXT_URL", DEFAULT_URL))
    parser.add_argument("--chat", default="anthropic-demo", help="the chat to continue")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--cache", action="store_true", help="use Anthropic's prompt cache")
    args = parser.parse_args(argv)
    if not os.environ.get("ANTHROPIC_API_KEY"):
        print(
            "This example calls the Anthropic API and needs a key:\n"
            "  export ANTHROPIC_API_KEY=sk-ant-...   "
            "(create one at https://console.anthropic.com/settings/keys)\n"
            "Its tests run offline: pytest tests/examples",
            file=sys.stderr,
        )
        return 2
    try:
        answers = asyncio.run(
            run(
                AsyncAnthropic(),
                args.url,
                args.prompts,
                chat_id=args.chat,
                model=args.model,
                cache=args.cache,
            )
        )
    except anthropic.APIError as exc:
        print(f"Anthropic API error: {exc}", file=sys.stderr)
        return 1
    for prompt, answer in zip(args.prompts, answers, strict=True):
        print(f"> {prompt}\n{answer}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
