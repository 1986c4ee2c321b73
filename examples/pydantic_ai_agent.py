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
from collections.abc import Sequence
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.exceptions import UserError
from pydantic_ai.models import Model

from agentcontext import (
    ContextEngine,
    ContextFragment,
    ContextStore,
    SqlContextStore,
    guardrail,
    hint,
    role,
)
from agentcontext.integrations.pydantic_ai import (
    history_processor,
    save_run,
    to_model_messages,
)

DEFAULT_URL = "sqlite+aiosqlite:///agentcontext.db"  # the command line's default database too


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
    resolved = await context.resolve()  # the rendered prompt and the stored messages
    result = await agent.run(
        prompt,
        instructions=resolved.system_prompt,
        message_history=to_model_messages(resolved.messages),
    )
    await save_run(context, result)  # the run's new messages, and its usage summed
    return result.output


async def ask_with_processor(
    model: Model | str, store: ContextStore, prompt: str, *, chat_id: str, user_id: str
) -> str:
    """The same run with a history processor: the agent reads the stored chat itself."""
    context = ContextEngine(store=store, chat_id=chat_id, user_id=user_id)
    context.set(*system_prompt())
    agent = Agent(
        model, tools=[get_weather], capabilities=[ProcessHistory(history_processor(context))]
    )
    result = await agent.run(prompt, instructions=(await context.resolve()).system_prompt)
    await save_run(context, result)
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
