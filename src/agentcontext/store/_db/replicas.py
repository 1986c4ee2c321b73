"""Read replicas: reads served by streaming standbys without ever reading one's own writes stale.

A store with ``read_replicas=[...]`` keeps, per chat, the primary's WAL position after the
last write it committed to that chat (its *floor*). A read of a chat goes to a replica whose
replayed position is at least that floor; positions only move forward, so a position seen once
stays a safe lower bound and most reads ask no replica anything. A replica behind the floor is
polled until ``replica_wait`` seconds have passed, then the primary serves, and the replica is
passed over at once by the reads it cannot serve for `LAG_SECONDS` (a run of reads waits once,
not each time).

No replica call waits for ever: asking a replica its position, or reading from it, is bounded
by ``replica_wait`` plus `CONNECT_SECONDS` (a read still running then is allowed on only if the
replica answers a position query within the same bound). A replica that does not answer
(a hung host, a paused virtual machine, a path that drops packets), is down, fails a read or is
not a standby is skipped for its back-off (`RETRY_SECONDS`, doubling while it keeps failing, at
most `MAX_RETRY_SECONDS`), with a warning on the ``agentcontext`` logger (at most one per
replica and reason in `WARN_SECONDS`). A call given up on is cancelled in the background (its
connection is closed, not returned) and ``close()`` waits for it.

What a read cannot tie to a chat waits for everything this store wrote. Writes whose position
is unknown (a caller's transaction committed later, a failed or refused write, a position
query that failed) make the next read of their chats ask the primary for its position first.
Writes, compare-and-swap and everything inside ``store.using()`` / ``store.begin()`` run on the
primary (`Database.run` decides; this module only serves reads).

A caller's reads never go back in time: the reads of one engine call (a state, then the
changes since it) must not come from two servers, the second behind the first. So a task's
reads stay on the replica that served its last read (for `PIN_SECONDS` after that read,
whatever chat they name); when the primary served one instead, the primary's position after
it becomes that task's floor, and any replica that has replayed that far may serve again.

A consistency token is a position written as PostgreSQL writes an LSN (``"0/16B3748"``). A
token passed in (``ContextEngine(..., after=token)``) raises the floor of its own chat only,
once the primary has been seen at or past it: a token ahead of the primary's log (forged, or
from another database) is refused with `InvalidInputError` at the first read it would delay,
and raises nothing.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable
from typing import Any, Protocol, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import greenlet_spawn

from agentcontext import _validate as v
from agentcontext.errors import ContextError, InvalidInputError, InvalidTypeError
from agentcontext.store._db.tokens import format_token, parse_token
from agentcontext.store._dialects import Dialect, Mode
from agentcontext.store.records import BranchState, ChatState

__all__ = ["Replica", "Replicas", "format_token", "parse_token"]

T = TypeVar("T")

log = logging.getLogger("agentcontext")


class Database(Protocol):
    """What replicas need of the store's database object (`_database.Database`)."""

    async def on_primary(self, mode: Mode, unit: Callable[[Connection], T]) -> T:
        """``unit`` on the primary."""
        ...

    def sync_read(self, engine: Engine, mode: Mode, unit: Callable[[Connection], T]) -> T:
        """A read unit on ``engine``, in SQLAlchemy's greenlet."""
        ...


RETRY_SECONDS = 5.0
"""How long a replica that failed is left alone before it is tried again (doubled after every
failure in a row, up to `MAX_RETRY_SECONDS`)."""
MAX_RETRY_SECONDS = 60.0
CONNECT_SECONDS = 1.0
"""Beyond ``replica_wait``, how long a replica may take to answer (opening a connection
included) before it counts as not answering."""
QUIET_SECONDS = 1.0
"""A replica not heard from for this long is asked its position before a read goes there (so
one that stopped answering meanwhile costs the read one bounded question, not a read that
hangs)."""
LAG_SECONDS = 1.0
"""How long a replica found behind a read's floor is passed over, without waiting, by reads
it has not replayed yet."""
WARN_SECONDS = 30.0
"""At most one warning per replica and reason in this many seconds."""
MAX_CHATS = 100_000
"""Chats whose floor is remembered one by one; older ones raise the floor of every read."""
MAX_REPLICAS = 64
PIN_SECONDS = 5.0
"""How long after a task's read its next read stays where that one ran."""
_UNKNOWN = 2**64
"""The floor after a read of the primary whose position is unknown: the primary serves."""


