"""Does each operation stay flat as the database grows? On SQLite, PostgreSQL and MariaDB.

    python benchmarks/bench_scale.py [--sizes 10000,1000000] [--backends sqlite,postgres]
                                     [--reps 5] [--pg-url URL] [--my-url URL] [--batch 2000]
                                     [--keep] [--data-dir DIR] [--out FILE]

(``--backends sqlite,postgres,mariadb`` adds MariaDB/MySQL: a scratch database per size on the
server of ``--my-url``, whose user may create databases.)

What the library claims at scale, and what this measures, on a database of each size
(``--sizes``, in messages) built the same way at every size:

- a search costs what its scope holds (a chat, or one user's chats), not what the database
  holds;
- ``list_chats(after=cursor)`` pages at the same cost at any depth;
- a delete costs what it deletes;
- retention works in short transactions: no concurrent save waits more than 100 ms while a
  prune of 10 % of the chats runs.

Every figure is printed per size with its **growth** (the largest size over the smallest, both
measured in the same run): a claim holds when the growth of its cells stays near 1x while the
database around the probed scope grows (100-fold with the default sizes).

**The dataset**, written through the public API, the same shape at every size:

- a *probe* user with 3 chats of 100 messages, identical at every size (same ids, same
  texts): its scope does not grow, only the database around it;
- a *big* user with ``size / 100`` chats of 66 messages (10 000 chats at 1 000 000);
- small users with 5 chats each, the rest of the messages in chats of about 64 (15 311 chats
  in all at 1 000 000);
- messages of about 400 characters of varied text (``_workload.text``: Zipf-distributed
  pseudo-words), alternating user and assistant; ``COMMON`` (the most common word) is in about
  90 % of them, ``RARE`` is planted in 1 message in 1 000 (in the probe chats, at a fixed
  place: 1 hit per probe chat), ``UNIQUE`` in 4 known messages (the probe user has 2 of them,
  the big user 1);
- interleaved as real traffic is: the messages go in 33 rounds, each giving every chat (in a
  shuffled order) its next share, so that each chat's messages are spread over the whole
  database. Chats are made with ``create_chat``, messages written with ``add_messages``
  (``--batch`` messages of many chats per call), then each chat's ``main`` head is set with
  ``update_branch_head``. The build rate (messages per second of library calls, text
  generation left out) is printed, and compared with ``import_chat`` of whole chats (the
  chats the prune below deletes, exported before it and imported again after it).
- PostgreSQL gets a ``VACUUM ANALYZE`` after the build (what autovacuum has done by then in a
  live database); SQLite nothing (the library runs no ``ANALYZE`` and neither do its users);
  MariaDB an ``ANALYZE TABLE`` of each table (what InnoDB's automatic recalculation of its
  statistics does once a tenth of a table changed), also to read the tables' sizes, after
  waiting for InnoDB's purge of what a kept database's last prune deleted (the seconds waited
  are recorded).

**The cells** (times are medians of ``--reps`` calls after a warm-up call; the calls of one
group take turns, the searches in a group apart from their ``LIKE`` floors; the garbage
collector runs as usual, since a full collection before each call would add a cost of its
own, growing with the heap, to calls of a millisecond or two):

1. ``search_messages(probe chat, COMMON / RARE)``, ``search_user_messages(probe user, COMMON /
   RARE)``: expected flat; against the floor of a ``LIKE '%word%'`` scan of the same scope's
   messages through the raw driver (aiosqlite / asyncpg / asyncmy; case-insensitive as the
   search is: SQLite's ``LIKE``, PostgreSQL's ``ILIKE``, MariaDB's ``LOWER(data) LIKE``), which
   only finds them (goal: search
   at least 20x faster; printed as "Nx LIKE's speed", LIKE's time over search's).
   ``search_user_messages(big user, COMMON / RARE / UNIQUE)``: the big user's chats grow with
   the database, so these are reported, not expected flat (RARE and UNIQUE against a LIKE
   scan of the big user's messages too).
2. ``list_chats(user_id=big user, limit=50)``: the first page; the page at depth D (half the big
   user's chats, at most 5 000) with ``offset=D``, and with ``after=`` the cursor of the chat
   before it (expected flat, where ``offset`` reads the chats it skips).
3. A cold ``ContextEngine(...).resolve()`` of the probe chat on a fresh store (opened and
   connected untimed, so nothing of the chat is cached), against the raw driver reading the
   same 100 rows with ``json.loads``; one ``save()`` of one message through a fresh engine of
   a small user's chat (another chat each time).
4. ``purge()`` of a chat (64 messages on ``main``) whose deleted side branch left 300 messages
   unreachable, built afresh for each call; then ``delete_chat()`` of it.
5. ``prune()`` of 10 % of the chats (every tenth, made old by setting ``updated_at`` through the
   store's engine, untimed) while another process (this script, ``--writer``) saves one message
   every 10 ms to a chat of its own through a store of its own, and a task of this process does
   the same on this process's store: the prune's duration, the chats it deleted, and the
   latency of the saves that overlapped it (max and p99), against the same writers' saves in
   the second before it. Run once per size (it deletes what it measures); the pruned chats are
   then imported again (``import_chat``), so a kept database stays whole for the next run.
   The prune's duration grows with the database (it deletes 10 % of it); its duration per
   chat deleted is expected flat.

``--keep`` keeps the databases (SQLite files in ``--data-dir``, server databases named
after the size) and a later run with ``--keep`` uses them again instead of building (its
build rate is the one recorded when it was built; the chats a prune deleted are back, written
whole by ``import_chat`` rather than interleaved). Without it everything is built in a
temporary directory or a scratch database and dropped. Every sample goes to the ``--out``
JSON file (default ``benchmarks/results/scale-<date>.json``). Keep validation runs small
(``--sizes 2000,20000 --reps 3`` takes about a minute); at the default sizes the build of
1 000 000 messages takes a quarter of an hour or more per backend.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiosqlite
import asyncmy  # type: ignore[import-untyped]
import asyncpg
from sqlalchemy import bindparam, text
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import message_data, vocabulary
from _workload import text as sample_text

from agentcontext import ChatExport, ContextEngine, MessageRecord, SqlContextStore, user

DEFAULT_PG = os.environ.get(
    "AGENTCONTEXT_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
)
DEFAULT_MY = os.environ.get(
    "AGENTCONTEXT_TEST_MARIADB_URL",
    "mysql+asyncmy://agentcontext:agentcontext@127.0.0.1:3306/agentcontext_test",
)
SCRIPT = str(Path(__file__).resolve())
LAYOUT_VERSION = 1
"""Bumped when the dataset changes, so that a kept database of another shape is not reused."""

COMMON = vocabulary()[0]
RARE = "zebracorn"  # no pseudo-word has a "z": only where planted
UNIQUE = "quokkaquest"
RARE_EVERY = 1000
ROUNDS = 33

PROBE_USER = "probe-user"
PROBE_CHAT = "probe-0"
PROBE_CHATS = 3
PROBE_LENGTH = 100
PROBE_RARE_AT = 50
BIG_USER = "big-user"
BIG_LENGTH = 66
SMALL_LENGTH = 64
SMALL_PER_USER = 5
UNIQUE_AT = {"probe-0": 30, "probe-2": 60, "big-00000": 10, "small-00000": 10}
META_CHAT = "bench-scale-meta"
PAGE = 50
DEPTH_MAX = 5000
PURGE_MAIN = 64
PURGE_SIDE = 300
PRUNE_EVERY = 10
OLD = datetime(2020, 1, 1, tzinfo=UTC)
CUTOFF = datetime(2021, 1, 1, tzinfo=UTC)
WRITER_INTERVAL = 0.01
WRITER_BASELINE = 1.0
SAVE_GOAL = 0.1
LIKE_GOAL = 20.0


# --- the dataset --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChatSpec:
    id: str
    user_id: str
    length: int
    ordinal: int
    """Its place among the chats that are not probes (-1 for a probe chat)."""


class Layout:
    """Every chat of a database of ``size`` messages: a pure function of the size."""

    def __init__(self, size: int) -> None:
        if size < 1000:
            raise SystemExit(f"sizes start at 1000 messages, got {size}")
        self.size = size
        chats = [ChatSpec(f"probe-{i}", PROBE_USER, PROBE_LENGTH, -1) for i in range(PROBE_CHATS)]
        self.big_chats = max(2, round(size / 100))
        chats += [ChatSpec(f"big-{i:05d}", BIG_USER, BIG_LENGTH, i) for i in range(self.big_chats)]
        rest = size - PROBE_CHATS * PROBE_LENGTH - BIG_LENGTH * self.big_chats
        small = max(1, rest // SMALL_LENGTH)
        base, extra = divmod(rest, small)
        chats += [
            ChatSpec(
                f"small-{i:05d}",
                f"user-{i // SMALL_PER_USER:05d}",
                base + (i < extra),
                self.big_chats + i,
            )
            for i in range(small)
        ]
        self.chats = chats
        self.small_chats = [c for c in chats if c.user_id not in (PROBE_USER, BIG_USER)]
        self.users = len({c.user_id for c in chats})
        self.depth = min(DEPTH_MAX, self.big_chats // 2)
        self.aged = [c for c in chats if c.ordinal >= 0 and c.ordinal % PRUNE_EVERY == 5]
        self.big_rare = sum(
            1 for c in chats if c.user_id == BIG_USER for i in range(c.length) if planted(c, i)
        )
        assert sum(c.length for c in chats) == size

    def describe(self) -> dict[str, Any]:
        return {
            "messages": self.size,
            "chats": len(self.chats),
            "users": self.users,
            "big_user_chats": self.big_chats,
            "small_chats": len(self.small_chats),
            "list_depth": self.depth,
            "aged_chats": len(self.aged),
            "big_user_rare_hits": self.big_rare,
        }


def planted(chat: ChatSpec, i: int) -> bool:
    """Whether message ``i`` of ``chat`` holds `RARE`."""
    if chat.ordinal < 0:
        return i == PROBE_RARE_AT
    return (chat.ordinal * BIG_LENGTH + i) % RARE_EVERY == RARE_EVERY // 2


def message_id(chat_id: str, i: int) -> str:
    return f"{chat_id}-{i:03d}"


def plant(rng: random.Random, body: str, word: str) -> str:
    words = body.split(" ")
    words.insert(rng.randrange(1, len(words)), word)
    return " ".join(words)


def record(chat: ChatSpec, rng: random.Random, i: int) -> MessageRecord:
    """Message ``i`` of ``chat`` (its texts come from the chat's own generator, in order, so a
    chat holds the same messages at every size)."""
    body = sample_text(rng)
    if planted(chat, i):
        body = plant(rng, body, RARE)
    if UNIQUE_AT.get(chat.id) == i:
        body = plant(rng, body, UNIQUE)
    role = "user" if i % 2 == 0 else "assistant"
    mid = message_id(chat.id, i)
    return MessageRecord(
        id=mid,
        chat_id=chat.id,
        parent_id=message_id(chat.id, i - 1) if i else None,
        name=role,
        data=message_data(mid, role, body),
    )


async def build(store: SqlContextStore, layout: Layout, batch: int) -> dict[str, Any]:
    """Write the layout's chats, interleaved; what each phase took."""
    started = time.perf_counter()
    took = {"create_chat": 0.0, "add_messages": 0.0, "update_branch_head": 0.0}
    generate = 0.0
    for chat in layout.chats:
        t = time.perf_counter()
        await store.create_chat(chat.id, user_id=chat.user_id, title=f"chat {chat.id}")
        took["create_chat"] += time.perf_counter() - t
    rngs = {chat.id: random.Random(chat.id) for chat in layout.chats}
    calls = 0
    for r in range(ROUNDS):
        order = list(layout.chats)
        random.Random(r).shuffle(order)
        t = time.perf_counter()
        pending: list[MessageRecord] = []
        for chat in order:
            for i in range(chat.length * r // ROUNDS, chat.length * (r + 1) // ROUNDS):
                pending.append(record(chat, rngs[chat.id], i))
        generate += time.perf_counter() - t
        for start in range(0, len(pending), batch):
            t = time.perf_counter()
            await store.add_messages(pending[start : start + batch])
            took["add_messages"] += time.perf_counter() - t
            calls += 1
        done = sum(c.length * (r + 1) // ROUNDS for c in layout.chats)
        progress(f"  build: round {r + 1}/{ROUNDS}, {done:,} messages", often=(r + 1) % 11 > 0)
    for chat in layout.chats:
        t = time.perf_counter()
        branch = await store.get_active_branch(chat.id)
        assert branch is not None
        await store.update_branch_head(
            branch.id, message_id(chat.id, chat.length - 1), expected_head=None
        )
        took["update_branch_head"] += time.perf_counter() - t
    progress("")
    library = sum(took.values())
    return {
        "seconds": {**took, "text_generation": generate, "wall": time.perf_counter() - started},
        "add_messages_calls": calls,
        "batch": batch,
        "rate": layout.size / library,
    }


def progress(line: str, *, often: bool = True) -> None:
    """A progress line on standard error: rewritten in place on a terminal, else only the lines
    that are not ``often``."""
    if sys.stderr.isatty():
        sys.stderr.write(f"\r{line:<70}\r" if line else f"\r{'':<70}\r")
        sys.stderr.flush()
    elif line and not often:
        print(line, file=sys.stderr, flush=True)


# --- timing -------------------------------------------------------------------------------------


async def sample(fns: dict[str, Callable[[], Awaitable[Any]]], reps: int) -> dict[str, list[float]]:
    """``reps`` wall times of each call, the calls taking turns, after one warm-up call each.

    The garbage collector runs as it would in a server: a full collection before each call
    would leave the processor's caches cold and add a cost of its own, which grows with the
    heap, to calls of a millisecond or two."""
    gc.collect()
    for fn in fns.values():
        await fn()
    out: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            started = time.perf_counter()
            await fn()
            out[name].append(time.perf_counter() - started)
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- raw driver floors --------------------------------------------------------------------------


class Raw:
    """The bare driver on the store's database: the LIKE scans and the chain read."""

    def __init__(self, backend: str, url: str) -> None:
        self.backend = backend
        self.url = url
        self.sqlite: aiosqlite.Connection | None = None
        self.pg: asyncpg.Connection | None = None
        self.my: Any = None

    async def __aenter__(self) -> Raw:
        if self.backend == "sqlite":
            self.sqlite = await aiosqlite.connect(make_url(self.url).database or "")
        elif self.backend == "mariadb":
            self.my = await my_connect(self.url)
        else:
            self.pg = await asyncpg.connect(dsn(self.url))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.sqlite is not None:
            await self.sqlite.close()
        if self.pg is not None:
            await self.pg.close()
        if self.my is not None:
            self.my.close()

    async def fetch(self, sql: dict[str, str], *args: Any) -> list[Any]:
        """The rows of the statement of this backend (``sql``: SQLite's with ``?`` parameters;
        ``pg``, ``my``: PostgreSQL's, MariaDB's, where they differ)."""
        if self.sqlite is not None:
            async with self.sqlite.execute(sql["sqlite"], args) as cursor:
                return list(await cursor.fetchall())
        if self.my is not None:
            statement = sql.get("my", sql["sqlite"].replace("?", "%s"))
            async with self.my.cursor() as cursor:
                await cursor.execute(statement, args)
                rows = list(await cursor.fetchall())
            await self.my.rollback()  # no snapshot kept open between calls
            return rows
        assert self.pg is not None
        return list(await self.pg.fetch(sql["pg"], *args))

    async def like_chat(self, chat_id: str, word: str) -> list[Any]:
        return await self.fetch(
            {
                "sqlite": "SELECT id, data FROM messages WHERE chat_id = ? AND data LIKE ?",
                "pg": "SELECT id, data::text FROM messages WHERE chat_id = $1 "
                "AND data::text ILIKE $2",
                "my": "SELECT id, data FROM messages WHERE chat_id = %s AND LOWER(data) LIKE %s",
            },
            chat_id,
            f"%{word}%",
        )

    async def like_user(self, user_id: str, word: str) -> list[Any]:
        return await self.fetch(
            {
                "sqlite": "SELECT m.id, m.data FROM messages AS m JOIN chats AS c "
                "ON c.id = m.chat_id WHERE c.user_id = ? AND m.data LIKE ?",
                "pg": "SELECT m.id, m.data::text FROM messages AS m JOIN chats AS c "
                "ON c.id = m.chat_id WHERE c.user_id = $1 AND m.data::text ILIKE $2",
                "my": "SELECT m.id, m.data FROM messages AS m JOIN chats AS c "
                "ON c.id = m.chat_id WHERE c.user_id = %s AND LOWER(m.data) LIKE %s",
            },
            user_id,
            f"%{word}%",
        )

    async def read_chat(self, chat_id: str) -> list[Any]:
        rows = await self.fetch(
            {
                "sqlite": "SELECT id, parent_id, name, data, created_at FROM messages "
                "WHERE chat_id = ?",
                "pg": "SELECT id, parent_id, name, data, created_at FROM messages "
                "WHERE chat_id = $1",
            },
            chat_id,
        )
        return [(r[0], r[1], r[2], json.loads(r[3]), r[4]) for r in rows]


def dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def my_connect(url: str, *, database: bool = True) -> Any:
    """A bare asyncmy connection to the MariaDB/MySQL server of ``url`` (to its database, or to
    none)."""
    parts = make_url(url)
    return await asyncmy.connect(
        host=parts.host or "127.0.0.1",
        port=parts.port or 3306,
        user=parts.username or "root",
        password=parts.password or "",
        database=parts.database if database else None,
        charset="utf8mb4",
    )


# --- the cells ----------------------------------------------------------------------------------


async def search_cells(store: SqlContextStore, raw: Raw, layout: Layout, reps: int) -> Any:
    # What each search must find, at every size.
    chat_hits = await store.search_messages(PROBE_CHAT, UNIQUE)
    assert [h.message.id for h in chat_hits] == [message_id(PROBE_CHAT, UNIQUE_AT[PROBE_CHAT])]
    assert len(await store.search_messages(PROBE_CHAT, RARE)) == 1
    assert len(await store.search_user_messages(PROBE_USER, RARE)) == PROBE_CHATS
    assert len(await store.search_user_messages(PROBE_USER, UNIQUE)) == 2
    assert len(await store.search_user_messages(BIG_USER, UNIQUE)) == 1
    big_rare = await store.search_user_messages(BIG_USER, RARE, limit=1000)
    assert len(big_rare) == min(layout.big_rare, 1000), (len(big_rare), layout.big_rare)
    assert len(await store.search_messages(PROBE_CHAT, COMMON)) == 20
    assert len(await raw.like_chat(PROBE_CHAT, RARE)) == 1
    assert len(await raw.like_user(PROBE_USER, RARE)) == PROBE_CHATS
    # Two groups: a LIKE scan of the big user takes seconds at a million messages, and the
    # call after seconds of waiting in this process runs cold (on some machines several
    # times slower), which would fall on the probe's first search at the largest size only.
    searches = await sample(
        {
            "search.chat.common": lambda: store.search_messages(PROBE_CHAT, COMMON),
            "search.chat.rare": lambda: store.search_messages(PROBE_CHAT, RARE),
            "search.user.common": lambda: store.search_user_messages(PROBE_USER, COMMON),
            "search.user.rare": lambda: store.search_user_messages(PROBE_USER, RARE),
            "search.big.common": lambda: store.search_user_messages(BIG_USER, COMMON),
            "search.big.rare": lambda: store.search_user_messages(BIG_USER, RARE),
            "search.big.unique": lambda: store.search_user_messages(BIG_USER, UNIQUE),
        },
        reps,
    )
    return searches | await sample(
        {
            "like.chat.common": lambda: raw.like_chat(PROBE_CHAT, COMMON),
            "like.chat.rare": lambda: raw.like_chat(PROBE_CHAT, RARE),
            "like.user.common": lambda: raw.like_user(PROBE_USER, COMMON),
            "like.user.rare": lambda: raw.like_user(PROBE_USER, RARE),
            "like.big.rare": lambda: raw.like_user(BIG_USER, RARE),
            "like.big.unique": lambda: raw.like_user(BIG_USER, UNIQUE),
        },
        reps,
    )


async def list_cells(store: SqlContextStore, layout: Layout, reps: int) -> Any:
    depth = layout.depth
    first = await store.list_chats(user_id=BIG_USER, limit=PAGE)
    assert len(first) == min(PAGE, layout.big_chats)
    before = await store.list_chats(user_id=BIG_USER, limit=1, offset=depth - 1)
    cursor = before[0].cursor
    by_offset = await store.list_chats(user_id=BIG_USER, limit=PAGE, offset=depth)
    by_cursor = await store.list_chats(user_id=BIG_USER, limit=PAGE, after=cursor)
    assert [c.id for c in by_offset] == [c.id for c in by_cursor]
    return await sample(
        {
            "list.first": lambda: store.list_chats(user_id=BIG_USER, limit=PAGE),
            "list.offset": lambda: store.list_chats(user_id=BIG_USER, limit=PAGE, offset=depth),
            "list.after": lambda: store.list_chats(user_id=BIG_USER, limit=PAGE, after=cursor),
        },
        reps,
    )


async def resolve_save_cells(
    store: SqlContextStore, raw: Raw, url: str, layout: Layout, reps: int
) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"resolve.cold": [], "resolve.floor": [], "save.one": []}
    rng = random.Random(layout.size)
    targets = layout.small_chats[:: max(1, len(layout.small_chats) // (reps + 1))]
    for rep in range(reps + 1):  # the first round is the warm-up
        fresh = SqlContextStore(url)
        try:
            await fresh.get_chat(targets[-1].id)  # connected and migrated; the probe untouched
            engine = ContextEngine(store=fresh, chat_id=PROBE_CHAT, user_id=PROBE_USER)
            started = time.perf_counter()
            result = await engine.resolve()
            cold = time.perf_counter() - started
            assert len(result.messages) == PROBE_LENGTH
        finally:
            await fresh.close()
        started = time.perf_counter()
        rows = await raw.read_chat(PROBE_CHAT)
        floor = time.perf_counter() - started
        assert len(rows) == PROBE_LENGTH
        target = targets[rep % len(targets)]
        engine = ContextEngine(store=store, chat_id=target.id, user_id=target.user_id)
        engine.set(user(sample_text(rng)))
        started = time.perf_counter()
        await engine.save()
        save = time.perf_counter() - started
        if rep:
            out["resolve.cold"].append(cold)
            out["resolve.floor"].append(floor)
            out["save.one"].append(save)
    return out


def plain(chat_id: str, i: int, parent: str | None, prefix: str) -> MessageRecord:
    mid = f"{chat_id}-{prefix}{i:03d}"
    role = "user" if i % 2 == 0 else "assistant"
    return MessageRecord(
        id=mid,
        chat_id=chat_id,
        parent_id=parent,
        name=role,
        data=message_data(mid, role, f"{prefix} message {i} of {chat_id}, {COMMON} and more"),
    )


async def purge_fixture(store: SqlContextStore, chat_id: str) -> None:
    """A chat of `PURGE_MAIN` messages on ``main`` and a deleted side branch of `PURGE_SIDE`
    from its middle, which only that branch reached."""
    await store.create_chat(chat_id, user_id="purge-user")
    main: list[MessageRecord] = []
    for i in range(PURGE_MAIN):
        main.append(plain(chat_id, i, main[-1].id if main else None, "m"))
    await store.add_messages(main)
    branch = await store.get_active_branch(chat_id)
    assert branch is not None
    await store.update_branch_head(branch.id, main[-1].id, expected_head=None)
    fork = main[PURGE_MAIN // 2 - 1].id
    side_branch = await store.create_branch(chat_id, "side", head_message_id=fork)
    side: list[MessageRecord] = []
    for i in range(PURGE_SIDE):
        side.append(plain(chat_id, i, side[-1].id if side else fork, "s"))
    await store.add_messages(side)
    await store.update_branch_head(side_branch.id, side[-1].id, expected_head=fork)
    assert await store.delete_branch(chat_id, "side")


async def purge_cells(store: SqlContextStore, reps: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"purge": [], "delete": []}
    for rep in range(reps + 1):
        chat_id = f"purge-{uuid.uuid4().hex[:12]}"
        await purge_fixture(store, chat_id)
        started = time.perf_counter()
        report = await store.purge(chat_id)
        purge = time.perf_counter() - started
        assert report.deleted_messages == PURGE_SIDE, report
        assert report.kept_messages == PURGE_MAIN, report
        started = time.perf_counter()
        assert await store.delete_chat(chat_id)
        delete = time.perf_counter() - started
        if rep:
            out["purge"].append(purge)
            out["delete"].append(delete)
    return out


# --- prune with writers -------------------------------------------------------------------------


async def save_loop(store: SqlContextStore, chat_id: str, user_id: str, stop: Any) -> list[Any]:
    """Save one message every `WRITER_INTERVAL` until ``stop()``: ``(wall start, seconds)``."""
    rng = random.Random(chat_id)
    samples: list[tuple[float, float]] = []
    while not stop():
        engine = ContextEngine(store=store, chat_id=chat_id, user_id=user_id)
        engine.set(user(sample_text(rng, 200)))
        wall = time.time()
        started = time.perf_counter()
        await engine.save()
        samples.append((wall, time.perf_counter() - started))
        await asyncio.sleep(WRITER_INTERVAL)
    return samples


async def writer_main(url: str, chat_id: str, user_id: str) -> None:
    """The other process: saves until a line comes on its standard input, then prints its
    samples."""
    async with SqlContextStore(url) as store:
        engine = ContextEngine(store=store, chat_id=chat_id, user_id=user_id)
        engine.set(user("first"))
        await engine.save()
        print("ready", flush=True)
        stop = asyncio.ensure_future(asyncio.to_thread(sys.stdin.readline))
        samples = await save_loop(store, chat_id, user_id, stop.done)
        await stop
    print(json.dumps(samples), flush=True)


def during(samples: list[Any], start: float, end: float) -> list[float]:
    """The latencies of the saves that overlapped ``[start, end]`` (wall clock)."""
    return [took for wall, took in samples if wall <= end and wall + took >= start]


def before(samples: list[Any], start: float) -> list[float]:
    """The latencies of the saves of the `WRITER_BASELINE` seconds before ``start``."""
    return [took for wall, took in samples if start - WRITER_BASELINE <= wall < start - took]


def latency_stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "median": statistics.median(values),
        "p99": percentile(values, 0.99),
        "max": max(values),
    }


async def age(store: SqlContextStore, chat_ids: list[str]) -> None:
    """Make these chats' last activity old (straight through the store's engine)."""
    value: Any = {
        "postgresql": OLD,
        "mysql": OLD.replace(tzinfo=None),  # DATETIME(6), in UTC
    }.get(store.dialect_name, OLD.isoformat(timespec="microseconds"))
    statement = text("UPDATE chats SET updated_at = :old WHERE id IN :ids").bindparams(
        bindparam("ids", expanding=True)
    )
    async with store.engine.begin() as conn:
        for start in range(0, len(chat_ids), 500):
            await conn.execute(statement, {"old": value, "ids": chat_ids[start : start + 500]})


async def prune_cell(store: SqlContextStore, url: str, layout: Layout) -> dict[str, Any]:
    aged = [c.id for c in layout.aged]
    await age(store, aged)
    # Kept aside (as JSON, lighter than the models) to write them back afterwards, timing
    # import_chat.
    started = time.perf_counter()
    exports = [(await store.export_chat(chat_id)).model_dump_json() for chat_id in aged]
    exported = time.perf_counter() - started

    tag = uuid.uuid4().hex[:8]
    other_chat, own_chat = f"writer-{tag}", f"inproc-{tag}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        SCRIPT,
        "--writer",
        url,
        other_chat,
        "writer-user",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    stopped = False
    own = asyncio.create_task(save_loop(store, own_chat, "writer-user", lambda: stopped))
    try:
        assert proc.stdout is not None
        ready = await proc.stdout.readline()
        assert ready.strip() == b"ready", ready
        await asyncio.sleep(WRITER_BASELINE)
        batches: list[float] = []  # when each batch of the prune committed (wall clock)
        start = time.time()
        began = time.perf_counter()
        report = await store.prune(
            older_than=CUTOFF, progress=lambda done, total: batches.append(time.time())
        )
        took = time.perf_counter() - began
        end = time.time()
        await asyncio.sleep(0.2)
        stopped = True
        own_samples = await own
        out, _ = await proc.communicate(b"stop\n")
    finally:
        stopped = True
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await asyncio.gather(own, return_exceptions=True)
    other_samples = json.loads(out.decode().strip().splitlines()[-1])
    assert sorted(report.chat_ids) == sorted(aged), (len(report.chat_ids), len(aged))
    for chat_id in (other_chat, own_chat):
        await store.delete_chat(chat_id)

    imported = 0.0
    messages = 0
    for line in exports:
        export = ChatExport.model_validate_json(line)
        messages += len(export.messages)
        started = time.perf_counter()
        await store.import_chat(export)
        imported += time.perf_counter() - started
    return {
        "seconds": took,
        "chats": len(report.chat_ids),
        "messages": report.deleted.get("messages", 0),
        "deleted": report.deleted,
        "other_process": {
            "during": latency_stats(during(other_samples, start, end)),
            "before": latency_stats(before(other_samples, start)),
            "samples": other_samples,
        },
        "same_process": {
            "during": latency_stats(during(own_samples, start, end)),
            "before": latency_stats(before(own_samples, start)),
            "samples": own_samples,
        },
        "window": [start, end],
        "batches": len(batches),
        "longest_batch": max(b - a for a, b in zip([start, *batches], batches, strict=False))
        if batches
        else None,
        "export_seconds": exported,
        "import": {"chats": len(aged), "messages": messages, "seconds": imported},
    }


# --- one database -------------------------------------------------------------------------------


async def is_built(url: str, size: int) -> dict[str, Any] | None:
    """The build record of a kept database holding this layout, or None."""
    async with SqlContextStore(url) as store:
        meta = await store.get_chat(META_CHAT)
    if meta is None or meta.metadata.get("layout") != [LAYOUT_VERSION, size]:
        return None
    return dict(meta.metadata["build"])


async def run_size(
    backend: str, url: str, size: int, args: argparse.Namespace, built: dict[str, Any] | None
) -> dict[str, Any]:
    """Build (unless ``built``: a kept database of this layout), then measure every cell."""
    layout = Layout(size)
    result: dict[str, Any] = {"backend": backend, "size": size, "dataset": layout.describe()}
    result["reused"] = built is not None
    if built is None:
        async with SqlContextStore(url) as store:
            built = await build(store, layout, args.batch)
            await store.create_chat(
                META_CHAT,
                user_id="bench-meta",
                metadata={"layout": [LAYOUT_VERSION, size], "build": built},
            )
    result["build"] = built
    if backend == "postgres":
        conn = await asyncpg.connect(dsn(url))
        try:
            await conn.execute("VACUUM ANALYZE")
        finally:
            await conn.close()
    if backend == "mariadb":
        result["purge_wait"] = await purged(url)
    result["server"], result["bytes"] = await footprint(backend, url)
    cells: dict[str, list[float]] = {}
    async with SqlContextStore(url) as store, Raw(backend, url) as raw:
        cells |= await search_cells(store, raw, layout, args.reps)
        cells |= await list_cells(store, layout, args.reps)
        cells |= await resolve_save_cells(store, raw, url, layout, args.reps)
        cells |= await purge_cells(store, args.reps)
        result["prune"] = await prune_cell(store, url, layout)
    result["cells"] = cells
    return result


async def purged(url: str, most: float = 1800.0) -> float:
    """Wait until InnoDB has purged the rows deleted before (a kept database's last prune
    deleted 10 % of it), at most ``most`` seconds: its purge threads would otherwise take the
    processor from every cell for minutes. The seconds waited."""
    started = time.perf_counter()
    conn = await my_connect(url)
    try:
        async with conn.cursor() as cursor:
            while time.perf_counter() - started < most:
                await cursor.execute(
                    "SELECT `count` FROM information_schema.INNODB_METRICS "
                    "WHERE name = 'trx_rseg_history_len'"
                )
                row = await cursor.fetchone()
                await conn.rollback()
                if row is None or int(row[0]) < 1000:
                    break
                progress(f"  waiting for InnoDB's purge: {int(row[0]):,} undo logs")
                await asyncio.sleep(5)
    finally:
        conn.close()
    progress("")
    return time.perf_counter() - started


async def footprint(backend: str, url: str) -> tuple[dict[str, Any], dict[str, int]]:
    """The server's settings that decide what fits in memory, and the bytes of each table (the
    database file on SQLite), read after the build."""
    if backend == "sqlite":
        path = make_url(url).database or ""
        return {}, {"file": file_bytes(path)}
    if backend == "postgres":
        conn = await asyncpg.connect(dsn(url))
        try:
            rows = await conn.fetch(
                "SELECT relname, pg_total_relation_size(oid) FROM pg_class "
                "WHERE relkind = 'r' AND relnamespace = 'public'::regnamespace"
            )
            shared = await conn.fetchval("SHOW shared_buffers")
        finally:
            await conn.close()
        return {"shared_buffers": shared}, {name: int(size) for name, size in rows}
    conn = await my_connect(url)
    try:
        async with conn.cursor() as cursor:
            # InnoDB's sizes in information_schema are those of its last statistics: read
            # afresh (what its automatic recalculation does once a tenth of a table changed).
            await cursor.execute("SHOW TABLES")
            for (table,) in await cursor.fetchall():
                await cursor.execute(f"ANALYZE TABLE `{table}`")
                await cursor.fetchall()
            await cursor.execute(
                "SELECT VERSION(), @@innodb_buffer_pool_size, @@innodb_flush_log_at_trx_commit"
            )
            version, pool, flush = await cursor.fetchone()
            await cursor.execute(
                "SELECT table_name, data_length + index_length FROM information_schema.TABLES "
                "WHERE table_schema = DATABASE()"
            )
            rows = await cursor.fetchall()
    finally:
        conn.close()
    server = {"version": version, "innodb_buffer_pool_size": int(pool), "flush_at_commit": flush}
    return server, {name: int(size) for name, size in rows}


async def run_backend(backend: str, args: argparse.Namespace, folder: Path) -> list[Any]:
    results = []
    for size in args.sizes:
        print(f"{backend}: {size:,} messages ...", file=sys.stderr, flush=True)
        if backend == "sqlite":
            path = folder / f"scale-{size}-v{LAYOUT_VERSION}.db"
            url = f"sqlite+aiosqlite:///{path}"
            built = await is_built(url, size) if args.keep else None
            if built is None:
                remove_sqlite(path)  # a kept database cut short is built again
            try:
                results.append(await run_size(backend, url, size, args, built))
            finally:
                if not args.keep:
                    remove_sqlite(path)
            continue
        if backend == "mariadb":
            results.append(await run_my_size(size, args))
            continue
        admin = await asyncpg.connect(dsn(args.pg_url))
        try:
            if args.keep:
                name = f"acbench_scale_{size}_v{LAYOUT_VERSION}"
                exists = await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
            else:
                name, exists = f"acbench_scale_{size}_{uuid.uuid4().hex[:8]}", None
            url = make_url(args.pg_url).set(database=name).render_as_string(hide_password=False)
            built = await is_built(url, size) if exists else None
            if built is None:  # a kept database cut short is built again
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                await admin.execute(f'CREATE DATABASE "{name}"')
            try:
                results.append(await run_size(backend, url, size, args, built))
            finally:
                if not args.keep:
                    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()
    return results


async def run_my_size(size: int, args: argparse.Namespace) -> dict[str, Any]:
    """One size on MariaDB/MySQL: a database of its own on the server of ``--my-url``."""
    admin = await my_connect(args.my_url, database=False)
    try:
        async with admin.cursor() as cursor:
            if args.keep:
                name = f"acbench_scale_{size}_v{LAYOUT_VERSION}"
                await cursor.execute(
                    "SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s", (name,)
                )
                exists = await cursor.fetchone()
            else:
                name, exists = f"acbench_scale_{size}_{uuid.uuid4().hex[:8]}", None
        url = make_url(args.my_url).set(database=name).render_as_string(hide_password=False)
        built = await is_built(url, size) if exists else None
        async with admin.cursor() as cursor:
            if built is None:  # a kept database cut short is built again
                if exists:
                    await cursor.execute(f"DROP DATABASE `{name}`")
                await cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        try:
            return await run_size("mariadb", url, size, args, built)
        finally:
            if not args.keep:
                async with admin.cursor() as cursor:
                    await cursor.execute(f"DROP DATABASE `{name}`")
    finally:
        admin.close()


# --- the report ---------------------------------------------------------------------------------

CELLS = [
    # key, label, expectation, baseline key (search: x faster than it; resolve: x of it)
    ("search.chat.common", "search_messages(probe chat, common word)", "flat", "like.chat.common"),
    ("search.chat.rare", "search_messages(probe chat, rare word)", "flat", "like.chat.rare"),
    (
        "search.user.common",
        "search_user_messages(probe user, common word)",
        "flat",
        "like.user.common",
    ),
    ("search.user.rare", "search_user_messages(probe user, rare word)", "flat", "like.user.rare"),
    ("search.big.common", "search_user_messages(big user, common word)", "its scope grows", None),
    (
        "search.big.rare",
        "search_user_messages(big user, rare word)",
        "its scope grows",
        "like.big.rare",
    ),
    (
        "search.big.unique",
        "search_user_messages(big user, unique word)",
        "1 hit",
        "like.big.unique",
    ),
    ("like.chat.common", "  floor: LIKE scan of the probe chat, common word", "flat", None),
    ("like.chat.rare", "  floor: LIKE scan of the probe chat, rare word", "flat", None),
    ("like.user.common", "  floor: LIKE scan of the probe user, common word", "flat", None),
    ("like.user.rare", "  floor: LIKE scan of the probe user, rare word", "flat", None),
    ("like.big.rare", "  floor: LIKE scan of the big user, rare word", "grows", None),
    ("like.big.unique", "  floor: LIKE scan of the big user, unique word", "grows", None),
    ("list.first", "list_chats(big user, limit=50)", "flat", None),
    ("list.offset", "list_chats(big user, limit=50, offset=D)", "grows with D", None),
    ("list.after", "list_chats(big user, limit=50, after=cursor at D)", "flat", None),
    ("resolve.cold", "cold resolve() of the probe chat, fresh store", "flat", "resolve.floor"),
    ("resolve.floor", "  floor: its 100 rows by the raw driver + json.loads", "flat", None),
    ("save.one", "save() of 1 message, fresh engine, a small chat", "flat", None),
    ("purge", f"purge() of {PURGE_SIDE} unreachable messages", "flat", None),
    ("delete", f"delete_chat() of a chat of {PURGE_MAIN} messages", "flat", None),
]


def duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:,.2f} s"
    if seconds >= 0.01:
        return f"{seconds * 1000:,.1f} ms"
    return f"{seconds * 1000:,.2f} ms"


def growth(values: list[float]) -> str:
    if len(values) < 2 or not values[0]:
        return "-"
    return f"{values[-1] / values[0]:.2f}x"


def report(backend: str, results: list[dict[str, Any]], reps: int) -> list[str]:
    sizes = [r["size"] for r in results]
    out = [f"\n## {backend}: medians of {reps} calls; growth = largest size / smallest\n"]
    for r in results:
        d, b, i = r["dataset"], r["build"], r["prune"]["import"]
        out.append(
            f"- {d['messages']:,} messages: {d['chats']:,} chats of {d['users']:,} users "
            f"(big user: {d['big_user_chats']:,} chats, {d['big_user_rare_hits']} rare hits; "
            f"D = {d['list_depth']:,}). Build: {b['rate']:,.0f} messages/s with create_chat + "
            f"add_messages + update_branch_head"
            + (" (the kept database's build)" if r["reused"] else "")
            + f"; {i['messages'] / i['seconds']:,.0f} messages/s with import_chat. Size after the "
            f"build: {sum(r['bytes'].values()) / d['messages']:,.0f} bytes a message"
            + (
                f" (search index {r['bytes']['message_terms'] / d['messages']:,.0f})"
                if "message_terms" in r["bytes"]
                else ""
            )
            + (f"; server {r['server']}" if r["server"] else "")
        )
    head = " | ".join(f"{s:,} msgs" for s in sizes)
    out += [
        "",
        f"| cell | {head} | growth | expected |",
        "|---|" + "---:|" * len(sizes) + "---:|---|",
    ]
    for key, label, expected, base in CELLS:
        medians = [statistics.median(r["cells"][key]) for r in results]
        shown = []
        for r, value in zip(results, medians, strict=True):
            cell = duration(value)
            if base is not None:
                floor = statistics.median(r["cells"][base])
                if key.startswith("search"):
                    cell += f" ({floor / value:.1f}x LIKE's speed)"
                else:
                    cell += f" ({value / floor:.1f}x floor)"
            shown.append(cell)
        out.append(f"| {label} | {' | '.join(shown)} | {growth(medians)} | {expected} |")
    rows: list[tuple[str, Callable[[dict[str, Any]], Any], bool, str]] = [
        ("prune() of 10 % of the chats: duration", lambda p: p["seconds"], True, "grows (10 %)"),
        ("  chats deleted", lambda p: p["chats"], False, ""),
        ("  messages deleted", lambda p: p["messages"], False, ""),
        ("  duration per chat deleted", lambda p: p["seconds"] / max(1, p["chats"]), True, "flat"),
        ("  batches (short transactions)", lambda p: p["batches"], False, ""),
        ("  longest batch, with the pause before it", lambda p: p["longest_batch"], True, ""),
    ]
    for who, name in (("other_process", "other process"), ("same_process", "same process")):
        for phase, what in (("during", "during the prune"), ("before", "in the second before")):
            rows.append((f"  {name}: saves {what}", _stat(who, phase, "n"), False, ""))
            for stat in ("p99", "max"):
                goal = "baseline" if phase == "before" else ""
                if phase == "during" and stat == "max":
                    goal = f"<= {SAVE_GOAL * 1000:.0f} ms"
                rows.append((f"    {stat}", _stat(who, phase, stat), True, goal))
    for label, get, is_time, expected in rows:
        values = [get(r["prune"]) for r in results]
        shown = ["-" if v is None else duration(v) if is_time else f"{v:,}" for v in values]
        numbers = [float(v) for v in values if v is not None]
        change = growth(numbers) if is_time and len(numbers) == len(values) else ""
        out.append(f"| {label} | {' | '.join(shown)} | {change} | {expected} |")
    return out


def _stat(who: str, phase: str, stat: str) -> Callable[[dict[str, Any]], float | None]:
    return lambda p: p[who][phase].get(stat)


def verdicts(backend: str, results: list[dict[str, Any]]) -> list[str]:
    out = []
    last = results[-1]
    keys = ("chat.rare", "chat.common", "user.rare", "user.common", "big.rare", "big.unique")
    for key in (f"search.{k}" for k in keys):
        base = "like." + key.split(".", 1)[1]
        speed = statistics.median(last["cells"][base]) / statistics.median(last["cells"][key])
        verdict = "meets" if speed >= LIKE_GOAL else "misses"
        out.append(
            f"- {backend}, {last['size']:,}: {key} runs at {speed:.1f}x the speed of the LIKE "
            f"scan of its scope ({verdict} the goal of {LIKE_GOAL:.0f}x)"
        )
    for r in results:
        worst = r["prune"]["other_process"]["during"].get("max")
        if worst is not None:
            verdict = "meets" if worst <= SAVE_GOAL else "misses"
            out.append(
                f"- {backend}, {r['size']:,}: the other process's slowest save during the prune "
                f"took {duration(worst)} ({verdict} the {SAVE_GOAL * 1000:.0f} ms goal)"
            )
    big = results[-1]
    minutes = 1_000_000 / big["build"]["rate"] / 60
    out.append(
        f"- {backend}: at the build rate of the {big['size']:,} run, 1 000 000 messages take "
        f"about {minutes:.0f} min of library calls "
        f"(plus {big['build']['seconds']['text_generation'] / big['size'] * 1e6 / 60:.1f} min "
        "of text generation)"
    )
    return out


def file_bytes(path: str) -> int:
    """The bytes of a SQLite database: its file and its write-ahead log."""
    return sum(Path(f).stat().st_size for f in (path, f"{path}-wal") if Path(f).exists())


def remove_sqlite(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str))


# --- main ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="10000,1000000", help="messages, comma-separated")
    parser.add_argument(
        "--backends", default="sqlite,postgres", help="sqlite, postgres, mariadb: one or more"
    )
    parser.add_argument(
        "--pg-url", default=DEFAULT_PG, help="a server database (a scratch one is made per size)"
    )
    parser.add_argument(
        "--my-url",
        default=DEFAULT_MY,
        help="a MariaDB/MySQL server database (a scratch one is made per size)",
    )
    parser.add_argument("--reps", type=int, default=5, help="timed calls per cell")
    parser.add_argument("--batch", type=int, default=2000, help="messages per add_messages call")
    parser.add_argument(
        "--keep", action="store_true", help="keep the databases, and use kept ones again"
    )
    parser.add_argument("--data-dir", help="where SQLite files go (default: a temporary one)")
    parser.add_argument(
        "--out",
        default=str(Path(SCRIPT).parent / "results" / f"scale-{datetime.now(UTC):%Y-%m-%d}.json"),
        help="the JSON file every sample goes to",
    )
    parser.add_argument("--writer", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.sizes = sorted(int(s.replace("_", "")) for s in args.sizes.split(","))
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(args.backends) - {"sqlite", "postgres", "mariadb"}
    if unknown:
        parser.error(f"unknown backends: {', '.join(sorted(unknown))}")
    return args


async def main(args: argparse.Namespace) -> None:
    if args.writer:
        await writer_main(*args.writer)
        return
    for size in args.sizes:
        Layout(size)  # refuses a size too small before anything is built
    lines = [
        "# Scale: does each operation stay flat as the database grows?",
        f"\n{datetime.now(UTC):%Y-%m-%d}; sizes {', '.join(f'{s:,}' for s in args.sizes)} "
        f"messages; common word {COMMON!r} (in ~90 % of messages), rare {RARE!r} "
        f"(1 in {RARE_EVERY:,}), unique {UNIQUE!r}",
    ]
    everything: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(),
        "args": {k: v for k, v in vars(args).items() if k != "writer"},
        "runs": [],
    }
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(args.data_dir or (Path(tempfile.gettempdir()) / "agentcontext-bench-scale"))
        if not args.keep and not args.data_dir:
            folder = Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        notes: list[str] = []
        for backend in args.backends:
            results = await run_backend(backend, args, folder)
            everything["runs"] += results
            lines += report(backend, results, args.reps)
            notes += verdicts(backend, results)
    lines += ["\n## Goals\n", *notes]
    print("\n".join(lines))
    write_json(Path(args.out), everything)
    print(f"\nevery sample: {args.out}")


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
