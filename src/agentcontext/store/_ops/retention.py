"""Retention and erasure: pruning chats by last activity, erasing a user, purging the history
nothing reaches any more. Arguments are checked by the caller.

Retention works in short transactions, so that writers never wait for a whole run: `prune`
and `erase_user` delete whole chats a batch at a time, each batch its own transaction (a
batch holds as many chats as about `Dialect.retention_seconds` of work deletes, measured as it
goes (`BATCH_SECONDS` by default); a chat larger than that is a batch of its own; what taking
its chats out of a search index kept apart from the rows needs is computed before, in a read
transaction: `Dialect.unindex_ahead`), and `purge` deletes a chat's unreachable messages a
batch at a time after one transaction that makes its kept parts whole. A run cut short
(cancelled, or a connection lost) has deleted whole chats or none of one, and running it again
finishes the job; each report counts what its run deleted. Between batches the run yields for a
moment (`Dialect.retention_pause`), so that a writer of a database with one writer at a time
(SQLite, another process included) gets its turn; a full garbage collection of the process
that is due runs there too, rather than inside a batch that holds the locks.

A purge keeps, for every branch head and checkpoint, what resolving it needs: the chain after
the deepest compaction on it, the compaction point itself and its summary, or the whole chain
when no compaction is on it. Everything else of the chat (messages only deleted branches
reached, prefixes every reaching chain is compacted past) is deleted with its search entries.
Each kept part whose parent went becomes a root: its parent link is cleared and the depths
below it count from 1 again, so every stored chain stays whole.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Connection, delete, exists, select, update

from agentcontext import _validate as v
from agentcontext.errors import (
    ChatNotFoundError,
    InvalidInputError,
    InvalidTypeError,
    StoreError,
)
from agentcontext.store._db.database import Database, unit
from agentcontext.store._db.schema import blobs as BL
from agentcontext.store._db.schema import branches as B
from agentcontext.store._db.schema import chats as C
from agentcontext.store._db.schema import checkpoints as K
from agentcontext.store._db.schema import messages as M
from agentcontext.store._db.schema import record_messages as RM
from agentcontext.store._db.schema import resolve_records as RR
from agentcontext.store._db.schema import snapshot_items as SI
from agentcontext.store._db.schema import snapshots as SN
from agentcontext.store._dialects import Dialect
from agentcontext.store._memory import forget_everywhere
from agentcontext.store._ops import branches as _branches
from agentcontext.store._ops import chats as _chats
from agentcontext.store._ops.messages import IN_CHUNK, stored_terms_of
from agentcontext.store.records import ChatInfo, ErasureReport, PruneReport, PurgeReport, utcnow

__all__ = [
    "BATCH_SECONDS",
    "TABLES",
    "Progress",
    "check_cutoff",
    "delete_chats",
    "drop_blobs",
    "erase_user",
    "prune",
    "purge",
]

Progress = Callable[[int, int], object]
"""Called after each batch with what is done and the whole (chats, or messages for a purge)."""

BATCH_SECONDS = 0.04
"""The work one batch of a retention run aims at: the longest a writer waits for it."""
_FIRST_BUDGET = 75
"""Messages the first batch deletes at most (later ones follow the time they take)."""

TABLES = (
    "chats",
    "messages",
    "branches",
    "checkpoints",
    "snapshots",
    "snapshot_items",
    "resolve_records",
    "record_messages",
    "blobs",
)
"""The tables a report counts deleted rows of, in this order."""

_COMPACTION = "compaction"

T = TypeVar("T")


def _chunks(items: Sequence[Any]) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), IN_CHUNK):
        yield items[start : start + IN_CHUNK]


# --- whole chats ----------------------------------------------------------------------------


def drop_blobs(conn: Connection, candidates: set[str]) -> int:
    """Delete those of ``candidates`` nothing refers to any more; how many. Blobs another
    chat's snapshot or record still uses stay."""
    dropped = 0
    for chunk in _chunks(sorted(candidates)):
        unreferenced = select(BL.c.hash).where(
            BL.c.hash.in_(chunk),
            ~exists().where(SI.c.blob_hash == BL.c.hash),
            ~exists().where(RR.c.prompt_hash == BL.c.hash),
            ~exists().where(RM.c.blob_hash == BL.c.hash),
        )
        dropped += int(conn.execute(delete(BL).where(BL.c.hash.in_(unreferenced))).rowcount or 0)
    return dropped