class _NoAnswer(Exception):
    """Internal: a replica did not answer within the bound (it was skipped)."""


class Replica:
    """One read replica: its engine and what the store knows of it."""

    __slots__ = (
        "asking",
        "behind_until",
        "checked_at",
        "down_until",
        "engine",
        "failures",
        "heard_at",
        "identified",
        "name",
        "owned",
        "position",
        "reads",
        "sync_engine",
        "warned",
    )

    def __init__(self, engine: AsyncEngine, *, owned: bool) -> None:
        self.engine = engine
        self.sync_engine: Engine = engine.sync_engine
        self.owned = owned
        self.name = engine.url.render_as_string(hide_password=True)
        self.position = 0
        """The highest replayed position seen (a lower bound of the replica's position now)."""
        self.identified = False
        """Whether it was found to replicate the primary's database (`Dialect.replica_identity`)."""
        self.checked_at = float("-inf")
        """When the query that gave `position` started (event loop time)."""
        self.down_until = float("-inf")
        self.failures = 0
        """Failures in a row (its back-off doubles with each)."""
        self.behind_until = float("-inf")
        """Until then, reads it has not replayed go to the primary without waiting for it."""
        self.heard_at = float("-inf")
        """When it last answered (a position query or a read)."""
        self.reads = 0
        """Reads this replica served."""
        self.warned: dict[str, float] = {}
        self.asking: asyncio.Future[None] | None = None
        """The position query out now, which callers that ask meanwhile wait for."""


class Pin:
    """Where a task's last read ran: a replica, or the primary and its position after the read
    (a floor for the task's next reads)."""

    __slots__ = ("expires", "floor", "replica")

    def __init__(self, replica: Replica | None, floor: int, expires: float) -> None:
        self.replica = replica
        self.floor = floor
        self.expires = expires


