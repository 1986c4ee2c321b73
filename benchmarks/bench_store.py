"""The store through the public API, against the raw drivers and OpenAI Agents' session.

    python benchmarks/bench_store.py [--pg-url URL] [--skip-postgres] [--sizes 10000,100000]
                                     [--runs 7] [--skip-openai-agents]

For each backend (an SQLite file; a scratch PostgreSQL database made and dropped here) and each
chat size, on conversations of alternating user/assistant messages of about 400 characters of
varied text (``_workload.py``), in one process, one measure after the other:

- **cold resolve**: ``await ContextEngine(store=..., chat_id=..., user_id=...).resolve()`` on a
  new engine over an open store (what every stateless request handler does), against the
  floor: the bare driver (aiosqlite / asyncpg, one connection) reading the same rows with one
  indexed ``SELECT`` and ``json.loads`` per row. Goal: at most 1.5x the floor.
- **save, 1 message per call**: ``engine.set(user(...)); await engine.save()`` on an open
  engine, against the bare driver writing the same rows in one transaction (bump the chat,
  insert the message and, on SQLite, its full-text entry, move the branch head). Goal: at
  most 1.5x. Like every measure here, each call follows a full garbage collection, which
  leaves the processor's caches cold, as the other work a server does between two saves of
  a turn would. A second row times the saves in a tight loop instead (caches warm), where
  the bare driver gains more than the store.
- **save, 100 per call**: 100 saves of 100 messages into a new chat; the median of the last
  ten against the first ten. Goal: at most 1.2 (it must not grow with the history).
- **rewind to N/2 + first resolve**: a new engine's ``rewind()`` to the middle message and
  ``resolve()`` of the new branch, against the bare driver reading those N/2 rows. Goal: 1.5x.
- **bytes per message on disk**, search index included, against a bare table holding the same
  messages (id, chat, parent, role, JSON, time; a primary key and an index on the chat; no
  search index). Goal: at most 1.6x.
- the same operations through OpenAI Agents' ``SQLAlchemySession`` (``get_items`` on a new
  session; ``add_items``; copying the first half into a new session, since it cannot branch),
  when ``openai-agents`` is installed.
- **connections**: the most server connections one PostgreSQL store held while 200 engines
  saved, resolved and searched at once, against its ``pool_size + max_overflow``.
- **a caller's engine**: the same cold resolve and save through a store given an
  ``AsyncEngine`` made by the caller, against a store made from the URL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
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
from sqlalchemy.ext.asyncio import create_async_engine

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import (
    conversation,
    median_time,
    median_times,
    message_data,
    ms,
    ratio,
    row,
    text,
    us,
)

from agentcontext import ContextEngine, SqlContextStore, user
from agentcontext.store import MessageRecord

DEFAULT_PG = os.environ.get(
    "AGENTCONTEXT_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
)

try:
    from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession
except ImportError:  # pragma: no cover - optional comparison
    SQLAlchemySession = None


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


# --- building chats ---------------------------------------------------------------------------


async def build_chat(store: SqlContextStore, chat_id: str, n: int) -> list[str]:
    """A chat of ``n`` messages written through the store, 1 000 per append; their ids."""
    await store.create_chat(chat_id, user_id="bench")
    branch = await store.get_active_branch(chat_id)
    assert branch is not None
    messages = conversation(n, seed=hash(chat_id) & 0xFFFF)
    parent: str | None = None
    for start in range(0, n, 1000):
        batch = []
        for message_id, role, body in messages[start : start + 1000]:
            batch.append(
                MessageRecord(
                    id=message_id,
                    chat_id=chat_id,
                    parent_id=parent,
                    name=role,
                    data=message_data(message_id, role, body),
                )
            )
            parent = message_id
        result = await store.append_messages(branch.id, batch, expected_head=batch[0].parent_id)
        assert result.ok
    return [m[0] for m in messages]


# --- the floors ---------------------------------------------------------------------------------


class SqliteFloor:
    """The bare aiosqlite driver on the store's file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.db: aiosqlite.Connection | None = None

    async def open(self) -> None:
        self.db = await aiosqlite.connect(self.path, isolation_level=None)
        # The store's durability: no fsync per commit in WAL mode (a killed process loses
        # nothing); SQLite's default would sync every commit and make the floor slow.
        await self.db.execute("PRAGMA synchronous = NORMAL")

    async def close(self) -> None:
        assert self.db is not None
        await self.db.close()

    async def read(self, chat_id: str, *, below: int | None = None) -> list[Any]:
        assert self.db is not None
        sql = "SELECT id, parent_id, name, data, created_at FROM messages WHERE chat_id = ?"
        args: tuple[Any, ...] = (chat_id,)
        if below is not None:
            sql += " AND depth <= ?"
            args = (chat_id, below)
        async with self.db.execute(sql, args) as cursor:
            rows = await cursor.fetchall()
        return [(r[0], r[1], r[2], json.loads(r[3]), r[4]) for r in rows]

    async def save(self, chat_id: str, branch_id: str, state: dict[str, Any]) -> None:
        assert self.db is not None
        message_id = uuid.uuid4().hex
        now = datetime.now(UTC).isoformat(timespec="microseconds")
        data = json.dumps(message_data(message_id, "user", state["text"]))
        await self.db.execute("BEGIN IMMEDIATE")
        await self.db.execute(
            "UPDATE chats SET updated_at = ?, version = version + 1, "
            "message_count = message_count + 1 WHERE id = ?",
            (now, chat_id),
        )
        await self.db.execute(
            "INSERT INTO messages (id, chat_id, parent_id, depth, name, type, data, created_at, "
            "version) VALUES (?, ?, ?, ?, 'user', 'message', ?, ?, ?)",
            (message_id, chat_id, state["head"], state["depth"] + 1, data, now, 1),
        )
        # The same search entry the store writes (its tokens: the text's words, lower-cased).
        await self.db.execute(
            "INSERT INTO messages_fts (rowid, tokens) VALUES (last_insert_rowid(), ?)",
            (" ".join(state["text"].lower().split()),),
        )
        await self.db.execute(
            "UPDATE branches SET head_message_id = ?, head_depth = ? WHERE id = ?",
            (message_id, state["depth"] + 1, branch_id),
        )
        await self.db.execute("COMMIT")
        state["head"], state["depth"] = message_id, state["depth"] + 1


