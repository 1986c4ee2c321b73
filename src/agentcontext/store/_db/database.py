"""The database object of a store: its one engine and the units of work run on it.

Every statement of a store runs in a *unit of work*: a plain function taking a SQLAlchemy
``Connection`` and returning a value, run by `Database.run` in one of four modes
(`_dialects.Mode`). A unit runs in SQLAlchemy's greenlet bridge
(one hop for the whole unit, not one per statement), on a connection of the store's engine,
or on the caller's connection inside ``store.using(connection)`` (``transactions``: the
caller's transactions are the database's `Callers`). Read replicas serve reads
(``replicas``); what went wrong is named here and in ``errors``.

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
import contextlib
import functools
import random
from collections.abc import Callable, Collection
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import greenlet_spawn

from agentcontext._keyring import KEYRING_TABLE
from agentcontext.encryption import KeyringInStoreError
from agentcontext.errors import (
    ChatBusyError,
    ContextError,
    EncryptionError,
    InvalidInputError,
    StoreClosedError,
    StoreError,
    StoreUnavailableError,
)
from agentcontext.store._db.errors import (
    driver_threads,
    is_connection_error,
    settle_driver_threads,
)
from agentcontext.store._db.schema import chats as C
from agentcontext.store._db.transactions import SETTLE_SECONDS, Callers, Transaction
from agentcontext.store._dialects import Dialect, Mode
from agentcontext.store._rows.sealing import KeyedSealer, KeyNeeded

if TYPE_CHECKING:
    from agentcontext.store._db.replicas import Replicas

__all__ = ["Database", "Transaction", "unit"]

TRANSIENT_ATTEMPTS = 8
"""Runs of a unit the server rolled back to break a deadlock (or whose lock wait timed out)
before the error is reported."""

_KEY_ATTEMPTS = 4
"""Runs of a unit that found data keys missing (each run fetches the keys it named)."""

T = TypeVar("T")
P = ParamSpec("P")

_Note = Callable[[], Callable[[int | None], None]]
"""Before the primary's position is read after a commit: returns what takes the answer."""


def unit(
    function: Callable[Concatenate[Connection, P], T], /, *args: P.args, **kwargs: P.kwargs
) -> Callable[[Connection], T]:
    """A unit of work: ``function(connection, *args, **kwargs)``, typed end to end."""
    return lambda conn: function(conn, *args, **kwargs)


