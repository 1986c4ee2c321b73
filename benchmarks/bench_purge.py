"""Storage after purging a compacted chat, on SQLite and PostgreSQL.

    python benchmarks/bench_purge.py [--pg-url ...] [--skip-postgres] [--messages N] [--tail N]

One chat of 100 000 messages (a sentence of text each), compacted so that only the last
``--tail`` messages (20 by default) stay after the compaction point, with a deleted side
branch of 1 000 messages. ``store.purge()`` then deletes everything no branch, checkpoint or
compaction tail reaches. Measured before and after, each after a ``VACUUM``:

- SQLite: the database file's pages (``page_count * page_size``);
- PostgreSQL: ``pg_total_relation_size`` of the store's tables (indexes and TOAST included)
  after ``VACUUM FULL`` (a plain ``VACUUM`` makes the space reusable by later rows without
  shrinking the files), in a database of its own.

Also a second, empty-history chat of the same tail written directly: the floor the purged
chat's rows should come close to. Target: after the purge, the chat costs no more than a
small multiple of what its tail alone costs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiosqlite
import asyncpg
from sqlalchemy import text
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from agentcontext.store import MessageRecord, SqlContextStore
from agentcontext.store._ops.retention import TABLES
from agentcontext.store.records import compaction_id

DEFAULT_PG = os.environ.get(
    "AGENTCONTEXT_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
)
SENTENCE = "the ledger balances while the quick brown fox jumps over the lazy dog number {i}"


def record(chat_id: str, message_id: str, parent: str | None, i: int) -> MessageRecord:
    role = "user" if i % 2 == 0 else "assistant"
    data = {
        "id": message_id,
        "role": role,
        "parts": [{"type": "text", "text": SENTENCE.format(i=i)}],
    }
    return MessageRecord(id=message_id, chat_id=chat_id, parent_id=parent, name=role, data=data)


async def fill(store: SqlContextStore, chat_id: str, n: int, branch: str = "main") -> list[str]:
    """``n`` messages in a chain on the chat's active branch; their ids."""
    await store.upsert_chat(chat_id, user_id="bench")
    active = await store.get_active_branch(chat_id)
    assert active is not None
    head = active.head_message_id
    ids: list[str] = []
    for start in range(0, n, 2_000):
        batch = []
        for i in range(start, min(n, start + 2_000)):
            message_id = f"{chat_id}-{branch}-{i}"
            batch.append(record(chat_id, message_id, head, i))
            head = message_id
            ids.append(message_id)
        await store.append_messages(active.id, batch, expected_head=batch[0].parent_id)
    return ids


async def compacted_chat(store: SqlContextStore, chat_id: str, n: int, tail: int) -> None:
    ids = await fill(store, chat_id, n)
    # A side branch of 1 000 messages from the middle, then deleted.
    middle = ids[n // 2]
    side = [record(chat_id, f"{chat_id}-side-0", middle, 0)]
    for i in range(1, 1_000):
        side.append(record(chat_id, f"{chat_id}-side-{i}", side[-1].id, i))
    await store.fork_branch(chat_id, "main", head_message_id=middle, activate=False, name="side")
    branch = await store.get_branch(chat_id, "side")
    assert branch is not None
    for start in range(0, len(side), 500):
        batch = side[start : start + 500]
        await store.append_messages(branch.id, batch, expected_head=batch[0].parent_id)
    await store.delete_branch(chat_id, "side")
    point = ids[n - tail - 1]
    summary = compaction_id(chat_id, point)
    await store.add_message(
        MessageRecord(
            id=summary,
            chat_id=chat_id,
            parent_id=point,
            name="user",
            type="compaction",
            data={"id": summary, "role": "user", "parts": [{"type": "text", "text": "summary"}]},
        )
    )


async def size(store: SqlContextStore) -> int:
    """Bytes the store's data takes, after a VACUUM (SQLite's through the driver: it cannot
    run inside the transaction the store's connections open)."""
    if store.dialect_name == "sqlite":
        path = make_url(store.engine.url).database
        assert path is not None
        async with aiosqlite.connect(path) as db:
            await db.execute("VACUUM")
            pages = (await (await db.execute("PRAGMA page_count")).fetchone() or (0,))[0]
            page_size = (await (await db.execute("PRAGMA page_size")).fetchone() or (0,))[0]
            return int(pages) * int(page_size)
    async with store.engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        # FULL: a plain VACUUM makes the space reusable but keeps the files' size.
        await conn.execute(text("VACUUM FULL"))
        total = 0
        for table in TABLES:
            total += int(
                await conn.scalar(
                    text("SELECT pg_total_relation_size(CAST(:t AS regclass))"), {"t": table}
                )
            )
        return total


async def bench(name: str, url: str, messages: int, tail: int) -> dict[str, Any]:
    async with SqlContextStore(url) as store:
        empty = await size(store)
        await compacted_chat(store, "long", messages, tail)
        before = await size(store)
        started = time.perf_counter()
        report = await store.purge("long")
        seconds = time.perf_counter() - started
        after = await size(store)
        await fill(store, "tail-only", tail + 1)  # the kept part, written alone
        floor = await size(store) - after
    return {
        "backend": name,
        "messages": messages + 1_000 + 1,
        "deleted": report.deleted_messages,
        "kept": report.kept_messages,
        "empty_bytes": empty,
        "before_bytes": before,
        "after_bytes": after,
        "purge_seconds": round(seconds, 2),
        "tail_alone_bytes": floor,
    }


def show(result: dict[str, Any]) -> None:
    kib = 1024
    print(
        f"{result['backend']:>10}: {result['messages']} messages, purge deleted "
        f"{result['deleted']} and kept {result['kept']} in {result['purge_seconds']} s; "
        f"store {result['before_bytes'] // kib} KiB before, {result['after_bytes'] // kib} KiB "
        f"after (empty store: {result['empty_bytes'] // kib} KiB; the kept tail written alone "
        f"adds {result['tail_alone_bytes'] // kib} KiB)"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--tail", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite+aiosqlite:///{Path(folder) / 'purge.db'}"
        show(await bench("sqlite", url, args.messages, args.tail))
    if args.skip_postgres:
        return
    admin = make_url(args.pg_url)
    database = f"bench_purge_{uuid.uuid4().hex[:8]}"
    dsn = admin.set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{database}"')
        try:
            url = admin.set(database=database).render_as_string(hide_password=False)
            show(await bench("postgresql", url, args.messages, args.tail))
        finally:
            await conn.execute(f'DROP DATABASE "{database}" WITH (FORCE)')
    finally:
        await conn.close()


if __name__ == "__main__":
    asyncio.run(main())
