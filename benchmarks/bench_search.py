"""Search and listing at scale, on SQLite and PostgreSQL.

    python benchmarks/bench_search.py [--pg-url ...] [--skip-postgres] [--messages N] [--chats N]

- **Full-text search**: one chat of 100 000 messages, a rare word in 0.1 % of them.
  ``search_messages`` (ranked, with snippets, every hit) against the floor of a ``LIKE`` scan
  of the same rows by the raw driver (aiosqlite / asyncpg). Target: at least 20x faster.
- **Listing**: 10 000 chats for one user and 10 000 for another; ``list_chats`` for a page of
  20 of one user, with the query plan showing the index it uses.

Times are medians of several runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiosqlite
import asyncpg
from sqlalchemy import text
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from agentcontext.store import MessageRecord, SqlContextStore
from agentcontext.store._db.schema import branches, chats

DEFAULT_PG = os.environ.get(
    "AGENTCONTEXT_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
)
RARE = "zebracorn"
WORDS = (  # noqa: SIM905 - a readable word list
    "the of and to in is you that it he was for on are as with his they at be this have "
    "from or one had by word but not what all were we when your can said there use an "
    "each which she do how their if will up other about out many then them these so some "
    "her would make like him into time has look two more write go see number no way "
    "could people my than first water been call who oil its now find long down day did "
    "get come made may part "
).split()


async def median_ms(fn: Callable[[], Awaitable[Any]], runs: int) -> float:
    await fn()
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


def sentence(rng: random.Random, rare: bool) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(12, 30))]
    if rare:
        words.insert(rng.randrange(len(words)), RARE)
    return " ".join(words).capitalize() + "."


async def fill_search_chat(store: SqlContextStore, n: int) -> int:
    rng = random.Random(7)
    await store.create_chat("big", user_id="bench")
    rare_every = 1000  # 0.1 %
    hits = 0
    for start in range(0, n, 5000):
        batch = []
        for i in range(start, min(n, start + 5000)):
            rare = i % rare_every == 0
            hits += rare
            batch.append(
                MessageRecord(
                    id=f"s{i}",
                    chat_id="big",
                    parent_id=None,
                    name="user" if i % 2 else "assistant",
                    data={
                        "id": f"s{i}",
                        "role": "user",
                        "parts": [{"type": "text", "text": sentence(rng, rare)}],
                    },
                )
            )
        await store.add_messages(batch)
    # Fresh statistics, as autovacuum or a periodic ANALYZE keeps them in a live database;
    # without them PostgreSQL's planner guesses the chat holds a handful of rows.
    async with store.engine.begin() as conn:
        await conn.execute(text("ANALYZE"))
    return hits


async def fill_chats(store: SqlContextStore, per_user: int) -> None:
    base = datetime(2026, 1, 1, tzinfo=UTC)
    rows, main_branches = [], []
    for user in ("alice", "bob"):
        for i in range(per_user):
            stamp = base + timedelta(seconds=i)
            chat_id = f"{user}-{i:05d}"
            rows.append(
                {
                    "id": chat_id,
                    "user_id": user,
                    "title": f"chat {i}",
                    "metadata": {"n": i % 7},
                    "created_at": stamp,
                    "updated_at": stamp,
                    "version": 1,
                }
            )
            main_branches.append(
                {
                    "id": uuid.uuid4().hex,
                    "chat_id": chat_id,
                    "name": "main",
                    "head_message_id": None,
                    "is_active": True,
                    "created_at": stamp,
                }
            )
    async with store.engine.begin() as conn:
        await conn.execute(chats.insert(), rows)
        await conn.execute(branches.insert(), main_branches)
        if store.dialect_name == "postgresql":
            await conn.execute(text("ANALYZE chats"))
            await conn.execute(text("ANALYZE branches"))
        else:
            await conn.execute(text("ANALYZE"))


async def query_plan(store: SqlContextStore) -> str:
    query = store.list_chats_query(user_id="alice", limit=20)
    compiled = str(query.compile(store.engine, compile_kwargs={"literal_binds": True}))
    explain = "EXPLAIN QUERY PLAN " if store.dialect_name == "sqlite" else "EXPLAIN "
    async with store.engine.connect() as conn:
        rows = (await conn.execute(text(explain + compiled))).all()
    if store.dialect_name == "sqlite":
        return "\n".join(f"  {row[-1]}" for row in rows)
    return "\n".join(f"  {row[0]}" for row in rows)


async def like_floor(name: str, url: str) -> Callable[[], Awaitable[Any]]:
    if name == "sqlite":
        db = await aiosqlite.connect(make_url(url).database or "")

        async def sqlite_scan() -> Any:
            cursor = await db.execute(
                "SELECT id, data FROM messages WHERE chat_id = ? AND data LIKE ?",
                ("big", f"%{RARE}%"),
            )
            return await cursor.fetchall()

        sqlite_scan.close = db.close  # type: ignore[attr-defined]
        return sqlite_scan
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await asyncpg.connect(dsn)

    async def pg_scan() -> Any:
        return await conn.fetch(
            "SELECT id, data::text FROM messages WHERE chat_id = $1 AND data::text ILIKE $2",
            "big",
            f"%{RARE}%",
        )

    pg_scan.close = conn.close  # type: ignore[attr-defined]
    return pg_scan


async def time_searches(store: SqlContextStore, hits: int, runs: int, out: dict[str, Any]) -> None:
    """Check the search of the big chat finds its ``hits``, then time every hit and the top 20."""
    found = await store.search_messages("big", RARE, limit=hits)
    assert len(found) == hits, (len(found), hits)
    assert all("<mark>" in result.snippet for result in found)
    out["hits"] = hits
    out["search_ms"] = await median_ms(lambda: store.search_messages("big", RARE, limit=hits), runs)
    out["top20_ms"] = await median_ms(lambda: store.search_messages("big", RARE), runs)


async def bench(name: str, url: str, messages: int, per_user: int, runs: int) -> dict[str, Any]:
    out: dict[str, Any] = {"backend": name}
    async with SqlContextStore(url) as store:
        hits = await fill_search_chat(store, messages)
        await time_searches(store, hits, runs, out)
        scan = await like_floor(name, url)
        assert len(await scan()) == hits
        out["like_ms"] = await median_ms(scan, runs)
        await scan.close()  # type: ignore[attr-defined]

        await fill_chats(store, per_user)
        page = await store.list_chats(user_id="alice", limit=20)
        assert [c.id for c in page][:2] == [
            f"alice-{per_user - 1:05d}",
            f"alice-{per_user - 2:05d}",
        ]
        out["list_ms"] = await median_ms(lambda: store.list_chats(user_id="alice", limit=20), runs)
        out["list_deep_ms"] = await median_ms(
            lambda: store.list_chats(user_id="alice", limit=20, offset=per_user // 2), runs
        )
        out["plan"] = await query_plan(store)
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--chats", type=int, default=10_000, help="chats per user")
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite+aiosqlite:///{Path(tmp) / 'search.db'}"
        results.append(await bench("sqlite", url, args.messages, args.chats, args.runs))
    if not args.skip_postgres:
        admin = make_url(args.pg_url)
        dsn = admin.set(drivername="postgresql").render_as_string(hide_password=False)
        database = f"acbench_{uuid.uuid4().hex[:8]}"
        conn = await asyncpg.connect(dsn)
        await conn.execute(f'CREATE DATABASE "{database}"')
        try:
            url = admin.set(database=database).render_as_string(hide_password=False)
            results.append(await bench("postgresql", url, args.messages, args.chats, args.runs))
        finally:
            await conn.execute(f'DROP DATABASE "{database}" WITH (FORCE)')
            await conn.close()

    print(f"\n## Search: {args.messages:,} messages in one chat, a word in 0.1 % of them\n")
    print(
        "| backend | LIKE scan, raw driver (ms) | search, all hits (ms) | speed-up "
        "| search, top 20 (ms) | speed-up |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['backend']} | {r['like_ms']:.2f} | {r['search_ms']:.2f} "
            f"| **{r['like_ms'] / r['search_ms']:.1f}x** | {r['top20_ms']:.2f} "
            f"| **{r['like_ms'] / r['top20_ms']:.1f}x** |"
        )
    print(
        f"\n{results[0]['hits']} hits; search ranks them and makes snippets, the LIKE scan only "
        "finds them. Target: at least 20x."
    )
    print(f"\n## Listing: {args.chats:,} chats for each of two users, a page of 20\n")
    print(f"| backend | first page (ms) | page at offset {args.chats // 2:,} (ms) |")
    print("|---|---:|---:|")
    for r in results:
        print(f"| {r['backend']} | {r['list_ms']:.2f} | {r['list_deep_ms']:.2f} |")
    for r in results:
        print(f"\nQuery plan of list_chats(user_id=..., limit=20) on {r['backend']}:\n")
        print(r["plan"])


if __name__ == "__main__":
    asyncio.run(main())