class Database:
    """One engine, run units of work on it, translate what goes wrong.

    Args:
        engine: The store's engine (the caller's, or one made from a URL).
        dialect: Its dialect strategy.
        owns_engine: Whether ``close()`` disposes the engine.
        prepare: Run once before the first unit (the schema check or migration).
    """

    def __init__(
        self,
        engine: AsyncEngine,
        dialect: Dialect,
        *,
        owns_engine: bool,
        prepare: Callable[[Database], Any],
        lock_timeout: float = 30.0,
        replicas: Replicas | None = None,
    ) -> None:
        self.engine = engine
        self.replicas = replicas
        """The read replicas (``read_replicas=``), or None."""
        self.lock_timeout = lock_timeout
        """Longest a write waits for a chat held by an open transaction of this process."""
        self.dialect = dialect
        if isinstance(dialect.sealer, KeyedSealer):
            dialect.sealer.holds_sealed = self.holds_sealed  # (before a user's first key)
        self.url = engine.url.render_as_string(hide_password=True)
        self.sync_engine = engine.sync_engine
        self._owns_engine = owns_engine
        self.one_connection = dialect.unit_locks(engine.url) == "all"
        """One connection shared by every unit (an in-memory SQLite database)."""
        self.schema_map = None if dialect.schema is None else {None: dialect.schema}
        """SQLAlchemy's ``schema_translate_map``: the store's tables in its schema."""
        self._prepare = prepare
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = False
        self._closed = False
        self._inflight: set[asyncio.Task[Any]] = set()
        # Locks are made on first use, in the store's loop.
        self._init_lock: asyncio.Lock | None = None
        self._write_lock: asyncio.Lock | None = None
        self._gate: asyncio.Semaphore | None = None
        """Units waiting for a connection queue here, first come first served, instead of in
        the pool, where a newcomer can take a connection returned for a waiter."""
        self.one_connection_lock: asyncio.Lock | None = None
        self.callers = Callers(self)
        """The caller transactions its calls join (``store.using()``, ``store.begin()``)."""

    # --- state ----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    @property
    def owns_engine(self) -> bool:
        """Whether ``close()`` disposes the engine (the store made it)."""
        return self._owns_engine

    @property
    def ready(self) -> bool:
        """Whether the schema was prepared (the store was used or initialised)."""
        return self._ready

    def check_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            self._init_lock = asyncio.Lock()
            locks = self.dialect.unit_locks(self.engine.url)
            if locks == "all":
                self.one_connection_lock = asyncio.Lock()
            elif locks == "writes":
                self._write_lock = asyncio.Lock()
            slots = _pool_slots(self.sync_engine.pool)
            if slots is not None:
                self._gate = asyncio.Semaphore(slots)
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
        self.check_loop()
        self.check_open()
        if self._ready:
            return
        assert self._init_lock is not None
        async with self._init_lock:
            if self._ready:
                return
            if self.dialect.sealer.encrypted and await self._run_unit(
                "read", self.dialect.holds_keyring, False
            ):
                raise KeyringInStoreError(
                    f"the database at {self.url} holds a keyring (the table "
                    f"{KEYRING_TABLE}): a copy of the data would carry the keys that open it. "
                    "Keep the keyring in a database of its own, and the store's data elsewhere"
                )
            await self._prepare(self)
            if await self._run_unit("read", self._opened, False):
                # A role that may only read (a viewer's) cannot record it; the database is
                # then known by its newest message, as before the setting existed.
                # The provider's keyring first, so that a database marked as encrypted has
                # one; a keyring that cannot be had now is made with the first key (the mark
                # is what keeps a store without a provider out, and records a database
                # sealed whole from the start).
                with contextlib.suppress(ContextError):
                    await self.dialect.sealer.create_keyring()
                with contextlib.suppress(ContextError):
                    await self._run_unit("write", self.dialect.mark_sealed, False)
            self._ready = True

    async def holds_sealed(self, user_id: str) -> bool:
        """Whether the database holds chats of ``user_id`` sealed (the sealer asks before a
        user's first key is made)."""
        sealed = functools.partial(self.dialect.holds_sealed, where=C.c.user_id == user_id)
        return await self.run("read", sealed)

    def _opened(self, conn: Connection) -> bool:
        """The dialect's checks of a database a store first uses; whether the database is
        still to be marked as encrypted."""
        self.dialect.on_open(conn)
        return self.dialect.check_sealing(conn)

    # --- units of work ----------------------------------------------------------------------

    async def run(
        self,
        mode: Mode,
        unit: Callable[[Connection], T],
        *,
        idempotent: bool = False,
        chat: str | Collection[str] | None = None,
        branch: str | None = None,
        primary: bool = False,
    ) -> T:
        """Run ``unit(connection)`` as one unit of work and return its result.

        ``read``: no transaction (each statement sees the latest commits); ``write``: one
        transaction, committed when the unit returns, rolled back if it raises; ``atomic``:
        a single statement that is atomic on its own (no BEGIN/COMMIT round trips).
        ``idempotent`` allows an atomic unit to run again after a lost connection (its own
        condition, such as a compare-and-swap, refuses a second application).

        ``chat`` names the chat(s) a write changes. Inside ``store.using()`` the caller's
        transaction then holds them until it ends; a write outside waits for that (at most
        ``lock_timeout``, then `ChatBusyError`) instead of blocking on the database's locks,
        so the two never deadlock.

        With read replicas, a read (``chat``: the chat(s) it reads, or ``branch``: a branch
        of the chat) runs on a replica that has replayed this store's writes to them, unless
        ``primary`` (a read that must see the latest commits of everyone, after a refused
        compare-and-swap); writes note the primary's position after their commit.
        """
        with self.dialect.sealer.pinned() as pin:
            for _attempt in range(_KEY_ATTEMPTS):
                try:
                    return await self._run(mode, unit, idempotent, chat, branch, primary)
                except KeyNeeded as need:
                    # The unit (rolled back) needs data keys of an encrypted store: fetch them
                    # and run it again (see `_rows.sealing`), keeping them while it runs.
                    pin(need)
                    await self.dialect.sealer.load(need)
        raise EncryptionError(
            "the key provider's keys kept changing while this call ran; nothing was done, "
            "call again"
        )

    async def _run(
        self,
        mode: Mode,
        unit: Callable[[Connection], T],
        idempotent: bool,
        chat: str | Collection[str] | None,
        branch: str | None,
        primary: bool,
    ) -> T:
        loop = self.check_loop()
        self.check_open()
        if not self._ready:
            await self.initialize()
        named = () if chat is None else ((chat,) if isinstance(chat, str) else tuple(chat))
        reading = mode in ("read", "snapshot")
        chats = () if reading else named
        binding = self.callers.binding()
        replicas = self.replicas
        if binding is not None:
            runner = self.callers.run_bound(binding, mode, unit, chats)
        elif replicas is not None and reading and not primary:
            if not named and branch is not None:
                found = replicas.chat_of(branch)
                named = () if found is None else (found,)
            runner = replicas.read(self, mode, unit, named, asyncio.current_task())
        else:
            if chats and self.callers.holds:
                await self.callers.wait_for_holds(chats)
            note = (
                None if replicas is None or reading else functools.partial(replicas.writing, chats)
            )
            runner = self._run_unit(mode, unit, idempotent, note)
        task = loop.create_task(runner)
        self._inflight.add(task)
        task.add_done_callback(self._finished)
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            # Let the unit settle first, so the caller never sees it land later.
            await asyncio.wait({task}, timeout=SETTLE_SECONDS)
            if replicas is not None and not reading:
                replicas.uncertain(chats)
            raise
        except BaseException:
            if replicas is not None and not reading:
                replicas.uncertain(chats)  # a refused compare-and-swap: someone wrote there
            raise
        if replicas is not None:
            replicas.learn(result)
        return result

    async def on_primary(self, mode: Mode, unit: Callable[[Connection], T]) -> T:
        """``unit`` on the primary, from inside a running unit of work (the replicas')."""
        return await self._run_unit(mode, unit, False)

    def sync_read(self, engine: Engine, mode: Mode, unit: Callable[[Connection], T]) -> T:
        """A read unit on another engine of the same database (a replica's), in the greenlet."""
        return self._sync_unit(mode, unit, _UnitState(mode, False), engine)

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._inflight.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a caller that stopped waiting is not told twice

    async def _run_unit(
        self,
        mode: Mode,
        unit: Callable[[Connection], T],
        idempotent: bool,
        note: _Note | None = None,
    ) -> T:
        if self.one_connection_lock is not None:
            await self.acquire_one_connection()
            try:
                return await self._run_unit_locked(mode, unit, idempotent, note)
            finally:
                self.one_connection_lock.release()
        lock: AbstractAsyncContextManager[Any] = nullcontext()
        if mode in ("write", "atomic") and self._write_lock is not None:
            lock = self._write_lock
        async with lock:
            return await self._run_unit_locked(mode, unit, idempotent, note)

    async def acquire_one_connection(self) -> None:
        """Take the in-memory database's one connection, once no caller's transaction has it
        to itself (waiting at most ``lock_timeout`` for one)."""
        assert self.one_connection_lock is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.lock_timeout
        while True:
            await self.one_connection_lock.acquire()
            holder = self.callers.exclusive
            if holder is None or not holder.is_open:
                return
            self.one_connection_lock.release()
            if not await holder.wait(max(0.0, deadline - loop.time())):
                raise ChatBusyError(
                    "the in-memory database's one connection is in a transaction of this "
                    "process (store.using() or store.begin()) that did not commit or roll back "
                    f"within {self.lock_timeout:g} s; nothing was done. End that transaction "
                    "first, or give the store a longer lock_timeout"
                )

    async def _run_unit_locked(
        self,
        mode: Mode,
        unit: Callable[[Connection], T],
        idempotent: bool,
        note: _Note | None,
    ) -> T:
        gate: AbstractAsyncContextManager[Any] = self._gate or nullcontext()
        reconnected = False
        for attempt in range(TRANSIENT_ATTEMPTS):
            state = _UnitState(mode, idempotent)
            try:
                async with gate:
                    return await greenlet_spawn(self._sync_unit, mode, unit, state, None, note)
            except ContextError:
                raise
            except (SQLAlchemyError, OSError, TimeoutError) as exc:
                if not state.may_retry() or attempt + 1 == TRANSIENT_ATTEMPTS:
                    error = await self.failed(exc)
                    raise _contended(error, self.dialect.is_transient(exc)) from exc
                if self.dialect.is_transient(exc):
                    # Rolled back by the server to break a deadlock, or a lock waited for
                    # too long: a lost race, run again after a moment.
                    await asyncio.sleep(random.uniform(0, 0.002 * 2**attempt))
                    continue
                if reconnected or not is_connection_error(exc):
                    raise await self.failed(exc) from exc
                reconnected = True
        raise AssertionError("unreachable")  # pragma: no cover

    def _sync_unit(
        self,
        mode: Mode,
        unit: Callable[[Connection], T],
        state: _UnitState,
        engine: Engine | None = None,
        note: _Note | None = None,
    ) -> T:
        with (engine or self.sync_engine).connect() as conn:
            self.dialect.prepare(conn, mode)
            if self.schema_map is not None:
                conn.execution_options(schema_translate_map=self.schema_map)
            if mode == "read":
                return unit(conn)
            if mode == "atomic":
                result = unit(conn)
                if self.dialect.atomic_needs_commit:
                    conn.commit()  # behind PgBouncer the statement ran in a transaction
                # Otherwise it committed by itself; closing rolls back SQLAlchemy's empty
                # transaction (no round trip on asyncpg) instead of resetting the connection.
                if note is not None:
                    self._note_position(conn, note)
                return result
            # (The transaction a statement of the dialect's `prepare` began, if it ran one.)
            transaction = conn.get_transaction() or conn.begin()
            try:
                result = unit(conn)
            except BaseException:
                if transaction.is_active:
                    transaction.rollback()
                raise
            state.committing = True
            transaction.commit()
            if note is not None:
                self._note_position(conn, note)
            return result

    def _note_position(self, conn: Connection, note: _Note) -> None:
        """Tell the replicas where the primary's log is after a commit (None: unknown)."""
        done = note()
        try:
            position = self.dialect.write_position(conn)
        except (SQLAlchemyError, OSError, TimeoutError):
            position = None  # committed all the same; the next read asks the primary
        done(position)

    # --- closing ----------------------------------------------------------------------------

    async def release(self) -> None:
        """After a failed opening: the connections of an engine the store made are closed
        (nothing else would close them); the engine stays usable, and so does the store."""
        if self._owns_engine:
            await self.engine.dispose()

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
            # Used from another (maybe closed) loop. Connections that belong to that loop are
            # dropped unclosed; SQLite's are closed here, or their driver threads would stay
            # until the collector finds them, then report to whatever loop runs at that time.
            if self._owns_engine:
                await self.engine.dispose(close=not self.dialect.loop_bound_connections)
            if self.replicas is not None:
                await self.replicas.close(close=False)
            return
        if self._inflight:
            await asyncio.gather(*list(self._inflight), return_exceptions=True)
        if self._owns_engine:
            await self.engine.dispose()
        if self.replicas is not None:
            await self.replicas.close()

    # --- errors -------------------------------------------------------------------------------

    async def failed(self, exc: BaseException) -> ContextError:
        """`translate`, after letting a connection that failed to open finish closing.

        aiosqlite stops the worker thread of a connection that failed to open without waiting
        for it; the thread then reports to the event loop, which may be closed by then (a
        command line that exits on the error), and prints a traceback. Waiting a moment for
        that thread to end keeps the failure clean. (Not when the database was only locked:
        no thread is stopping then, and the wait would last its whole two seconds.)
        """
        error = self.translate(exc)
        if (
            isinstance(error, StoreUnavailableError)
            and is_connection_error(exc)
            and driver_threads()
        ):
            await settle_driver_threads(keep_alive=True)
        return error

    def translate(self, exc: BaseException) -> ContextError:
        """A `ContextError` for a driver or SQLAlchemy error."""
        first_line = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [""])[0]
        reason = first_line or type(exc).__name__
        busy = any(holder.is_open for holder in self.callers.holds.values())
        named = self.dialect.translate(exc, reason, self.engine.url, busy)
        if named is not None:
            return named
        if is_connection_error(exc):
            return StoreUnavailableError(
                f"cannot reach the database at {self.url}: {reason}. Check that the server "
                "is running and the URL is right; the store reconnects by itself once it is back"
            )
        if self.dialect.is_out_of_range(exc):
            return InvalidInputError(
                f"a number or date is out of the range the database can store ({reason})"
            )
        return StoreError(f"database error on {self.url}: {reason}")


def _contended(error: ContextError, transient: bool) -> ContextError:
    """``error``, marked `StoreUnavailableError.contended` when what it reports is a lost race
    (a deadlock, a lock wait that timed out) after the unit's runs: no caller should run the
    unit again at once (a dropped connection is not marked)."""
    if transient and isinstance(error, StoreUnavailableError):
        error.contended = True
    return error


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


def _pool_slots(pool: Any) -> int | None:
    """How many connections ``pool`` lends at most (None: no fixed bound)."""
    size, overflow = getattr(pool, "size", None), getattr(pool, "_max_overflow", None)
    if not callable(size) or not isinstance(overflow, int) or overflow < 0:
        return None
    total = size() + overflow
    return total if isinstance(total, int) and total > 0 else None