def delete_chats(
    conn: Connection,
    dialect: Dialect,
    chat_ids: Sequence[str],
    ahead: Mapping[int, Any] | None = None,
) -> dict[str, int]:
    """Delete whole chats (their rows locked already) and the blobs only they used; the rows
    deleted per table (``ahead``: see `Dialect.unindex_ahead`)."""
    counts = dict.fromkeys(TABLES, 0)
    candidates: set[str] = set()
    for chunk in _chunks(chat_ids):  # a statement per table for each chunk of chats
        for table, deleted in _chats.delete_rows(conn, dialect, chunk, ahead, candidates).items():
            counts[table] += deleted
    counts["blobs"] = drop_blobs(conn, candidates)
    dialect.tidy_search_index(conn, counts["messages"])
    return counts


def check_cutoff(older_than: object) -> datetime:
    """The moment before which chats are old: ``older_than`` itself (an aware datetime) or
    that long ago (a positive timedelta)."""
    if isinstance(older_than, timedelta):
        if older_than <= timedelta(0):
            raise InvalidInputError(
                f"older_than must be a positive duration such as timedelta(days=90), got "
                f"{older_than!r}"
            )
        try:
            return utcnow() - older_than
        except OverflowError:
            raise InvalidInputError(f"older_than {older_than!r} reaches before year 1") from None
    if not isinstance(older_than, datetime):
        raise InvalidTypeError(
            f"older_than must be a datetime (aware) or a timedelta, got {v.type_name(older_than)}"
        )
    return v.check_timestamp(older_than, "older_than").astimezone(UTC)


def _where(cutoff: datetime | None, user_id: str | None) -> list[Any]:
    where: list[Any] = []
    if cutoff is not None:
        where.append(C.c.updated_at < cutoff)
    if user_id is not None:
        where.append(C.c.user_id == user_id)
    return where


def _candidates(
    conn: Connection, cutoff: datetime | None, user_id: str | None
) -> list[tuple[str, int]]:
    """The chats a run deletes (as they are now), oldest activity first, with their sizes."""
    query = (
        select(C.c.id, C.c.message_count)
        .where(*_where(cutoff, user_id))
        .order_by(C.c.updated_at, C.c.id)
    )
    return [(chat_id, int(count)) for chat_id, count in conn.execute(query)]


def _delete_batch(
    conn: Connection,
    dialect: Dialect,
    ids: Sequence[str],
    cutoff: datetime | None,
    user_id: str | None,
    ahead: Mapping[int, Any],
) -> tuple[list[ChatInfo], dict[str, int]]:
    """Delete those of ``ids`` that still match, whole (write transaction): their rows are
    locked first, so a chat written meanwhile is read again after its writer commits and
    kept when it no longer matches. The chats as they were, and the rows deleted per table."""
    locked = list(
        conn.scalars(
            select(C.c.id)
            .where(C.c.id.in_(list(ids)), *_where(cutoff, user_id))
            .order_by(C.c.updated_at, C.c.id)
            .with_for_update()
        )
    )
    chats: list[ChatInfo] = []
    if locked:
        query = _chats.list_query(
            dialect,
            user_id=user_id,
            metadata=None,
            limit=None,
            offset=0,
            older_than=cutoff,
            ids=locked,
        )
        chats = _chats.list_chats(conn, dialect, query, sealed_ok=True)
    return chats, delete_chats(conn, dialect, [chat.id for chat in chats], ahead)


