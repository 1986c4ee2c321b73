"""Resolve throughput with one read replica against the primary alone.

    python benchmarks/bench_replicas.py [--pg-url URL] [--replica-url URL] [--chats 50]
                                        [--messages 40] [--resolves 2000] [--concurrency 8]
                                        [--rounds 3] [--json]

Without ``--replica-url`` a streaming standby of the server at ``--pg-url`` is started on
loopback for the run (``tests/store/_standby.py``: ``pg_basebackup -R`` and ``pg_ctl``; the
server must allow replication connections from 127.0.0.1, see ``.ci/run``) and removed after.
A scratch database is made on the primary and dropped at the end.

``--chats`` chats of ``--messages`` messages (about 400 characters each) are written, and the
standby is waited for. Then, in each round, ``--resolves`` cold resolves
(``ContextEngine(...).resolve()`` on a new engine, what a stateless request handler does) of
random chats run ``--concurrency`` at a time, on:

- **primary**: ``SqlContextStore(url)``;
- **replica, read-only**: ``SqlContextStore(url, read_replicas=[replica])`` on chats it never
  wrote (every read on the replica, no position check);
- **replica, after a save**: the same, each resolve preceded by a save of one message to the
  chat by the same store, so the resolve waits (bounded) for the replica to replay it; against
  the primary alone doing the same save + resolve.

It prints resolves per second (the median round) and where the reads ran. On one machine the
standby shares the processor with the primary, so it cannot be faster here: the figure
measures what routing costs, not what a replica on its own hardware gains.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from agentcontext import ContextEngine, SqlContextStore, assistant_text, user  # noqa: E402

DEFAULT_PG = os.environ.get(
    "AGENTCONTEXT_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
)


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def _sql(url: str, statement: str) -> Any:
    conn = await asyncpg.connect(_dsn(url), timeout=10)
    try:
        return await conn.fetchval(statement)
    finally:
        await conn.close()


async def _caught_up(primary: str, replica: str) -> None:
    target = await _sql(primary, "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
    for _ in range(6000):
        try:
            if await _sql(replica, "SELECT pg_last_wal_replay_lsn() - '0/0'::pg_lsn") >= target:
                return
        except (OSError, asyncpg.PostgresError):
            pass
        await asyncio.sleep(0.01)
    raise SystemExit("the replica did not catch up")


def _text(rng: random.Random) -> str:
    words = ("context", "engine", "replica", "branch", "token", "model", "window", "chat")
    return " ".join(rng.choice(words) for _ in range(55))[:400]


async def _fill(url: str, chats: int, messages: int) -> list[str]:
    rng = random.Random(7)
    ids = [f"chat-{index}" for index in range(chats)]
    async with SqlContextStore(url) as store:
        for chat_id in ids:
            context = ContextEngine(store=store, chat_id=chat_id, user_id="u")
            for _ in range(messages // 2):
                context.set(user(_text(rng)), assistant_text(_text(rng)))
            await context.save()
    return ids


async def _round(
    store: SqlContextStore, ids: list[str], resolves: int, concurrency: int, write: bool
) -> float:
    rng = random.Random()
    queue = list(range(resolves))

    async def worker() -> None:
        while queue:
            queue.pop()
            chat_id = rng.choice(ids)
            if write:
                writer = ContextEngine(store=store, chat_id=chat_id, user_id="u")
                writer.set(user("one more"))
                await writer.save()
            await ContextEngine(store=store, chat_id=chat_id, user_id="u").resolve()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return resolves / (time.perf_counter() - started)


async def _measure(
    url: str, replicas: list[str], ids: list[str], args: argparse.Namespace, write: bool
) -> dict[str, Any]:
    rates: list[float] = []
    async with SqlContextStore(url, read_replicas=replicas) as store:
        await _round(store, ids, max(50, args.resolves // 10), args.concurrency, write)  # warm
        for _ in range(args.rounds):
            rates.append(await _round(store, ids, args.resolves, args.concurrency, write))
        where = None if store.db.replicas is None else store.db.replicas.stats()
    return {"resolves_per_s": round(statistics.median(rates)), "reads": where}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    parser.add_argument("--replica-url")
    parser.add_argument("--chats", type=int, default=50)
    parser.add_argument("--messages", type=int, default=40)
    parser.add_argument("--resolves", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    standby = None
    name = f"acbench_replicas_{uuid.uuid4().hex[:8]}"
    await _sql(args.pg_url, f'CREATE DATABASE "{name}"')
    primary = make_url(args.pg_url).set(database=name).render_as_string(hide_password=False)
    try:
        if args.replica_url is None:
            from tests.store._standby import COPIED_SETTINGS, StandbyError, start_standby

            conn = await asyncpg.connect(_dsn(args.pg_url), timeout=10)
            try:
                rows = await conn.fetch(
                    "SELECT name, setting FROM pg_settings WHERE name = ANY($1::text[])",
                    list(COPIED_SETTINGS),
                )
            finally:
                await conn.close()
            try:
                standby = await asyncio.to_thread(
                    start_standby, args.pg_url, {row["name"]: row["setting"] for row in rows}
                )
            except StandbyError as exc:
                print(f"skipped: cannot start a standby ({exc}); pass --replica-url")
                return
            replica = standby.url(name)
        else:
            replica = (
                make_url(args.replica_url).set(database=name).render_as_string(hide_password=False)
            )
        ids = await _fill(primary, args.chats, args.messages)
        await _caught_up(primary, replica)
        results = {
            "primary": await _measure(primary, [], ids, args, False),
            "replica, read-only": await _measure(primary, [replica], ids, args, False),
            "primary, save + resolve": await _measure(primary, [], ids, args, True),
            "replica, save + resolve": await _measure(primary, [replica], ids, args, True),
        }
    finally:
        if standby is not None:
            await asyncio.to_thread(standby.remove)
        await _sql(args.pg_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(
        f"{args.chats} chats of {args.messages} messages, {args.resolves} cold resolves per "
        f"round, {args.concurrency} at a time, median of {args.rounds} rounds"
    )
    for label, result in results.items():
        reads = result["reads"]
        shown = "" if reads is None else f"  (reads: {reads})"
        print(f"{label:<26} {result['resolves_per_s']:>7} resolves/s{shown}")


if __name__ == "__main__":
    asyncio.run(main())
