"""The hot write path: appending new messages and moving the head, at driver speed.

A save is the one write every turn makes, so it skips SQLAlchemy's per-statement machinery
(on aiosqlite, three or four thread hand-offs per statement; on asyncpg, a Python layer per
round trip) and talks to the driver directly, with the same SQL meaning as the general path
in ``_branches``:

1. lock the chat row and take the next change version,
2. insert the messages, each depth computed from its stored parent in SQL (NULL, hence
   refused, when the parent is missing or in another chat); an id that exists is refused,
3. move the head by compare-and-swap,

all in one transaction. Anything unusual raises :class:`SlowPath` after rolling back, and the
caller takes the general path, which names the problem precisely.

- SQLite: one call into a dedicated writer thread with its own connection runs the whole
  transaction (one thread hand-off instead of about fifteen).
- PostgreSQL: one statement (data-modifying common table expressions) on a connection of a
  small asyncpg pool: one round trip, atomic without an explicit transaction.

Hot reads that are one statement (search) take the same road: :class:`RawQuery` is the SQL
SQLAlchemy compiled for the statement, run by :class:`SqliteReader` (one hand-off to a reader
thread with its own connection) or on the asyncpg pool (one round trip).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from agentcontext._validate import dumps
from agentcontext.errors import BranchNotFoundError, ChatNotFoundError, StoreError
from agentcontext.store import _text
from agentcontext.store._dialect import SQLITE_SYNCHRONOUS
from agentcontext.store.base import AppendResult
from agentcontext.store.records import MessageRecord, utcnow

__all__ = [
    "NewMessage",
    "PostgresAppender",
    "RawQuery",
    "SlowPath",
    "SqliteAppender",
    "SqliteReader",
    "plan",
]


class SlowPath(Exception):
    """Internal: the fast append met something unusual and rolled back."""


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A message row to insert, with its depth as ``depth(anchor) + offset``."""

    id: str
    chat_id: str
    parent_id: str | None
    anchor: str | None
    offset: int
    name: str
    type: str
    data: str | None
    search_text: str
    created_at: datetime


def plan(records: Sequence[MessageRecord]) -> list[NewMessage]:
    """Rows for records that must all be new; a parent inside the batch must come first."""
    position = {record.id: i for i, record in enumerate(records)}
    out: list[NewMessage] = []
    for index, record in enumerate(records):
        parent = record.parent_id
        if parent is not None and parent in position:
            if position[parent] > index:
                raise SlowPath
            anchor, offset = out[position[parent]].anchor, out[position[parent]].offset + 1
        else:
            anchor, offset = parent, 1
        out.append(
            NewMessage(
                id=record.id,
                chat_id=record.chat_id,
                parent_id=parent,
                anchor=anchor,
                offset=offset,
                name=record.name,
                type=record.type,
                data=None if record.data is None else dumps(record.data),
                search_text=_text.search_text(record.data),
                created_at=record.created_at,
            )
        )
    return out


def _iso(moment: datetime) -> str:
    # The text form UTCDateTime stores on SQLite.
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


_SQLITE_TOUCH = (
    "UPDATE chats SET updated_at = ?, version = version + 1, message_count = message_count + ? "
    "WHERE id = ? RETURNING version"
)
_SQLITE_INSERT = (
    "INSERT INTO messages (id, chat_id, parent_id, depth, name, type, data, search_text, "
    "created_at, version) VALUES (?, ?, ?, "
    "coalesce((SELECT depth FROM messages WHERE id = ? AND chat_id = ?), ?) + ?, "
    "?, ?, ?, ?, ?, ?)"
)
_SQLITE_MOVE = (
    "UPDATE branches SET head_message_id = ? "
    "WHERE id = ? AND chat_id = ? AND head_message_id IS ? RETURNING id"
)
_SQLITE_HEAD = "SELECT chat_id, head_message_id FROM branches WHERE id = ?"


@dataclass(frozen=True)
class RawQuery:
    """The SQL of a read statement as its dialect compiles it, to run on the bare driver.

    Compiled once; :meth:`args` orders a call's parameters (merged over the values fixed in
    the statement, such as a function's constant arguments) as the SQL's placeholders expect.
    """

    sql: str
    names: tuple[str, ...]
    fixed: dict[str, Any]

    @classmethod
    def of(cls, statement: Any, dialect: Any) -> RawQuery:
        compiled = statement.compile(dialect=dialect)
        return cls(compiled.string, tuple(compiled.positiontup or ()), dict(compiled.params))

    def args(self, params: dict[str, Any]) -> list[Any]:
        merged = {**self.fixed, **params}
        return [merged[name] for name in self.names]


_T = TypeVar("_T")


class _SqliteThread:
    """One SQLite connection of its own, used only from one dedicated thread."""

    _thread_name = "agentcontext"

    def __init__(self, path: str, busy_timeout: float, pragmas: tuple[str, ...]) -> None:
        self._path = path
        self._busy_timeout = busy_timeout
        self._pragmas = pragmas
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self._thread_name)
        self._conn: sqlite3.Connection | None = None

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = sqlite3.connect(
                self._path,
                timeout=self._busy_timeout,
                isolation_level=None,
                check_same_thread=False,
            )
            for pragma in self._pragmas:
                conn.execute(pragma)
            self._conn = conn
        return self._conn

    async def _run(self, fn: Callable[..., _T], *args: Any) -> _T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn, *args)

    async def close(self) -> None:
        def shut() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await self._run(shut)
        self._executor.shutdown(wait=True)