async def delete_matching(
    db: Database,
    dialect: Dialect,
    cutoff: datetime | None,
    user_id: str | None,
    progress: Progress | None = None,
) -> tuple[list[ChatInfo], dict[str, int]]:
    """Delete the chats with no activity since ``cutoff`` (None: any) of ``user_id`` (None:
    anyone's), whole, a batch at a time (see the module's documentation). The chats deleted
    (newest activity first) and the rows deleted per table."""
    # On the primary: a replica may not have what another process saved a moment ago.
    found = await db.run("read", unit(_candidates, cutoff, user_id), primary=True)
    total = len(found)
    chats: list[ChatInfo] = []
    counts = dict.fromkeys(TABLES, 0)
    budget = _FIRST_BUDGET
    start = 0
    while start < total:
        end, size = start, 0
        while end < total and (end == start or size + found[end][1] <= budget):
            size += found[end][1]
            end += 1
        batch = [chat_id for chat_id, _ in found[start:end]]
        # What taking the chats out of the search index needs is computed before the write
        # lock is taken (on SQLite, every writer of the database waits while it is held).
        ahead: Mapping[int, Any] = {}
        if not dialect.entries_go_with_rows:
            ahead = await db.run("read", unit(dialect.unindex_ahead, batch))
        (deleted, rows), took = await db.run(
            "write",
            _timed(unit(_delete_batch, dialect, batch, cutoff, user_id, ahead)),
            chat=batch,
        )
        forget_everywhere(*(chat.id for chat in deleted))
        chats += deleted
        for table, count in rows.items():
            counts[table] += count
        start = end
        if progress is not None:
            progress(start, total)
        budget = _next_budget(budget, size, took, dialect.retention_seconds)
        if start < total:
            await _between_batches(db, dialect, took)
    chats.sort(key=lambda chat: (chat.updated_at, chat.id), reverse=True)
    return chats, counts


async def _between_batches(db: Database, dialect: Dialect, took: float) -> None:
    """The pause after a batch that took ``took`` seconds (`Dialect.retention_pause`), the
    write-ahead log checkpointed at its start where the dialect says so, and a full garbage
    collection that is due run in it (`collect_if_due`)."""
    collect_if_due()  # (it blocks this process: the whole pause comes after it)
    pause = dialect.retention_pause(took)
    if dialect.checkpoints_after_batches:
        loop = asyncio.get_running_loop()
        began = loop.time()
        await db.run("read", unit(dialect.checkpoint_log))
        pause -= loop.time() - began
    if pause > 0:
        await asyncio.sleep(pause)


def collect_if_due() -> bool:
    """Run the garbage collector's full collection now if the next automatic one would be
    full (whether it ran). The interpreter runs one when its oldest generation's count passes
    its threshold, at whatever allocation comes next: inside a batch it would run while the
    batch holds its locks (on SQLite the database's one write lock, which writers of other
    chats and processes wait for), and a full collection of a large process takes tens or
    hundreds of milliseconds. Run between batches, it costs the same and blocks no one."""
    if not gc.isenabled():
        return False
    threshold = gc.get_threshold()
    count = gc.get_count()
    if len(threshold) < 3 or len(count) < 3 or threshold[2] <= 0 or count[2] < threshold[2]:
        return False
    gc.collect()
    return True


def _timed(work: Callable[[Connection], T]) -> Callable[[Connection], tuple[T, float]]:
    """A unit that also says how long its work took once it ran (seconds): what a batch held
    its locks for. The wait for a connection or for the write lock, behind busy writers of the
    same store, is not the batch's work and does not shrink the next one."""

    def run(conn: Connection) -> tuple[T, float]:
        started = time.perf_counter()
        result = work(conn)
        return result, time.perf_counter() - started

    return run


def _next_budget(budget: int, size: int, took: float, seconds: float = BATCH_SECONDS) -> int:
    """The messages the next batch may delete: as many as ``seconds`` took at the rate
    this batch ran at, at most twice as many as before (or half as many)."""
    if size <= 0 or took <= 0:
        return min(budget * 2, 100_000)
    aimed = int(size * seconds / took)
    return max(50, min(aimed, budget * 2, 100_000))


async def prune(
    db: Database,
    dialect: Dialect,
    cutoff: datetime,
    user_id: str | None,
    progress: Progress | None = None,
) -> PruneReport:
    """Delete the chats (of ``user_id``, or everyone's) with no activity since ``cutoff``."""
    chats, counts = await delete_matching(db, dialect, cutoff, user_id, progress)
    return PruneReport(
        older_than=cutoff,
        user_id=user_id,
        chat_ids=[chat.id for chat in chats],
        chats=chats,
        deleted=counts,
        pruned_at=utcnow(),
    )


