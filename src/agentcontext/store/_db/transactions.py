"""The caller's transactions a store's calls join: ``store.using(connection)`` and
``store.begin()``.

Inside ``async with store.using(connection):`` every store call of the current task (and of
tasks started inside the block, which take turns) runs on the caller's connection, in a
SAVEPOINT, without committing: the caller's commit keeps what the store wrote, their rollback
leaves nothing of it. Chats written in such a transaction are *held* until it ends: a writer of
the same chat outside it waits for that (at most ``lock_timeout``) instead of blocking on the
database's locks, so the two never deadlock. In memory (one shared connection), a caller's
transaction has that connection to itself until it ends.

`Callers` is the part of a `Database` that keeps these; the database's units of work ask it
whether the current task runs inside a block (`Callers.binding`).
"""

from __future__ import annotations

import asyncio
import contextvars
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from sqlalchemy import Connection, Engine, event
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agentcontext import _validate as v
from agentcontext.errors import (
    ChatBusyError,
    ContextError,
    InvalidInputError,
    InvalidTypeError,
    StoreError,
)
from agentcontext.store._dialects import BEGIN_OPTION, Dialect, Mode

if TYPE_CHECKING:
    from agentcontext.store._db.replicas import Replicas

__all__ = ["Callers", "Transaction", "Units"]

T = TypeVar("T")

SETTLE_SECONDS = 30.0
"""Longest a cancelled call waits for its unit of work (or a step of ``begin()``) to commit,
roll back or close."""

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


def _autocommit(connection: Connection) -> bool:
    """Whether a connection runs in AUTOCOMMIT isolation (no transaction to join)."""
    level = connection.get_execution_options().get("isolation_level")
    if level is None:  # the engine's own level (create_engine(isolation_level=...))
        level = getattr(connection.engine.dialect, "_on_connect_isolation_level", None)
    return isinstance(level, str) and level.upper() == "AUTOCOMMIT"


class Units(Protocol):
    """What the caller transactions need of the database that runs the units of work
    (`database.Database`)."""

    dialect: Dialect
    engine: AsyncEngine
    sync_engine: Engine
    url: str
    lock_timeout: float
    one_connection: bool
    one_connection_lock: asyncio.Lock | None
    schema_map: dict[None, str] | None
    replicas: Replicas | None

    @property
    def ready(self) -> bool: ...
    def check_loop(self) -> asyncio.AbstractEventLoop: ...
    def check_open(self) -> None: ...
    async def initialize(self) -> None: ...
    async def acquire_one_connection(self) -> None: ...
    async def failed(self, exc: BaseException) -> ContextError: ...
    async def run(self, mode: Mode, unit: Callable[[Connection], T]) -> T: ...
    async def on_primary(self, mode: Mode, unit: Callable[[Connection], T]) -> T: ...


