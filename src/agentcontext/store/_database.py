"""The database object of a store: its one engine, units of work, and what can go wrong.

Every statement of a store runs in a *unit of work*: a plain function taking a SQLAlchemy
``Connection`` and returning a value, run by `Database.run` in one of three modes
(`_dialects.Mode`). A unit runs in SQLAlchemy's greenlet bridge
(one hop for the whole unit, not one per statement), on a connection of the store's engine,
or on the caller's connection inside ``store.using(connection)``.

Guarantees kept here, once for the whole store:

- **Cancellation** never leaves a unit half done, and nothing of a cancelled call happens
  later: a unit runs in a task of its own, shielded, and a cancelled caller (or one timed out by
  ``asyncio.wait_for``) lets it finish (commit or roll back, and give its connection back to
  the pool intact) before the cancellation goes on. The wait is bounded (`SETTLE_SECONDS`): a
  caller can always get away from a server that stopped answering; its unit then finishes in
  the background, and ``close()`` waits for it.
- **Lost connections**: with no ping on checkout, a unit that finds its connection dead is
  run again once on a fresh one when that is safe (reads; transactions that failed before
  their commit; statements declared idempotent).
- **One event loop**: a store belongs to the loop that first uses it; another loop gets a
  clear `StoreError` instead of a hang.
- **Errors** the library can name are translated into `ContextError`
  subclasses; messages fit the backend (a file for SQLite, a server for PostgreSQL).
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from typing import Any, TypeVar

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.util import greenlet_spawn

from agentcontext import _validate as v
from agentcontext.errors import (
    ContextError,
    InvalidInputError,
    InvalidTypeError,
    StoreClosedError,
    StoreError,
    StoreUnavailableError,
)
from agentcontext.store._dialects import Dialect, Mode

__all__ = ["Database", "driver_threads", "settle_driver_threads"]

T = TypeVar("T")

SETTLE_SECONDS = 30.0
"""Longest a cancelled call waits for its unit of work to commit or roll back."""

_BOUND: contextvars.ContextVar[Mapping[int, AsyncConnection]] = contextvars.ContextVar(
    "agentcontext_bound_connections"
)
"""The caller connections of ``store.using(...)`` blocks of the current task, by database."""

_CONNECTION_ERRORS = frozenset(
    {
        "ConnectionDoesNotExistError",
        "CannotConnectNowError",
        "ConnectionFailureError",
        "TooManyConnectionsError",
        "AdminShutdownError",
        "InternalClientError",
        "InvalidAuthorizationSpecificationError",
    }
)


def is_connection_error(exc: BaseException) -> bool:
    """True when the database could not be reached or the connection was lost."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (OSError, ConnectionError, TimeoutError)):
            return True
        if type(current).__name__ in _CONNECTION_ERRORS:
            return True
        message = str(current)
        if "unable to open database file" in message or "connection was closed" in message:
            return True
        nxt = getattr(current, "orig", None) or current.__cause__ or current.__context__
        current = nxt if isinstance(nxt, BaseException) else None
    return False


