"""The context window and compaction, through the public API, ratios measured in one run.

    python benchmarks/bench_window.py [--pg-url URL] [--skip-postgres] [--runs 7]

For each backend (an SQLite file; a scratch PostgreSQL database made and dropped here), on
conversations of alternating user/assistant messages of about 400 characters (``_workload.py``):

- **compacted 100k vs 1k**: a fresh engine's ``resolve()`` of a 100 000-message chat compacted
  to its last 2 turns (``await engine.compact(summarize)``), against a fresh engine's
  ``resolve()`` of a 1 000-message chat. Goal: at most 1.2x.
- **window vs plain**: a fresh engine's ``resolve(window=ContextWindow(128_000))`` of a
  10 000-message chat against its plain ``resolve()``. Messages are counted once per process:
  the first windowed resolve of the process counts them (shown apart), later fresh engines
  find the counts. Goal: at most 1.2x.
- **prefix stability**: a 300-turn conversation run through one engine under
  ``ContextWindow(16_000, reserve_output=1_000)``: the share of turns whose request starts with
  exactly the previous turn's messages (what keeps a provider's prompt cache hitting).
  Goal: at least 90 %.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
from sqlalchemy import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import median_time, ms, ratio, row, text
from bench_store import DEFAULT_PG, _dsn, build_chat

from agentcontext import (
    ContextEngine,
    ContextWindow,
    Message,
    SqlContextStore,
    assistant,
    user,
)


async def summarize(messages: list[Message]) -> str:
    return f"The conversation so far: {len(messages)} messages about the ledger."


async def bench_backend(name: str, url: str, runs: int) -> list[str]:
    out = [f"\n## {name}\n", row("measure", "agentcontext", "baseline", "ratio", "goal")]
    out.append(row("---", "---", "---", "---", "---"))
    async with SqlContextStore(url) as store:
        await build_chat(store, "small", 1_000)
        await build_chat(store, "large", 100_000)
        await ContextEngine(store=store, chat_id="large", user_id="bench").compact(summarize)

        async def cold(chat_id: str) -> None:
            await ContextEngine(store=store, chat_id=chat_id, user_id="bench").resolve()

        small = await median_time(lambda: cold("small"), runs)
        large = await median_time(lambda: cold("large"), runs)
        out.append(
            row(
                "resolve(), 100k compacted vs 1k",
                ms(large),
                ms(small),
                ratio(large, small),
                "≤ 1.2x",
            )
        )

        await build_chat(store, "window", 10_000)
        window = ContextWindow(128_000)

        async def windowed() -> None:
            await ContextEngine(store=store, chat_id="window", user_id="bench").resolve(
                window=window
            )

        started = time.perf_counter()
        await windowed()
        first = time.perf_counter() - started
        plain = await median_time(lambda: cold("window"), runs)
        fitted = await median_time(windowed, runs)
        out.append(
            row(
                "resolve(window=), 10k, vs resolve()",
                ms(fitted),
                ms(plain),
                ratio(fitted, plain),
                "≤ 1.2x",
            )
        )
        out.append(
            row(
                "… the first in the process (counting)",
                ms(first),
                ms(plain),
                ratio(first, plain),
                "",
            )
        )

        rng = random.Random(3)
        engine = ContextEngine(store=store, chat_id="turns", user_id="bench")
        turn_window = ContextWindow(16_000, reserve_output=1_000)
        previous: list[str] | None = None
        stable = turns = 0
        for _ in range(300):
            engine.set(user(text(rng)))
            sent = [m.id for m in (await engine.resolve(window=turn_window)).messages]
            if previous is not None:
                turns += 1
                stable += sent[: len(previous)] == previous
            engine.set(assistant(text(rng)))
            await engine.save()
            previous = [m.id for m in (await engine.resolve(window=turn_window)).messages]
        share = stable / turns
        out.append(row("turns sending the previous prefix (300)", f"{share:.0%}", "", "", "≥ 90 %"))
    return out


async def main(args: argparse.Namespace) -> None:
    out = [
        "# Context window and compaction benchmark (public API, ratios in the same run)",
        f"\nmessages of about 400 characters; median of {args.runs} runs; "
        f"{datetime.now(UTC):%Y-%m-%d}",
    ]
    with tempfile.TemporaryDirectory() as directory:
        out += await bench_backend("SQLite", f"sqlite+aiosqlite:///{directory}/w.db", args.runs)
    if not args.skip_postgres:
        admin = await asyncpg.connect(_dsn(args.pg_url))
        name = f"acbench_{uuid.uuid4().hex[:8]}"
        await admin.execute(f'CREATE DATABASE "{name}"')
        url = make_url(args.pg_url).set(database=name).render_as_string(hide_password=False)
        try:
            out += await bench_backend("PostgreSQL", url, args.runs)
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await admin.close()
    print("\n".join(out))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument("--runs", type=int, default=7)
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
