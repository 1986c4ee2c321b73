"""What a save costs the database alone, beside the shared harness's raw floor.

    python benchmarks/bench_save_floor.py [--backends sqlite,postgres,mariadb] [--saves 200]
                                          [--pg-url URL] [--my-url URL] [--out FILE]

The shared harness compares a save through the library with a *raw floor*: the bare driver
inserting the same text into one table with two indexes, no foreign key, no search index, in
one transaction. The library's save writes more than that, by design (DESIGN.md, and issue 38:
the foreign keys stay, the search index is written in the save's transaction, messages are
validated). This probe splits the distance between the two into what the database spends on
those rows and what Python spends, so that a goal stated as a ratio to the floor can be
checked against the part of the distance no Python work can remove.

It builds a chat through the public API (SQLite and PostgreSQL: 10 000 messages written 100
a call, then saves of 100 messages, the harness's bulk cell; MariaDB: 1 000 messages written
one a call, then saves of one message, the harness's one-message cell), takes the statements
of one more save as the store sends them (SQLAlchemy's ``before_cursor_execute`` event), and
then times, in one process, the cells taken in turn in four rounds, ``--saves`` times each:

- ``floor``: the harness's raw floor (its schema and its statements, on the bare driver);
- the store's own statements replayed on the bare driver with fresh message ids, so each
  appends for real and commits: without the search entries, then whole. SQLite: the append's
  one statement with its FTS5 text emptied or kept, and the ``COMMIT``. PostgreSQL: the
  append's one statement, which commits itself, with the messages' search hashes as empty
  arrays or as sent. MariaDB: the one compound statement, which commits itself, with and
  without its ``message_terms`` rows and packed keys; then (last: these rows are not the
  library's) the same row written as plain statements (``BEGIN``, the insert into the store's
  ``messages`` table, ``COMMIT``), with the branch's and the chat's updates and the locking
  read added one by one;
- ``library``: ``engine.save()`` of the same number of messages through the public API.

Each line is the median time of one save, and its ratio to the floor of the same run. The
replays run on the bare driver without the thread hand-off (SQLite) or SQLAlchemy: they are
the database's part alone. Texts are the shared harness's (``../shared/bench/workload.py``)
when it is there, else this folder's workload.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1] / "src"))
sys.path.insert(0, str(HERE.parent))
SHARED = HERE.parents[2] / "shared"

from sqlalchemy import event  # noqa: E402

import agentcontext as ac  # noqa: E402

CHAT, USER = "chat-001", "user-001"
ROUNDS = 4


def messages(n: int) -> list[dict[str, str]]:
    """The harness's messages when its workload is there (the same text the floor writes)."""
    if (SHARED / "bench" / "workload.py").exists():
        sys.path.insert(0, str(SHARED))
        from bench.workload import make_messages

        return list(make_messages(n))
    import _workload

    return [
        {"id": mid, "role": role, "text": body} for mid, role, body in _workload.conversation(n)
    ]


def to_message(m: dict[str, str]) -> Any:
    if m["role"] == "user":
        return ac.user(m["text"], id=m["id"])
    return ac.assistant_text(m["text"], id=m["id"])


def floor_data(m: dict[str, str]) -> str:
    """The harness floor's JSON of a message."""
    body = {"role": m["role"], "parts": [{"type": "text", "text": m["text"]}]}
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


async def timed(step: Callable[[], Awaitable[Any]], count: int) -> list[float]:
    out = []
    for _ in range(count):
        start = time.perf_counter()
        await step()
        out.append(time.perf_counter() - start)
    return out


def timed_sync(step: Callable[[], Any], count: int) -> list[float]:
    out = []
    for _ in range(count):
        start = time.perf_counter()
        step()
        out.append(time.perf_counter() - start)
    return out