class Callers:
    """The caller transactions of one `Database`: ``using()`` blocks, ``begin()``, the chats
    their open transactions hold, and (in memory) the one that has the connection to itself."""

    def __init__(self, db: Units) -> None:
        self.db = db
        self.holds: dict[str, Transaction] = {}
        """Chats written by a caller's transaction still open (``store.using``), by chat."""
        self.exclusive: Transaction | None = None
        """In memory: the caller's transaction that has the one connection to itself."""
        self._identity: tuple[Any, ...] | None = None

    def binding(self) -> _Binding | None:
        """The ``using()`` block of this database the current task runs in, or None."""
        return _BOUND.get({}).get(id(self.db))

    def transaction(self) -> Transaction | None:
        """The caller's transaction the current task's calls run in (``using``), or None."""
        binding = _BOUND.get({}).get(id(self.db))
        return None if binding is None else binding.watch.transaction

    async def wait_for_holds(
        self, chats: Collection[str], *, mine: Transaction | None = None
    ) -> None:
        """Wait until no other open caller transaction holds one of ``chats``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.db.lock_timeout
        for chat_id in chats:
            while True:
                holder = self.holds.get(chat_id)
                if holder is None or holder is mine or not holder.is_open:
                    break
                if not await holder.wait(max(0.0, deadline - loop.time())):
                    raise ChatBusyError(
                        f"chat {chat_id!r} is held by a transaction of this process "
                        "(store.using() or store.begin()) that did not commit or roll back "
                        f"within {self.db.lock_timeout:g} s; nothing was written. End that "
                        "transaction first, or give the store a longer lock_timeout"
                    )

    def hold(self, chats: Collection[str], transaction: Transaction) -> None:
        for chat_id in chats:
            if self.holds.get(chat_id) is transaction:
                continue
            self.holds[chat_id] = transaction

            def release(chat_id: str = chat_id) -> None:
                if self.holds.get(chat_id) is transaction:
                    del self.holds[chat_id]

            transaction.on_end(release)

    async def run_bound(
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
                    await self.wait_for_holds(chats, mine=transaction)
                    self.hold(chats, transaction)
                if self.db.replicas is not None:
                    transaction.on_end(self._committed_later(transaction, chats))
                call = self._savepoint(unit)
            if self.db.schema_map is not None:
                call = self._in_schema(call)
            try:
                return await conn.run_sync(call)
            except ContextError:
                raise
            except (SQLAlchemyError, OSError, TimeoutError) as exc:
                raise await self.db.failed(exc) from exc

    def _committed_later(
        self, transaction: Transaction, chats: Collection[str]
    ) -> Callable[[], None]:
        def ended() -> None:
            if self.db.replicas is not None and transaction.state == "committed":
                self.db.replicas.uncertain(chats)

        return ended

    def _in_schema(self, unit: Callable[[Connection], T]) -> Callable[[Connection], T]:
        """``unit`` on a caller's connection with the store's tables in its schema, the
        connection's own options as they were afterwards."""

        def run(conn: Connection) -> T:
            before = conn.get_execution_options().get("schema_translate_map")
            conn.execution_options(
                schema_translate_map={**(before or {}), **(self.db.schema_map or {})}
            )
            try:
                return unit(conn)
            finally:
                conn.execution_options(schema_translate_map=before)

        return run

    def _savepoint(self, unit: Callable[[Connection], T]) -> Callable[[Connection], T]:
        def run(conn: Connection) -> T:
            self.db.dialect.join_transaction(conn)
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
        self.db.check_loop()
        self.db.check_open()
        if connection.closed:
            raise InvalidInputError("store.using() was given a closed connection")
        if connection.dialect.name != self.db.dialect.name:
            raise InvalidInputError(
                f"store.using() needs a connection to the store's database ({self.db.url}), got "
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
        if id(self.db) in _BOUND.get({}):
            raise InvalidInputError("store.using() blocks of one store cannot be nested")
        if not self.db.ready:
            await self.db.initialize()
        watch = _watch(connection)
        await self._check_same_database(connection, watch)
        exclusive = self.db.one_connection and self.exclusive is not watch.transaction
        if exclusive:
            await self._take_memory(watch.transaction)
        binding = _Binding(connection, watch)
        token = _BOUND.set({**_BOUND.get({}), id(self.db): binding})
        try:
            yield
        finally:
            binding.active = False
            _BOUND.reset(token)

    async def _take_memory(self, transaction: Transaction) -> None:
        """In memory, give a caller's transaction the one connection until it ends."""
        await self.db.acquire_one_connection()
        try:
            self.exclusive = transaction
        finally:
            assert self.db.one_connection_lock is not None
            self.db.one_connection_lock.release()

        def release() -> None:
            if self.exclusive is transaction:
                self.exclusive = None

        transaction.on_end(release)

    async def _check_same_database(self, connection: AsyncConnection, watch: _Watch) -> None:
        """Refuse a connection to another database than the store's."""
        if connection.engine.sync_engine is self.db.sync_engine:
            return  # the store's own engine (store.begin(), store.engine.begin())
        if self.db.one_connection:
            # An in-memory database is reachable only through the store's own engine (its one
            # connection).
            theirs = connection.engine.url.render_as_string(hide_password=True)
            raise InvalidInputError(
                f"store.using() was given a connection to another database ({theirs}) than "
                f"the store's in-memory one ({self.db.url}); pass a connection of the store's own "
                "engine (store.engine.begin())"
            )
        if watch.identity is None:
            watch.identity = await self._settled(
                connection.run_sync(self.db.dialect.database_identity)
            )
        if watch.identity != await self._own_identity():
            theirs = connection.engine.url.render_as_string(hide_password=True)
            raise InvalidInputError(
                f"store.using() was given a connection to another database ({theirs}) than "
                f"the store's ({self.db.url}); the store's writes would land there. Pass a "
                "connection of the store's own database (store.engine.begin(), say)"
            )

    async def _own_identity(self) -> tuple[Any, ...]:
        if self._identity is None:
            # (The primary's: a read replica is another server, which using() must refuse.)
            self._identity = await self.db.on_primary("read", self.db.dialect.database_identity)
        return self._identity

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[AsyncConnection]:
        """A transaction on the store's engine with this task's calls in it (``store.begin``).

        On SQLite it takes the write lock up front (``BEGIN IMMEDIATE``); in memory it has the
        one connection to itself until it ends.
        """
        self.db.check_loop()
        self.db.check_open()
        if not self.db.ready:
            await self.db.initialize()
        transaction: Transaction | None = None
        if self.db.one_connection:
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
                    self.exclusive = watch.transaction
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
        opening: asyncio.Future[AsyncConnection] = asyncio.ensure_future(self.db.engine.connect())
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            await asyncio.wait({opening}, timeout=SETTLE_SECONDS)
            if opening.done() and not opening.cancelled() and opening.exception() is None:
                await asyncio.shield(opening.result().close())
            raise
        except (SQLAlchemyError, OSError, TimeoutError) as exc:
            raise await self.db.failed(exc) from exc

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
            raise await self.db.failed(exc) from exc

    def _release_exclusive(self, transaction: Transaction) -> Callable[[], None]:
        def release() -> None:
            if self.exclusive is transaction:
                self.exclusive = None

        return release

    @property
    def bound(self) -> bool:
        """Whether the current task runs inside a ``using()`` block of this store."""
        return id(self.db) in _BOUND.get({})
