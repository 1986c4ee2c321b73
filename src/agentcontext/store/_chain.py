"""Loading the chain of messages that ends at a head, root first, however long.

Every message stores its ``depth`` (the length of the chain ending at it), so the length of a
chain is known before it is read, and the walk is bounded: a cycle or a broken link in stored
data is detected instead of looped over.

Two plans, chosen per call:

- *chat scan*: when the chain holds at least half of the chat's messages (the usual, mostly
  linear conversation), read the chat's messages with one indexed query and follow the parent
  links in memory; JSON is decoded only for the rows on the chain;
- *recursive walk*: otherwise, a recursive CTE follows ``parent_id`` from the head.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import DateTime, Text, cast, func, literal, select, text, type_coerce
from sqlalchemy.ext.asyncio import AsyncConnection

from agentcontext._validate import loads
from agentcontext.errors import InvalidGraphError, MessageNotFoundError
from agentcontext.store import _rows
from agentcontext.store._schema import messages as M
from agentcontext.store.records import MessageRecord

_loads = loads

# The chat scan in plain SQL: one indexed query, no per-column type processing.
_SCAN = {
    "sqlite": text(
        "SELECT id, chat_id, parent_id, name, type, data, created_at, depth "
        "FROM messages WHERE chat_id = :chat_id"
    ),
    "postgresql": text(
        "SELECT id, chat_id, parent_id, name, type, data::text, created_at, depth "
        "FROM messages WHERE chat_id = :chat_id"
    ),
}
_fromisoformat = datetime.fromisoformat


def _data_as_text(column: Any, dialect_name: str) -> Any:
    # The JSON column as its raw text, so only the rows kept are decoded.
    return cast(column, Text)


def _raw_timestamp(column: Any, dialect_name: str) -> Any:
    # The timestamp as the driver returns it (ISO text on SQLite, an aware UTC datetime from
    # asyncpg), skipping the per-row type-decorator call.
    if dialect_name == "postgresql":
        return type_coerce(column, DateTime(timezone=True))
    return cast(column, Text)


async def load_chain(
    conn: AsyncConnection, dialect_name: str, head_id: str, *, after: str | None = None
) -> list[MessageRecord]:
    """The chain ending at ``head_id`` (root first), or only the part after ``after``."""
    same = M.alias("same_chat")
    chat_size_query = (
        select(func.count()).select_from(same).where(same.c.chat_id == M.c.chat_id)
    ).scalar_subquery()
    head_row = (
        await conn.execute(select(M.c.chat_id, M.c.depth, chat_size_query).where(M.c.id == head_id))
    ).first()
    if head_row is None:
        raise MessageNotFoundError(f"message {head_id!r} does not exist")
    chat_id, head_depth, chat_size = head_row
    stop_depth = 0
    if after is not None:
        if after == head_id:
            return []
        anchor = (await conn.execute(select(M.c.chat_id, M.c.depth).where(M.c.id == after))).first()
        if anchor is None:
            raise MessageNotFoundError(f"message {after!r} does not exist")
        if anchor[0] != chat_id or anchor[1] >= head_depth:
            raise InvalidGraphError(f"message {after!r} is not an ancestor of {head_id!r}")
        stop_depth = anchor[1]
    expected = head_depth - stop_depth
    if expected * 2 >= chat_size:
        rows = (await conn.execute(_SCAN[dialect_name], {"chat_id": chat_id})).all()
        by_id = {row[0]: row for row in rows}
        picked: list[Any] = []
        current: str | None = head_id
        while len(picked) < expected and current is not None and current != after:
            row = by_id.get(current)
            if row is None:
                break
            picked.append(row)
            current = row[2]
    else:
        picked = await _walk(conn, dialect_name, head_id, expected)
    _check(picked, head_id, after, expected, head_depth, chat_id)
    picked.reverse()
    make, decode, parse = _rows.message_of, _loads, _fromisoformat
    with _rows.gc_paused():
        return [
            make(
                row[0],
                row[1],
                row[2],
                row[3],
                row[4],
                None if row[5] is None else decode(row[5]),
                parse(row[6]) if row[6].__class__ is str else row[6],
            )
            for row in picked
        ]


async def _walk(conn: AsyncConnection, dialect_name: str, head_id: str, expected: int) -> list[Any]:
    base = (
        select(
            M.c.id,
            M.c.chat_id,
            M.c.parent_id,
            M.c.name,
            M.c.type,
            _data_as_text(M.c.data, dialect_name).label("data"),
            _raw_timestamp(M.c.created_at, dialect_name).label("created_at"),
            M.c.depth,
            literal(1).label("n"),
        )
        .where(M.c.id == head_id)
        .cte("chain", recursive=True)
    )
    parent = M.alias("parent")
    step = select(
        parent.c.id,
        parent.c.chat_id,
        parent.c.parent_id,
        parent.c.name,
        parent.c.type,
        _data_as_text(parent.c.data, dialect_name),
        _raw_timestamp(parent.c.created_at, dialect_name),
        parent.c.depth,
        base.c.n + 1,
    ).where(parent.c.id == base.c.parent_id, base.c.n < expected)
    chain = base.union_all(step)
    rows = list((await conn.execute(select(chain))).all())
    if any(rows[i][8] != i + 1 for i in range(len(rows))):
        rows.sort(key=lambda r: r[8])
    return rows


def _check(
    rows: list[Any],
    head_id: str,
    after: str | None,
    expected: int,
    head_depth: int,
    chat_id: str,
) -> None:
    consistent = len(rows) == expected and all(
        row[1] == chat_id and row[7] == head_depth - i for i, row in enumerate(rows)
    )
    if consistent and rows and rows[-1][2] != after:
        if after is None:
            consistent = False
        else:
            raise InvalidGraphError(f"message {after!r} is not an ancestor of {head_id!r}")
    if not consistent:
        raise InvalidGraphError(
            f"the stored chain ending at {head_id!r} is inconsistent (a cycle, a broken parent "
            "link, or a message of another chat); the database was changed outside agentcontext"
        )
