"""A process that takes a turn with a ``once`` reminder, for the cross-process latch test.

Run as a subprocess::

    python tests/reminders/once_worker.py URL CHAT_ID NAME

It imports everything, prints ``ready``, waits for a line on stdin, then opens the chat with a
new engine, sets ``reminder("welcome", once="welcome")`` and a user message ``NAME``, resolves,
saves the turn with an answer, and prints ``fired`` or ``quiet`` (whether the reminder was in
what it sent).
"""

from __future__ import annotations

import asyncio
import sys

from agentcontext import ContextEngine, SqlContextStore, assistant_text, reminder, user


async def main(url: str, chat_id: str, name: str) -> None:
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    async with SqlContextStore(url) as store:
        engine = ContextEngine(store=store, chat_id=chat_id, user_id="u1")
        engine.set(reminder("welcome", once="welcome"), user(name))
        sent = (await engine.resolve()).messages[-1]
        engine.set(assistant_text(f"answer to {name}"))
        await engine.save()
    print("fired" if "welcome" in sent.text else "quiet", flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