class Replicas:
    """The read replicas of one store and the floors of the chats it wrote."""

    def __init__(self, replicas: list[Replica], dialect: Dialect, wait: float) -> None:
        self.replicas = replicas
        self.dialect = dialect
        self.wait = wait
        self.retry_seconds = RETRY_SECONDS
        self.lag_seconds = LAG_SECONDS
        self.primary_reads = 0
        """Reads the primary served although replicas were configured."""
        self._floors: OrderedDict[str, int] = OrderedDict()
        self._anon = 0
        """Floor of every read: writes that named no chat, chats forgotten (`MAX_CHATS`)."""
        self._top = 0
        """Everything this store wrote: the floor of a read of no chat."""
        self._pending: set[str] = set()
        self._pending_anon = False
        self._told: OrderedDict[str, int] = OrderedDict()
        """Positions of tokens passed in, by chat, not yet known to be behind the primary."""
        self._primary_seen = 0
        """The highest position the primary's log was seen at (tokens up to it are real)."""
        self._branches: OrderedDict[str, str] = OrderedDict()
        """Branch id → chat id, learned from what the store read (a branch never moves)."""
        self._next = 0
        self._pins: weakref.WeakKeyDictionary[object, Pin] = weakref.WeakKeyDictionary()
        """By task: where the task's last read ran (`Pin`)."""
        self._abandoned: set[asyncio.Future[Any]] = set()
        """Calls given up on (cancelled, settling in the background)."""
        self._primary_identity: tuple[Any, ...] | None = None
        """`Dialect.replica_identity` of the primary, asked before the first replica read."""
        self._identity_asked = False

    # --- what this store wrote ------------------------------------------------------------------

    def wrote(self, chats: Collection[str], position: int | None) -> None:
        """A write to ``chats`` (none: it named no chat) committed; the primary's position after
        its commit, or None when that is unknown (the next read asks the primary)."""
        if position is None:
            self.uncertain(chats)
            return
        self._top = max(self._top, position)
        self._primary_seen = max(self._primary_seen, position)
        if not chats:
            self._anon = max(self._anon, position)
        for chat_id in chats:
            self._raise(chat_id, position)

    def writing(self, chats: Collection[str]) -> Callable[[int | None], None]:
        """Called before the primary is asked for its position after a commit to ``chats``;
        the function returned takes the answer (`wrote`). Marks made before the question are
        settled by its answer as well."""
        marked, anon = set(self._pending), self._pending_anon

        def done(position: int | None) -> None:
            if position is not None:
                self._settle(marked, anon, position)
            self.wrote(chats, position)

        return done

    def _settle(self, marked: set[str], anon: bool, position: int) -> None:
        """Pending marks made before ``position`` was read are floors at ``position``."""
        self._pending.difference_update(marked)
        if anon:
            self._pending_anon = False
            self.wrote((), position)
        if marked:  # (none marked is not "a write that named no chat")
            self.wrote(marked, position)

    def uncertain(self, chats: Collection[str]) -> None:
        """``chats`` (none: anything) may have changed on the primary after the floors known."""
        if chats:
            self._pending.update(chats)
        else:
            self._pending_anon = True

    def told(self, chat_id: str, position: int) -> None:
        """Reads of ``chat_id`` see what was committed at ``position`` (a token passed in).

        Only the chat's own floor rises, and only once the primary is known to have reached
        ``position``: a token beyond what the primary was seen at is checked against it at
        the next read of the chat (`floor`)."""
        if position <= self._primary_seen:
            self._raise(chat_id, position)
            return
        if self._told.get(chat_id, -1) < position:
            self._told[chat_id] = position
        self._told.move_to_end(chat_id)
        while len(self._told) > MAX_CHATS:
            self._told.popitem(last=False)

    def token(self, chat_id: str) -> str | None:
        """The consistency token of the last write this store committed to ``chat_id``."""
        if chat_id in self._pending or self._pending_anon:
            return None
        floor = max(self._floors.get(chat_id, 0), self._anon)
        return self.dialect.format_token(floor) if floor else None

    def learn(self, result: object) -> None:
        """Note which chat a branch belongs to, from a state read."""
        if isinstance(result, (BranchState, ChatState)):
            branch = result.branch
            self._branches[branch.id] = branch.chat_id
            self._branches.move_to_end(branch.id)
            if len(self._branches) > MAX_CHATS:
                self._branches.popitem(last=False)

    def chat_of(self, branch_id: str) -> str | None:
        """The chat of a branch seen before, or None."""
        return self._branches.get(branch_id)

    def _raise(self, chat_id: str, position: int) -> None:
        if self._floors.get(chat_id, -1) < position:
            self._floors[chat_id] = position
        self._floors.move_to_end(chat_id)
        while len(self._floors) > MAX_CHATS:
            _, forgotten = self._floors.popitem(last=False)
            self._anon = max(self._anon, forgotten)

    async def floor(self, db: Database, chats: Collection[str]) -> int:
        """The position a replica must have replayed to serve a read of ``chats`` (none: a read
        that names no chat).

        Raises:
            InvalidInputError: a token passed in for one of ``chats`` is ahead of the
                primary's log (it raises nothing, and is forgotten).
        """
        wanted = self._pending_anon or (
            bool(self._pending) and (not chats or not self._pending.isdisjoint(chats))
        )
        told = [chat_id for chat_id in chats if chat_id in self._told]
        if wanted or told:
            # Marked before this query starts, so its answer covers them.
            marked, anon = set(self._pending), self._pending_anon
            position = await db.on_primary("read", self.dialect.write_position)
            if position is not None:
                self._primary_seen = max(self._primary_seen, position)
                if wanted:
                    self._settle(marked, anon, position)
            self._check_told(told, position)
        if not chats:
            return self._top
        return max([self._anon, *(self._floors.get(chat_id, 0) for chat_id in chats)])

    def _check_told(self, chats: list[str], primary: int | None) -> None:
        """Tokens of ``chats`` at or behind the primary's ``primary`` position become floors;
        one ahead of it is refused."""
        ahead: list[tuple[str, int]] = []
        for chat_id in chats:
            position = self._told.pop(chat_id)
            if primary is None:
                continue  # (a database whose log position is unknown: nothing to wait for)
            position = self.dialect.settle_token(position)
            if position <= primary:
                self._raise(chat_id, position)
            else:
                ahead.append((chat_id, position))
        if ahead and primary is not None:
            chat_id, position = ahead[0]
            token, at = self.dialect.format_token(position), self.dialect.format_token(primary)
            raise InvalidInputError(
                f"the consistency token {token} given for chat {chat_id!r} "
                f"is ahead of the primary database's log (at {at}): it was "
                "not issued by this database. Pass SaveResult.consistency_token exactly as a "
                "save of this database returned it, or no token"
            )

    # --- reads --------------------------------------------------------------------------------

    async def read(
        self,
        db: Database,
        mode: Mode,
        unit: Callable[[Connection], T],
        chats: Collection[str],
        owner: object = None,
    ) -> T:
        """``unit`` on a replica that has replayed this store's writes to ``chats``, or on the
        primary. ``owner`` (the calling task) reads where it last read (see the module's
        docstring)."""
        floor = await self.floor(db, chats)
        if not self._identity_asked:
            # What its replicas must share with it, asked once before any is read from.
            self._primary_identity = await db.on_primary("read", self.dialect.replica_identity)
            self._identity_asked = True
        loop = asyncio.get_running_loop()
        pin = None if owner is None else self._pins.get(owner)
        if pin is not None and pin.expires <= loop.time():
            pin = None
        if pin is not None:
            floor = max(floor, pin.floor)
        replica = None
        if floor < _UNKNOWN:
            replica = await self._choose(floor, only=None if pin is None else pin.replica)
        if replica is not None:
            try:
                result: T = await self._read_on(replica, db, mode, unit)
            except ContextError:
                raise
            except _NoAnswer:
                pass  # skipped already
            except (SQLAlchemyError, OSError, TimeoutError) as exc:
                self._skip(replica, "failed", f"a read failed ({_reason(exc)})")
            else:
                replica.reads += 1
                replica.failures = 0
                replica.heard_at = loop.time()
                self._pin(owner, replica, 0)
                return result
        self.primary_reads += 1
        result = await db.on_primary(mode, unit)
        if owner is not None:
            # Where the primary's log is after the read: what it read is no newer than that.
            try:
                position = await db.on_primary("read", self.dialect.write_position)
            except (SQLAlchemyError, OSError, TimeoutError, ContextError):
                position = None
            if position is not None:
                self._primary_seen = max(self._primary_seen, position)
            self._pin(owner, None, _UNKNOWN if position is None else position)
        return result

    def _pin(self, owner: object, replica: Replica | None, floor: int) -> None:
        if owner is None:
            return
        self._pins[owner] = Pin(replica, floor, asyncio.get_running_loop().time() + PIN_SECONDS)

    @property
    def bound(self) -> float:
        """The longest one call to a replica may take before it counts as not answering."""
        return self.wait + CONNECT_SECONDS

    async def _read_on(
        self, replica: Replica, db: Database, mode: Mode, unit: Callable[[Connection], T]
    ) -> T:
        """``unit`` on ``replica``. A read still running after `bound` goes on only while the
        replica answers a position query within `bound`; else it is given up (`_NoAnswer`)."""
        task: asyncio.Future[T] = asyncio.ensure_future(
            greenlet_spawn(db.sync_read, replica.sync_engine, mode, unit)
        )
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self.bound)
                if done:
                    return task.result()
                # A long read, or a replica that stopped answering: ask it something small.
                await self._refresh(replica, self.bound)
                if replica.down_until > asyncio.get_running_loop().time():
                    raise _NoAnswer
        except BaseException:
            if not task.done():
                self._abandon(task)
            raise

    def _abandon(self, task: asyncio.Future[Any]) -> None:
        """Cancel a call given up on; it settles in the background (``close()`` waits)."""
        task.cancel()
        self._abandoned.add(task)

        def settled(done: asyncio.Future[Any]) -> None:
            self._abandoned.discard(done)
            if not done.cancelled():
                done.exception()  # retrieved: nobody waits for it any more

        task.add_done_callback(settled)

    async def _choose(self, floor: int, *, only: Replica | None = None) -> Replica | None:
        """A live replica that has replayed ``floor`` (``only`` that one, if given), waiting
        up to `wait` for one; None when none has. Replicas found behind a moment ago are not
        waited for."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        live = self._live(start, only)
        for replica in live:
            if replica.position >= floor:
                if start - replica.heard_at > QUIET_SECONDS:
                    # Silent for a while: make sure it still answers before reading there.
                    await self._refresh(replica, self.bound)
                    if replica.down_until > loop.time():
                        continue
                return replica
        live = [replica for replica in live if replica.behind_until <= start]
        deadline = start + self.wait
        delay = 0.002
        while live:
            bound = max(0.0, deadline - loop.time()) + CONNECT_SECONDS
            await asyncio.gather(*(self._refresh(replica, bound) for replica in live))
            now = loop.time()
            live = [r for r in self._live(now, only) if r.behind_until <= start]
            for replica in live:
                if replica.position >= floor:
                    return replica
            if now >= deadline:
                break
            await asyncio.sleep(min(delay, deadline - now))
            delay = min(delay * 2, 0.05)
        now = loop.time()
        wanted = self.dialect.format_token(floor)
        for replica in live:
            replica.behind_until = now + self.lag_seconds
            self._warn(
                replica,
                "lagging",
                f"had not replayed position {wanted} after {self.wait:g} s "
                f"(at {self.dialect.format_token(replica.position)}); reads it has not "
                f"replayed go to the primary without waiting for {self.lag_seconds:g} s",
            )
        return None

    def _live(self, now: float, only: Replica | None = None) -> list[Replica]:
        """The replicas not skipped now (``only`` that one, if given), starting with the
        next in turn."""
        if only is not None:
            return [only] if only.down_until <= now else []
        count = len(self.replicas)
        self._next = (self._next + 1) % count
        turn = self.replicas[self._next :] + self.replicas[: self._next]
        return [replica for replica in turn if replica.down_until <= now]

    async def _refresh(self, replica: Replica, bound: float) -> None:
        """Ask ``replica`` how far it has replayed, waiting at most ``bound`` seconds for the
        answer (callers that ask while a question is out wait for the same one). A replica
        that does not answer in time is skipped, and the question cancelled."""
        if replica.down_until > asyncio.get_running_loop().time():
            return
        question = replica.asking
        if question is None or question.done():
            question = replica.asking = asyncio.ensure_future(self._ask(replica))
        done, _ = await asyncio.wait({question}, timeout=bound)
        if done:
            return  # answered (or skipped by `_ask`, or given up on by another caller)
        if replica.asking is question:
            replica.asking = None
        self._abandon(question)
        self._skip(replica, "silent", f"did not answer within {bound:.3g} s")

    async def _ask(self, replica: Replica) -> None:
        """One position query to ``replica``; what it says (or that it failed) is noted."""
        started = asyncio.get_running_loop().time()
        check = self._primary_identity if not replica.identified else None
        try:
            position, identity = await greenlet_spawn(
                self._position, replica.sync_engine, check is not None
            )
        except ContextError:
            raise
        except (SQLAlchemyError, OSError, TimeoutError) as exc:
            self._skip(replica, "down", f"cannot be reached ({_reason(exc)})")
            return
        if position is None:
            self._skip(replica, "primary", self.dialect.not_a_replica)
            return
        if check is not None:
            if identity != check:
                self._skip(
                    replica,
                    "other",
                    "is not a replica of the primary's database (another database, or a "
                    "server of another cluster); check the URLs of read_replicas",
                )
                return
            replica.identified = True
        replica.position = max(replica.position, position)
        replica.checked_at = started
        replica.heard_at = asyncio.get_running_loop().time()
        replica.failures = 0

    def _position(self, engine: Engine, identify: bool) -> tuple[int | None, Any]:
        """The replica's replayed position and, when ``identify``, its
        `Dialect.replica_identity`."""
        with engine.connect() as conn:
            self.dialect.prepare(conn, "read")
            position = self.dialect.replay_position(conn)
            identity = self.dialect.replica_identity(conn) if identify else None
            return position, identity

    def _skip(self, replica: Replica, kind: str, reason: str) -> None:
        now = asyncio.get_running_loop().time()
        replica.failures += 1
        seconds = min(self.retry_seconds * 2 ** (replica.failures - 1), MAX_RETRY_SECONDS)
        seconds = max(seconds, self.retry_seconds) if self.retry_seconds > 0 else 0.0
        replica.down_until = now + seconds
        self._warn(replica, kind, f"{reason}; skipped for {seconds:g} s")

    def _warn(self, replica: Replica, kind: str, reason: str) -> None:
        now = asyncio.get_running_loop().time()
        if now - replica.warned.get(kind, float("-inf")) < WARN_SECONDS:
            return
        replica.warned[kind] = now
        log.warning(
            "read replica %s %s; the primary serves its reads meanwhile", replica.name, reason
        )

    def stats(self) -> dict[str, Any]:
        """Reads served by each replica (by URL) and by the primary."""
        return {
            "replicas": {replica.name: replica.reads for replica in self.replicas},
            "primary": self.primary_reads,
        }

    async def close(self, *, close: bool = True) -> None:
        """Let the calls given up on settle (a few seconds at most: their connections are
        closed, not waited for), then dispose the engines the store made for its replicas."""
        for replica in self.replicas:
            if replica.asking is not None and not replica.asking.done():
                self._abandon(replica.asking)
            replica.asking = None
        if self._abandoned and close:
            await asyncio.wait(set(self._abandoned), timeout=SETTLE_SECONDS)
        for replica in self.replicas:
            if replica.owned:
                await replica.engine.dispose(close=close)


SETTLE_SECONDS = 5.0
"""Longest ``close()`` waits for replica calls given up on (a connection to a server that
stopped answering is closed within about 2 s)."""


def _reason(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return (text[0] if text else "") or type(exc).__name__


def check_replicas(value: object) -> tuple[Any, ...]:
    """``read_replicas`` as a tuple of URLs (str) and engines, or an error saying what to pass."""
    from sqlalchemy.engine import URL

    if isinstance(value, (str, bytes, URL, AsyncEngine)) or not isinstance(value, Iterable):
        raise InvalidTypeError(
            "read_replicas must be a list of replica URLs or AsyncEngines, got "
            f"{v.type_name(value)}; write read_replicas=[url] for one"
        )
    items = tuple(value)
    if len(items) > MAX_REPLICAS:
        raise InvalidInputError(f"read_replicas has {len(items)} entries; at most {MAX_REPLICAS}")
    for index, item in enumerate(items):
        if not isinstance(item, (str, URL, AsyncEngine)):
            raise InvalidTypeError(
                f"read_replicas[{index}] must be a database URL or an AsyncEngine, got "
                f"{v.type_name(item)}"
            )
    return items
