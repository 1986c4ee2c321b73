"""Crash safety: a writer killed with SIGKILL at random moments never leaves a damaged database.

A writer process (``crash_writer.py``) saves turns in a loop on a few chats — several messages
per save, streaming turns, rewinds, checkpoints, restores, ``btw``, branch switches, edits —
and is killed with SIGKILL at a random moment. After every kill, with the writer dead:

- SQLite: ``PRAGMA integrity_check`` is ok, ``PRAGMA foreign_key_check`` finds nothing and the
  full-text index agrees with its table (the file is opened as it was left, ``-wal`` and
  ``-shm`` included, with the plain ``sqlite3`` module: opening it recovers);
- every branch's chain walks from its head to its root (raw parent links: no dangling
  parent, no foreign parent, no cycle, depths consistent) and the store loads the same chain;
- every turn on every chain is whole or absent (its parts together and in order), except an
  interrupted streaming turn: a user message followed by its empty placeholder, at the end;
- exactly one branch per chat is active;
- nothing committed before is lost;
- the next writer (a new process, new engines) carries on from the stored head: its first
  save's parent is the head left by the killed one, after it completed an interrupted
  streaming turn in place.

Kills: ``AGENTCONTEXT_CRASH_KILLS_SQLITE`` (default 50) and ``AGENTCONTEXT_CRASH_KILLS_POSTGRES``
(default 20); the random choices come from ``AGENTCONTEXT_CRASH_SEED`` (random by default,
printed, and named in every failure).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import random
import signal
import sqlite3
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from agentcontext import Message, SqlContextStore
from agentcontext.fragments import is_empty_assistant_placeholder
from tests.conftest import _dsn, fresh_database
from tests.conftest import _my_exec as my_exec
from tests.reliability.crash_writer import chat_ids, first_turn, parse_marker

pytestmark = pytest.mark.slow

WRITER = Path(__file__).with_name("crash_writer.py")
ROOT = Path(__file__).resolve().parents[2]
CHATS = 3
PREFIX = "crash"
KILLS = {
    "sqlite": int(os.environ.get("AGENTCONTEXT_CRASH_KILLS_SQLITE", "50")),
    "postgres": int(os.environ.get("AGENTCONTEXT_CRASH_KILLS_POSTGRES", "20")),
    "mariadb": int(os.environ.get("AGENTCONTEXT_CRASH_KILLS_MARIADB", "20")),
}
SEED = int(os.environ.get("AGENTCONTEXT_CRASH_SEED") or random.randrange(2**31))
EARLY_KILLS = 0.2
"""Share of kills timed from the writer's start rather than from its first saves."""
READY_TIMEOUT = 60.0
REPLY_TIMEOUT = 30.0
BACKENDS_GONE_TIMEOUT = 30.0


# --- the database as it is on disk ----------------------------------------------------------


@dataclass
class Row:
    id: str
    chat_id: str
    parent_id: str | None
    depth: int
    message: Message


@dataclass
class Snapshot:
    """The raw rows, read without the library."""

    chats: list[str]
    messages: dict[str, Row]
    branches: list[tuple[str, str, str, str | None, bool]]  # id, chat_id, name, head, active
    checkpoints: list[tuple[str, str, str]]  # chat_id, name, message_id


def _row(id_: str, chat_id: str, parent_id: str | None, depth: int, data: Any) -> Row:
    if isinstance(data, str):
        data = json.loads(data)
    return Row(id_, chat_id, parent_id, int(depth), Message.model_validate(data))