class Capture:
    """The statements a store sends while the block runs."""

    def __init__(self, store: Any) -> None:
        self.engine = store._db.engine.sync_engine
        self.seen: list[tuple[str, Any]] = []

    def _on(self, conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        self.seen.append((statement, parameters))

    def __enter__(self) -> Capture:
        event.listen(self.engine, "before_cursor_execute", self._on)
        return self

    def __exit__(self, *_: Any) -> None:
        event.remove(self.engine, "before_cursor_execute", self._on)


class Renamer:
    """Fresh ids for a replayed save: every id of the captured save gets a new one, and the
    head it was appended to becomes the last id the previous replay appended."""

    def __init__(self, captured_ids: list[str], head: str) -> None:
        self.ids = captured_ids
        self.head = head  # the head the captured save appended to
        self.current = captured_ids[-1]  # the captured save already moved the head here

    def next(self, params: Any) -> tuple[Any, ...]:
        fresh = {old: uuid.uuid4().hex for old in self.ids}
        fresh[self.head] = self.current
        self.current = fresh[self.ids[-1]]

        def renamed(value: Any) -> Any:
            if isinstance(value, str):
                return fresh.get(value, value)
            if isinstance(value, list):  # (PostgreSQL's arrays of a column's values)
                return [renamed(item) for item in value]
            return value

        return tuple(map(renamed, params))


async def build_and_capture(
    store: Any, texts: list[dict[str, str]], size: int, batch: int, marker: str
) -> tuple[Any, str, Any, Renamer]:
    """A chat of ``size`` messages written ``batch`` a call through the public API, then one
    more save of ``batch`` messages: its engine, the statement of its append (the one that
    starts with ``marker``) with its parameters, and a `Renamer` for replays of it."""
    engine = ac.ContextEngine(store=store, chat_id=CHAT, user_id=USER)
    for i in range(0, size, batch):
        engine.set(*map(to_message, texts[i : i + batch]))
        await engine.save()
    captured = texts[size : size + batch]
    with Capture(store) as capture:
        engine.set(*map(to_message, captured))
        await engine.save()
    statement, params = next((s, p) for s, p in capture.seen if s.lstrip().startswith(marker))
    renamer = Renamer([m["id"] for m in captured], texts[size - 1]["id"])
    return engine, statement, params, renamer


# --- SQLite: saves of 100 messages ---------------------------------------------------------


async def sqlite_cells(saves: int, batch: int = 100, size: int = 10_000) -> dict[str, float]:
    from agentcontext.store._dialects.sqlite import _ROW_PARAMETERS

    folder = Path(tempfile.mkdtemp(prefix="save-floor-"))
    path = folder / "store.db"
    texts = messages(size + batch * (2 * saves + 2))
    store = ac.SqlContextStore(f"sqlite+aiosqlite:///{path}")
    await store.initialize()
    engine, statement, params, renamer = await build_and_capture(
        store, texts, size, batch, "INSERT INTO message_appends"
    )
    width, tokens = len(_ROW_PARAMETERS), _ROW_PARAMETERS.index("tokens")
    plain = tuple("" if i % width == tokens else p for i, p in enumerate(params))

    db = sqlite3.connect(path, isolation_level=None)  # beside the store's own connection
    db.execute("PRAGMA foreign_keys = ON")
    db.execute("PRAGMA synchronous = NORMAL")  # the store's default
    commits: dict[str, list[float]] = {"append, no search index": [], "append": []}

    def replay(values: tuple[Any, ...], commit: list[float]) -> Callable[[], None]:
        def step() -> None:
            db.execute("BEGIN IMMEDIATE")
            db.execute(statement, renamer.next(values)).fetchall()
            start = time.perf_counter()
            db.execute("COMMIT")
            commit.append(time.perf_counter() - start)

        return step

    floor_path = folder / "floor.db"
    floor = sqlite3.connect(floor_path)  # the harness's floor: sqlite3's defaults, WAL
    floor.execute("PRAGMA journal_mode=WAL")
    floor.executescript(
        """
        CREATE TABLE messages (id TEXT PRIMARY KEY, chat_id TEXT NOT NULL, parent_id TEXT,
                               seq INTEGER NOT NULL, data TEXT NOT NULL);
        CREATE UNIQUE INDEX messages_chat_seq ON messages (chat_id, seq);
        """
    )
    floor_rows = [
        (m["id"], CHAT, texts[i - 1]["id"] if i else None, i, floor_data(m))
        for i, m in enumerate(texts)
    ]
    for i in range(0, size, batch):
        floor.executemany("INSERT INTO messages VALUES (?, ?, ?, ?, ?)", floor_rows[i : i + batch])
        floor.commit()
    floor_next = iter(range(size, len(floor_rows), batch))

    def floor_save() -> None:
        start = next(floor_next)
        floor.executemany(
            "INSERT INTO messages VALUES (?, ?, ?, ?, ?)", floor_rows[start : start + batch]
        )
        floor.commit()

    # The library's saves: fresh messages each, on an engine that has read the chain (the
    # replays move its head behind its back).
    rest = iter(range(size + batch, len(texts), batch))
    written = ""

    async def library_save() -> None:
        nonlocal written
        start = next(rest)
        engine.set(*map(to_message, texts[start : start + batch]))
        await engine.save()
        written = texts[start + batch - 1]["id"]

    # The harness's floor exactly: the same statements through aiosqlite's thread.
    import aiosqlite

    threaded = await aiosqlite.connect(folder / "floor-aiosqlite.db")
    await threaded.execute("PRAGMA journal_mode=WAL")
    await threaded.execute(
        "CREATE TABLE messages (id TEXT PRIMARY KEY, chat_id TEXT NOT NULL, parent_id TEXT, "
        "seq INTEGER NOT NULL, data TEXT NOT NULL)"
    )
    await threaded.execute("CREATE UNIQUE INDEX messages_chat_seq ON messages (chat_id, seq)")
    await threaded.executemany("INSERT INTO messages VALUES (?, ?, ?, ?, ?)", floor_rows[:size])
    await threaded.commit()
    threaded_next = iter(range(size, len(floor_rows), batch))

    async def threaded_save() -> None:
        start = next(threaded_next)
        await threaded.executemany(
            "INSERT INTO messages VALUES (?, ?, ?, ?, ?)", floor_rows[start : start + batch]
        )
        await threaded.commit()

    results: dict[str, list[float]] = {}
    block = max(1, saves // ROUNDS)
    for _ in range(ROUNDS):  # every cell in turn, so the chat's growth falls on each alike
        engine = ac.ContextEngine(store=store, chat_id=CHAT, user_id=USER)
        await engine.resolve()
        results.setdefault("library", []).extend(await timed(library_save, block))
        renamer.current = written
        for name, values in (("append, no search index", plain), ("append", params)):
            results.setdefault(name, []).extend(timed_sync(replay(values, commits[name]), block))
        results.setdefault("floor", []).extend(timed_sync(floor_save, block))
        results.setdefault("floor through aiosqlite (the harness's)", []).extend(
            await timed(threaded_save, block)
        )
    db.close()
    await threaded.close()
    await store.close()
    floor.close()
    shutil.rmtree(folder, ignore_errors=True)
    out = {name: median_ms(samples) for name, samples in results.items()}
    for name, samples in commits.items():
        out[f"{name}: its COMMIT"] = median_ms(samples)
    return out


# --- MariaDB: saves of one message ---------------------------------------------------------

_TERMS = re.compile(r"INSERT IGNORE INTO message_terms .*?; (?=UPDATE chats)", re.S)
_PACKED = re.compile(r"X'[0-9a-f]*'")


async def mariadb_cells(url: str, saves: int, size: int = 1_000) -> dict[str, float]:
    import asyncmy
    from sqlalchemy.engine import make_url

    where = make_url(url)
    database = f"bench_savefloor_{uuid.uuid4().hex[:8]}"
    login = {
        "host": where.host or "127.0.0.1",
        "port": where.port or 3306,
        "user": where.username,
        "password": where.password or "",
    }
    admin = await asyncmy.connect(**login, autocommit=True)
    async with admin.cursor() as cur:
        await cur.execute(f"CREATE DATABASE {database} CHARACTER SET utf8mb4")
    try:
        return await _mariadb(where.set(database=database), login, database, saves, size)
    finally:
        async with admin.cursor() as cur:
            await cur.execute(f"DROP DATABASE IF EXISTS {database}")
        admin.close()


async def _mariadb(
    url: Any, login: dict[str, Any], database: str, saves: int, size: int
) -> dict[str, float]:
    import asyncmy

    texts = messages(size + 2 * saves + 2)
    store = ac.SqlContextStore(url.render_as_string(hide_password=False))
    await store.initialize()
    engine, compound, params, renamer = await build_and_capture(
        store, texts, size, 1, "BEGIN NOT ATOMIC"
    )
    branch = next(iter(await store.list_branches(CHAT))).id

    conn = await asyncmy.connect(**login, db=database, autocommit=True)
    cur = conn.cursor()
    bare = _PACKED.sub("NULL", _TERMS.sub("", compound))

    def compound_step(sql: str) -> Callable[[], Awaitable[None]]:
        async def step() -> None:
            await cur.execute(sql, renamer.next(params))
            await cur.fetchall()
            while await cur.nextset():
                pass

        return step

    data = floor_data(texts[0])

    def plain_step(*parts: str) -> Callable[[], Awaitable[None]]:
        async def step() -> None:
            fresh, parent = uuid.uuid4().hex, renamer.current
            await conn.begin()
            if "lock" in parts:
                await cur.execute(
                    "SELECT c.user_id, b.head_message_id, c.version, b.head_depth "
                    "FROM chats AS c JOIN branches AS b ON b.chat_id = c.id "
                    "WHERE c.id = %s AND b.id = %s FOR UPDATE",
                    (CHAT, branch),
                )
                await cur.fetchall()
            await cur.execute(
                "INSERT INTO messages (id, chat_id, parent_id, depth, name, type, data, "
                "created_at, version) VALUES (%s, %s, %s, 0, 'user', 'message', %s, NOW(6), 0)",
                (fresh, CHAT, parent, data),
            )
            if "branch" in parts:
                await cur.execute(
                    "UPDATE branches SET head_message_id = %s WHERE id = %s", (fresh, branch)
                )
            if "chat" in parts:
                await cur.execute(
                    "UPDATE chats SET updated_at = NOW(6), version = version + 1, "
                    "message_count = message_count + 1 WHERE id = %s",
                    (CHAT,),
                )
            await conn.commit()
            renamer.current = fresh

        return step

    await cur.execute(
        """CREATE TABLE floor_messages (
            id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
            chat_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
            parent_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
            seq BIGINT NOT NULL,
            data JSON NOT NULL,
            UNIQUE KEY messages_chat_seq (chat_id, seq)
        ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"""
    )
    floor_rows = [
        (m["id"], CHAT, texts[i - 1]["id"] if i else None, i, floor_data(m))
        for i, m in enumerate(texts)
    ]
    for row in floor_rows[:size]:
        await conn.begin()
        await cur.execute("INSERT INTO floor_messages VALUES (%s, %s, %s, %s, %s)", row)
        await conn.commit()
    floor_next = iter(floor_rows[size:])

    async def floor_save() -> None:
        await conn.begin()
        await cur.executemany(
            "INSERT INTO floor_messages (id, chat_id, parent_id, seq, data) "
            "VALUES (%s, %s, %s, %s, %s)",
            [next(floor_next)],
        )
        await conn.commit()

    unused = iter(texts[size + 1 :])
    written = ""

    async def library_save() -> None:
        nonlocal written
        m = next(unused)
        engine.set(to_message(m))
        await engine.save()
        written = m["id"]

    results: dict[str, list[float]] = {}
    block = max(1, saves // ROUNDS)
    compounds = [
        ("compound, no search entries", compound_step(bare)),
        ("compound (the library's statement)", compound_step(compound)),
    ]
    for _ in range(ROUNDS):  # every cell in turn, so the chat's growth falls on each alike
        engine = ac.ContextEngine(store=store, chat_id=CHAT, user_id=USER)
        await engine.resolve()  # the replays moved the head behind the store's back
        results.setdefault("library", []).extend(await timed(library_save, block))
        renamer.current = written
        for name, step in compounds:
            results.setdefault(name, []).extend(await timed(step, block))
        results.setdefault("floor", []).extend(await timed(floor_save, block))
    await store.close()
    # The plain rows are not the library's (depth 0, no search entries): they come last.
    plain = [
        ("plain: BEGIN, INSERT INTO messages, COMMIT", plain_step()),
        ("plain: + the branch's head", plain_step("branch")),
        ("plain: + the chat's activity", plain_step("branch", "chat")),
        ("plain: + the locking read (5 round trips)", plain_step("lock", "branch", "chat")),
    ]
    for _ in range(2):
        for name, step in plain:
            results.setdefault(name, []).extend(await timed(step, block))
    await cur.close()
    conn.close()
    return {name: median_ms(samples) for name, samples in results.items()}


# --- PostgreSQL: saves of 100 messages --------------------------------------------------------


async def postgres_cells(
    url: str, saves: int, batch: int = 100, size: int = 10_000
) -> dict[str, float]:
    import asyncpg
    from sqlalchemy.engine import make_url

    where = make_url(url)
    dsn = where.set(drivername="postgresql").render_as_string(hide_password=False)
    database = f"bench_savefloor_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(dsn)
    await admin.execute(f"CREATE DATABASE {database}")
    try:
        return await _postgres(where.set(database=database), saves, batch, size)
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        await admin.close()


async def _postgres(url: Any, saves: int, batch: int, size: int) -> dict[str, float]:
    import asyncpg

    texts = messages(size + batch * (2 * saves + 2))
    store = ac.SqlContextStore(url.render_as_string(hide_password=False))
    await store.initialize()
    engine, statement, params, renamer = await build_and_capture(
        store, texts, size, batch, "WITH touched AS"
    )
    # The search hashes are the array of each message's int4 terms, as text: emptied below.
    hashes = next(
        i
        for i, p in enumerate(params)
        if isinstance(p, list) and re.fullmatch(r"\{[-0-9, ]*\}", str(p[0]))
    )
    plain = tuple(["{}"] * len(p) if i == hashes else p for i, p in enumerate(params))

    dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await asyncpg.connect(dsn)

    def replay(values: tuple[Any, ...]) -> Callable[[], Awaitable[None]]:
        async def step() -> None:
            await conn.fetch(statement, *renamer.next(values))

        return step

    await conn.execute(
        """CREATE TABLE floor_messages (id text PRIMARY KEY, chat_id text NOT NULL,
                                        parent_id text, seq bigint NOT NULL, data json NOT NULL);
           CREATE UNIQUE INDEX floor_messages_chat_seq ON floor_messages (chat_id, seq)"""
    )
    floor_rows = [
        (m["id"], CHAT, texts[i - 1]["id"] if i else None, i, floor_data(m))
        for i, m in enumerate(texts)
    ]
    await conn.executemany(
        "INSERT INTO floor_messages VALUES ($1, $2, $3, $4, $5)", floor_rows[:size]
    )
    floor_next = iter(range(size, len(floor_rows), batch))

    async def floor_save() -> None:
        start = next(floor_next)
        async with conn.transaction():
            await conn.executemany(
                "INSERT INTO floor_messages (id, chat_id, parent_id, seq, data) "
                "VALUES ($1, $2, $3, $4, $5)",
                floor_rows[start : start + batch],
            )

    rest = iter(range(size + batch, len(texts), batch))
    written = ""

    async def library_save() -> None:
        nonlocal written
        start = next(rest)
        engine.set(*map(to_message, texts[start : start + batch]))
        await engine.save()
        written = texts[start + batch - 1]["id"]

    results: dict[str, list[float]] = {}
    block = max(1, saves // ROUNDS)
    for _ in range(ROUNDS):  # every cell in turn, so the chat's growth falls on each alike
        engine = ac.ContextEngine(store=store, chat_id=CHAT, user_id=USER)
        await engine.resolve()
        results.setdefault("library", []).extend(await timed(library_save, block))
        renamer.current = written
        for name, values in (("append, no search hashes", plain), ("append", params)):
            results.setdefault(name, []).extend(await timed(replay(values), block))
        results.setdefault("floor", []).extend(await timed(floor_save, block))
    await store.close()
    await conn.close()
    return {name: median_ms(samples) for name, samples in results.items()}


def report(backend: str, cells: dict[str, float], what: str) -> list[str]:
    floor = cells["floor"]
    lines = [f"\n{backend}: {what}", f"{'cell':<48} {'median ms':>10} {'x floor':>8}"]
    for name, value in cells.items():
        lines.append(f"{name:<48} {value:>10.3f} {value / floor:>8.2f}")
    return lines


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="sqlite,postgres,mariadb")
    parser.add_argument("--saves", type=int, default=200)
    parser.add_argument(
        "--my-url", default="mysql+asyncmy://agentcontext:agentcontext@127.0.0.1:3306/"
    )
    parser.add_argument("--pg-url", default="postgresql+asyncpg://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    found: dict[str, dict[str, float]] = {}
    lines: list[str] = []
    for backend in args.backends.split(","):
        if backend == "sqlite":
            found[backend] = await sqlite_cells(args.saves)
            lines += report(backend, found[backend], "a save of 100 messages, chat of 10 000")
        elif backend == "postgres":
            found[backend] = await postgres_cells(args.pg_url, args.saves)
            lines += report(backend, found[backend], "a save of 100 messages, chat of 10 000")
        elif backend == "mariadb":
            found[backend] = await mariadb_cells(args.my_url, args.saves)
            lines += report(backend, found[backend], "a save of one message, chat of 1 000")
        else:
            parser.error(f"unknown backend {backend!r}: sqlite, postgres or mariadb")
        print("\n".join(lines[-(len(found[backend]) + 2) :]), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"saves": args.saves, "cells": found}, indent=2) + "\n")
        args.out.with_suffix(".txt").write_text("\n".join(lines).lstrip() + "\n")


if __name__ == "__main__":
    asyncio.run(main())
