"""Loading the chain of messages that ends at a head, root first, however long.

Every message stores its ``depth`` (the length of the chain ending at it), so the length of a
chain is known before it is read, and the walk is bounded: a cycle or a broken link in stored
data is detected instead of looped over.

Two plans, chosen per call:

- *range scan*: when the chain holds at least half of the chat's messages (the usual, mostly
  linear conversation), read the chat's messages in the chain's depth range with one indexed
  query and follow the parent links in memory;
- *recursive walk*: otherwise (a short tail of a long chat, a branch among many), a recursive
  query follows ``parent_id`` from the head.

Two shapes: records (``get_message_chain``) and, for the engine, `ChainRows` holding each
message's JSON text undecoded, which the engine validates into messages in one pass.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, and_, bindparam, literal, select, text

from agentcontext import _validate as v
from agentcontext._gc import gc_paused
from agentcontext.errors import ChatNotFoundError, InvalidGraphError
from agentcontext.store._db.schema import chats as C
from agentcontext.store._db.schema import messages as M
from agentcontext.store._dialects import Dialect
from agentcontext.store._rows.codec import json_of, record_of
from agentcontext.store.records import ChainRows, MessageRecord

__all__ = ["active_records", "head_info", "load_records", "load_rows"]

_STATEMENTS: dict[tuple[str, str, str], Any] = {}


def _columns(dialect: Dialect | None, shape: str, m: Any) -> list[Any]:
    """The columns of each shape; the parent link and the depth always come last. Without a
    dialect, the columns as stored (JSON and times not turned into text yet)."""
    data = m.c.data if dialect is None else dialect.raw_json(m.c.data)
    if shape == "rows":
        return [m.c.id, data, m.c.parent_id, m.c.depth]
    created_at = m.c.created_at if dialect is None else dialect.raw_time(m.c.created_at)
    return [m.c.id, m.c.chat_id, m.c.name, m.c.type, data, created_at, m.c.parent_id, m.c.depth]


def _statement(dialect: Dialect, shape: str, plan: str) -> Any:
    """The statement of a shape and plan, built once per dialect."""
    key = (dialect.name, shape, plan)
    found = _STATEMENTS.get(key)
    if found is None:
        if plan == "scan":
            # In depth order (the order of the index it reads): a chat with no other branch
            # in the range gives the chain itself, root first.
            found = (
                select(*_columns(dialect, shape, M))
                .where(
                    M.c.chat_id == bindparam("chat_id"),
                    M.c.depth > bindparam("stop_depth"),
                    M.c.depth <= bindparam("head_depth"),
                )
                .order_by(M.c.depth)
            )
            if dialect.raw_json_misleads_planner:
                # The rows picked in a subquery the planner cannot merge (OFFSET 0), their
                # JSON turned into bytes outside it: PostgreSQL guesses such an expression 32
                # bytes wide, and with that guess read a chat's whole table and sorted it on
                # disk (10 000 messages: 20-26 ms of server time, against 6-9 ms through the
                # index).
                picked = found.with_only_columns(*_columns(None, shape, M)).offset(0)
                inner = picked.subquery("picked")
                found = select(*_columns(dialect, shape, inner)).order_by(inner.c.depth)
        else:
            chain = (
                select(M.c.id, literal(1).label("n"))
                .where(M.c.id == bindparam("head_id"))
                .cte("chain", recursive=True)
            )
            parent = M.alias("p")
            chain = chain.union_all(
                select(parent.c.parent_id, chain.c.n + 1)
                .join_from(chain, parent, parent.c.id == chain.c.id)
                .where(chain.c.n < bindparam("expected"), parent.c.parent_id.is_not(None))
            )
            found = (
                select(*_columns(dialect, shape, M))
                .join_from(
                    chain, M, and_(M.c.id == chain.c.id, M.c.chat_id == bindparam("chat_id"))
                )
                .order_by(chain.c.n)
            )
        _STATEMENTS[key] = found
    return found


_HEAD_INFO = (
    select(M.c.chat_id, M.c.depth, C.c.message_count)
    .join_from(M, C, C.c.id == M.c.chat_id)
    .where(M.c.id == bindparam("head_id"))
)


def head_info(conn: Connection, head_id: str) -> tuple[str, int, int] | None:
    """``(chat_id, depth, chat message count)`` of a message, or None."""
    row = conn.execute(_HEAD_INFO, {"head_id": head_id}).first()
    return None if row is None else (row[0], int(row[1]), int(row[2]))


def _stop_depth(conn: Connection, chat_id: str, head_id: str, head_depth: int, after: str) -> int:
    row = conn.execute(select(M.c.chat_id, M.c.depth).where(M.c.id == after)).first()
    if row is None or row[0] != chat_id or int(row[1]) >= head_depth:
        raise InvalidGraphError(f"message {after!r} is not an ancestor of {head_id!r}")
    return int(row[1])


def _pick(
    conn: Connection,
    dialect: Dialect,
    shape: str,
    chat_id: str,
    head_id: str,
    head_depth: int,
    chat_size: int,
    stop_depth: int,
    after: str | None,
) -> list[Any]:
    """The chain's rows, root first, checked."""
    expected = head_depth - stop_depth
    if expected <= 0:
        return []
    if expected * 2 >= chat_size:
        result = conn.execute(
            _statement(dialect, shape, "scan"),
            {"chat_id": chat_id, "stop_depth": stop_depth, "head_depth": head_depth},
        )
        with gc_paused():  # the driver has the rows already: no await until they are Rows
            rows: list[Any] = list(result.all())
        if not (len(rows) == expected and rows[-1][0] == head_id and _linked(rows)):
            # Other branches share the depth range: follow the parent links from the head.
            by_id = {row[0]: row for row in rows}
            rows = []
            current: str | None = head_id
            while len(rows) < expected and current is not None and current != after:
                row = by_id.get(current)
                if row is None:
                    break
                rows.append(row)
                current = row[-2]
            rows.reverse()
    else:
        result = conn.execute(
            _statement(dialect, shape, "walk"),
            {"head_id": head_id, "expected": expected, "chat_id": chat_id},
        )
        with gc_paused():
            rows = list(result.all())
        rows.reverse()
    # The chain as stored must be whole: the expected length, the depths its head's depth
    # counts down to, and a root (or the message it continues from) as its first parent.
    consistent = (
        len(rows) == expected
        and rows[-1][0] == head_id
        and [row[-1] for row in rows] == list(range(stop_depth + 1, head_depth + 1))
    )
    if consistent and rows[0][-2] != after:
        if after is None:
            consistent = False
        else:
            raise InvalidGraphError(f"message {after!r} is not an ancestor of {head_id!r}")
    if not consistent:
        if conn.execute(select(C.c.id).where(C.c.id == chat_id)).first() is None:
            # Deleted between this read's statements (erase_user, prune, delete_chat of
            # another caller): a chat that is gone, not a chain changed outside the library.
            raise ChatNotFoundError(f"chat {chat_id!r} was deleted while it was being read")
        raise InvalidGraphError(
            f"the stored chain ending at {head_id!r} is inconsistent (a cycle, a broken parent "
            "link, or a message of another chat); the database was changed outside agentcontext"
        )
    return rows