def sqlite_snapshot(path: Path) -> Snapshot:
    """Check the file with the plain sqlite3 module and read it."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        # The external-content FTS index matches the messages table (raises if not).
        conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")
        return Snapshot(
            chats=[r[0] for r in conn.execute("SELECT id FROM chats")],
            messages={
                r[0]: _row(*r)
                for r in conn.execute(
                    "SELECT id, chat_id, parent_id, depth, data FROM messages ORDER BY seq"
                )
            },
            branches=[
                (r[0], r[1], r[2], r[3], bool(r[4]))
                for r in conn.execute(
                    "SELECT id, chat_id, name, head_message_id, is_active FROM branches"
                )
            ],
            checkpoints=list(conn.execute("SELECT chat_id, name, message_id FROM checkpoints")),
        )
    finally:
        conn.close()


async def postgres_snapshot(url: str) -> Snapshot:
    conn = await asyncpg.connect(_dsn(url), timeout=10)
    try:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            chats = [r[0] for r in await conn.fetch("SELECT id FROM chats")]
            messages = await conn.fetch(
                "SELECT id, chat_id, parent_id, depth, data::text FROM messages ORDER BY seq"
            )
            branches = await conn.fetch(
                "SELECT id, chat_id, name, head_message_id, is_active FROM branches"
            )
            checkpoints = await conn.fetch("SELECT chat_id, name, message_id FROM checkpoints")
    finally:
        await conn.close()
    return Snapshot(
        chats=chats,
        messages={r[0]: _row(*r) for r in messages},
        branches=[tuple(r) for r in branches],  # type: ignore[misc]
        checkpoints=[tuple(r) for r in checkpoints],  # type: ignore[misc]
    )


async def mariadb_snapshot(url: str) -> Snapshot:
    """The rows in one consistent read (InnoDB's snapshot of a REPEATABLE READ transaction)."""
    chats, messages, branches, checkpoints = (
        await my_exec(
            url,
            "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ",
            "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY",
            "SELECT id FROM chats",
            "SELECT id, chat_id, parent_id, depth, data FROM messages ORDER BY seq",
            "SELECT id, chat_id, name, head_message_id, is_active FROM branches",
            "SELECT chat_id, name, message_id FROM checkpoints",
            "COMMIT",
            results=True,
        )
    )[2:6]
    return Snapshot(
        chats=[r[0] for r in chats],
        messages={r[0]: _row(*r) for r in messages},
        branches=[(r[0], r[1], r[2], r[3], bool(r[4])) for r in branches],
        checkpoints=[tuple(r) for r in checkpoints],  # type: ignore[misc]
    )


async def wait_for_mariadb_sessions_to_end(url: str) -> None:
    """After a kill, MariaDB ends the killed client's sessions when it notices the closed
    socket (rolling back what they had not committed); wait for that."""
    database = make_url(url).database
    deadline = time.monotonic() + BACKENDS_GONE_TIMEOUT
    while True:
        [[others]] = await my_exec(
            url,
            "SELECT count(*) FROM information_schema.processlist WHERE db = "
            f"'{database}' AND id <> CONNECTION_ID()",
        )
        if not others:
            return
        assert time.monotonic() < deadline, (
            f"{others} sessions of the killed writer still open after {BACKENDS_GONE_TIMEOUT:.0f}s"
        )
        await asyncio.sleep(0.01)


async def wait_for_backends_to_end(url: str) -> None:
    """After a kill, PostgreSQL ends the killed client's sessions (rolling back what they had
    not committed); wait for that, so that nothing of the killed writer lands after the check."""
    database = make_url(url).database
    conn = await asyncpg.connect(_dsn(url), timeout=10)
    try:
        deadline = time.monotonic() + BACKENDS_GONE_TIMEOUT
        while True:
            others = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 "
                "AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
                database,
            )
            if not others:
                return
            assert time.monotonic() < deadline, (
                f"{others} sessions of the killed writer still open after "
                f"{BACKENDS_GONE_TIMEOUT:.0f}s"
            )
            await asyncio.sleep(0.01)
    finally:
        await conn.close()


# --- the checks -------------------------------------------------------------------------------


