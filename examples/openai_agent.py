"""An agent loop with the official OpenAI SDK, its context kept in agentcontext.

The system prompt is built from fragments; the conversation lives in a database (SQLite by
default, PostgreSQL with ``--url``). Each turn calls the model until it answers without calling
a tool. The tool calls and their results are stored as ``ToolPart`` parts of the assistant's
message, so the next turn, or another process, sends them back to the model as they were.

Run it::

    export OPENAI_API_KEY=sk-...
    python examples/openai_agent.py "What's the weather in Paris?" "And in Tokyo?"
    agentcontext show openai-demo          # the stored conversation, as a tree

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
from typing import Any, cast

import openai
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from agentcontext import (
    ContextEngine,
    ContextFragment,
    Message,
    Part,
    SqlContextStore,
    TextPart,
    ToolPart,
    assistant,
    guardrail,
    hint,
    role,
    user,
)

DEFAULT_URL = "sqlite+aiosqlite:///agentcontext.db"  # the command line's default database too
DEFAULT_MODEL = "gpt-5-mini"
MAX_STEPS = 8  # model calls per turn: a model that keeps calling tools cannot loop forever


# --- the tool ------------------------------------------------------------------------------


def get_weather(city: str) -> dict[str, Any]:
    """The current weather of a city (canned data: the example needs no weather service)."""
    sky, celsius = {"paris": ("sunny", 24), "tokyo": ("rainy", 18)}.get(
        city.strip().lower(), ("cloudy", 15)
    )
    return {"city": city, "sky": sky, "celsius": celsius}


TOOLS: list[ChatCompletionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather of a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city's name."}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
]


def call_tool(call_id: str, name: str, arguments: str) -> ToolPart:
    """Run one tool call. A failure becomes an ``output-error`` part the model can read."""
    try:
        args = json.loads(arguments or "{}")
        if name != "get_weather":
            raise ValueError(f"unknown tool {name!r}")
        # Stored as the JSON text the model reads, so later requests repeat it byte for byte
        # (PostgreSQL's JSONB would not keep the key order of a dict).
        output = json.dumps(get_weather(**args))
    except (ValueError, TypeError) as exc:  # bad JSON, unknown tool, wrong arguments
        return ToolPart(
            tool_call_id=call_id,
            tool_name=name,
            input=arguments,
            state="output-error",
            error=str(exc),
        )
    return ToolPart(
        tool_call_id=call_id, tool_name=name, input=args, state="output-available", output=output
    )


# --- the agent loop ------------------------------------------------------------------------


def system_prompt() -> list[ContextFragment]:
    """The fragments that render into the system prompt."""
    return [
        role("You are a travel assistant."),
        hint("Answer in one or two sentences."),
        guardrail("Never guess the weather.", reason="Call get_weather instead."),
    ]


async def run_turn(client: AsyncOpenAI, context: ContextEngine, text: str, *, model: str) -> str:
    """One user turn: call the model until it stops calling tools, then save the turn."""
    context.set(user(text))
    answer = Message(id=uuid.uuid4().hex, role="assistant")
    for _ in range(MAX_STEPS):
        resolved = await context.resolve()  # system prompt + stored history + this turn so far
        response = await client.chat.completions.create(
            model=model,
            messages=cast(list[ChatCompletionMessageParam], resolved.to_openai()),
            tools=TOOLS,
        )
        if response.usage is not None:
            await context.track_usage(response.usage)  # summed in the chat's metadata
        reply = response.choices[0].message
        parts: list[Part] = [TextPart(text=reply.content)] if reply.content else []
        for call in reply.tool_calls or []:
            if call.type == "function":
                parts.append(call_tool(call.id, call.function.name, call.function.arguments))
        answer = answer.model_copy(update={"parts": [*answer.parts, *parts]})
        context.set(assistant(answer))  # same id: replaces the draft queued by the last step
        if not reply.tool_calls:
            break
    await context.save()  # the user message and the whole answer, in one transaction
    return answer.text


async def run(
    client: AsyncOpenAI,
    store_url: str,
    prompts: Sequence[str],
    *,
    chat_id: str = "openai-demo",
    user_id: str = "demo-user",
    model: str = DEFAULT_MODEL,
) -> list[str]:
    """Run one turn per prompt in the chat ``chat_id``; return the answers."""
    async with SqlContextStore(store_url) as store:
        context = ContextEngine(store=store, chat_id=chat_id, user_id=user_id)
        context.set(*system_prompt())
        return [await run_turn(client, context, prompt, model=model) for prompt in prompts]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="An OpenAI agent whose context is stored.")
    parser.add_argument("prompts", nargs="*", default=["What's the weather in Paris?"])
    parser.add_argument("--url", default=os.environ.get("AGENTCONTEXT_URL", DEFAULT_URL))
    parser.add_argument("--chat", default="openai-demo", help="the chat to continue")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    args = parser.parse_args(argv)
    if not os.environ.get("OPENAI_API_KEY"):
        print(
            "This example calls the OpenAI API and needs a key:\n"
            "  export OPENAI_API_KEY=sk-...   (create one at https://platform.openai.com/api-keys)\n"
            "OPENAI_BASE_URL points it at any OpenAI-compatible server. "
            "Its tests run offline: pytest tests/examples",
            file=sys.stderr,
        )
        return 2
    try:
        answers = asyncio.run(
            run(AsyncOpenAI(), args.url, args.prompts, chat_id=args.chat, model=args.model)
        )
    except openai.APIError as exc:
        print(f"OpenAI API error: {exc}", file=sys.stderr)
        return 1
    for prompt, answer in zip(args.prompts, answers, strict=True):
        print(f"> {prompt}\n{answer}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
