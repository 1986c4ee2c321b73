"""Pages of a chain for viewers: read only what one page shows, however long the chain.

A page is ``limit`` messages of the chain that ends at a message, read by a recursive query
that walks ``parent_id`` up from that message at most ``limit`` steps: the cost of a page
does not depend on the length of the chain. The next (older) page starts at the parent of
the page's first message: keyset paging, with no offset to count past.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, and_, bindparam, literal, select

from agentcontext.store import _rows
from agentcontext.store._dialects import Dialect
from agentcontext.store._schema import messages as M
from agentcontext.store.records import ChainPage

__all__ = ["chain_page"]

_STATEMENTS: dict[str, Any] = {}


def _statement(dialect: Dialect) -> Any:
    found = _STATEMENTS.get(dialect.name)
    if found is None:
        walk = (
            select(M.c.id, literal(1).label("n"))
            .where(M.c.id == bindparam("end_id"), M.c.chat_id == bindparam("chat_id"))
            .cte("walk", recursive=True)
        )
        parent = M.alias("p")
        walk = walk.union_all(
            select(parent.c.parent_id, walk.c.n + 1)
            .join_from(walk, parent, parent.c.id == walk.c.id)
            .where(walk.c.n < bindparam("limit"), parent.c.parent_id.is_not(None))
        )
        found = (
            select(
                M.c.id,
                M.c.chat_id,
                M.c.parent_id,
                M.c.name,
                M.c.type,
                dialect.raw_json(M.c.data),
                dialect.raw_time(M.c.created_at),
                M.c.depth,
            )
            .join_from(walk, M, and_(M.c.id == walk.c.id, M.c.chat_id == bindparam("chat_id")))
            .order_by(walk.c.n.desc())
        )
        _STATEMENTS[dialect.name] = found
    return found


def chain_page(
    conn: Connection, dialect: Dialect, chat_id: str, end_id: str, limit: int
) -> ChainPage:
    """Up to ``limit`` messages of the chain ending at ``end_id`` (root first), with the
    depth of each, and whether older messages come before them.

    An id that is not a message of the chat gives an empty page.
    """
    rows = conn.execute(
        _statement(dialect), {"end_id": end_id, "chat_id": chat_id, "limit": limit}
    ).all()
    decode_json, decode_time = dialect.decode_json, dialect.decode_time
    records = [
        _rows.message_of(
            row[0], row[1], row[2], row[3], row[4], decode_json(row[5]), decode_time(row[6])
        )
        for row in rows
    ]
    depths = [int(row[7]) for row in rows]
    return _rows.build(
        ChainPage,
        {
            "messages": records,
            "depths": depths,
            "older": bool(records) and records[0].parent_id is not None,
        },
    )
