"""SQLAlchemy's aiosqlite adapter, with one hand-off to the driver's thread per statement.

aiosqlite runs each sqlite3 call on a thread of its own, and every call is a hand-off: the
event loop queues it, the thread runs it, and the loop is woken with the result (about 30 µs
on a quiet machine, more when the other core is busy). SQLAlchemy's adapter makes a statement
three or four such calls: open a cursor, execute, fetch the rows, close the cursor. Here the
cursor does all four in one call on the driver's thread and keeps what they return (the rows,
the description, the row count, the last row id), so a one-statement save costs one hand-off
and a read one.

Everything else is SQLAlchemy's: the engine, its pool, the connection's mutex, the exceptions
it translates, and the server-side cursors (`stream`), which keep the adapter's own cursor.

**Waiting for the lock.** SQLite's own busy handler (the driver's ``timeout`` argument) sleeps
between its tries for 1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50 and then 100 ms: a writer that
finds the database locked for 80 ms wakes next at 103 ms, and one that finds it locked again at
each of its tries can sleep through the gaps between another process's short transactions (a
retention run's batches) altogether. Here the handler is off and the statement itself is tried
again, every half millisecond at first and at most every two, until the timeout the connection
was opened with: a writer gets the lock within 2 ms of its release. A statement is tried again
only when SQLite's handler would have waited for it (outside a transaction, or first in one)
and SQLite says it did nothing (``SQLITE_BUSY``, ``SQLITE_BUSY_RECOVERY``; not
``SQLITE_BUSY_SNAPSHOT``, whose transaction must start over), and so is a ``COMMIT``. The
server-side cursors' statements wait the same way.

The adapter is used by stores made from a URL, through ``create_async_engine(module=...)``;
an engine a caller made keeps the cursor it was made with. Should aiosqlite lose the call
that runs a function on its thread (``Connection._execute``, the one SQLAlchemy's own adapter
also relies on), stores fall back to SQLAlchemy's cursor.
"""

from __future__ import annotations

import collections
import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

import aiosqlite
from sqlalchemy.dialects.sqlite.aiosqlite import (
    AsyncAdapt_aiosqlite_connection,
    AsyncAdapt_aiosqlite_cursor,
    AsyncAdapt_aiosqlite_dbapi,
    AsyncAdapt_aiosqlite_ss_cursor,
)
from sqlalchemy.util import EMPTY_DICT
from sqlalchemy.util.concurrency import await_only as await_

__all__ = ["DBAPI"]

T = TypeVar("T")

_Outcome = tuple[Any, list[Any], int, int | None]
"""What a statement gives: its description, its rows, its row count and last row id."""


_RETRIED = frozenset({5, 261})
"""``SQLITE_BUSY`` and ``SQLITE_BUSY_RECOVERY``: the lock was not free and nothing was done."""

_SQLITE_DEFAULT_TIMEOUT = 5.0
"""The sqlite3 module's own default ``timeout`` (stores pass ``sqlite_busy_timeout``, 30 s by
default)."""

_pause = time.sleep  # (the tests watch the pauses here)
_FIRST_PAUSE = 0.0005
_LONGEST_PAUSE = 0.002


def _locked(exc: sqlite3.OperationalError) -> bool:
    return getattr(exc, "sqlite_errorcode", None) in _RETRIED


def _patiently(attempt: Callable[[], T], patience: float, again: Callable[[], bool]) -> T:
    """``attempt()``, tried again while SQLite finds the database locked and ``again()`` says
    nothing was done, for at most ``patience`` seconds after the first refusal."""
    deadline = pause = 0.0
    while True:
        try:
            return attempt()
        except sqlite3.OperationalError as exc:
            if not _locked(exc) or not again():
                raise
            now = time.monotonic()
            if not deadline:
                deadline, pause = now + patience, _FIRST_PAUSE
            elif now >= deadline:
                raise
            _pause(min(pause, deadline - now))
            pause = min(pause * 1.5, _LONGEST_PAUSE)


def _run(connection: _Connection, operation: str, parameters: Any, many: bool) -> _Outcome:
    """On aiosqlite's thread: the statement, from opening a cursor to closing it."""
    sqlite: sqlite3.Connection = connection._connection._conn
    return _waiting(connection, lambda: _once(sqlite, operation, parameters, many), many)


def _waiting(connection: _Connection, attempt: Callable[[], T], many: bool) -> T:
    """On aiosqlite's thread: a statement, tried again while the database is locked where
    SQLite's busy handler would have waited: outside a transaction, or first in one (a
    transaction that has read sees BUSY at once, since waiting could deadlock)."""
    sqlite: sqlite3.Connection = connection._connection._conn
    opened = sqlite.in_transaction
    may_wait = not opened or connection.fresh
    changes = sqlite.total_changes
    try:
        outcome = _patiently(
            attempt,
            connection.patience,
            # executemany outside a transaction commits row by row: once a row is in, the
            # rest cannot simply be tried again.
            lambda: may_wait and (not many or sqlite.total_changes == changes),
        )
    except sqlite3.OperationalError as exc:
        # A refusal for the lock leaves a transaction as it was; another failure may have
        # read first.
        connection.fresh = connection.fresh and _locked(exc)
        raise
    except BaseException:
        connection.fresh = False
        raise
    # BEGIN (or SAVEPOINT) opened a transaction that has not touched the database yet.
    connection.fresh = not opened and sqlite.in_transaction
    return outcome