class PostgresFloor:
    """The bare asyncpg driver on the store's database."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn: asyncpg.Connection | None = None

    async def open(self) -> None:
        self.conn = await asyncpg.connect(_dsn(self.url))

    async def close(self) -> None:
        assert self.conn is not None
        await self.conn.close()

    async def read(self, chat_id: str, *, below: int | None = None) -> list[Any]:
        assert self.conn is not None
        if below is None:
            rows = await self.conn.fetch(
                "SELECT id, parent_id, name, data, created_at FROM messages WHERE chat_id = $1",
                chat_id,
            )
        else:
            rows = await self.conn.fetch(
                "SELECT id, parent_id, name, data, created_at FROM messages "
                "WHERE chat_id = $1 AND depth <= $2",
                chat_id,
                below,
            )
        return [(r[0], r[1], r[2], json.loads(r[3]), r[4]) for r in rows]

    async def save(self, chat_id: str, branch_id: str, state: dict[str, Any]) -> None:
        assert self.conn is not None
        message_id = uuid.uuid4().hex
        now = datetime.now(UTC)
        data = json.dumps(message_data(message_id, "user", state["text"]))
        async with self.conn.transaction():
            await self.conn.execute(
                "UPDATE chats SET updated_at = $1, version = version + 1, "
                "message_count = message_count + 1 WHERE id = $2",
                now,
                chat_id,
            )
            await self.conn.execute(
                "INSERT INTO messages (id, chat_id, parent_id, depth, name, type, data, "
                "created_at, version) VALUES ($1, $2, $3, $4, 'user', 'message', $5, $6, 1)",
                message_id,
                chat_id,
                state["head"],
                state["depth"] + 1,
                data,
                now,
            )
            await self.conn.execute(
                "UPDATE branches SET head_message_id = $1, head_depth = $2 WHERE id = $3",
                message_id,
                state["depth"] + 1,
                branch_id,
            )
        state["head"], state["depth"] = message_id, state["depth"] + 1


# --- disk -------------------------------------------------------------------------------------


def sqlite_bytes(path: str) -> int:
    """Pages in use of an SQLite file (its WAL checkpointed first)."""
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
        return int((pages - free) * size)
    finally:
        conn.close()


async def sqlite_floor_bytes(n: int, directory: str) -> int:
    path = os.path.join(directory, f"floor-{n}.db")
    db = await aiosqlite.connect(path, isolation_level=None)
    await db.execute("PRAGMA journal_mode = WAL")
    await db.execute(
        "CREATE TABLE m (id TEXT PRIMARY KEY, chat_id TEXT NOT NULL, parent_id TEXT, "
        "role TEXT NOT NULL, data TEXT NOT NULL, created_at TEXT NOT NULL)"
    )
    await db.execute("CREATE INDEX m_chat ON m (chat_id)")
    await db.execute("BEGIN")
    parent = None
    now = datetime.now(UTC).isoformat(timespec="microseconds")
    for message_id, role, body in conversation(n, seed=7):
        await db.execute(
            "INSERT INTO m VALUES (?, ?, ?, ?, ?, ?)",
            (
                message_id,
                "floor",
                parent,
                role,
                json.dumps(message_data(message_id, role, body)),
                now,
            ),
        )
        parent = message_id
    await db.execute("COMMIT")
    await db.close()
    return sqlite_bytes(path)


async def postgres_bytes(conn: asyncpg.Connection, tables: list[str]) -> int:
    total = 0
    for table in tables:
        size = await conn.fetchval("SELECT pg_total_relation_size(to_regclass($1))", table)
        total += int(size or 0)
    return total


async def postgres_floor_bytes(conn: asyncpg.Connection, n: int) -> int:
    await conn.execute(
        "CREATE TABLE bench_floor (id VARCHAR(255) PRIMARY KEY, chat_id VARCHAR(255) NOT NULL, "
        "parent_id VARCHAR(255), role VARCHAR(32) NOT NULL, data JSONB NOT NULL, "
        "created_at TIMESTAMPTZ NOT NULL)"
    )
    await conn.execute("CREATE INDEX bench_floor_chat ON bench_floor (chat_id)")
    parent = None
    now = datetime.now(UTC)
    rows = []
    for message_id, role, body in conversation(n, seed=7):
        rows.append(
            (
                message_id,
                "floor",
                parent,
                role,
                json.dumps(message_data(message_id, role, body)),
                now,
            )
        )
        parent = message_id
    for start in range(0, n, 1000):
        await conn.executemany(
            "INSERT INTO bench_floor VALUES ($1, $2, $3, $4, $5, $6)", rows[start : start + 1000]
        )
    return await postgres_bytes(conn, ["bench_floor"])


CALLER = "caller's engine"

OUR_TABLES = [
    "chats",
    "messages",
    "branches",
    "checkpoints",
    "blobs",
    "snapshots",
    "snapshot_items",
    "resolve_records",
    "record_messages",
]

# --- one backend --------------------------------------------------------------------------------


async def bench_backend(
    name: str, url: str, sizes: list[int], args: argparse.Namespace
) -> list[str]:
    lines = [f"\n## {name}\n"]
    sqlite = url.startswith("sqlite")
    floor: SqliteFloor | PostgresFloor = (
        SqliteFloor(make_url(url).database or "") if sqlite else PostgresFloor(url)
    )
    store = SqlContextStore(url)
    await store.initialize()
    await floor.open()
    lines.append(row("measure", "floor", "OpenAI Agents", "agentcontext", "vs floor", "goal"))
    lines.append(row("---", "---:", "---:", "---:", "---:", "---"))
    try:
        ours_disk = 0
        for n in sizes:
            size_lines, disk = await bench_size(store, floor, url, n, args)
            lines += size_lines
            if n == sizes[0]:
                ours_disk = disk
        lines += await bench_saves(store, floor, url, args)
        if sizes:
            lines += await bench_disk(url, sqlite, sizes[0], ours_disk, floor, args)
        lines += await bench_caller_engine(url, store, args)
        if not sqlite:
            lines += await bench_connections(url)
    finally:
        await floor.close()
        await store.close()
    return lines


async def bench_size(
    store: SqlContextStore,
    floor: SqliteFloor | PostgresFloor,
    url: str,
    n: int,
    args: argparse.Namespace,
) -> tuple[list[str], int]:
    """Cold resolve and rewind at one chat size; the store's bytes right after the build."""
    lines = []
    chat_id = f"bench-{n}"
    ids = await build_chat(store, chat_id, n)
    if isinstance(floor, SqliteFloor):
        disk = sqlite_bytes(floor.path)
    else:
        assert floor.conn is not None
        disk = await postgres_bytes(floor.conn, OUR_TABLES)

    async def cold() -> None:
        await ContextEngine(store=store, chat_id=chat_id, user_id="bench").resolve()

    oa_cold = await openai_cold(url, chat_id, n) if args.openai else None
    reads = await median_times(
        [lambda: floor.read(chat_id), cold, *([oa_cold] if oa_cold else [])], args.runs
    )
    floor_read, ours_read = reads[0], reads[1]
    oa_read = reads[2] if oa_cold else None
    lines.append(
        row(
            f"cold resolve, {n:,} messages",
            ms(floor_read),
            ms(oa_read) if oa_read else "-",
            ms(ours_read),
            ratio(ours_read, floor_read),
            "<= 1.5x",
        )
    )
    middle = ids[n // 2 - 1]

    async def rewind() -> None:
        engine = ContextEngine(store=store, chat_id=chat_id, user_id="bench")
        await engine.rewind(middle)
        await engine.resolve()

    oa_copy = await openai_prefix(url, chat_id, n) if args.openai else None
    prefixes = await median_times(
        [lambda: floor.read(chat_id, below=n // 2), rewind, *([oa_copy] if oa_copy else [])],
        args.runs,
    )
    floor_prefix, ours_rewind = prefixes[0], prefixes[1]
    oa_rewind = prefixes[2] if oa_copy else None
    lines.append(
        row(
            f"rewind to N/2 + first resolve, {n:,}",
            ms(floor_prefix),
            ms(oa_rewind) if oa_rewind else "-",
            ms(ours_rewind),
            ratio(ours_rewind, floor_prefix),
            "<= 1.5x",
        )
    )
    return lines, disk


async def bench_saves(
    store: SqlContextStore, floor: SqliteFloor | PostgresFloor, url: str, args: argparse.Namespace
) -> list[str]:
    lines = []
    await store.create_chat("floor-saves", user_id="bench")
    branch = await store.get_active_branch("floor-saves")
    assert branch is not None
    rng = random.Random(3)
    state: dict[str, Any] = {"head": None, "depth": 0, "text": text(rng)}
    engine = ContextEngine(store=store, chat_id="saves", user_id="bench")
    await engine.resolve()
    body = text(rng)

    async def save_one() -> None:
        engine.set(user(body))
        await engine.save()

    oa_one = await openai_save(url) if args.openai else None
    saves = await median_times(
        [
            lambda: floor.save("floor-saves", branch.id, state),
            save_one,
            *([oa_one] if oa_one else []),
        ],
        args.runs * 30,
        warmup=20,
    )
    warm = await median_times(
        [
            lambda: floor.save("floor-saves", branch.id, state),
            save_one,
            *([oa_one] if oa_one else []),
        ],
        args.runs * 30,
        warmup=20,
        collect=False,
    )
    for label, (floor_save, ours_save, *oa) in (
        ("save, 1 message per call", saves),
        ("the same in a tight loop (no collection between calls: caches warm)", warm),
    ):
        lines.append(
            row(
                label,
                us(floor_save),
                us(oa[0]) if oa else "-",
                us(ours_save),
                ratio(ours_save, floor_save),
                "<= 1.5x",
            )
        )
    growth_engine = ContextEngine(store=store, chat_id="growth", user_id="bench")
    batch = [text(rng) for _ in range(100)]
    times = []
    for _ in range(100):
        growth_engine.set(*(user(t) for t in batch))
        started = time.perf_counter()
        await growth_engine.save()
        times.append(time.perf_counter() - started)
    first = sorted(times[:10])[5]
    last = sorted(times[-10:])[5]
    lines.append(
        row(
            "save, 100 per call: last 10 vs first 10 of 100 calls",
            "-",
            "-",
            f"{ms(first)} → {ms(last)}",
            ratio(last, first),
            "<= 1.2",
        )
    )
    return lines


async def bench_disk(
    url: str,
    sqlite: bool,
    n: int,
    ours: int,
    floor: SqliteFloor | PostgresFloor,
    args: argparse.Namespace,
) -> list[str]:
    if sqlite:
        base = await sqlite_floor_bytes(n, str(Path(make_url(url).database or "").parent))
    else:
        assert isinstance(floor, PostgresFloor)
        assert floor.conn is not None
        base = await postgres_floor_bytes(floor.conn, n)
    oa = await openai_bytes(url, n) if args.openai else None
    return [
        row(
            f"bytes per message on disk ({n:,}, search index included)",
            f"{base / n:,.0f}",
            f"{oa / n:,.0f}" if oa else "-",
            f"{ours / n:,.0f}",
            ratio(ours, base),
            "<= 1.6x",
        )
    ]


async def bench_caller_engine(
    url: str, store: SqlContextStore, args: argparse.Namespace
) -> list[str]:
    engine = create_async_engine(
        url, connect_args={} if url.startswith("sqlite") else {"timeout": 10}
    )
    caller = SqlContextStore(engine)
    rng = random.Random(5)
    body = text(rng)
    lines = []
    try:
        results = {}
        for label, target in (("URL", store), (CALLER, caller)):
            context = ContextEngine(store=target, chat_id=f"engine-{label}", user_id="bench")
            await context.resolve()

            async def save_one(context: ContextEngine = context) -> None:
                context.set(user(body))
                await context.save()

            results[label] = await median_time(save_one, args.runs * 30, warmup=20)
        lines.append(
            row(
                "save through a caller's AsyncEngine vs a URL",
                "-",
                "-",
                f"{us(results['URL'])} / {us(results[CALLER])}",
                ratio(results[CALLER], results["URL"]),
                "~ 1x",
            )
        )
        cold = {}
        for label, target in (("URL", store), (CALLER, caller)):

            async def resolve(target: SqlContextStore = target) -> None:
                await ContextEngine(store=target, chat_id="bench-10000", user_id="bench").resolve()

            cold[label] = await median_time(resolve, args.runs)
        lines.append(
            row(
                "cold resolve (10,000) through a caller's AsyncEngine vs a URL",
                "-",
                "-",
                f"{ms(cold['URL'])} / {ms(cold[CALLER])}",
                ratio(cold[CALLER], cold["URL"]),
                "~ 1x",
            )
        )
    finally:
        await caller.close()
        await engine.dispose()
    return lines


async def bench_connections(url: str) -> list[str]:
    marker = f"agentcontext-bench-{uuid.uuid4().hex[:6]}"
    store = SqlContextStore(
        url,
        pool_size=5,
        max_overflow=5,
        pool_timeout=120,
        connect_args={"server_settings": {"application_name": marker}},
    )
    admin = await asyncpg.connect(_dsn(url))
    peak = 0
    done = asyncio.Event()

    async def watch() -> None:
        nonlocal peak
        while not done.is_set():
            count = await admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", marker
            )
            peak = max(peak, int(count))
            await asyncio.sleep(0.002)

    async def one(i: int) -> None:
        engine = ContextEngine(store=store, chat_id=f"conn-{i % 40}", user_id="bench")
        engine.set(user(f"turn {i}"))
        await engine.save()
        await engine.resolve()
        await store.search_messages(f"conn-{i % 40}", "turn")

    watcher = asyncio.create_task(watch())
    started = time.perf_counter()
    try:
        await asyncio.gather(*(one(i) for i in range(200)))
    finally:
        done.set()
        await watcher
        await admin.close()
        await store.close()
    elapsed = time.perf_counter() - started
    return [
        row(
            "server connections of one store, 200 concurrent engines",
            "-",
            "-",
            f"{peak} (pool 5 + overflow 5), {elapsed:.1f} s",
            f"{peak}/10",
            "<= pool_size + max_overflow",
        )
    ]


# --- OpenAI Agents' SQLAlchemySession ------------------------------------------------------------

_OA_ENGINES: dict[str, Any] = {}


async def _oa_engine(url: str) -> Any:
    if url not in _OA_ENGINES:
        _OA_ENGINES[url] = create_async_engine(url)
    return _OA_ENGINES[url]


async def _oa_build(url: str, session_id: str, n: int) -> Any:
    engine = await _oa_engine(url)
    session = SQLAlchemySession(session_id, engine=engine, create_tables=True)
    if not await session.get_items(limit=1):
        # As the SDK stores a run: user inputs as easy input messages, assistant replies as
        # the Responses API output items the Runner saves.
        items = [
            {"role": "user", "content": body}
            if role == "user"
            else {
                "id": f"msg_{message_id}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": body, "annotations": []}],
            }
            for message_id, role, body in conversation(n, seed=hash(session_id) & 0xFFFF)
        ]
        for start in range(0, n, 1000):
            await session.add_items(items[start : start + 1000])
    return engine