@dataclass
class History:
    """What earlier checks saw."""

    heads: dict[str, str | None] = field(default_factory=dict)
    """Each chat's active head after the previous kill."""
    loaded: set[tuple[str, str | None]] = field(default_factory=set)
    """(branch, head) pairs whose chain the store loaded (and matched the raw walk)."""
    open_streams: set[str] = field(default_factory=set)
    """Chats whose active head is the placeholder of an interrupted streaming turn."""
    rows: dict[str, Row] = field(default_factory=dict)
    """The messages as the last check read them."""
    placeholders: set[str] = field(default_factory=set)
    """Placeholders of interrupted streaming turns seen at a check."""
    resumed_streams: int = 0
    continued: int = 0


def walk(snapshot: Snapshot, chat_id: str, head: str | None) -> list[str]:
    """The chain ending at ``head``, root first, from the raw parent links."""
    chain: list[str] = []
    seen: set[str] = set()
    current = head
    while current is not None:
        assert current not in seen, f"cycle through {current!r} in chat {chat_id!r}"
        seen.add(current)
        row = snapshot.messages.get(current)
        assert row is not None, f"dangling link to {current!r} in chat {chat_id!r}"
        assert row.chat_id == chat_id, f"{current!r} of chat {row.chat_id!r} on {chat_id!r}"
        chain.append(current)
        parent = None if row.parent_id is None else snapshot.messages.get(row.parent_id)
        expected_depth = 1 if parent is None else parent.depth + 1
        assert row.depth == expected_depth, f"depth {row.depth} of {current!r}"
        current = row.parent_id
    chain.reverse()
    return chain


def check_turns(messages: list[Message], where: str) -> bool:
    """Every turn on a chain is whole and in order; returns whether it ends in a placeholder.

    The one allowed incomplete turn is a streaming turn cut between ``begin_turn`` and
    ``complete_turn``: its user message and the empty placeholder, at the end of the chain.
    """
    seen: set[str] = set()
    index, open_stream = 0, False
    while index < len(messages):
        found = parse_marker(messages[index].text)
        assert found is not None and found[1] == 1 and messages[index].role == "user", (
            f"{where}: message {index} ({messages[index].text!r}) does not start a turn"
        )
        turn, _, parts = found
        assert turn not in seen, f"{where}: turn {turn} twice"
        seen.add(turn)
        for part in range(2, parts + 1):
            at = index + part - 1
            assert at < len(messages), f"{where}: turn {turn} cut after part {part - 1}/{parts}"
            message = messages[at]
            if is_empty_assistant_placeholder(message):
                assert turn.endswith(".s") and at == len(messages) - 1, (
                    f"{where}: an empty placeholder at {at} in turn {turn}"
                )
                open_stream = True
                continue
            assert message.role == "assistant" and parse_marker(message.text) == (
                turn,
                part,
                parts,
            ), f"{where}: part {part}/{parts} of turn {turn} is {message.text!r}"
        index += parts
    return open_stream