def _linked(rows: list[Any]) -> bool:
    """Whether rows in depth order each have the previous one as parent (compared as lists,
    which runs at C speed on chains of 100 000 messages)."""
    return [row[-2] for row in rows[1:]] == [row[0] for row in rows[:-1]]


def load_records(
    conn: Connection, dialect: Dialect, head_id: str, *, after: str | None = None
) -> list[MessageRecord]:
    """The chain ending at ``head_id`` as records (root first); ``[]`` for an unknown head."""
    info = head_info(conn, head_id)
    if info is None:
        return []
    chat_id, head_depth, chat_size = info
    stop = 0
    if after is not None:
        if after == head_id:
            return []
        stop = _stop_depth(conn, chat_id, head_id, head_depth, after)
    _owner_key(conn, dialect, chat_id)
    picked = _pick(conn, dialect, "records", chat_id, head_id, head_depth, chat_size, stop, after)
    with gc_paused():
        return [
            record_of(dialect, row[0], row[1], row[6], row[2], row[3], row[4], row[5])
            for row in picked
        ]


def check_load(
    chat_id: object,
    head_id: object,
    head_depth: object,
    chat_size: object,
    stop_depth: object,
    stop_at: object,
    compacted: object,
) -> None:
    """The arguments of `ContextStore.load_chain_rows`, checked."""
    v.check_id(chat_id, "chat_id")
    v.check_id(head_id, "head_id")
    v.check_optional_count(head_depth, "head_depth")
    v.check_optional_count(chat_size, "chat_size")
    v.check_count(stop_depth, "stop_depth")
    v.check_optional_id(stop_at, "stop_at")
    v.check_bool(compacted, "compacted")


