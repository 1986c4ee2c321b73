"""Where a turn's processor time goes on MariaDB: the client's and the server's, per turn.

    python benchmarks/bench_turn_cpu.py [--my-url URL] [--agents 16] [--turns 100] [--runs 2]

The shared harness's concurrency cell times about 1.2 s of turns, after a seed of several
seconds, on a machine whose two cores the client and the server share: its ratios move by
half between runs. This probe runs longer and measures what a turn costs in processor time,
which the machine's noise moves less than throughput:

- ``--agents`` tasks in one process, one store (a pool of as many connections), each on its
  own chat of 200 messages (60 words from a vocabulary of 3 000, as the harness's texts);
- each turn, as the harness's: a fresh ``ContextEngine``, ``resolve()``, then ``save()`` of a
  user message and an assistant reply;
- per turn: the wall time of all turns over their number (as throughput), this process's CPU
  time (``time.process_time``) and the server's (``mariadbd``'s user and system ticks from
  ``/proc``: the server must run on this machine).

Each run is on a scratch database ``bench_turncpu_<hex>`` (dropped afterwards). To compare two
versions of the library, run it with ``PYTHONPATH=<other checkout>/src`` and ``--no-src``
(which leaves out this checkout's ``src/``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
if "--no-src" not in sys.argv:
    sys.path.insert(0, str(HERE.parents[1] / "src"))

from sqlalchemy import text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402
from sqlalchemy.ext.asyncio import create_async_engine  # noqa: E402

import agentcontext as ac  # noqa: E402

WORDS = [*(f"w{i}" for i in range(3000)), "agent", "database", "context", "window", "search"]


def server_ticks() -> int:
    """The MariaDB server's user + system CPU time so far, in clock ticks."""
    pid = next(p for p in os.listdir("/proc") if p.isdigit() and _comm(p) in ("mariadbd", "mysqld"))
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _comm(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


async def one_run(url: str, agents: int, turns: int) -> dict[str, Any]:
    name = f"bench_turncpu_{uuid.uuid4().hex[:8]}"
    admin = create_async_engine(url)
    async with admin.begin() as conn:
        await conn.execute(text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
    scratch = make_url(url).set(database=name).render_as_string(hide_password=False)
    try:
        async with ac.SqlContextStore(scratch, pool_size=agents) as store:
            rng = random.Random(1)
            for a in range(agents):
                engine = ac.ContextEngine(store=store, chat_id=f"chat{a}", user_id=f"user{a}")
                engine.set(
                    *(
                        ac.user(words(rng, 60)) if i % 2 == 0 else ac.assistant_text(words(rng, 60))
                        for i in range(200)
                    )
                )
                await engine.save()

            async def agent(a: int) -> None:
                own = random.Random(a)
                for _ in range(turns):
                    engine = ac.ContextEngine(store=store, chat_id=f"chat{a}", user_id=f"user{a}")
                    await engine.resolve()
                    engine.set(ac.user(words(own, 60)), ac.assistant_text(words(own, 60)))
                    await engine.save()

            ticks, cpu, wall = server_ticks(), time.process_time(), time.perf_counter()
            await asyncio.gather(*(agent(a) for a in range(agents)))
            wall = time.perf_counter() - wall
            cpu = time.process_time() - cpu
            ticks = server_ticks() - ticks
    finally:
        async with admin.begin() as conn:
            await conn.execute(text(f"DROP DATABASE `{name}`"))
        await admin.dispose()
    n = agents * turns
    per_tick = 1000 / os.sysconf("SC_CLK_TCK")
    return {
        "turns_per_s": n / wall,
        "client_ms_per_turn": cpu / n * 1000,
        "server_ms_per_turn": ticks * per_tick / n,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--my-url", default="mysql+asyncmy://bench:bench@127.0.0.1:3306/",
        help="a server database whose user may create databases",
    )  # fmt: skip
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--turns", type=int, default=100, help="turns per agent")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--no-src", action="store_true", help="import agentcontext as installed")
    args = parser.parse_args()
    for _ in range(args.runs):
        found = await one_run(args.my_url, args.agents, args.turns)
        print(
            f"{args.agents} agents: {found['turns_per_s']:.0f} turns/s, per turn "
            f"{found['client_ms_per_turn']:.2f} ms of the client's CPU and "
            f"{found['server_ms_per_turn']:.2f} ms of the server's",
            flush=True,
        )


if __name__ == "__main__":
    asyncio.run(main())