class SqliteReader(_SqliteThread):
    """Runs single read statements on its own connection, in one reader thread.

    A lone SELECT is its own transaction, reading one consistent snapshot (WAL); the reader
    never writes (``PRAGMA query_only``), so it never waits for the write lock.
    """

    _thread_name = "agentcontext-r"

    def __init__(self, path: str, busy_timeout: float) -> None:
        super().__init__(path, busy_timeout, ("PRAGMA query_only = ON",))

    def _fetch(self, sql: str, args: list[Any]) -> list[Any]:
        return self._connection().execute(sql, args).fetchall()

    async def fetch(self, query: RawQuery, params: dict[str, Any]) -> list[Any]:
        return await self._run(self._fetch, query.sql, query.args(params))


class SqliteAppender(_SqliteThread):
    """Runs the append transaction on its own connection, in one writer thread."""

    def __init__(self, path: str, busy_timeout: float, synchronous: str = "NORMAL") -> None:
        super().__init__(
            path, busy_timeout, ("PRAGMA foreign_keys = ON", SQLITE_SYNCHRONOUS[synchronous])
        )
        self._synchronous = synchronous

    async def append(
        self,
        chat_id: str,
        branch_id: str,
        rows: list[NewMessage],
        expected_head: str | None,
        new_head: str,
    ) -> AppendResult:
        return await self._run(self._append, chat_id, branch_id, rows, expected_head, new_head)

    def _append(
        self,
        chat_id: str,
        branch_id: str,
        rows: list[NewMessage],
        expected_head: str | None,
        new_head: str,
    ) -> AppendResult:
        conn = self._connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            touched = conn.execute(_SQLITE_TOUCH, (_iso(utcnow()), len(rows), chat_id)).fetchone()
            if touched is None:
                raise ChatNotFoundError(f"chat {chat_id!r} does not exist")
            version = int(touched[0])
            try:
                for row in rows:
                    conn.execute(
                        _SQLITE_INSERT,
                        (
                            row.id,
                            row.chat_id,
                            row.parent_id,
                            row.anchor,
                            row.chat_id,
                            0 if row.anchor is None else None,
                            row.offset,
                            row.name,
                            row.type,
                            row.data,
                            row.search_text,
                            _iso(row.created_at),
                            version,
                        ),
                    )
            except sqlite3.IntegrityError:
                raise SlowPath from None
            moved = conn.execute(
                _SQLITE_MOVE, (new_head, branch_id, chat_id, expected_head)
            ).fetchone()
            if moved is None:
                current = conn.execute(_SQLITE_HEAD, (branch_id,)).fetchone()
                conn.execute("ROLLBACK")
                if current is None or current[0] != chat_id:
                    raise BranchNotFoundError(
                        f"chat {chat_id!r} has no branch with id {branch_id!r}"
                    )
                return AppendResult(ok=False, head_message_id=current[1], version=version - 1)
            conn.execute("COMMIT")
            return AppendResult(ok=True, head_message_id=new_head, version=version)
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise


# One statement, one round trip, atomic on its own. Data dependencies fix the order of its
# parts, and with it the lock order every writer follows (the chat row, then the branch row):
# "touched" locks the chat and bumps its version and message count, "cur" locks the branch,
# "guard" fails the whole statement (division by zero, nothing applied) when the locked head
# is not the expected one, "ins" inserts, "moved" moves the head. A missing or foreign parent
# makes a depth NULL and an existing id breaks the primary key: the statement fails too.
_PG_APPEND = """
WITH touched AS (
    UPDATE chats SET updated_at = $1, version = version + 1,
                     message_count = message_count + $16
    WHERE id = $2
    RETURNING version
), cur AS (
    SELECT b.head_message_id FROM branches b, touched
    WHERE b.id = $3 AND b.chat_id = $2
    FOR UPDATE OF b
), guard AS (
    SELECT 1 / (CASE WHEN cur.head_message_id IS NOT DISTINCT FROM $4 THEN 1 ELSE 0 END) AS ok
    FROM cur
), ins AS (
    INSERT INTO messages (id, chat_id, parent_id, depth, name, type, data, search_text,
                          created_at, version)
    SELECT r.id, $2, r.parent_id,
           coalesce((SELECT m.depth FROM messages m WHERE m.id = r.anchor AND m.chat_id = $2),
                    r.rooted) + r.step,
           r.name, r.type, r.data::jsonb, r.search_text, r.created_at, touched.version
    FROM touched, guard,
         unnest($5::varchar[], $6::varchar[], $7::varchar[], $8::integer[], $9::integer[],
                $10::varchar[], $11::varchar[], $12::text[], $13::text[], $14::timestamptz[])
           AS r(id, parent_id, anchor, rooted, step, name, type, data, search_text, created_at)
    WHERE guard.ok = 1
    RETURNING 1
), moved AS (
    UPDATE branches SET head_message_id = $15
    WHERE id = $3 AND (SELECT count(*) FROM ins) = $16
    RETURNING 1
)
SELECT (SELECT version FROM touched), (SELECT count(*) FROM moved)
"""


