"""An agent loop with the official OpenAI SDK, its context kept in agentcontext.

The system prompt is built from fragments; the conversation lives in a database (SQLite by
default, PostgreSQL with ``--url``). Each turn calls the model until it answers without calling
a tool. The tool calls and their results are stored as ``ToolPart`` parts of the assistant's
message, so the next turn, or another process, sends them back to the model as they were.

Run it::

    export OPENAI_API_KEY=sk-...
    python examples/openai_agent.py "What's the weather in Paris?" "And in Tokyo?"
    python examples/openai_agent.py --api responses "And in Rome?"   # the Responses API
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
from typing import Any

import openai
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletion, ChatCompletionToolParam
from openai.types.responses import FunctionToolParam, Response

from agentcontext import (
    ContextEngine,
    ContextFragment,
    Message,
    ResolveResult,
    SqlContextStore,
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


RESPONSES_TOOLS: list[FunctionToolParam] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Get the current weather of a city.",
        "parameters": TOOLS[0]["function"]["parameters"],
        "strict": True,
    }
]


def call_tool(call: ToolPart) -> ToolPart:
    """Run one tool call. A failure becomes an ``output-error`` part the model can read."""
    try:
        # Arguments that are not JSON come as the text the model wrote: parsing it again
        # gives the model the parser's error.
        args = json.loads(call.input) if isinstance(call.input, str) else call.input
        if call.tool_name != "get_weather":
            raise ValueError(f"unknown tool {call.tool_name!r}")
        # Stored as the JSON text the model reads, so later requests repeat it byte for byte
        # (PostgreSQL's JSONB would not keep the key order of a dict).
        output = json.dumps(get_weather(**args))
    except (ValueError, TypeError) as exc:  # bad JSON, unknown tool, wrong arguments
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


async def call_model(
    client: AsyncOpenAI, resolved: ResolveResult, *, model: str, api: str = "chat"
) -> Message:
    """One model call, on Chat Completions or the Responses API; the reply as a message."""
    response: ChatCompletion | Response
    if api == "responses":
        response = await client.responses.create(
            model=model,
            instructions=resolved.system_prompt,
            input=resolved.to_openai_responses(),  # reasoning items go back by id
            tools=RESPONSES_TOOLS,
            include=["reasoning.encrypted_content"],
            store=False,
        )
    else:
        response = await client.chat.completions.create(
            model=model, messages=resolved.to_openai(), tools=TOOLS
        )
    return Message.from_openai(response)  # text, tool calls, reasoning and usage


async def run_turn(
    client: AsyncOpenAI, context: ContextEngine, text: str, *, model: str, api: str = "chat"
) -> str:
    """One user turn: call the model until it stops calling tools, then save the turn."""
    context.set(user(text))
    answer = Message(id=uuid.uuid4().hex, role="assistant")
    for _ in range(MAX_STEPS):
        resolved = await context.resolve()  # system prompt + stored history + this turn so far
        reply = await call_model(client, resolved, model=model, api=api)
        if reply.metadata and "usage" in reply.metadata:
            await context.track_usage(reply.metadata["usage"])  # summed in the chat's metadata
        calls = [part for part in reply.parts if isinstance(part, ToolPart)]
        parts = [call_tool(part) if isinstance(part, ToolPart) else part for part in reply.parts]
        answer = answer.model_copy(update={"parts": [*answer.parts, *parts]})
        context.set(assistant(answer))  # same id: replaces the draft queued by the last step
        if not calls:
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
    api: str = "chat",
) -> list[str]:
    """Run one turn per prompt in the chat ``chat_id``; return the answers."""
    async with SqlContextStore(store_url) as store:
        context = ContextEngine(store=store, chat_id=chat_id, user_id=user_id)
        context.set(*system_prompt())
        return [await run_turn(client, context, p, model=model, api=api) for p in prompts]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="An OpenAI agent whose context is stored.")
    parser.add_argument("prompts", nargs="*", default=["What's the weather in Paris?"])
    parser.add_argument("--url", default=os.environ.get("AGENTCONTEXT_URL", DEFAULT_URL))
    parser.add_argument("--chat", default="openai-demo", help="the chat to continue")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--api", choices=["chat", "responses"], default="chat")
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
            run(
                AsyncOpenAI(),
                args.url,
                args.prompts,
                chat_id=args.chat,
                model=args.model,
                api=args.api,
            )
        )
    except openai.APIError as exc:
        print(f"OpenAI API error: {exc}", file=sys.stderr)
        return 1
    for prompt, answer in zip(args.prompts, answers, strict=True):
        print(f"> {prompt}\n{answer}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
