"""Store benchmark: chain loads against the raw driver, and append throughput.

    python benchmarks/bench_store.py [--pg-url postgresql+asyncpg://postgres@127.0.0.1/postgres]

For each backend (SQLite file, PostgreSQL) it prints:

- loading a 10 000-message chain with ``get_message_chain`` against the floor: the raw driver
  (aiosqlite / asyncpg) reading the same rows with one indexed query and decoding their JSON;
  the target is a ratio of at most 1.5;
- append throughput in messages per second, in batches of 100 (``append_messages``: insert +
  head compare-and-swap in one transaction);
- loading a 100 000-message chain.

Times are medians of several runs, measured in the same process one after the other.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiosqlite
import asyncpg
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from agentcontext._validate import loads
from agentcontext.store import MessageRecord, SqlContextStore
from agentcontext.store._rows import gc_paused

DEFAULT_PG = os.environ.get(
    "AGENTCONTEXT_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
)


def message_data(i: int) -> dict[str, Any]:
    role = "user" if i % 2 == 0 else "assistant"
    return {
        "id": f"m{i}",
        "role": role,
        "parts": [{"type": "text", "text": f"Message number {i}: " + "lorem ipsum dolor " * 6}],
    }


async def median_time(fn: Callable[[], Awaitable[Any]], runs: int) -> float:
    await fn()  # warm up
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


async def build_chain(store: SqlContextStore, chat_id: str, n: int) -> str:
    await store.create_chat(chat_id, user_id="bench")
    branch = await store.get_active_branch(chat_id)
    assert branch is not None
    parent: str | None = None
    for start in range(0, n, 1000):
        batch = []
        for i in range(start, min(n, start + 1000)):
            mid = f"{chat_id}-m{i}"
            batch.append(
                MessageRecord(
                    id=mid,
                    chat_id=chat_id,
                    parent_id=parent,
                    name="user" if i % 2 == 0 else "assistant",
                    data=message_data(i),
                )
            )
            parent = mid
        result = await store.append_messages(branch.id, batch, expected_head=batch[0].parent_id)
        assert result.ok
    assert parent is not None
    return parent


async def floor_sqlite(
    path: str, chat_id: str, loads: Callable[[str], Any] = json.loads, paused: bool = False
) -> Callable[[], Awaitable[Any]]:
    db = await aiosqlite.connect(path)

    async def read() -> list[tuple[Any, ...]]:
        cursor = await db.execute(
            "SELECT id, chat_id, parent_id, name, type, data, created_at "
            "FROM messages WHERE chat_id = ?",
            (chat_id,),
        )
        rows = await cursor.fetchall()
        with gc_paused() if paused else contextlib.nullcontext():
            return [(*row[:5], loads(row[5]), row[6]) for row in rows]

    read.close = db.close  # type: ignore[attr-defined]
    return read


async def floor_postgres(
    url: str, chat_id: str, loads: Callable[[str], Any] = json.loads, paused: bool = False
) -> Callable[[], Awaitable[Any]]:
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await asyncpg.connect(dsn)

    async def read() -> list[tuple[Any, ...]]:
        rows = await conn.fetch(
            "SELECT id, chat_id, parent_id, name, type, data, created_at "
            "FROM messages WHERE chat_id = $1",
            chat_id,
        )
        with gc_paused() if paused else contextlib.nullcontext():
            return [(*row[:5], loads(row[5]), row[6]) for row in rows]

    read.close = conn.close  # type: ignore[attr-defined]
    return read


async def bench_backend(
    name: str, url: str, floor_arg: str, *, big: int, runs: int
) -> dict[str, Any]:
    out: dict[str, Any] = {"backend": name}
    async with SqlContextStore(url) as store:
        head = await build_chain(store, "chain10k", 10_000)
        load = await median_time(lambda: store.get_message_chain(head), runs)
        make_floor = floor_sqlite if name == "sqlite" else floor_postgres
        floor = await make_floor(floor_arg, "chain10k")
        rows = await floor()
        assert len(rows) == 10_000
        floor_time = await median_time(floor, runs)
        await floor.close()  # type: ignore[attr-defined]
        # The same floor decoding as the library does (pydantic-core's parser, the cyclic
        # garbage collector paused): what is left of the ratio is the library's own work.
        fast_floor = await make_floor(floor_arg, "chain10k", loads, True)
        fast_floor_time = await median_time(fast_floor, runs)
        await fast_floor.close()  # type: ignore[attr-defined]
        out["chain_10k_ms"] = load * 1000
        out["floor_10k_ms"] = floor_time * 1000
        out["ratio"] = load / floor_time
        out["fast_floor_10k_ms"] = fast_floor_time * 1000
        out["fast_ratio"] = load / fast_floor_time

        # Append throughput: batches of 100 chained messages, each an atomic CAS append.
        await store.create_chat("append", user_id="bench")
        branch = await store.get_active_branch("append")
        assert branch is not None
        head_id: str | None = None
        total = 5_000
        started = time.perf_counter()
        for start in range(0, total, 100):
            batch = []
            for i in range(start, start + 100):
                mid = f"a{i}"
                batch.append(
                    MessageRecord(
                        id=mid,
                        chat_id="append",
                        parent_id=head_id,
                        name="user",
                        data=message_data(i),
                    )
                )
                head_id = mid
            result = await store.append_messages(branch.id, batch, expected_head=batch[0].parent_id)
            assert result.ok
        out["append_msgs_per_s"] = total / (time.perf_counter() - started)

        big_head = await build_chain(store, "chainbig", big)
        started = time.perf_counter()
        chain = await store.get_message_chain(big_head)
        out[f"chain_{big // 1000}k_ms"] = (time.perf_counter() - started) * 1000
        assert len(chain) == big
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="admin URL to create a scratch DB")
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument("--big", type=int, default=100_000, help="size of the long chain")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "bench.db")
        results.append(
            await bench_backend(
                "sqlite", f"sqlite+aiosqlite:///{path}", path, big=args.big, runs=args.runs
            )
        )
    if not args.skip_postgres:
        admin = make_url(args.pg_url)
        dsn = admin.set(drivername="postgresql").render_as_string(hide_password=False)
        name = f"acbench_{uuid.uuid4().hex[:8]}"
        conn = await asyncpg.connect(dsn)
        await conn.execute(f'CREATE DATABASE "{name}"')
        try:
            url = admin.set(database=name).render_as_string(hide_password=False)
            results.append(
                await bench_backend("postgresql", url, url, big=args.big, runs=args.runs)
            )
        finally:
            await conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
            await conn.close()

    big_key = f"chain_{args.big // 1000}k_ms"
    print("\n## Store benchmark\n")
    print(
        "| backend | 10k chain (ms) | floor: raw driver + json.loads (ms) | ratio (target <= 1.5) "
        "| floor decoding as the library does (ms) | ratio "
        f"| append msgs/s (batches of 100) | {args.big // 1000}k chain (ms) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['backend']} | {r['chain_10k_ms']:.1f} | {r['floor_10k_ms']:.1f} "
            f"| **{r['ratio']:.2f}x** | {r['fast_floor_10k_ms']:.1f} | {r['fast_ratio']:.2f}x "
            f"| {r['append_msgs_per_s']:.0f} | {r[big_key]:.0f} |"
        )
    print(
        "\nThe library decodes stored JSON with pydantic-core's parser and pauses the cyclic "
        "garbage collector while it builds a chain's records; the second floor does the same, "
        "so its ratio is the library's own overhead."
    )


if __name__ == "__main__":
    asyncio.run(main())
