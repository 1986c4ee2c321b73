"""The database object of a store: its one engine, units of work, and what can go wrong.

Every statement of a store runs in a *unit of work*: a plain function taking a SQLAlchemy
``Connection`` and returning a value, run by `Database.run` in one of four modes
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
import functools
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Concatenate, Literal, ParamSpec, TypeVar

from sqlalchemy import Connection, Engine, event
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.util import greenlet_spawn

from agentcontext import _validate as v
from agentcontext.errors import (
    ChatBusyError,
    ContextError,
    InvalidInputError,
    InvalidTypeError,
    StoreClosedError,
    StoreError,
    StoreUnavailableError,
)
from agentcontext.store._dialects import BEGIN_OPTION, Dialect, Mode

if TYPE_CHECKING:
    from agentcontext.store._replicas import Replicas

__all__ = ["Database", "Transaction", "driver_threads", "settle_driver_threads", "unit"]

T = TypeVar("T")
P = ParamSpec("P")

_Note = Callable[[], Callable[[int | None], None]]
"""Before the primary's position is read after a commit: returns what takes the answer."""


def unit(
    function: Callable[Concatenate[Connection, P], T], /, *args: P.args, **kwargs: P.kwargs
) -> Callable[[Connection], T]:
    """A unit of work: ``function(connection, *args, **kwargs)``, typed end to end."""
    return lambda conn: function(conn, *args, **kwargs)


SETTLE_SECONDS = 30.0
"""Longest a cancelled call waits for its unit of work to commit or roll back."""

_BOUND: contextvars.ContextVar[Mapping[int, _Binding]] = contextvars.ContextVar(
    "agentcontext_bound_connections"
)
"""The ``store.using(...)`` blocks the current task runs in, by database. Tasks started inside
a block inherit it (a copy of the context): their calls run on the same connection, one at a
time."""


