"""Retention and erasure: pruning chats by last activity, erasing a user, purging the history
nothing reaches any more. Plain functions of a connection, each run as one write transaction;
arguments are checked by the caller.

A purge keeps, for every branch head and checkpoint, what resolving it needs: the chain after
the deepest compaction on it, the compaction point itself and its summary, or the whole chain
when no compaction is on it. Everything else of the chat (messages only deleted branches
reached, prefixes every reaching chain is compacted past) is deleted with its search entries.
Each kept part whose parent went becomes a root: its parent link is cleared and the depths
below it count from 1 again, so every stored chain stays whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, delete, exists, select, update

from agentcontext import _validate as v
from agentcontext.errors import ChatNotFoundError, InvalidInputError, InvalidTypeError
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
from agentcontext.store._ops import branches as _branches
from agentcontext.store._ops import chats as _chats
from agentcontext.store._ops.messages import IN_CHUNK, stored_terms_of
from agentcontext.store.records import ErasureReport, PruneReport, PurgeReport, utcnow

__all__ = ["TABLES", "check_cutoff", "delete_chats", "drop_blobs", "erase_user", "prune", "purge"]

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


def _chunks(items: Sequence[Any]) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), IN_CHUNK):
        yield items[start : start + IN_CHUNK]


# --- whole chats ----------------------------------------------------------------------------


def _chat_blobs(conn: Connection, chat_id: str) -> set[str]:
    """The blobs the chat's snapshots and resolve records refer to."""
    found: set[str] = set()
    snapshot_ids = select(SN.c.id).where(SN.c.chat_id == chat_id)
    record_ids = select(RR.c.id).where(RR.c.chat_id == chat_id)
    found.update(conn.scalars(select(SI.c.blob_hash).where(SI.c.snapshot_id.in_(snapshot_ids))))
    found.update(conn.scalars(select(RR.c.prompt_hash).where(RR.c.chat_id == chat_id)))
    found.update(conn.scalars(select(RM.c.blob_hash).where(RM.c.record_id.in_(record_ids))))
    return found


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


def delete_chats(conn: Connection, dialect: Dialect, chat_ids: Sequence[str]) -> dict[str, int]:
    """Delete whole chats (their rows locked already) and the blobs only they used; the rows
    deleted per table."""
    counts = dict.fromkeys(TABLES, 0)
    candidates: set[str] = set()
    for chat_id in chat_ids:
        candidates |= _chat_blobs(conn, chat_id)
        for table, deleted in _chats.delete_rows(conn, dialect, chat_id).items():
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


def _locked_ids(conn: Connection, *where: Any) -> list[str]:
    """The ids of the chats matching ``where``, their rows locked for this transaction (a
    chat written meanwhile is read again after its writer commits, and skipped when it no
    longer matches)."""
    query = select(C.c.id).where(*where).order_by(C.c.updated_at, C.c.id).with_for_update()
    return list(conn.scalars(query))


def prune(conn: Connection, dialect: Dialect, cutoff: datetime, user_id: str | None) -> PruneReport:
    """Delete the chats (of ``user_id``, or everyone's) with no activity since ``cutoff``."""
    where = [C.c.updated_at < cutoff] + ([C.c.user_id == user_id] if user_id is not None else [])
    ids = _locked_ids(conn, *where)
    chats = []
    for chunk in _chunks(ids):
        query = _chats.list_query(
            dialect, user_id=user_id, metadata=None, limit=None, offset=0, older_than=cutoff
        )
        chats += _chats.list_chats(conn, query.where(query.selected_columns.id.in_(chunk)))
    chats.sort(key=lambda chat: (chat.updated_at, chat.id), reverse=True)
    counts = delete_chats(conn, dialect, [chat.id for chat in chats])
    return PruneReport(
        older_than=cutoff,
        user_id=user_id,
        chat_ids=[chat.id for chat in chats],
        chats=chats,
        deleted=counts,
        pruned_at=utcnow(),
    )


def erase_user(conn: Connection, dialect: Dialect, user_id: str) -> ErasureReport:
    """Delete every chat of ``user_id`` with all its rows, and the blobs only they used."""
    ids = _locked_ids(conn, C.c.user_id == user_id)
    counts = delete_chats(conn, dialect, ids)
    return ErasureReport(user_id=user_id, chat_ids=ids, deleted=counts, erased_at=utcnow())


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


def purge(conn: Connection, dialect: Dialect, chat_id: str) -> PurgeReport:
    """Delete the messages of the chat no branch head, checkpoint or compaction tail
    reaches (write transaction)."""
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
    gone = sorted((i for i in nodes if i not in kept), key=lambda i: -nodes[i][1])
    detached = 0
    if gone:
        detached = _detach(conn, gone)
        _rebase(conn, nodes, kept)
        _delete_messages(conn, dialect, gone)
        dialect.tidy_search_index(conn, len(gone))
        purged_at = utcnow()
        conn.execute(
            update(C)
            .where(C.c.id == chat_id)
            .values(
                version=C.c.version + 1,
                message_count=C.c.message_count - len(gone),
                purged_at=purged_at,
            )
        )
        _branches.sync_head_depths(conn, chat_id)
    return PurgeReport(
        chat_id=chat_id,
        deleted_messages=len(gone),
        kept_messages=len(kept),
        detached=detached,
        purged_at=purged_at,
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
        seqs = conn.execute(select(M.c.seq).where(M.c.id.in_(chunk))).scalars().all()
        dialect.unindex_rows(conn, stored_terms_of(conn, dialect, [int(seq) for seq in seqs]))
        conn.execute(delete(M).where(M.c.id.in_(chunk)))