class Database:
    """One engine, run units of work on it, translate what goes wrong.

    Args:
        engine: The store's engine (the caller's, or one made from a URL).
        dialect: Its dialect strategy.
        owns_engine: Whether ``close()`` disposes the engine.
        memory: An SQLite in-memory database (one shared connection: units take turns).
        prepare: Run once before the first unit (the schema check or migration).
    """

    def __init__(
        self,
        engine: AsyncEngine,
        dialect: Dialect,
        *,
        owns_engine: bool,
        memory: bool,
        prepare: Callable[[Database], Any],
    ) -> None:
        self.engine = engine
        self.dialect = dialect
        self.url = engine.url.render_as_string(hide_password=True)
        self._sync_engine = engine.sync_engine
        self._owns_engine = owns_engine
        self._memory = memory
        self._prepare = prepare
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = False
        self._closed = False
        self._inflight: set[asyncio.Task[Any]] = set()
        # Locks are made on first use, in the store's loop.
        self._init_lock: asyncio.Lock | None = None
        self._write_lock: asyncio.Lock | None = None
        self._all_lock: asyncio.Lock | None = None

    # --- state ----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    @property
    def ready(self) -> bool:
        """Whether the schema was prepared (the store was used or initialised)."""
        return self._ready

    def _check_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            self._init_lock = asyncio.Lock()
            if self.dialect.is_sqlite:
                if self._memory:
                    self._all_lock = asyncio.Lock()
                else:
                    self._write_lock = asyncio.Lock()
        elif loop is not self._loop:
            raise StoreError(
                f"this store ({self.url}) belongs to another event loop: a store (and its "
                "connections) works in the event loop that first used it. Create one store "
                "per event loop, for example one per asyncio.run() or per thread"
            )
        return loop

    def check_open(self) -> None:
        """Raise `StoreClosedError` after ``close()``."""
        if self._closed:
            raise StoreClosedError(
                f"this store ({self.url}) is closed; create a new SqlContextStore"
            )

    async def initialize(self) -> None:
        """Prepare the schema once (idempotent)."""
        self._check_loop()
        self.check_open()
        if self._ready:
            return
        assert self._init_lock is not None
        async with self._init_lock:
            if self._ready:
                return
            await self._prepare(self)
            self._ready = True

    # --- units of work ----------------------------------------------------------------------

    async def run(
        self, mode: Mode, unit: Callable[[Connection], T], *, idempotent: bool = False
    ) -> T:
        """Run ``unit(connection)`` as one unit of work and return its result.

        ``read``: no transaction (each statement sees the latest commits); ``write``: one
        transaction, committed when the unit returns, rolled back if it raises; ``atomic``:
        a single statement that is atomic on its own (no BEGIN/COMMIT round trips).
        ``idempotent`` allows an atomic unit to run again after a lost connection (its own
        condition, such as a compare-and-swap, refuses a second application).
        """
        loop = self._check_loop()
        self.check_open()
        if not self._ready:
            await self.initialize()
        bound = _BOUND.get({}).get(id(self))
        if bound is not None:
            return await self._run_bound(bound, mode, unit)
        task = loop.create_task(self._run_unit(mode, unit, idempotent))
        self._inflight.add(task)
        task.add_done_callback(self._finished)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            # Let the unit settle first, so the caller never sees it land later.
            await asyncio.wait({task}, timeout=SETTLE_SECONDS)
            raise

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._inflight.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a caller that stopped waiting is not told twice

    async def _run_unit(self, mode: Mode, unit: Callable[[Connection], T], idempotent: bool) -> T:
        lock: AbstractAsyncContextManager[Any] = nullcontext()
        if self._all_lock is not None:
            lock = self._all_lock
        elif mode in ("write", "atomic") and self._write_lock is not None:
            lock = self._write_lock
        async with lock:
            for attempt in (0, 1):
                state = _UnitState(mode, idempotent)
                try:
                    return await greenlet_spawn(self._sync_unit, mode, unit, state)
                except ContextError:
                    raise
                except (SQLAlchemyError, OSError, TimeoutError) as exc:
                    if not (attempt == 0 and is_connection_error(exc) and state.may_retry()):
                        raise await self.failed(exc) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _sync_unit(self, mode: Mode, unit: Callable[[Connection], T], state: _UnitState) -> T:
        with self._sync_engine.connect() as conn:
            self.dialect.prepare(conn, mode)
            if mode == "read":
                return unit(conn)
            if mode == "atomic":
                result = unit(conn)
                if self.dialect.atomic_needs_commit:
                    conn.commit()  # behind PgBouncer the statement ran in a transaction
                # Otherwise it committed by itself; closing rolls back SQLAlchemy's empty
                # transaction (no round trip on asyncpg) instead of resetting the connection.
                return result
            transaction = conn.begin()
            try:
                result = unit(conn)
            except BaseException:
                if transaction.is_active:
                    transaction.rollback()
                raise
            state.committing = True
            transaction.commit()
            return result

    async def _run_bound(
        self, conn: AsyncConnection, mode: Mode, unit: Callable[[Connection], T]
    ) -> T:
        try:
            if mode in ("read", "snapshot"):
                return await conn.run_sync(unit)
            # A SAVEPOINT: a unit that fails (a head conflict, say) leaves the caller's
            # transaction as it was, and usable.
            async with conn.begin_nested():
                return await conn.run_sync(unit)
        except ContextError:
            raise
        except (SQLAlchemyError, OSError, TimeoutError) as exc:
            raise await self.failed(exc) from exc

    # --- the caller's transaction -------------------------------------------------------------

    @asynccontextmanager
    async def using(self, connection: object) -> AsyncIterator[None]:
        """Run this task's units on ``connection`` (in its transaction) inside the block."""
        if not isinstance(connection, AsyncConnection):
            raise InvalidTypeError(
                "store.using() takes a SQLAlchemy AsyncConnection (from engine.connect() or "
                f"engine.begin()), got {v.type_name(connection)}"
            )
        self._check_loop()
        self.check_open()
        if connection.closed:
            raise InvalidInputError("store.using() was given a closed connection")
        if connection.dialect.name != self.dialect.name:
            raise InvalidInputError(
                f"store.using() needs a connection to the store's database ({self.dialect.name}),"
                f" got one to {connection.dialect.name}"
            )
        if not connection.in_transaction():
            raise InvalidInputError(
                "store.using() needs a connection inside a transaction, so the store's writes "
                "commit or roll back with yours: async with engine.begin() as conn: ..."
            )
        if not self._ready:
            await self.initialize()
        bound = dict(_BOUND.get({}))
        if id(self) in bound:
            raise InvalidInputError("store.using() blocks of one store cannot be nested")
        bound[id(self)] = connection
        token = _BOUND.set(bound)
        try:
            yield
        finally:
            _BOUND.reset(token)

    @property
    def bound(self) -> bool:
        """Whether the current task runs inside a ``using()`` block of this store."""
        return id(self) in _BOUND.get({})

    # --- closing ----------------------------------------------------------------------------

    async def close(self) -> None:
        """Wait for units still running, then dispose the engine if the store made it."""
        if self._closed:
            return
        self._closed = True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover - close() is a coroutine
            loop = None
        if self._loop is not None and loop is not self._loop:
            # The connections belong to another (maybe closed) loop: drop them unclosed.
            if self._owns_engine:
                await self.engine.dispose(close=False)
            return
        if self._inflight:
            await asyncio.gather(*list(self._inflight), return_exceptions=True)
        if self._owns_engine:
            await self.engine.dispose()

    # --- errors -------------------------------------------------------------------------------

    async def failed(self, exc: BaseException) -> ContextError:
        """`translate`, after letting a connection that failed to open finish closing.

        aiosqlite stops the worker thread of a connection that failed to open without waiting
        for it; the thread then reports to the event loop, which may be closed by then (a
        command line that exits on the error), and prints a traceback. Waiting a moment for
        that thread to end keeps the failure clean.
        """
        error = self.translate(exc)
        if self.dialect.is_sqlite and isinstance(error, StoreUnavailableError):
            await settle_driver_threads(keep_alive=True)
        return error

    def translate(self, exc: BaseException) -> ContextError:
        """A `ContextError` for a driver or SQLAlchemy error."""
        first_line = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [""])[0]
        reason = first_line or type(exc).__name__
        if self.dialect.is_sqlite:
            if "unable to open database file" in reason:
                return StoreUnavailableError(
                    f"cannot open the SQLite database at {self.url}: {reason}. Check that its "
                    "directory exists and is writable"
                )
            if "file is not a database" in reason or "malformed" in reason:
                return StoreError(
                    f"{self.url} is not a valid SQLite database ({reason}); point the store at "
                    "a new file or restore this one from a backup"
                )
            if "database is locked" in reason:
                return StoreUnavailableError(
                    f"the SQLite database at {self.url} stayed locked by another process for "
                    "longer than the busy timeout (sqlite_busy_timeout); retry, or let that "
                    "process finish its write"
                )
        elif is_connection_error(exc):
            return StoreUnavailableError(
                f"cannot reach the database at {self.url}: {reason}. Check that the server "
                "is running and the URL is right; the store reconnects by itself once it is back"
            )
        if self.dialect.is_out_of_range(exc):
            return InvalidInputError(
                f"a number or date is out of the range the database can store ({reason})"
            )
        return StoreError(f"database error on {self.url}: {reason}")


