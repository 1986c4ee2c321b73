"""Search at 100 000 messages on MariaDB against a LIKE scan: the MariaDB cell of bench_search.py.

    python benchmarks/bench_search_mariadb.py [--my-url URL] [--messages N] [--runs N]

The same chat as ``benchmarks/bench_search.py`` builds (its sentence generator and seed: one
chat of ``--messages`` messages, the rare word in 0.1 % of them, written with
``add_messages`` 5 000 at a time), on a scratch database ``bench_acsearch_<hex>`` of the
server (dropped afterwards), then an untimed ``ANALYZE TABLE`` of the store's tables.
Measured, medians of ``--runs`` calls after a warm-up call:

- ``search_messages(chat, RARE, limit=hits)``: every hit, ranked, with snippets;
- ``search_messages(chat, RARE)``: the top 20 (the default);
- the floor: the raw driver (asyncmy, one connection) scanning the same chat's stored JSON
  with a case-insensitive ``LIKE '%word%'`` (``COLLATE utf8mb4_general_ci``, as PostgreSQL's
  floor uses ``ILIKE``); it only finds the rows. Target: search at least 20x faster.

The user of the URL needs the right to create and drop the ``bench_*`` databases (the shared
harness's ``bench/my.sh`` makes such a user, ``bench``/``bench``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1] / "src"))
sys.path.insert(0, str(HERE.parent))

import asyncmy  # noqa: E402
from bench_search import RARE, fill_search_chat, median_ms, time_searches  # noqa: E402
from sqlalchemy import text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

import agentcontext  # noqa: E402
from agentcontext.store import SqlContextStore  # noqa: E402


async def analyze(store: SqlContextStore) -> None:
    async with store.engine.connect() as conn:
        names = (await conn.execute(text("SHOW TABLES"))).scalars().all()
        await conn.execute(text("ANALYZE TABLE " + ", ".join(f"`{n}`" for n in names)))


async def run(url: str, messages: int, runs: int) -> dict:
    parsed = make_url(url)
    conn_args = {
        "host": parsed.host or "127.0.0.1",
        "port": parsed.port or 3306,
        "user": parsed.username,
        "password": parsed.password or "",
    }
    database = f"bench_acsearch_{uuid.uuid4().hex[:8]}"
    admin = await asyncmy.connect(**conn_args, autocommit=True)
    async with admin.cursor() as cur:
        await cur.execute(f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4")
    out: dict = {"backend": "mariadb", "messages": messages, "runs": runs}
    try:
        store_url = parsed.set(drivername="mysql+asyncmy", database=database)
        async with SqlContextStore(store_url.render_as_string(hide_password=False)) as store:
            started = time.perf_counter()
            # bench_search's fill ends with a bare ANALYZE (SQLite / PostgreSQL syntax):
            # MariaDB refuses it; the rows are all in by then, the ANALYZE TABLE below replaces it.
            try:
                hits = await fill_search_chat(store, messages)
            except Exception as exc:
                if "ANALYZE" not in str(exc):
                    raise
                hits = len(range(0, messages, 1000))
            out["build_s"] = time.perf_counter() - started
            await analyze(store)
            await time_searches(store, hits, runs, out)

            raw = await asyncmy.connect(**conn_args, db=database, autocommit=True)

            async def scan() -> list:
                async with raw.cursor() as cur:
                    await cur.execute(
                        "SELECT id, data FROM messages WHERE chat_id = %s "
                        "AND data COLLATE utf8mb4_general_ci LIKE %s",
                        ("big", f"%{RARE}%"),
                    )
                    return list(await cur.fetchall())

            assert len(await scan()) == hits
            out["like_ms"] = await median_ms(scan, runs)
            raw.close()
    finally:
        async with admin.cursor() as cur:
            await cur.execute(f"DROP DATABASE IF EXISTS `{database}`")
        admin.close()
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--my-url", default="mysql+asyncmy://bench:bench@127.0.0.1:3306/")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--out", help="JSON file for the figures")
    args = parser.parse_args()
    r = await run(args.my_url, args.messages, args.runs)
    r["agentcontext"] = str(Path(agentcontext.__file__).parent)
    n = args.messages
    print(f"\n## Search on MariaDB: {n:,} messages in one chat, a word in 0.1 % of them\n")
    print(f"build: {r['build_s']:.1f} s ({n / r['build_s']:,.0f} messages/s, add_messages)\n")
    print(
        "| backend | LIKE scan, raw driver (ms) | search, all hits (ms) | speed-up "
        "| search, top 20 (ms) | speed-up |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    print(
        f"| mariadb | {r['like_ms']:.2f} | {r['search_ms']:.2f} "
        f"| **{r['like_ms'] / r['search_ms']:.1f}x** | {r['top20_ms']:.2f} "
        f"| **{r['like_ms'] / r['top20_ms']:.1f}x** |"
    )
    print(f"\n{r['hits']} hits. Target: at least 20x.")
    if args.out:
        write_json(args.out, r)


def write_json(path: str, figures: dict) -> None:
    Path(path).write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