async def openai_cold(url: str, chat_id: str, n: int) -> Callable[[], Awaitable[None]]:
    """``get_items()`` on a new session over an open engine (the data built first)."""
    engine = await _oa_build(url, chat_id, n)

    async def cold() -> None:
        await SQLAlchemySession(chat_id, engine=engine).get_items()

    return cold


async def openai_prefix(url: str, chat_id: str, n: int) -> Callable[[], Awaitable[None]]:
    """The SDK's "rewind": copying the first half into a new session, then reading it."""
    engine = await _oa_build(url, chat_id, n)

    async def copy() -> None:
        items = await SQLAlchemySession(chat_id, engine=engine).get_items()
        fork = SQLAlchemySession(f"{chat_id}-{uuid.uuid4().hex[:8]}", engine=engine)
        await fork.add_items(items[: n // 2])
        await fork.get_items()

    return copy


async def openai_save(url: str) -> Callable[[], Awaitable[None]]:
    """``add_items()`` of one item on an open session."""
    engine = await _oa_engine(url)
    session = SQLAlchemySession("oa-saves", engine=engine, create_tables=True)
    rng = random.Random(3)
    item = {"role": "user", "content": text(rng)}

    async def add() -> None:
        await session.add_items([item])

    return add


async def openai_bytes(url: str, n: int) -> int:
    if url.startswith("sqlite"):
        path = str(Path(make_url(url).database or "").parent / f"openai-{n}.db")
        engine = create_async_engine(f"sqlite+aiosqlite:///{path}")
        await _oa_build_on(engine, n)
        await engine.dispose()
        return sqlite_bytes(path)
    engine = create_async_engine(url)
    await _oa_build_on(engine, n, "oa-disk")
    await engine.dispose()
    conn = await asyncpg.connect(_dsn(url))
    try:
        # The two tables hold only this session's items and the benchmark's other sessions:
        # measure a copy made of this session alone.
        await conn.execute(
            "CREATE TABLE oa_copy AS SELECT * FROM agent_messages WHERE session_id = 'oa-disk'"
        )
        await conn.execute("CREATE INDEX oa_copy_session ON oa_copy (session_id, created_at)")
        await conn.execute("ALTER TABLE oa_copy ADD PRIMARY KEY (id)")
        return await postgres_bytes(conn, ["oa_copy"])
    finally:
        await conn.close()


async def _oa_build_on(engine: Any, n: int, session_id: str = "oa-disk") -> None:
    session = SQLAlchemySession(session_id, engine=engine, create_tables=True)
    items = [{"role": role, "content": body} for _, role, body in conversation(n, seed=7)]
    for start in range(0, n, 1000):
        await session.add_items(items[start : start + 1000])


# --- main ----------------------------------------------------------------------------------------


async def main(args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    out = [
        "# Store benchmark (public API, ratios against the raw drivers in the same run)",
        f"\nmessages of about 400 characters; median of {args.runs} runs (saves: "
        f"{args.runs * 30}); {datetime.now(UTC):%Y-%m-%d}",
    ]
    with tempfile.TemporaryDirectory() as directory:
        url = f"sqlite+aiosqlite:///{directory}/bench.db"
        out += await bench_backend("SQLite", url, sizes, args)
        for engine in _OA_ENGINES.values():
            await engine.dispose()
        _OA_ENGINES.clear()
    if not args.skip_postgres:
        admin = await asyncpg.connect(_dsn(args.pg_url))
        name = f"acbench_{uuid.uuid4().hex[:8]}"
        await admin.execute(f'CREATE DATABASE "{name}"')
        url = make_url(args.pg_url).set(database=name).render_as_string(hide_password=False)
        try:
            out += await bench_backend("PostgreSQL", url, sizes, args)
        finally:
            for engine in _OA_ENGINES.values():
                await engine.dispose()
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await admin.close()
    print("\n".join(out))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--skip-openai-agents", action="store_true")
    args = parser.parse_args()
    args.openai = SQLAlchemySession is not None and not args.skip_openai_agents
    return args


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
