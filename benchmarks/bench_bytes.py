"""PostgreSQL bytes per message, one message per save: where they go, and what ``VACUUM``
changes.

    python benchmarks/bench_bytes.py [--pg-url URL] [--messages N]

The shared harness (``shared/bench``) reads the size of each contender's database right after
its appends. With one message per save, every agentcontext save also rewrites the chat's row
(its activity time, change counter and message count) and the branch's row (its head). Those
rows are indexed on what changes (chats by activity time, for ``list_chats`` and retention; a
branch by its head, for the foreign key that guards a message's deletion), so PostgreSQL
cannot update them in place (no HOT update): each save leaves a dead row version and three
index entries. This cell tells those bytes apart from the messages' own, and shows what a
``VACUUM`` (as autovacuum runs it in a live database) does to them.

Beside the harness's cell, on its floor (its raw schema: ``messages (id text PRIMARY KEY,
chat_id, parent_id, seq, data json)``, a unique index on ``(chat_id, seq)``, one ``INSERT``
per call in a transaction) and through the public API (``engine.set(user(...))`` and
``await engine.save()`` per message), each in a scratch database of its own:

1. N messages saved one per call; bytes of every table, index and TOAST (the harness's reading);
2. ``VACUUM`` (plain: dead rows and index entries freed for reuse, files unchanged);
3. N more messages; the bytes again, over 2N messages;
4. ``VACUUM`` again, and the bytes of each of agentcontext's relations, largest first.

The message texts are this project's workload (``_workload.py``: ~400 characters of
Zipf-distributed words), not the harness's, so the search index's share differs from it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path

import asyncpg
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import conversation, message_data, ratio, row

from agentcontext import ContextEngine, SqlContextStore, assistant_text, user

DEFAULT_PG = os.environ.get(
    "AGENTCONTEXT_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
)
CHAT = "chat-001"

_SIZE = """
SELECT c.relname, c.relkind, pg_relation_size(c.oid)
FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i', 't')
UNION ALL
SELECT 'toast of ' || c.relname, 't', pg_relation_size(c.reltoastrelid)
FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind = 'r' AND c.reltoastrelid <> 0
"""
_TOTAL = """
SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)
FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind = 'r'
"""


def _dsn(url: str, database: str | None = None) -> str:
    parsed = make_url(url)
    if database is not None:
        parsed = parsed.set(database=database)
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


class Scratch:
    """A database of its own, dropped at the end."""

    def __init__(self, url: str, label: str) -> None:
        self.url = url
        self.name = f"bench_bytes_{label}_{uuid.uuid4().hex[:8]}"

    async def __aenter__(self) -> Scratch:
        admin = await asyncpg.connect(_dsn(self.url))
        try:
            await admin.execute(f'CREATE DATABASE "{self.name}"')
        finally:
            await admin.close()
        self.conn = await asyncpg.connect(_dsn(self.url, self.name))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.conn.close()
        admin = await asyncpg.connect(_dsn(self.url))
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        finally:
            await admin.close()

    @property
    def sqlalchemy_url(self) -> str:
        return make_url(self.url).set(database=self.name).render_as_string(hide_password=False)

    async def total(self) -> int:
        return int(await self.conn.fetchval(_TOTAL))

    async def vacuum(self) -> None:
        await self.conn.execute("VACUUM")

    async def relations(self) -> list[tuple[str, int]]:
        rows = await self.conn.fetch(_SIZE)
        return sorted(((r[0], int(r[2])) for r in rows if r[2]), key=lambda r: -r[1])


async def floor_saves(db: Scratch, messages: list[tuple[str, str, str]], start: int) -> None:
    """The harness's raw PostgreSQL floor: one INSERT per call, in a transaction."""
    if start == 0:
        await db.conn.execute(
            "CREATE TABLE messages (id text PRIMARY KEY, chat_id text NOT NULL, parent_id text, "
            "seq bigint NOT NULL, data json NOT NULL);"
            "CREATE UNIQUE INDEX messages_chat_seq ON messages (chat_id, seq);"
            "CREATE TABLE branches (id text PRIMARY KEY, chat_id text NOT NULL, "
            "name text NOT NULL, head_id text NOT NULL, head_seq bigint NOT NULL);"
        )
    insert = await db.conn.prepare(
        "INSERT INTO messages (id, chat_id, parent_id, seq, data) VALUES ($1, $2, $3, $4, $5)"
    )
    parent = messages[start - 1][0] if start else None
    for seq, (message_id, role, body) in enumerate(messages[start:], start):
        async with db.conn.transaction():
            await insert.fetch(
                message_id, CHAT, parent, seq, json.dumps(message_data(message_id, role, body))
            )
        parent = message_id


async def store_saves(engine: ContextEngine, messages: list[tuple[str, str, str]]) -> None:
    """One message per ``save()``, through the public API."""
    for message_id, role, body in messages:
        make = user if role == "user" else assistant_text
        engine.set(make(body, id=message_id))
        await engine.save()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    parser.add_argument("--messages", type=int, default=10_000)
    args = parser.parse_args()
    n = args.messages
    messages = conversation(2 * n, seed=3)
    readings: dict[str, list[int]] = {"floor": [], "agentcontext": []}
    breakdown: list[tuple[str, int]] = []

    async with Scratch(args.pg_url, "floor") as db:
        started = time.perf_counter()
        await floor_saves(db, messages[:n], 0)
        readings["floor"].append(await db.total())
        await db.vacuum()
        readings["floor"].append(await db.total())
        await floor_saves(db, messages, n)
        readings["floor"].append(await db.total())
        print(f"floor: {time.perf_counter() - started:.1f} s", file=sys.stderr)

    async with Scratch(args.pg_url, "agentcontext") as db:
        started = time.perf_counter()
        store = SqlContextStore(db.sqlalchemy_url)
        try:
            await store.initialize()
            engine = ContextEngine(store=store, chat_id=CHAT, user_id="user-001")
            await store_saves(engine, messages[:n])
            readings["agentcontext"].append(await db.total())
            await db.vacuum()
            readings["agentcontext"].append(await db.total())
            await store_saves(engine, messages[n:])
            readings["agentcontext"].append(await db.total())
        finally:
            await store.close()
        await db.vacuum()
        breakdown = await db.relations()
        print(f"agentcontext: {time.perf_counter() - started:.1f} s", file=sys.stderr)

    counts = (n, n, 2 * n)
    print(f"PostgreSQL, one message per save, bytes per message ({n:,} then {2 * n:,})\n")
    print(row("reading", "floor", "agentcontext", "ratio"))
    print(row("---", "---:", "---:", "---:"))
    steps = (
        f"after {n:,} saves (the harness's reading)",
        "after VACUUM",
        f"after {n:,} more saves ({2 * n:,} messages)",
    )
    for step, count, base, ours in zip(
        steps, counts, readings["floor"], readings["agentcontext"], strict=True
    ):
        print(row(step, f"{base / count:,.0f}", f"{ours / count:,.0f}", ratio(ours, base)))
    print(f"\nagentcontext's relations after {2 * n:,} messages and a VACUUM:\n")
    print(row("relation", "bytes", "per message"))
    print(row("---", "---:", "---:"))
    for name, size in breakdown:
        if size >= 16_384:
            print(row(name, f"{size:,}", f"{size / (2 * n):,.1f}"))


if __name__ == "__main__":
    asyncio.run(main())