def load_rows(
    conn: Connection,
    dialect: Dialect,
    chat_id: str,
    head_id: str,
    *,
    head_depth: int | None = None,
    chat_size: int | None = None,
    stop_depth: int = 0,
    stop_at: str | None = None,
    compacted: bool = False,
) -> ChainRows:
    """The engine's shape: ids, parents and JSON texts of the chain (root first), only the
    part deeper than ``stop_depth`` (whose first message's parent is ``stop_at``).

    With ``compacted``, the deepest compaction that folds an ancestor of the head (or the
    head itself) is returned with the rows after it, and the folded messages are not read."""
    if head_depth is None or chat_size is None:
        info = head_info(conn, head_id)
        if info is None or info[0] != chat_id:
            raise InvalidGraphError(f"message {head_id!r} is not a message of chat {chat_id!r}")
        _, head_depth, chat_size = info
    _owner_key(conn, dialect, chat_id)
    if compacted and stop_at is None:
        found = _compacted(conn, dialect, chat_id, head_id, head_depth, chat_size)
        if found is not None:
            return found
    picked = _pick(
        conn, dialect, "rows", chat_id, head_id, head_depth, chat_size, stop_depth, stop_at
    )
    return _chain_rows(dialect, chat_id, picked)


def _owner_key(conn: Connection, dialect: Dialect, chat_id: str) -> None:
    """In an encrypted store, ask for the chat owner's key before a long read (`KeyNeeded`
    runs the unit again: better before the rows are read than after)."""
    if dialect.sealer.encrypted:
        owner = conn.execute(select(C.c.user_id).where(C.c.id == chat_id)).scalar()
        if owner is not None:
            dialect.sealer.note_owner(chat_id, str(owner))
            dialect.sealer.require((str(owner),))


def _chain_rows(dialect: Dialect, chat_id: str, picked: list[Any], **summary: Any) -> ChainRows:
    ids = [row[0] for row in picked]
    return ChainRows(
        ids=ids,
        data=json_of(dialect, chat_id, ids, [row[1] for row in picked]),
        parent_ids=[row[2] for row in picked],
        **summary,
    )


def _compacted(
    conn: Connection, dialect: Dialect, chat_id: str, head_id: str, head_depth: int, size: int
) -> ChainRows | None:
    """The tail after the deepest compaction on the head's chain, or None if none is."""
    candidates = conn.execute(
        _compactions_statement(dialect), {"chat_id": chat_id, "depth": head_depth + 1}
    ).all()
    for summary_id, data, through, depth in candidates:
        through_depth = int(depth) - 1
        summary = {
            "summary_id": summary_id,
            "summary": json_of(dialect, chat_id, [summary_id], [data])[0],
            "base_id": through,
        }
        if through_depth == head_depth:
            if through == head_id:
                return _chain_rows(dialect, chat_id, [], **summary)
            continue
        try:
            picked = _pick(
                conn, dialect, "rows", chat_id, head_id, head_depth, size, through_depth, through
            )
        except InvalidGraphError:
            continue  # a compaction of another branch; the plain load reports real damage
        return _chain_rows(dialect, chat_id, picked, **summary)
    return None


def _compactions_statement(dialect: Dialect) -> Any:
    key = (dialect.name, "rows", "compactions")
    found = _STATEMENTS.get(key)
    if found is None:
        found = _STATEMENTS[key] = (
            select(M.c.id, dialect.raw_json(M.c.data), M.c.parent_id, M.c.depth)
            .where(
                M.c.chat_id == bindparam("chat_id"),
                text("type = 'compaction'"),  # as the partial index says it
                M.c.depth <= bindparam("depth"),
            )
            .order_by(M.c.depth.desc(), M.c.seq.desc())
        )
    return found


def active_records(conn: Connection, dialect: Dialect, chat_id: str) -> list[MessageRecord]:
    """The chain of the chat's active branch as records (snapshot); `ChatNotFoundError` for
    an unknown chat."""
    from agentcontext.store._ops import branches as _branches
    from agentcontext.store._ops import chats as _chats

    branch = _branches.active(conn, chat_id)
    if branch is None:
        _chats.require(conn, chat_id)
        return []
    if branch.head_message_id is None:
        return []
    return load_records(conn, dialect, branch.head_message_id)