def _commit(connection: _Connection) -> None:
    """On aiosqlite's thread: COMMIT, tried again while the database is locked (a rollback
    journal's COMMIT waits for readers to finish; in WAL mode it never waits)."""
    _patiently(connection._connection._conn.commit, connection.patience, lambda: True)


def _once(sqlite: sqlite3.Connection, operation: str, parameters: Any, many: bool) -> _Outcome:
    """The statement, from opening a cursor to closing it."""
    cursor = sqlite.cursor()
    try:
        if many:
            cursor.executemany(operation, parameters)
        elif parameters is None:
            cursor.execute(operation)
        else:
            cursor.execute(operation, parameters)
        description = cursor.description
        rows = cursor.fetchall() if description else []
        return description, rows, cursor.rowcount, cursor.lastrowid
    finally:
        cursor.close()


class _Cursor(AsyncAdapt_aiosqlite_cursor):
    """A DBAPI cursor whose statements run whole in one call on the driver's thread."""

    __slots__ = ("_arraysize", "_description", "_lastrowid", "_rowcount")

    def __init__(self, adapt_connection: AsyncAdapt_aiosqlite_connection) -> None:
        # No driver cursor is opened here: each statement opens and closes its own.
        self._adapt_connection = adapt_connection
        self._connection = adapt_connection._connection
        self._soft_closed_memoized = EMPTY_DICT
        self._rows = collections.deque()
        self._description: Any = None
        self._rowcount = -1
        self._lastrowid: int | None = None
        self._arraysize = 1

    @property
    def description(self) -> Any:
        return self._description

    @property
    def rowcount(self) -> int:
        return self._rowcount

    @property
    def lastrowid(self) -> Any:
        return self._lastrowid

    @property
    def arraysize(self) -> int:
        return self._arraysize

    @arraysize.setter
    def arraysize(self, value: int) -> None:
        self._arraysize = value

    async def _execute_async(self, operation: Any, parameters: Any) -> None:
        await self._statement(operation, parameters, many=False)

    async def _executemany_async(self, operation: Any, seq_of_parameters: Any) -> None:
        await self._statement(operation, seq_of_parameters, many=True)

    async def _statement(self, operation: Any, parameters: Any, *, many: bool) -> None:
        driver = self._connection
        async with self._adapt_connection._execute_mutex:
            outcome: _Outcome = await driver._execute(
                _run, self._adapt_connection, operation, parameters, many
            )
        self._description, rows, self._rowcount, self._lastrowid = outcome
        self._rows = collections.deque(rows)

    async def _async_soft_close(self) -> None:
        """Nothing is open between statements."""

    def close(self) -> None:
        self._rows.clear()

    def nextset(self) -> None:
        """sqlite3 returns one result set per statement."""

    def setinputsizes(self, *inputsizes: Any) -> None:
        """sqlite3 needs no input sizes."""


class _ServerSideCursor(AsyncAdapt_aiosqlite_ss_cursor):
    """SQLAlchemy's server-side cursor (``stream``), whose statement waits for the lock too."""

    __slots__ = ()

    async def _execute_async(self, operation: Any, parameters: Any) -> Any:
        connection = self._adapt_connection
        raw: sqlite3.Cursor = cast(Any, self._cursor)._cursor  # aiosqlite's sqlite3 cursor
        args = () if parameters is None else (parameters,)
        async with connection._execute_mutex:
            await connection._connection._execute(
                _waiting, connection, lambda: raw.execute(operation, *args), False
            )
        return self._cursor


class _Connection(AsyncAdapt_aiosqlite_connection):
    """A connection whose statements and commits wait for the lock themselves, for at most
    ``patience`` seconds (the ``timeout`` it was opened with)."""

    __slots__ = ("fresh", "patience")
    _cursor_cls: type[AsyncAdapt_aiosqlite_cursor] = _Cursor
    _ss_cursor_cls = _ServerSideCursor

    def __init__(self, dbapi: Any, connection: Any, patience: float) -> None:
        super().__init__(dbapi, connection)
        self.patience = patience
        self.fresh = False  # (read and written on the driver's thread only)

    def commit(self) -> None:
        driver = self._connection
        if driver._connection:
            try:
                await_(driver._execute(_commit, self))
            except Exception as error:
                self._handle_exception(error)


class _Dbapi(AsyncAdapt_aiosqlite_dbapi):
    """SQLAlchemy's aiosqlite module, whose connections make `_Cursor` cursors and wait for
    the lock in short steps rather than in SQLite's busy handler."""

    def connect(self, *arg: Any, **kw: Any) -> _Connection:
        patience = float(kw.pop("timeout", _SQLITE_DEFAULT_TIMEOUT))
        adapted = super().connect(*arg, timeout=0.0, **kw)
        return _Connection(self, adapted._connection, patience)


DBAPI: _Dbapi | None = (
    _Dbapi(aiosqlite, sqlite3)
    if callable(getattr(aiosqlite.Connection, "_execute", None))
    else None
)
"""The module to give ``create_async_engine`` for an aiosqlite URL (None: keep SQLAlchemy's)."""