async def check_database(
    url: str, backend: str, history: History, run: int, ready: bool, db_path: Path | None
) -> None:
    """Everything that must hold after a kill; updates ``history``."""
    if backend == "sqlite":
        assert db_path is not None
        snapshot = sqlite_snapshot(db_path)
    elif backend == "mariadb":
        snapshot = await mariadb_snapshot(url)
    else:
        snapshot = await postgres_snapshot(url)
    expected_chats = set(chat_ids(PREFIX, CHATS))
    if ready:
        assert set(snapshot.chats) == expected_chats
    assert set(snapshot.chats) <= expected_chats

    # Nothing committed is lost or changed (only placeholders are filled in, in place).
    for message_id, before in history.rows.items():
        row = snapshot.messages.get(message_id)
        assert row is not None, f"message {message_id!r} was committed, now it is gone"
        assert (row.chat_id, row.parent_id, row.depth) == (
            before.chat_id,
            before.parent_id,
            before.depth,
        ), f"message {message_id!r} moved"
        assert row.message == before.message or message_id in history.placeholders, (
            f"message {message_id!r} changed: {before.message.text!r} -> {row.message.text!r}"
        )

    async with SqlContextStore(url, migrate=False) as store:
        for chat_id in sorted(snapshot.chats):
            branches = [b for b in snapshot.branches if b[1] == chat_id]
            active = [b for b in branches if b[4]]
            assert len(active) == 1, f"chat {chat_id!r} has {len(active)} active branches"
            stored_active = await store.get_active_branch(chat_id)
            assert stored_active is not None and stored_active.id == active[0][0]
            listed = await store.list_branches(chat_id)
            assert sorted(b.id for b in listed) == sorted(b[0] for b in branches)
            for branch_id, _, name, head, is_active in branches:
                chain = walk(snapshot, chat_id, head)
                if (branch_id, head) not in history.loaded:
                    # A branch's chain changes only when its head moves: load each once.
                    records = [] if head is None else await store.get_message_chain(head)
                    assert [r.id for r in records] == chain, f"{name!r}: store chain differs"
                    history.loaded.add((branch_id, head))
                open_stream = check_turns(
                    [snapshot.messages[i].message for i in chain], f"{chat_id}/{name}"
                )
                if is_active:
                    stored = await store.get_messages(chat_id)
                    assert [r.id for r in stored] == chain
                    if open_stream and head is not None:
                        history.placeholders.add(head)
                else:
                    assert not open_stream, f"{chat_id}/{name}: a placeholder off the active branch"
            for _, name, message_id in (c for c in snapshot.checkpoints if c[0] == chat_id):
                row = snapshot.messages.get(message_id)
                assert row is not None and row.chat_id == chat_id, f"checkpoint {name!r}"

            # The writer of this run carried on from the head the previous one left.
            index = int(chat_id.rsplit("-", 1)[1])
            starts = [
                row
                for row in snapshot.messages.values()
                if row.chat_id == chat_id
                and (found := parse_marker(row.message.text))
                and found[0] == first_turn(run, index)
                and found[1] == 1
            ]
            assert len(starts) <= 1
            assert starts or not ready, f"{chat_id}: the writer said ready but saved nothing"
            previous = history.heads.get(chat_id)
            if starts:
                assert starts[0].parent_id == previous, (
                    f"{chat_id}: run {run} started at {starts[0].parent_id!r}, not at the "
                    f"head {previous!r} left by the killed writer"
                )
                history.continued += 1
                if chat_id in history.open_streams:
                    # It completed the interrupted streaming turn in place first.
                    assert previous is not None
                    completed = snapshot.messages[previous].message
                    opened = snapshot.messages[previous].parent_id
                    assert opened is not None
                    turn = parse_marker(snapshot.messages[opened].message.text)
                    assert turn is not None
                    assert parse_marker(completed.text) == (turn[0], 2, 2), (
                        f"{chat_id}: the interrupted streaming turn {turn[0]} was not completed"
                    )
                    history.resumed_streams += 1
            head = active[0][3]
            history.heads[chat_id] = head
            history.open_streams.discard(chat_id)
            if head is not None and is_empty_assistant_placeholder(snapshot.messages[head].message):
                history.open_streams.add(chat_id)
    history.rows = snapshot.messages


# --- the writer processes -------------------------------------------------------------------


