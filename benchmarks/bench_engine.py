"""Engine benchmark: incremental resolve, history-independent writes, and the raw-driver floor.

    python benchmarks/bench_engine.py [--pg-url postgresql+asyncpg://postgres@127.0.0.1/postgres]
                                      [--skip-postgres] [--runs 9] [--big 100000]

For each backend (an SQLite file, and a scratch PostgreSQL database created and dropped here)
it prints the ratios below with their targets. Long histories are written with the store
directly (``append_messages`` in batches of 1000); every time is the median of ``--runs`` runs
after one warm-up run, measured in this process one after the other.

- **warm vs cold resolve** at 10 000 messages: ``resolve()`` on an engine that already holds
  the chain, right after it saved a 2-message turn, against ``resolve()`` on a new engine for
  the same chat of a store that decoded nothing (``cache_bytes=0``: it loads everything).
  Target: cold / warm >= 20.
- **fresh engines on a warm store**: ``resolve()`` on a new engine of the store whose memory
  holds the chat (``cache_bytes``), right after another engine's turn and unchanged since,
  against the cold one. Targets: <= 0.25 and <= 0.2.
- **history independence**: saving a 2-message turn, ``rewind`` (to the last turn's user
  message), ``btw`` and ``checkpoint`` with 100 and with 100 000 messages of history (warm
  engines). Target: ratio <= 1.3.
- **save vs raw insert**: ``save()`` of one message (insert + head compare-and-swap in one
  transaction) against the raw driver (aiosqlite / asyncpg) inserting one row into the same
  table in its own transaction (BEGIN; INSERT; COMMIT). Target: ratio <= 2.
- **rewind + resolve vs raw read**: ``rewind()`` to the middle of a 10 000-message chain and
  ``resolve()`` of the new branch, against the raw driver reading those 5 000 rows with one
  query and decoding their JSON. Target: ratio <= 1.2. Shown for a warm engine (the chat is
  open, as in an application) and, for information, for a new engine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiosqlite
import asyncpg
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from agentcontext import ContextEngine, assistant_text, user
from agentcontext.store import MessageRecord, SqlContextStore

DEFAULT_PG = os.environ.get(
    "AGENTCONTEXT_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
)
TEXT = "lorem ipsum dolor " * 6


def message_data(message_id: str, i: int) -> dict[str, Any]:
    role = "user" if i % 2 == 0 else "assistant"
    return {"id": message_id, "role": role, "parts": [{"type": "text", "text": f"{i}: {TEXT}"}]}


async def build_chat(store: SqlContextStore, chat_id: str, n: int) -> list[str]:
    """A chat whose main branch is a chain of ``n`` messages; returns their ids, root first."""
    await store.create_chat(chat_id, user_id="bench")
    branch = await store.get_active_branch(chat_id)
    assert branch is not None
    ids: list[str] = []
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
                    data=message_data(mid, i),
                )
            )
            ids.append(mid)
            parent = mid
        result = await store.append_messages(branch.id, batch, expected_head=batch[0].parent_id)
        assert result.ok
    return ids


def engine(store: SqlContextStore, chat_id: str) -> ContextEngine:
    return ContextEngine(store=store, chat_id=chat_id, user_id="bench")


class Timer:
    """Collects samples of one measurement; the first one is a warm-up and is dropped."""

    def __init__(self) -> None:
        self.samples: list[float] = []

    async def time(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        started = time.perf_counter()
        result = await fn()
        self.samples.append(time.perf_counter() - started)
        return result

    @property
    def median(self) -> float:
        return statistics.median(self.samples[1:] if len(self.samples) > 1 else self.samples)


def turn(n: int) -> tuple[Any, Any]:
    return user(f"question {n}: {TEXT}"), assistant_text(f"answer {n}: {TEXT}")


# --- raw driver floors ------------------------------------------------------------------


class RawSqlite:
    def __init__(self, path: str) -> None:
        self.path = path

    async def open(self) -> None:
        self.db = await aiosqlite.connect(self.path, isolation_level=None)
        # The store's connection settings, so the floor pays the same durability.
        await self.db.execute("PRAGMA synchronous = NORMAL")
        await self.db.execute("PRAGMA foreign_keys = ON")

    async def insert_one(self, chat_id: str, message_id: str) -> None:
        await self.db.execute("BEGIN")
        await self.db.execute(
            "INSERT INTO messages (id, chat_id, parent_id, depth, name, type, data, "
            "created_at, version) VALUES (?, ?, NULL, 1, 'user', 'message', ?, ?, 1)",
            (
                message_id,
                chat_id,
                json.dumps(message_data(message_id, 0)),
                datetime.now(UTC).isoformat(timespec="microseconds"),
            ),
        )
        await self.db.execute("COMMIT")

    async def read_chain_prefix(self, chat_id: str, depth: int) -> list[tuple[Any, ...]]:
        cursor = await self.db.execute(
            "SELECT id, chat_id, parent_id, name, type, data, created_at FROM messages "
            "WHERE chat_id = ? AND depth <= ?",
            (chat_id, depth),
        )
        rows = await cursor.fetchall()
        return [(*row[:5], json.loads(row[5]), row[6]) for row in rows]

    async def close(self) -> None:
        await self.db.close()


class RawPostgres:
    def __init__(self, url: str) -> None:
        self.dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)

    async def open(self) -> None:
        self.conn = await asyncpg.connect(self.dsn)

    async def insert_one(self, chat_id: str, message_id: str) -> None:
        async with self.conn.transaction():  # BEGIN; INSERT; COMMIT
            await self.conn.execute(
                "INSERT INTO messages (id, chat_id, parent_id, depth, name, type, data, "
                "created_at, version) VALUES ($1, $2, NULL, 1, 'user', 'message', "
                "$3::jsonb, $4, 1)",
                message_id,
                chat_id,
                json.dumps(message_data(message_id, 0)),
                datetime.now(UTC),
            )

    async def read_chain_prefix(self, chat_id: str, depth: int) -> list[tuple[Any, ...]]:
        rows = await self.conn.fetch(
            "SELECT id, chat_id, parent_id, name, type, data::text, created_at FROM messages "
            "WHERE chat_id = $1 AND depth <= $2",
            chat_id,
            depth,
        )
        return [(*row[:5], json.loads(row[5]), row[6]) for row in rows]

    async def close(self) -> None:
        await self.conn.close()


# --- measurements -----------------------------------------------------------------------


async def resolve_warm_vs_cold(store: SqlContextStore, url: str, runs: int) -> dict[str, float]:
    """Warm engine, fresh engines on this store (its decoded-chain memory: right after another
    engine's turn, and unchanged since), and fresh engines on a store that decoded nothing."""
    await build_chat(store, "r10k", 10_000)
    warm = engine(store, "r10k")
    assert len((await warm.resolve()).messages) == 10_000
    timers = {key: Timer() for key in ("warm", "cold", "fresh_turn", "fresh_same")}
    async with SqlContextStore(url, cache_bytes=0) as blank:
        for n in range(runs + 1):
            warm.set(*turn(n))
            await warm.save()
            result = await timers["warm"].time(warm.resolve)
            assert len(result.messages) == 10_002 + 2 * n
            for key in ("fresh_turn", "fresh_same"):
                fresh = engine(store, "r10k")
                assert len((await timers[key].time(fresh.resolve)).messages) == 10_002 + 2 * n
            cold = engine(blank, "r10k")
            assert len((await timers["cold"].time(cold.resolve)).messages) == 10_002 + 2 * n
    return {key: timer.median for key, timer in timers.items()}


async def history_independence(
    store: SqlContextStore, big: int, runs: int
) -> dict[str, dict[str, float]]:
    sizes = {"small": 100, "big": big}
    engines: dict[str, ContextEngine] = {}
    for key, size in sizes.items():
        await build_chat(store, f"h{key}", size)
        engines[key] = engine(store, f"h{key}")
        assert len(await engines[key].get_messages()) == size
    timers = {op: {key: Timer() for key in sizes} for op in ("save", "rewind", "btw", "checkpoint")}
    for n in range(runs + 1):
        for key, e in engines.items():  # interleaved, so drift hits both sizes alike
            e.set(*turn(n))
            await timers["save"][key].time(e.save)
            # Rewind to the user message of the last turn (to retry the answer); then back to
            # main (untimed), which re-attaches the answer the rewind cut off.
            question = (await e.get_messages())[-2].id
            await timers["rewind"][key].time(lambda e=e, question=question: e.rewind(question))
            await e.switch_branch("main")
            await timers["btw"][key].time(e.btw)
            await timers["checkpoint"][key].time(lambda e=e: e.checkpoint("bench"))
    return {op: {key: t.median for key, t in by_size.items()} for op, by_size in timers.items()}


async def save_vs_raw_insert(store: SqlContextStore, raw: Any, runs: int) -> dict[str, float]:
    await store.create_chat("one", user_id="bench")
    await store.create_chat("raw", user_id="bench")
    e = engine(store, "one")
    await e.get_messages()
    save_t, raw_t = Timer(), Timer()
    for n in range(runs * 3 + 1):
        e.set(user(f"message {n}: {TEXT}"))
        await save_t.time(e.save)
        await raw_t.time(lambda n=n: raw.insert_one("raw", f"raw-{n}"))
    return {"save": save_t.median, "raw": raw_t.median}


async def rewind_resolve_vs_raw_read(
    store: SqlContextStore, raw: Any, runs: int
) -> dict[str, float]:
    ids = await build_chat(store, "mid10k", 10_000)
    middle = ids[4_999]
    warm = engine(store, "mid10k")
    await warm.resolve()
    warm_t, cold_t, raw_t = Timer(), Timer(), Timer()

    async def rewind_and_resolve(e: ContextEngine) -> None:
        await e.rewind(middle)
        result = await e.resolve()
        assert len(result.messages) == 5_000
        assert result.messages[-1].id == middle

    for _ in range(runs + 1):
        await warm_t.time(lambda: rewind_and_resolve(warm))
        await warm.switch_branch("main")
        await warm.resolve()  # warm again on the whole chain (untimed)
        cold = engine(store, "mid10k")
        await cold_t.time(lambda cold=cold: rewind_and_resolve(cold))
        await cold.switch_branch("main")
        rows = await raw_t.time(lambda: raw.read_chain_prefix("mid10k", 5_000))
        assert len(rows) == 5_000
    return {"warm": warm_t.median, "cold": cold_t.median, "raw": raw_t.median}


async def bench_backend(name: str, url: str, raw: Any, *, big: int, runs: int) -> dict[str, Any]:
    out: dict[str, Any] = {"backend": name}
    async with SqlContextStore(url) as store:
        await raw.open()
        try:
            out["resolve"] = await resolve_warm_vs_cold(store, url, runs)
            out["history"] = await history_independence(store, big, runs)
            out["insert"] = await save_vs_raw_insert(store, raw, runs)
            out["rewind_read"] = await rewind_resolve_vs_raw_read(store, raw, runs)
        finally:
            await raw.close()
    return out


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def report(results: list[dict[str, Any]], big: int) -> None:
    rows: list[tuple[str, str, list[str]]] = []

    def row(label: str, target: str, cell: Callable[[dict[str, Any]], str]) -> None:
        rows.append((label, target, [cell(r) for r in results]))

    row(
        "resolve() at 10k: cold / warm (after a 2-message save)",
        ">= 20x",
        lambda r: (
            f"**{r['resolve']['cold'] / r['resolve']['warm']:.1f}x** "
            f"({ms(r['resolve']['cold'])} / {ms(r['resolve']['warm'])})"
        ),
    )
    row(
        "resolve() at 10k, fresh engine on a store that decoded the chat / cold: "
        "after another engine's turn; unchanged",
        "<= 0.25x; <= 0.2x",
        lambda r: (
            f"**{r['resolve']['fresh_turn'] / r['resolve']['cold']:.3f}x**; "
            f"**{r['resolve']['fresh_same'] / r['resolve']['cold']:.3f}x** "
            f"({ms(r['resolve']['fresh_turn'])}; {ms(r['resolve']['fresh_same'])})"
        ),
    )
    for op, label in (
        ("save", "save() of a 2-message turn"),
        ("rewind", "rewind()"),
        ("btw", "btw()"),
        ("checkpoint", "checkpoint()"),
    ):
        row(
            f"{label}: {big:,} / 100 messages of history",
            "<= 1.3x",
            lambda r, op=op: (
                f"**{r['history'][op]['big'] / r['history'][op]['small']:.2f}x** "
                f"({ms(r['history'][op]['big'])} / {ms(r['history'][op]['small'])})"
            ),
        )
    row(
        "save() of 1 message / raw BEGIN; INSERT; COMMIT",
        "<= 2x",
        lambda r: (
            f"**{r['insert']['save'] / r['insert']['raw']:.2f}x** "
            f"({ms(r['insert']['save'])} / {ms(r['insert']['raw'])})"
        ),
    )
    row(
        "rewind to the middle of 10k + resolve(), warm engine / raw read of 5k rows",
        "<= 1.2x",
        lambda r: (
            f"**{r['rewind_read']['warm'] / r['rewind_read']['raw']:.2f}x** "
            f"({ms(r['rewind_read']['warm'])} / {ms(r['rewind_read']['raw'])})"
        ),
    )
    row(
        "the same with a new engine (loads the 5k chain) / raw read",
        "(info)",
        lambda r: (
            f"{r['rewind_read']['cold'] / r['rewind_read']['raw']:.2f}x "
            f"({ms(r['rewind_read']['cold'])} / {ms(r['rewind_read']['raw'])})"
        ),
    )
    print("\n## Engine benchmark\n")
    print("| measurement | target | " + " | ".join(r["backend"] for r in results) + " |")
    print("|---|---|" + "---:|" * len(results))
    for label, target, cells in rows:
        print(f"| {label} | {target} | " + " | ".join(cells) + " |")
    print("\nRatios in bold, then the two medians they divide.")


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="admin URL to create a scratch DB")
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument("--big", type=int, default=100_000, help="the long history")
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "bench.db")
        results.append(
            await bench_backend(
                "sqlite",
                f"sqlite+aiosqlite:///{path}",
                RawSqlite(path),
                big=args.big,
                runs=args.runs,
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
                await bench_backend(
                    "postgresql", url, RawPostgres(url), big=args.big, runs=args.runs
                )
            )
        finally:
            await conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
            await conn.close()
    report(results, args.big)


if __name__ == "__main__":
    asyncio.run(main())
