"""Messages: upserts (with their search entries), reads, ancestry, re-parenting, the change feed.
Plain functions of a connection; arguments are checked by the caller."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    cast,
    exists,
    func,
    literal,
    select,
    update,
)

from agentcontext.errors import InvalidGraphError, InvalidInputError, MessageNotFoundError
from agentcontext.store._db.schema import branches as B
from agentcontext.store._db.schema import chats as C
from agentcontext.store._db.schema import messages as M
from agentcontext.store._dialects import Dialect
from agentcontext.store._ops.chats import touch as touch_chat
from agentcontext.store._rows.codec import (
    message_columns,
    message_rows,
    row_record,
    stored_terms,
    terms_to_unindex,
)
from agentcontext.store._rows.terms import ScopedTerms
from agentcontext.store.records import MessageRecord

__all__ = [
    "COMPACTION",
    "ExistingMessages",
    "changes",
    "fetch_nodes",
    "owners_of",
    "stored_terms_of",
    "get",
    "has_children",
    "is_ancestor",
    "set_parent",
    "summary_refused",
    "write",
]

IN_CHUNK = 2000
"""Ids per ``IN (...)`` lookup (well under every backend's bound-parameter limit)."""


_UPSERTS: dict[str, Any] = {}


class ExistingMessages(Exception):
    """Internal: messages that were to be inserted exist already (rolls the transaction back)."""

    def __init__(self, ids: list[str]) -> None:
        super().__init__(ids)
        self.ids = ids


COMPACTION = "compaction"
"""The stored type of a compaction summary."""


def summary_refused(message_id: str, role: str) -> InvalidInputError:
    """The error for a compaction summary given where only a message of the branch may go:
    ``role`` is what it would have been (``"its head"``, ``"the parent of message 'x'"``)."""
    return InvalidInputError(
        f"message {message_id!r} is a compaction summary, which sits beside a branch and "
        f"cannot be {role}; use the message it folds up to instead"
    )


def fetch_nodes(conn: Connection, ids: Iterable[str]) -> dict[str, Any]:
    """``(id, chat_id, parent_id, depth, created_at, seq, type)`` of the stored messages
    among ``ids``."""
    found: dict[str, Any] = {}
    pending = list(ids)
    for start in range(0, len(pending), IN_CHUNK):
        chunk = pending[start : start + IN_CHUNK]
        rows = conn.execute(
            select(
                M.c.id, M.c.chat_id, M.c.parent_id, M.c.depth, M.c.created_at, M.c.seq, M.c.type
            ).where(M.c.id.in_(chunk))
        )
        for row in rows:
            found[row[0]] = row
    return found


def stored_terms_of(
    conn: Connection, dialect: Dialect, seqs: list[int], *, deleting: bool = False
) -> list[tuple[int, ScopedTerms]]:
    """``(seq, search terms)`` of stored messages, read from their rows and their chats'
    owners (what the search index holds for them, to take it out again). ``deleting``: the
    messages are about to be deleted, and those whose owner's data key was destroyed are left
    out (`terms_to_unindex`) instead of raising `EncryptionError`."""
    terms_of = terms_to_unindex if deleting else stored_terms
    found: list[tuple[int, ScopedTerms]] = []
    for start in range(0, len(seqs), IN_CHUNK):
        rows = conn.execute(
            select(M.c.seq, dialect.raw_json(M.c.data), M.c.chat_id, C.c.user_id, M.c.id)
            .join_from(M, C, C.c.id == M.c.chat_id)
            .where(M.c.seq.in_(seqs[start : start + IN_CHUNK]))
        )
        for seq, raw, chat_id, user_id, message_id in rows:
            terms = terms_of(dialect, raw, chat_id, message_id, user_id)
            if terms is not None:
                found.append((int(seq), terms))
    return found


def owners_of(conn: Connection, chat_ids: Iterable[str]) -> dict[str, str]:
    """The user of each of these chats that exists."""
    wanted = list(set(chat_ids))
    found: dict[str, str] = {}
    for start in range(0, len(wanted), IN_CHUNK):
        rows = conn.execute(
            select(C.c.id, C.c.user_id).where(C.c.id.in_(wanted[start : start + IN_CHUNK]))
        )
        found.update((chat_id, user_id) for chat_id, user_id in rows)
    return found


def write(
    conn: Connection,
    dialect: Dialect,
    records: list[MessageRecord],
    versions: dict[str, int],
    *,
    updates: Collection[str] | None = None,
) -> list[MessageRecord]:
    """Upsert checked records inside the caller's write transaction.

    ``versions`` maps each chat to the change version this transaction writes with. New
    messages get their depth from their parent (stored, or earlier in the batch); existing
    ones keep parent, chat, depth, type and creation time and take the new content. With
    ``updates``, only those ids may exist already; others raise `ExistingMessages`. Search
    entries follow the content. A compaction summary is never a parent (checked here, under
    the chat's lock, against the stored type, which no update changes).
    """
    batch_ids = {r.id for r in records}
    lookup = set(batch_ids)
    lookup.update(r.parent_id for r in records if r.parent_id is not None)
    existing = fetch_nodes(conn, lookup)
    if updates is not None:
        refused = [r.id for r in records if r.id in existing and r.id not in updates]
        if refused:
            raise ExistingMessages(refused)
    depth: dict[str, int] = {}
    chat_of: dict[str, str] = {}
    type_of: dict[str, str] = {}
    rows: list[dict[str, Any]] = []
    stored: list[MessageRecord] = []
    new_terms: dict[str, ScopedTerms] = {}
    old_seqs: list[int] = []
    owners = owners_of(conn, {r.chat_id for r in records})
    for record, prepared in zip(records, message_rows(dialect, records, owners), strict=True):
        old = existing.get(record.id) if record.id in batch_ids else None
        if old is not None:
            if old[1] != record.chat_id:
                raise InvalidGraphError(
                    f"message {record.id!r} belongs to chat {old[1]!r}, not "
                    f"{record.chat_id!r}; message ids are global, pick a new id"
                )
            if old[6] != record.type:
                raise InvalidInputError(
                    f"message {record.id!r} is stored with type {old[6]!r} and cannot be "
                    f"rewritten as type {record.type!r}; write a new message instead"
                )
            parent_id, row_depth, created_at = old[2], old[3], old[4]
            old_seqs.append(int(old[5]))
        else:
            parent_id, created_at = record.parent_id, record.created_at
            row_depth = (
                1
                if parent_id is None
                else _child_depth(record, existing, depth, chat_of, type_of, batch_ids)
            )
        depth[record.id] = row_depth
        chat_of[record.id] = record.chat_id
        type_of[record.id] = record.type
        new_terms[record.id] = prepared.terms
        rows.append(
            {
                "id": record.id,
                "chat_id": record.chat_id,
                "parent_id": parent_id,
                "depth": row_depth,
                "name": record.name,
                "type": record.type,
                "data_json": prepared.data,
                "created_at": created_at,
                "version": versions[record.chat_id],
            }
        )
        stored.append(
            record
            if old is None
            else record.model_copy(update={"parent_id": parent_id, "created_at": created_at})
        )
    old_entries = stored_terms_of(conn, dialect, old_seqs) if old_seqs else []
    for row in rows:
        row.update(dialect.search_row_values(new_terms[row["id"]]))
    written = dialect.upsert_messages(conn, rows)
    if len(written) != len(rows):
        # A concurrent writer created one of these ids in another chat after our check.
        raise InvalidGraphError(
            "a message id of this batch was just created in another chat; "
            "message ids are global, pick new ids"
        )
    dialect.unindex_rows(conn, old_entries)
    dialect.index_rows(conn, [(int(seq), new_terms[message_id]) for message_id, seq in written])
    added: dict[str, int] = {}
    for record in records:
        if record.id not in existing:
            added[record.chat_id] = added.get(record.chat_id, 0) + 1
    for chat_id, count in added.items():
        conn.execute(
            update(C).where(C.c.id == chat_id).values(message_count=C.c.message_count + count)
        )
    return stored


def _child_depth(
    record: MessageRecord,
    existing: dict[str, Any],
    depth: dict[str, int],
    chat_of: dict[str, str],
    type_of: dict[str, str],
    batch_ids: set[str],
) -> int:
    parent_id = record.parent_id
    assert parent_id is not None
    if parent_id in depth:
        parent_chat, parent_depth = chat_of[parent_id], depth[parent_id]
        parent_type = type_of[parent_id]
    elif parent_id in existing:
        parent_chat, parent_depth = existing[parent_id][1], existing[parent_id][3]
        parent_type = existing[parent_id][6]
    elif parent_id in batch_ids:
        raise InvalidInputError(
            f"message {record.id!r} comes before its parent {parent_id!r} in the batch; "
            "put parents first"
        )
    else:
        raise MessageNotFoundError(f"parent message {parent_id!r} of {record.id!r} does not exist")
    if parent_chat != record.chat_id:
        raise InvalidGraphError(
            f"parent {parent_id!r} of message {record.id!r} is in chat {parent_chat!r}, "
            f"not {record.chat_id!r}"
        )
    if parent_type == COMPACTION:
        raise summary_refused(parent_id, f"the parent of message {record.id!r}")
    return int(parent_depth) + 1


def get(conn: Connection, dialect: Dialect, message_id: str) -> MessageRecord | None:
    """The message, or None."""
    row = conn.execute(select(*message_columns(dialect, M)).where(M.c.id == message_id)).first()
    return None if row is None else row_record(dialect, row)


def changes(
    conn: Connection, dialect: Dialect, chat_id: str, since_version: int
) -> list[MessageRecord]:
    """Messages of the chat written (inserted or updated) after ``since_version``, in
    insertion order."""
    rows = conn.execute(
        select(*message_columns(dialect, M))
        .where(M.c.chat_id == chat_id, M.c.version > cast(since_version, BigInteger))
        .order_by(M.c.seq)
    )
    return [row_record(dialect, row) for row in rows]


def has_children(conn: Connection, message_id: str) -> bool:
    """Whether any message has this one as its parent."""
    return bool(conn.scalar(select(exists().where(M.c.parent_id == message_id))))


def is_ancestor(conn: Connection, ancestor_id: str, message_id: str) -> bool:
    """Whether ``ancestor_id`` is on the chain ending at ``message_id`` (itself included)."""
    if ancestor_id == message_id:
        return conn.scalar(select(literal(1)).where(M.c.id == message_id)) is not None
    nodes = fetch_nodes(conn, {ancestor_id, message_id})
    if ancestor_id not in nodes or message_id not in nodes:
        return False
    anc, msg = nodes[ancestor_id], nodes[message_id]
    if anc[1] != msg[1] or anc[3] >= msg[3]:
        return False
    # Walk up from message_id; depth strictly decreases, so corrupt cycles still end.
    base = (
        select(M.c.id, M.c.parent_id, M.c.depth)
        .where(M.c.id == message_id)
        .cte("up", recursive=True)
    )
    parent = M.alias("parent")
    step = select(parent.c.id, parent.c.parent_id, parent.c.depth).where(
        parent.c.id == base.c.parent_id,
        parent.c.depth < base.c.depth,
        parent.c.depth >= anc[3],
    )
    up = base.union_all(step)
    found = conn.scalar(select(literal(1)).select_from(up).where(up.c.id == ancestor_id))
    return found is not None


def set_parent(conn: Connection, message_id: str, parent_id: str | None, touch: Any) -> None:
    """Re-parent a message and its subtree (write transaction). ``touch(chat_id)`` records the
    change and returns the chat's new version."""
    nodes = fetch_nodes(conn, {message_id} | ({parent_id} if parent_id else set()))
    node = nodes.get(message_id)
    if node is None:
        raise MessageNotFoundError(f"message {message_id!r} does not exist")
    chat_id, old_depth = node[1], node[3]
    version = touch(chat_id)
    if parent_id is None:
        new_depth = 1
    else:
        parent = nodes.get(parent_id)
        if parent is None:
            raise MessageNotFoundError(f"parent message {parent_id!r} does not exist")
        if parent[1] != chat_id:
            raise InvalidGraphError(
                f"parent {parent_id!r} is in chat {parent[1]!r}, but message "
                f"{message_id!r} is in chat {chat_id!r}"
            )
        if parent[6] == COMPACTION:
            raise summary_refused(parent_id, f"the parent of message {message_id!r}")
        if is_ancestor(conn, message_id, parent_id):
            raise InvalidGraphError(
                f"{parent_id!r} descends from {message_id!r}; making it the parent "
                "would create a cycle"
            )
        new_depth = parent[3] + 1
    base = select(M.c.id).where(M.c.id == message_id).cte("subtree", recursive=True)
    child = M.alias("child")
    subtree = base.union_all(
        select(child.c.id).where(child.c.chat_id == chat_id, child.c.parent_id == base.c.id)
    )
    # (Read first: not every database updates a table through a query of itself.)
    moved = conn.execute(select(subtree.c.id)).scalars().all()
    conn.execute(update(M).where(M.c.id == message_id).values(parent_id=parent_id))
    # The whole subtree's chains changed: new depths, and a new version so that engines
    # holding any of it in memory notice.
    for start in range(0, len(moved), IN_CHUNK):
        conn.execute(
            update(M)
            .where(M.c.id.in_(moved[start : start + IN_CHUNK]))
            .values(depth=M.c.depth + (new_depth - old_depth), version=version)
        )
    # Heads inside the subtree moved with it.
    head_depth = select(M.c.depth).where(M.c.id == B.c.head_message_id).scalar_subquery()
    conn.execute(
        update(B).where(B.c.chat_id == chat_id).values(head_depth=func.coalesce(head_depth, 0))
    )


def add(conn: Connection, dialect: Dialect, records: list[MessageRecord]) -> list[MessageRecord]:
    """`write` checked records of any chats as one change of each (write transaction)."""
    versions = {
        chat_id: touch_chat(conn, dialect, chat_id)
        for chat_id in dict.fromkeys(r.chat_id for r in records)
    }
    return write(conn, dialect, records, versions)


def reparent(conn: Connection, dialect: Dialect, message_id: str, parent_id: str | None) -> None:
    """`set_parent`, recorded as a change of the chat (write transaction)."""
    set_parent(conn, message_id, parent_id, lambda chat_id: touch_chat(conn, dialect, chat_id))