class Writers:
    """Writer processes, forked on request by ``crash_writer.py --serve``.

    Each writer is a process of its own, killed with SIGKILL; forking them from one process
    that has imported everything starts each in milliseconds.
    """

    def __init__(self, process: asyncio.subprocess.Process, work: Path) -> None:
        self.process = process
        self.work = work
        self.replies: asyncio.Queue[list[str]] = asyncio.Queue()
        self.ready: dict[int, asyncio.Event] = collections.defaultdict(asyncio.Event)
        self.reader = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, work: Path) -> Writers:
        with (work / "serve.stderr").open("wb") as err:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                str(WRITER),
                "--serve",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                cwd=ROOT,
            )
        return cls(process, work)

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            words = line.decode().split()
            if words[0] == "ready":
                self.ready[int(words[1])].set()
            else:
                self.replies.put_nowait(words)
        self.replies.put_nowait(["eof"])

    def stderr(self, run: int) -> Path:
        return self.work / f"writer-{run}.stderr"

    async def _request(self, **command: Any) -> list[str]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command).encode() + b"\n")
        await self.process.stdin.drain()
        reply = await asyncio.wait_for(self.replies.get(), REPLY_TIMEOUT)
        expected = {"start": "started", "kill": "killed"}[command["op"]]
        if reply[:2] != [expected, str(command["run"])]:
            pytest.fail(
                f"writer server answered {reply}: {(self.work / 'serve.stderr').read_text()}"
            )
        return reply[2:]

    async def start(self, url: str, run: int, seed: int) -> None:
        argv = [url, PREFIX, str(run), str(seed), "--chats", str(CHATS)]
        await self._request(op="start", run=run, argv=argv, stderr=str(self.stderr(run)))

    async def wait_ready(self, run: int) -> None:
        try:
            await asyncio.wait_for(self.ready[run].wait(), READY_TIMEOUT)
        except TimeoutError:
            await self.kill(run)  # fails the test with the writer's stderr if it had stopped
            pytest.fail(f"writer {run} was not ready after {READY_TIMEOUT:.0f}s")

    async def kill(self, run: int) -> bool:
        """SIGKILL; returns whether the writer had printed ``ready``."""
        status = await self._request(op="kill", run=run)
        if status != ["signal", str(int(signal.SIGKILL))]:
            pytest.fail(
                f"writer {run} stopped by itself ({' '.join(status)}):\n"
                f"{self.stderr(run).read_text()}"
            )
        return self.ready[run].is_set()

    async def close(self) -> None:
        """End the server; it kills the writers still running."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), REPLY_TIMEOUT)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
        await self.reader


async def crash_loop(url: str, backend: str, kills: int, tmp_path: Path) -> History:
    rng = random.Random(f"{SEED}-{backend}")
    db_path = Path(make_url(url).database or "") if backend == "sqlite" else None
    async with SqlContextStore(url):
        pass  # the schema exists before the first writer starts
    history = History()
    started = time.monotonic()
    writers = await Writers.open(tmp_path)
    try:
        for run in range(1, kills + 1):
            await writers.start(url, run, rng.randrange(2**31))
            if rng.random() >= EARLY_KILLS:
                await writers.wait_ready(run)
            await asyncio.sleep(rng.uniform(0.010, 0.300))
            ready = await writers.kill(run)
            if backend == "postgres":
                await wait_for_backends_to_end(url)
            elif backend == "mariadb":
                await wait_for_mariadb_sessions_to_end(url)
            try:
                await check_database(url, backend, history, run, ready, db_path)
            except AssertionError as exc:
                raise AssertionError(f"after kill {run} ({backend}): {exc}") from exc
    finally:
        await writers.close()
    turns = {found[0] for row in history.rows.values() if (found := parse_marker(row.message.text))}
    print(
        f"\ncrash test [{backend}]: {kills} kills in {time.monotonic() - started:.1f}s "
        f"(seed {SEED}); {len(turns)} turns, {len(history.rows)} messages, "
        f"{len(history.loaded)} branch heads checked; {history.continued} starts after a kill "
        f"checked, {len(history.placeholders)} streaming turns left open, "
        f"{history.resumed_streams} of them completed by the next writer"
    )
    return history


@contextlib.contextmanager
def _database(backend: str, tmp_path: Path) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'crash.db'}"
    else:
        with fresh_database(backend, "accrash") as url:
            yield url


async def test_sigkill_at_random_moments_leaves_a_consistent_database(
    backend: str, tmp_path: Path
) -> None:
    kills = KILLS[backend]
    try:
        with _database(backend, tmp_path) as url:
            await crash_loop(url, backend, kills, tmp_path)
    except (AssertionError, pytest.fail.Exception) as exc:
        raise AssertionError(f"{exc}\n(rerun with AGENTCONTEXT_CRASH_SEED={SEED})") from exc