async def erase_user(
    db: Database, dialect: Dialect, user_id: str, progress: Progress | None = None
) -> ErasureReport:
    """Delete every chat of ``user_id`` with all its rows, and the blobs only they used; in an
    encrypted store, then destroy the user's data key (every copy of their rows, backups
    included, is unreadable from then on). The key goes last: deleting an SQLite row reads its
    text to take its search terms out. Chats saved while it ran are looked for again, and
    deleted, once the key is gone."""
    with dialect.sealer.erasing(user_id):  # this store seals nothing of theirs meanwhile
        chats, counts = await delete_matching(db, dialect, None, user_id, progress)
        ids = [chat.id for chat in reversed(chats)]  # oldest activity first
        destroyed = int(await dialect.sealer.destroy(user_id))
        # A chat of the user saved while the deletion ran (the end of a reply as the erasure
        # was asked for; another store's) was not in its list, and was sealed under the key
        # just destroyed: no one could read it. Deleted too, with any key made for it
        # meanwhile, until none is found.
        for _ in range(_LATE_PASSES):
            late, more = await delete_matching(db, dialect, None, user_id)
            if not late:
                break
            ids += [chat.id for chat in reversed(late)]
            for table, count in more.items():
                counts[table] += count
            destroyed += int(await dialect.sealer.destroy(user_id))
    return ErasureReport(
        user_id=user_id,
        chat_ids=ids,
        deleted=counts,
        erased_at=utcnow(),
        keys_destroyed=destroyed,
    )


_LATE_PASSES = 3
"""Passes of `erase_user` after the key is destroyed, for chats saved while it ran."""


# --- purging a chat's unreachable history -----------------------------------------------------


def _kept(nodes: dict[str, tuple[str | None, int, str]], targets: Iterable[str]) -> set[str]:
    """The messages resolving each target needs (see the module's documentation)."""
    summaries: dict[str, list[str]] = {}
    for message_id, (parent, _, kind) in nodes.items():
        if kind == _COMPACTION and parent is not None:
            summaries.setdefault(parent, []).append(message_id)
    kept: set[str] = set()
    seen: set[str] = set()  # walked up from already: what lies above is kept
    for target in targets:
        current: str | None = target
        while current is not None and current in nodes and current not in seen:
            seen.add(current)
            kept.add(current)
            folded_here = summaries.get(current)
            if folded_here:
                kept.update(folded_here)  # the compaction point and its summary
                break
            current = nodes[current][0]
    # Summaries of kept points stay too: small, and a head may move back onto them.
    for point, found in summaries.items():
        if point in kept:
            kept.update(found)
    return kept


class _Reached(Exception):
    """Internal: a message about to be purged is reached again (a branch, a checkpoint or a
    new message points at it since the plan was made): the plan is made again."""


def _purge_plan(
    conn: Connection, dialect: Dialect, chat_id: str
) -> tuple[list[str], int, int, datetime | None]:
    """The first transaction of a purge: the messages no branch head, checkpoint or compaction
    tail reaches (deepest first), made unreachable for good: the links of snapshots and resolve
    records to them cleared, each kept part whose parent goes made a root (its depths counted
    from 1 again), the chat's version moved and its purge time set. Also how many messages are
    kept, how many links were cleared, and the purge time."""
    dialect.lock_chat(conn, chat_id)
    purged_at = conn.scalar(select(C.c.purged_at).where(C.c.id == chat_id))
    if not _chats.exists(conn, chat_id):
        raise ChatNotFoundError(f"chat {chat_id!r} does not exist")
    nodes: dict[str, tuple[str | None, int, str]] = {
        row[0]: (row[1], int(row[2]), row[3])
        for row in conn.execute(
            select(M.c.id, M.c.parent_id, M.c.depth, M.c.type).where(M.c.chat_id == chat_id)
        )
    }
    targets = [
        *conn.scalars(
            select(B.c.head_message_id).where(
                B.c.chat_id == chat_id, B.c.head_message_id.is_not(None)
            )
        ),
        *conn.scalars(select(K.c.message_id).where(K.c.chat_id == chat_id)),
    ]
    kept = _kept(nodes, targets)
    gone = sorted((i for i in nodes if i not in kept), key=lambda i: (-nodes[i][1], i))
    detached = 0
    if gone:
        detached = _detach(conn, gone)
        _rebase(conn, nodes, kept)
        purged_at = utcnow()
        conn.execute(
            update(C).where(C.c.id == chat_id).values(version=C.c.version + 1, purged_at=purged_at)
        )
        _branches.sync_head_depths(conn, chat_id)
    return gone, len(kept), detached, purged_at


