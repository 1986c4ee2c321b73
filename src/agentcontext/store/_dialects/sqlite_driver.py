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
The adapter is used by stores made from a URL, through ``create_async_engine(module=...)``;
an engine a caller made keeps the cursor it was made with. Should aiosqlite lose the call
that runs a function on its thread (``Connection._execute``, the one SQLAlchemy's own adapter
also relies on), stores fall back to SQLAlchemy's cursor.
"""

from __future__ import annotations

import collections
import sqlite3
from typing import Any

import aiosqlite
from sqlalchemy.dialects.sqlite.aiosqlite import (
    AsyncAdapt_aiosqlite_connection,
    AsyncAdapt_aiosqlite_cursor,
    AsyncAdapt_aiosqlite_dbapi,
)
from sqlalchemy.util import EMPTY_DICT

__all__ = ["DBAPI"]

_Outcome = tuple[Any, list[Any], int, int | None]
"""What a statement gives: its description, its rows, its row count and last row id."""


def _run(driver: Any, operation: str, parameters: Any, many: bool) -> _Outcome:
    """On aiosqlite's thread: the statement, from opening a cursor to closing it."""
    cursor: sqlite3.Cursor = driver._conn.cursor()
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
            outcome: _Outcome = await driver._execute(_run, driver, operation, parameters, many)
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


class _Connection(AsyncAdapt_aiosqlite_connection):
    __slots__ = ()
    _cursor_cls: type[AsyncAdapt_aiosqlite_cursor] = _Cursor


class _Dbapi(AsyncAdapt_aiosqlite_dbapi):
    """SQLAlchemy's aiosqlite module, whose connections make `_Cursor` cursors."""

    def connect(self, *arg: Any, **kw: Any) -> _Connection:
        adapted = super().connect(*arg, **kw)
        return _Connection(self, adapted._connection)


DBAPI: _Dbapi | None = (
    _Dbapi(aiosqlite, sqlite3)
    if callable(getattr(aiosqlite.Connection, "_execute", None))
    else None
)
"""The module to give ``create_async_engine`` for an aiosqlite URL (None: keep SQLAlchemy's)."""