_PG_STATE = """
SELECT b.chat_id, b.head_message_id, (SELECT version FROM chats WHERE id = $2)
FROM (SELECT 1) AS one LEFT JOIN branches b ON b.id = $1 AND b.chat_id = $2
"""


_ACQUIRE_TIMEOUT = 30.0
"""Seconds a call waits for a free pooled connection (SQLAlchemy's pool_timeout default)."""


class PostgresAppender:
    """Runs the append transaction on its own small asyncpg pool.

    Its own pool, rather than SQLAlchemy's, skips the pre-ping round trip of each checkout: a
    connection found dead when the transaction begins is replaced and the transaction retried
    (nothing had been sent); one lost later raises, and the engine, which treats that outcome
    as unknown, checks whether the turn landed before retrying.
    """

    def __init__(
        self, connect_kwargs: dict[str, Any], max_size: int = 10, generic_plans: bool = True
    ) -> None:
        self._connect_kwargs = connect_kwargs
        self._max_size = max_size
        self._generic_plans = generic_plans
        self._pool: Any = None
        self._pool_lock = asyncio.Lock()
        self._closed = False

    async def _get_pool(self) -> Any:
        if self._pool is None:
            import asyncpg

            async with self._pool_lock:
                if self._closed:
                    raise StoreError("this store is closed; create a new one")
                if self._pool is None:
                    kwargs = dict(self._connect_kwargs)
                    if self._generic_plans and kwargs.get("statement_cache_size") != 0:
                        # Plan the append statement once per connection, not per call.
                        # (Not behind PgBouncer: it refuses unknown startup parameters, and
                        # statements are not kept there anyway.)
                        settings = dict(kwargs.pop("server_settings", None) or {})
                        settings.setdefault("plan_cache_mode", "force_generic_plan")
                        kwargs["server_settings"] = settings
                    self._pool = await asyncpg.create_pool(
                        min_size=0, max_size=self._max_size, **kwargs
                    )
        return self._pool

    async def append(
        self,
        chat_id: str,
        branch_id: str,
        rows: list[NewMessage],
        expected_head: str | None,
        new_head: str,
    ) -> AppendResult:
        import asyncpg

        pool = await self._get_pool()
        args = (
            utcnow(),
            chat_id,
            branch_id,
            expected_head,
            [row.id for row in rows],
            [row.parent_id for row in rows],
            [row.anchor for row in rows],
            [0 if row.anchor is None else None for row in rows],
            [row.offset for row in rows],
            [row.name for row in rows],
            [row.type for row in rows],
            ["null" if row.data is None else row.data for row in rows],
            [row.search_text for row in rows],
            [row.created_at for row in rows],
            new_head,
            len(rows),
        )
        for attempt in range(2):
            async with pool.acquire(timeout=_ACQUIRE_TIMEOUT) as raw:
                try:
                    version, moved = await raw.fetchrow(_PG_APPEND, *args)
                except asyncpg.DivisionByZeroError:
                    # The guard: the branch head was not the expected one. Nothing applied.
                    current = await raw.fetchrow(_PG_STATE, branch_id, chat_id)
                    return AppendResult(
                        ok=False, head_message_id=current[1], version=int(current[2])
                    )
                except asyncpg.IntegrityConstraintViolationError:
                    raise SlowPath from None
                except (asyncpg.ConnectionDoesNotExistError, OSError):
                    # A pooled connection that died: the statement ran nowhere, or nowhere
                    # that could commit (it is atomic); try once more on a fresh one.
                    if attempt:
                        raise
                    continue
                if moved:
                    return AppendResult(ok=True, head_message_id=new_head, version=int(version))
                # Nothing was written: the chat or the branch is missing.
                current = await raw.fetchrow(_PG_STATE, branch_id, chat_id)
                if current[2] is None:
                    raise ChatNotFoundError(f"chat {chat_id!r} does not exist")
                raise BranchNotFoundError(f"chat {chat_id!r} has no branch with id {branch_id!r}")
        raise AssertionError("unreachable")  # pragma: no cover

    async def fetch(self, query: RawQuery, params: dict[str, Any]) -> list[Any]:
        """Run one read statement: one round trip. A read is safe to retry once on a fresh
        connection when a pooled one turns out to be dead."""
        import asyncpg

        pool = await self._get_pool()
        args = query.args(params)
        for attempt in range(2):
            async with pool.acquire(timeout=_ACQUIRE_TIMEOUT) as raw:
                try:
                    return list(await raw.fetch(query.sql, *args))
                except (asyncpg.ConnectionDoesNotExistError, OSError):
                    if attempt:
                        raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def close(self) -> None:
        async with self._pool_lock:
            self._closed = True
            if self._pool is not None:
                await self._pool.close()
                self._pool = None