class Transaction:
    """A caller's transaction that a store's calls joined (``store.using`` / ``store.begin``).

    Open until the caller commits or rolls back (SQLAlchemy's ``commit`` and ``rollback``
    events of the connection say when); an engine that wrote in it checks `rolled_back` on
    its next call, and writers outside it wait for `wait`.
    """

    __slots__ = ("_callbacks", "_ended", "state")

    def __init__(self) -> None:
        self.state: Literal["open", "committed", "rolled back"] = "open"
        self._ended: asyncio.Event | None = None
        self._callbacks: list[Callable[[], None]] = []

    @property
    def is_open(self) -> bool:
        """Whether the caller has not committed or rolled back yet."""
        return self.state == "open"

    @property
    def rolled_back(self) -> bool:
        """Whether the caller rolled back (or closed the connection without committing)."""
        return self.state == "rolled back"

    def on_end(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the transaction ends (at once if it has)."""
        if self.is_open:
            self._callbacks.append(callback)
        else:
            callback()

    def end(self, state: Literal["committed", "rolled back"]) -> None:
        if not self.is_open:
            return
        self.state = state
        if self._ended is not None:
            self._ended.set()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    async def wait(self, seconds: float) -> bool:
        """Wait until the transaction ends; False if it is still open after ``seconds``."""
        if not self.is_open:
            return True
        if self._ended is None:
            self._ended = asyncio.Event()
        try:
            await asyncio.wait_for(self._ended.wait(), seconds)
        except TimeoutError:
            return False
        return True


class _Watch:
    """What the store knows of one caller connection: its current transaction (followed
    through the connection's events), the lock that makes the store's units on it take
    turns, and which database it reaches."""

    __slots__ = ("__weakref__", "identity", "lock", "transaction")

    def __init__(self, sync_connection: Connection) -> None:
        self.transaction = Transaction()
        self.lock = asyncio.Lock()
        self.identity: tuple[Any, ...] | None = None
        ref = weakref.ref(self)

        def ended(state: Literal["committed", "rolled back"]) -> Callable[[Connection], None]:
            def listener(_conn: Connection) -> None:
                watch = ref()
                if watch is not None:
                    finished, watch.transaction = watch.transaction, Transaction()
                    finished.end(state)

            return listener

        event.listen(sync_connection, "commit", ended("committed"))
        event.listen(sync_connection, "rollback", ended("rolled back"))


_WATCHES: weakref.WeakKeyDictionary[Connection, _Watch] = weakref.WeakKeyDictionary()


def _watch(connection: AsyncConnection) -> _Watch:
    sync_connection = connection.sync_connection
    assert sync_connection is not None
    watch = _WATCHES.get(sync_connection)
    if watch is None:
        watch = _WATCHES[sync_connection] = _Watch(sync_connection)
    return watch


class _Binding:
    """One ``store.using(connection)`` block."""

    __slots__ = ("active", "connection", "watch")

    def __init__(self, connection: AsyncConnection, watch: _Watch) -> None:
        self.connection = connection
        self.watch = watch
        self.active = True


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
        self.url = engine.url.render_as_string(hide_password=True)
        self._sync_engine = engine.sync_engine
        self._owns_engine = owns_engine
        self._memory = dialect.unit_locks(engine.url) == "all"
        self._translate = None if dialect.schema is None else {None: dialect.schema}
        """SQLAlchemy's ``schema_translate_map``: the store's tables in its schema."""
        """One connection shared by every unit (an in-memory SQLite database)."""
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
        self._all_lock: asyncio.Lock | None = None
        self._holds: dict[str, Transaction] = {}
        """Chats written by a caller's transaction still open (``store.using``), by chat."""
        self._exclusive: Transaction | None = None
        """In memory: the caller's transaction that has the one connection to itself."""
        self._identity: tuple[Any, ...] | None = None

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

    def _check_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            self._init_lock = asyncio.Lock()
            locks = self.dialect.unit_locks(self.engine.url)
            if locks == "all":
                self._all_lock = asyncio.Lock()
            elif locks == "writes":
                self._write_lock = asyncio.Lock()
            slots = _pool_slots(self._sync_engine.pool)
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
        loop = self._check_loop()
        self.check_open()
        if not self._ready:
            await self.initialize()
        named = () if chat is None else ((chat,) if isinstance(chat, str) else tuple(chat))
        reading = mode in ("read", "snapshot")
        chats = () if reading else named
        binding = _BOUND.get({}).get(id(self))
        replicas = self.replicas
        if binding is not None:
            runner = self._run_bound(binding, mode, unit, chats)
        elif replicas is not None and reading and not primary:
            if not named and branch is not None:
                found = replicas.chat_of(branch)
                named = () if found is None else (found,)
            runner = replicas.read(self, mode, unit, named, asyncio.current_task())
        else:
            if chats and self._holds:
                await self._wait_for_holds(chats)
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

    def transaction(self) -> Transaction | None:
        """The caller's transaction the current task's calls run in (``using``), or None."""
        binding = _BOUND.get({}).get(id(self))
        return None if binding is None else binding.watch.transaction

    async def _wait_for_holds(
        self, chats: Collection[str], *, mine: Transaction | None = None
    ) -> None:
        """Wait until no other open caller transaction holds one of ``chats``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.lock_timeout
        for chat_id in chats:
            while True:
                holder = self._holds.get(chat_id)
                if holder is None or holder is mine or not holder.is_open:
                    break
                if not await holder.wait(max(0.0, deadline - loop.time())):
                    raise ChatBusyError(
                        f"chat {chat_id!r} is held by a transaction of this process "
                        "(store.using() or store.begin()) that did not commit or roll back "
                        f"within {self.lock_timeout:g} s; nothing was written. End that "
                        "transaction first, or give the store a longer lock_timeout"
                    )

    def _hold(self, chats: Collection[str], transaction: Transaction) -> None:
        for chat_id in chats:
            if self._holds.get(chat_id) is transaction:
                continue
            self._holds[chat_id] = transaction

            def release(chat_id: str = chat_id) -> None:
                if self._holds.get(chat_id) is transaction:
                    del self._holds[chat_id]

            transaction.on_end(release)

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
        if self._all_lock is not None:
            await self._acquire_memory()
            try:
                return await self._run_unit_locked(mode, unit, idempotent, note)
            finally:
                self._all_lock.release()
        lock: AbstractAsyncContextManager[Any] = nullcontext()
        if mode in ("write", "atomic") and self._write_lock is not None:
            lock = self._write_lock
        async with lock:
            return await self._run_unit_locked(mode, unit, idempotent, note)

    async def _acquire_memory(self) -> None:
        """Take the in-memory database's one connection, once no caller's transaction has it
        to itself (waiting at most ``lock_timeout`` for one)."""
        assert self._all_lock is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.lock_timeout
        while True:
            await self._all_lock.acquire()
            holder = self._exclusive
            if holder is None or not holder.is_open:
                return
            self._all_lock.release()
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
        for attempt in (0, 1):
            state = _UnitState(mode, idempotent)
            try:
                async with gate:
                    return await greenlet_spawn(self._sync_unit, mode, unit, state, None, note)
            except ContextError:
                raise
            except (SQLAlchemyError, OSError, TimeoutError) as exc:
                if not (attempt == 0 and is_connection_error(exc) and state.may_retry()):
                    raise await self.failed(exc) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _sync_unit(
        self,
        mode: Mode,
        unit: Callable[[Connection], T],
        state: _UnitState,
        engine: Engine | None = None,
        note: _Note | None = None,
    ) -> T:
        with (engine or self._sync_engine).connect() as conn:
            self.dialect.prepare(conn, mode)
            if self._translate is not None:
                conn.execution_options(schema_translate_map=self._translate)
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
            transaction = conn.begin()
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

    async def _run_bound(
        self,
        binding: _Binding,
        mode: Mode,
        unit: Callable[[Connection], T],
        chats: Collection[str],
    ) -> T:
        watch = binding.watch
        async with watch.lock:  # tasks started inside the block take turns
            conn = binding.connection
            if not binding.active:
                raise StoreError(
                    "this call was started inside a store.using() (or store.begin()) block "
                    "that has ended; nothing was done. Await the tasks you start inside the "
                    "block before it ends"
                )
            if conn.closed or not conn.in_transaction():
                raise StoreError(
                    "the connection given to store.using() is no longer in a transaction "
                    "(it was committed, rolled back or closed inside the block); nothing was "
                    "done. Begin a new transaction and a new store.using() block"
                )
            transaction = watch.transaction
            if mode in ("read", "snapshot"):
                call = unit
            else:
                if chats:
                    await self._wait_for_holds(chats, mine=transaction)
                    self._hold(chats, transaction)
                if self.replicas is not None:
                    transaction.on_end(self._committed_later(transaction, chats))
                call = self._savepoint(unit)
            if self._translate is not None:
                call = self._in_schema(call)
            try:
                return await conn.run_sync(call)
            except ContextError:
                raise
            except (SQLAlchemyError, OSError, TimeoutError) as exc:
                raise await self.failed(exc) from exc

    def _committed_later(
        self, transaction: Transaction, chats: Collection[str]
    ) -> Callable[[], None]:
        def ended() -> None:
            if self.replicas is not None and transaction.state == "committed":
                self.replicas.uncertain(chats)

        return ended

    def _in_schema(self, unit: Callable[[Connection], T]) -> Callable[[Connection], T]:
        """``unit`` on a caller's connection with the store's tables in its schema, the
        connection's own options as they were afterwards."""

        def run(conn: Connection) -> T:
            before = conn.get_execution_options().get("schema_translate_map")
            conn.execution_options(
                schema_translate_map={**(before or {}), **(self._translate or {})}
            )
            try:
                return unit(conn)
            finally:
                conn.execution_options(schema_translate_map=before)

        return run

    def _savepoint(self, unit: Callable[[Connection], T]) -> Callable[[Connection], T]:
        def run(conn: Connection) -> T:
            self.dialect.join_transaction(conn)
            # A SAVEPOINT: a unit that fails (a head conflict, say) leaves the caller's
            # transaction as it was, and usable.
            with conn.begin_nested():
                return unit(conn)

        return run

    # --- the caller's transaction -------------------------------------------------------------

    def using(self, connection: object) -> AbstractAsyncContextManager[None]:
        """Run this task's units on ``connection`` (in its transaction) inside the block (a
        connection of another type is refused at once, not on entering the block)."""
        if not isinstance(connection, AsyncConnection):
            raise InvalidTypeError(
                "store.using() takes a SQLAlchemy AsyncConnection (from engine.connect() or "
                f"engine.begin()), got {v.type_name(connection)}"
            )
        return self._using(connection)

    @asynccontextmanager
    async def _using(self, connection: AsyncConnection) -> AsyncIterator[None]:
        self._check_loop()
        self.check_open()
        if connection.closed:
            raise InvalidInputError("store.using() was given a closed connection")
        if connection.dialect.name != self.dialect.name:
            raise InvalidInputError(
                f"store.using() needs a connection to the store's database ({self.url}), got "
                f"one to a {connection.dialect.name} database"
            )
        if not connection.in_transaction():
            raise InvalidInputError(
                "store.using() needs a connection inside a transaction, so the store's writes "
                "commit or roll back with yours: async with engine.begin() as conn: ..."
            )
        if connection.sync_connection is not None and _autocommit(connection.sync_connection):
            raise InvalidInputError(
                "store.using() was given a connection in AUTOCOMMIT isolation: every statement "
                "commits at once, so a rollback could not undo the store's writes. Use a "
                "connection with a real transaction (the engine's default isolation level)"
            )
        if id(self) in _BOUND.get({}):
            raise InvalidInputError("store.using() blocks of one store cannot be nested")
        if not self._ready:
            await self.initialize()
        watch = _watch(connection)
        await self._check_same_database(connection, watch)
        exclusive = self._memory and self._exclusive is not watch.transaction
        if exclusive:
            await self._take_memory(watch.transaction)
        binding = _Binding(connection, watch)
        token = _BOUND.set({**_BOUND.get({}), id(self): binding})
        try:
            yield
        finally:
            binding.active = False
            _BOUND.reset(token)

    async def _take_memory(self, transaction: Transaction) -> None:
        """In memory, give a caller's transaction the one connection until it ends."""
        await self._acquire_memory()
        try:
            self._exclusive = transaction
        finally:
            assert self._all_lock is not None
            self._all_lock.release()

        def release() -> None:
            if self._exclusive is transaction:
                self._exclusive = None

        transaction.on_end(release)

    async def _check_same_database(self, connection: AsyncConnection, watch: _Watch) -> None:
        """Refuse a connection to another database than the store's."""
        if connection.engine.sync_engine is self._sync_engine:
            return  # the store's own engine (store.begin(), store.engine.begin())
        if self._memory:
            # An in-memory database is reachable only through the store's own engine (its one
            # connection).
            theirs = connection.engine.url.render_as_string(hide_password=True)
            raise InvalidInputError(
                f"store.using() was given a connection to another database ({theirs}) than "
                f"the store's in-memory one ({self.url}); pass a connection of the store's own "
                "engine (store.engine.begin())"
            )
        if watch.identity is None:
            watch.identity = await self._settled(
                connection.run_sync(self.dialect.database_identity)
            )
        if watch.identity != await self._own_identity():
            theirs = connection.engine.url.render_as_string(hide_password=True)
            raise InvalidInputError(
                f"store.using() was given a connection to another database ({theirs}) than "
                f"the store's ({self.url}); the store's writes would land there. Pass a "
                "connection of the store's own database (store.engine.begin(), say)"
            )

    async def _own_identity(self) -> tuple[Any, ...]:
        if self._identity is None:
            self._identity = await self.run("read", self.dialect.database_identity)
        return self._identity

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[AsyncConnection]:
        """A transaction on the store's engine with this task's calls in it (``store.begin``).

        On SQLite it takes the write lock up front (``BEGIN IMMEDIATE``); in memory it has the
        one connection to itself until it ends.
        """
        self._check_loop()
        self.check_open()
        if not self._ready:
            await self.initialize()
        transaction: Transaction | None = None
        if self._memory:
            # The placeholder is swapped for the connection's transaction below; meanwhile no
            # other task's unit may start on the shared connection.
            transaction = Transaction()
            await self._take_memory(transaction)
        try:
            conn = await self._connect()
            try:
                await conn.execution_options(**{BEGIN_OPTION: "immediate"})
                watch = _watch(conn)
                await self._settled(conn.begin())
                if transaction is not None:
                    self._exclusive = watch.transaction
                    watch.transaction.on_end(self._release_exclusive(watch.transaction))
                async with self.using(conn):
                    yield conn
                if conn.in_transaction():  # (the caller may have ended it already)
                    await self._settled(conn.commit())
            except BaseException:
                if not conn.closed and conn.in_transaction():
                    await self._settled(conn.rollback())
                raise
            finally:
                await self._settled(conn.close())
        finally:
            if transaction is not None:
                transaction.end("committed")

    async def _connect(self) -> AsyncConnection:
        """A connection of the store's engine for ``begin()``; closed again if the caller is
        cancelled while it opens (a connection nobody checks in would be dropped by the
        garbage collector, and with it an in-memory database)."""
        opening: asyncio.Future[AsyncConnection] = asyncio.ensure_future(self.engine.connect())
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            await asyncio.wait({opening}, timeout=SETTLE_SECONDS)
            if opening.done() and not opening.cancelled() and opening.exception() is None:
                await asyncio.shield(opening.result().close())
            raise
        except (SQLAlchemyError, OSError, TimeoutError) as exc:
            raise await self.failed(exc) from exc

    async def _settled(self, step: Awaitable[T]) -> T:
        """Run a step of ``begin()`` (connect, BEGIN, COMMIT, ROLLBACK, close) to its end even
        when the caller is cancelled meanwhile, so a connection never stays half-way through
        one, holding SQLite's write lock or losing the in-memory database; driver errors are
        named like every other of the store's."""
        task: asyncio.Future[T] = asyncio.ensure_future(step)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            await asyncio.wait({task}, timeout=SETTLE_SECONDS)
            raise
        except (SQLAlchemyError, OSError, TimeoutError) as exc:
            raise await self.failed(exc) from exc

    def _release_exclusive(self, transaction: Transaction) -> Callable[[], None]:
        def release() -> None:
            if self._exclusive is transaction:
                self._exclusive = None

        return release

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
        that thread to end keeps the failure clean.
        """
        error = self.translate(exc)
        if isinstance(error, StoreUnavailableError) and driver_threads():
            await settle_driver_threads(keep_alive=True)
        return error

    def translate(self, exc: BaseException) -> ContextError:
        """A `ContextError` for a driver or SQLAlchemy error."""
        first_line = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [""])[0]
        reason = first_line or type(exc).__name__
        busy = any(holder.is_open for holder in self._holds.values())
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


def _autocommit(connection: Connection) -> bool:
    """Whether a connection runs in AUTOCOMMIT isolation (no transaction to join)."""
    level = connection.get_execution_options().get("isolation_level")
    if level is None:  # the engine's own level (create_engine(isolation_level=...))
        level = getattr(connection.engine.dialect, "_on_connect_isolation_level", None)
    return isinstance(level, str) and level.upper() == "AUTOCOMMIT"


def _pool_slots(pool: Any) -> int | None:
    """How many connections ``pool`` lends at most (None: no fixed bound)."""
    size, overflow = getattr(pool, "size", None), getattr(pool, "_max_overflow", None)
    if not callable(size) or not isinstance(overflow, int) or overflow < 0:
        return None
    total = size() + overflow
    return total if isinstance(total, int) and total > 0 else None