def _purge_batch(conn: Connection, dialect: Dialect, chat_id: str, batch: list[str]) -> int:
    """Delete a batch of a purge's messages (the deepest left; write transaction), unless one
    of them is reached again (`_Reached`). The links cleared meanwhile."""
    dialect.lock_chat(conn, chat_id)
    present = list(conn.scalars(select(M.c.id).where(M.c.id.in_(batch))))
    if not present:
        return 0
    reached = (
        exists().where(B.c.head_message_id.in_(present))
        | exists().where(K.c.message_id.in_(present))
        | exists().where(M.c.parent_id.in_(present), M.c.id.not_in(present))
    )
    if conn.scalar(select(reached)):
        raise _Reached
    detached = _detach(conn, present)
    _delete_messages(conn, dialect, present)
    dialect.tidy_search_index(conn, len(present))
    conn.execute(
        update(C).where(C.c.id == chat_id).values(message_count=C.c.message_count - len(present))
    )
    return detached


async def purge(
    db: Database, dialect: Dialect, chat_id: str, progress: Progress | None = None
) -> PurgeReport:
    """Delete the messages of the chat no branch head, checkpoint or compaction tail
    reaches: one transaction makes them unreachable for good, then batches delete them,
    deepest first (see the module's documentation)."""
    deleted = 0
    for _attempt in range(3):
        plan = unit(_purge_plan, dialect, chat_id)
        gone, kept, detached, purged_at = await db.run("write", plan, chat=chat_id)
        budget, start = _FIRST_BUDGET, 0
        try:
            while start < len(gone):
                batch = gone[start : start + budget]
                more, took = await db.run(
                    "write", _timed(unit(_purge_batch, dialect, chat_id, batch)), chat=chat_id
                )
                detached += more
                start += len(batch)
                deleted += len(batch)
                if progress is not None:
                    progress(start, len(gone))
                budget = _next_budget(budget, len(batch), took, dialect.retention_seconds)
                if start < len(gone):
                    await _between_batches(db, dialect, took)
        except _Reached:
            continue  # reached again meanwhile: plan again from what is there now
        return PurgeReport(
            chat_id=chat_id,
            deleted_messages=deleted,
            kept_messages=kept,
            detached=detached,
            purged_at=purged_at,
        )
    raise StoreError(
        f"purge of chat {chat_id!r} did not finish: its messages kept being reached again "
        "while it ran (a rewind or checkpoint to them); run it again"
    )


def _detach(conn: Connection, gone: Sequence[str]) -> int:
    """Clear the links of snapshots and resolve records to messages about to be deleted."""
    detached = 0
    for chunk in _chunks(gone):
        for table, column in ((SN, SN.c.message_id), (RR, RR.c.head_message_id)):
            result = conn.execute(update(table).where(column.in_(chunk)).values({column: None}))
            detached += int(result.rowcount or 0)
    return detached


def _rebase(
    conn: Connection, nodes: dict[str, tuple[str | None, int, str]], kept: set[str]
) -> None:
    """Make each kept message whose parent goes a root, and count the depths below it from 1
    again (in memory first, then one update per distinct shift)."""
    shift: dict[str, int] = {}
    roots: list[str] = []
    for message_id in sorted(kept, key=lambda i: nodes[i][1]):
        parent, depth, _ = nodes[message_id]
        if parent is None:
            shift[message_id] = 0
        elif parent not in kept:
            roots.append(message_id)
            shift[message_id] = depth - 1
        else:
            shift[message_id] = shift[parent]
    for chunk in _chunks(roots):
        conn.execute(update(M).where(M.c.id.in_(chunk)).values(parent_id=None))
    by_shift: dict[int, list[str]] = {}
    for message_id, amount in shift.items():
        if amount:
            by_shift.setdefault(amount, []).append(message_id)
    for amount, ids in sorted(by_shift.items()):
        for chunk in _chunks(ids):
            conn.execute(update(M).where(M.c.id.in_(chunk)).values(depth=M.c.depth - amount))


def _delete_messages(conn: Connection, dialect: Dialect, gone: Sequence[str]) -> None:
    """Delete messages (deepest first, so no parent goes before its children) with their
    search entries."""
    for chunk in _chunks(gone):
        if not dialect.entries_go_with_rows:
            seqs = conn.execute(select(M.c.seq).where(M.c.id.in_(chunk))).scalars().all()
            found = stored_terms_of(conn, dialect, [int(seq) for seq in seqs], deleting=True)
            dialect.unindex_rows(conn, found)
        dialect.delete_messages(conn, M.c.id.in_(chunk))
