"""Keep a long conversation inside the model's window: fit each request, compact now and then.

    python examples/compaction.py   (needs OPENAI_API_KEY; the tests run it with a fake client)

Each turn resolves under a `ContextWindow` (the oldest turns are left out when the request would
not fit), and once the request leaves messages out, the older part of the branch is folded into
a summary written by the model itself. The summary is stored in the graph beside the branch;
nothing is deleted.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentcontext import (
    ContextEngine,
    ContextWindow,
    Message,
    SqlContextStore,
    assistant,
    role,
    user,
)

WINDOW = ContextWindow(model_id="gpt-4o-mini", reserve_output=2_000)


def summarizer(client: Any, model: str = "gpt-4o-mini") -> Any:
    """An async summarize callable for `ContextEngine.compact`, backed by Chat Completions."""

    async def summarize(messages: list[Message]) -> str:
        transcript = "\n".join(f"{m.role}: {m.text}" for m in messages)
        response = await client.chat.completions.create(
            model=model,
            messages=[
                {
                    "role": "system",
                    "content": "Summarise this conversation for its own continuation. Keep "
                    "names, numbers, decisions and open questions.",
                },
                {"role": "user", "content": transcript},
            ],
        )
        return response.choices[0].message.content or ""

    return summarize


async def turn(engine: ContextEngine, client: Any, question: str) -> str:
    """One turn: fit the request, ask, save; compact when the window had to leave turns out."""
    engine.set(user(question))
    request = await engine.resolve(window=WINDOW)
    response = await client.chat.completions.create(
        model="gpt-4o-mini", messages=request.to_openai()
    )
    answer = response.choices[0].message.content or ""
    engine.set(assistant(answer))
    await engine.save()
    if request.omitted:
        await engine.compact(summarizer(client), keep_last_turns=2)
    return answer


async def run(client: Any, url: str, questions: list[str]) -> list[str]:
    """Ask every question in one chat; the answers."""
    async with SqlContextStore(url) as store:
        engine = ContextEngine(store=store, chat_id="long-chat", user_id="demo")
        engine.set(role("You are a patient bookkeeping tutor."))
        return [await turn(engine, client, question) for question in questions]


if __name__ == "__main__":
    from openai import AsyncOpenAI

    answers = asyncio.run(
        run(AsyncOpenAI(), "sqlite+aiosqlite:///compaction.db", ["What is a ledger?"])
    )
    print(answers[-1])