def _driver_threads() -> list[threading.Thread]:
    return [
        thread
        for thread in threading.enumerate()
        if getattr(getattr(thread, "_target", None), "__name__", "") == "_connection_worker_thread"
    ]


def driver_threads() -> set[threading.Thread]:
    """aiosqlite's worker threads alive now."""
    return set(_driver_threads())


async def settle_driver_threads(
    *, keep_alive: bool = False, since: set[threading.Thread] | None = None, within: float = 2.0
) -> None:
    """Let aiosqlite's worker threads that are stopping finish while the loop still runs.

    aiosqlite stops the thread of a connection that failed to open (or was closed) without
    waiting for it; the thread then reports to the event loop, and if that loop has closed
    meanwhile (a command line exiting on the error) it prints a traceback. With
    ``keep_alive``, wait until one of the threads alive now has ended (the one stopping);
    otherwise until every thread started after ``since`` (a `driver_threads` snapshot) has.
    At most ``within`` seconds.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    threads = [t for t in _driver_threads() if since is None or t not in since]
    while threads and loop.time() < deadline:
        alive = [thread for thread in threads if thread.is_alive()]
        if (keep_alive and len(alive) < len(threads)) or (not keep_alive and not alive):
            break
        await asyncio.sleep(0.005)
    await asyncio.sleep(0)  # run the callbacks the threads posted


class _UnitState:
    """How far a unit got, to tell whether running it again after a lost connection is safe:
    always for reads and idempotent units, for a transaction only if its commit was not sent
    (the server rolls back what a dead connection left), never for other lone statements (the
    server may have applied one before the connection died)."""

    __slots__ = ("committing", "idempotent", "mode")

    def __init__(self, mode: Mode, idempotent: bool) -> None:
        self.mode = mode
        self.idempotent = idempotent
        self.committing = False

    def may_retry(self) -> bool:
        if self.mode in ("read", "snapshot") or self.idempotent:
            return True
        return self.mode == "write" and not self.committing
