"""What a viewer's page shows, read without loading the whole chat.

- `chain_page`: ``limit`` messages of the chain that ends at a message, read by a recursive
  query that walks ``parent_id`` up from that message at most ``limit`` steps: the cost of a
  page does not depend on the length of the chain. The next (older) page starts at the
  parent of the page's first message: keyset paging, with no offset to count past.
- `graph_outline`: a chat's graph with its long linear runs folded. The messages that shape
  the drawing are *kept* (roots, leaves, forks, parents of compactions, compactions, branch
  heads, checkpoints, the selected message); every other message has exactly one child, so
  they form linear runs between kept messages (`_outline.Runs`). The runs are found from each
  message's id, parent and type (no JSON, no text) once per chat version and kept in the
  store's `OutlineMemory`; a page then reads the chat's version, branches and checkpoints, and
  the full rows of the messages it draws only.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, and_, bindparam, literal, select

from agentcontext.errors import ChatNotFoundError
from agentcontext.store._db.schema import chats as C
from agentcontext.store._db.schema import messages as M
from agentcontext.store._dialects import Dialect
from agentcontext.store._memory import OutlineMemory
from agentcontext.store._ops import branches as _branches
from agentcontext.store._ops import checkpoints as _checkpoints
from agentcontext.store._ops.outline import Runs
from agentcontext.store._rows import decode as _rows
from agentcontext.store._rows import text as _text
from agentcontext.store._rows.codec import checked_data, row_record
from agentcontext.store.records import ChainPage, GraphNode, GraphOutline

__all__ = ["chain_page", "graph_outline"]

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
    records = [row_record(dialect, row) for row in rows]
    depths = [int(row[7]) for row in rows]
    return _rows.build(
        ChainPage,
        {
            "messages": records,
            "depths": depths,
            "older": bool(records) and records[0].parent_id is not None,
        },
    )


_BATCH = 500


def graph_outline(
    conn: Connection,
    dialect: Dialect,
    chat_id: str,
    *,
    fold: int,
    keep: list[str],
    opened: list[str],
    memory: OutlineMemory | None = None,
) -> GraphOutline:
    """The chat's graph with linear runs of ``fold`` or more messages folded, read in one
    transaction: the chat's runs (from ``memory`` when it holds them at the chat's version;
    else from every message's id, parent and type, no JSON, left in ``memory``), then the full
    rows of the messages drawn only."""
    identity = conn.execute(select(C.c.incarnation, C.c.version).where(C.c.id == chat_id)).first()
    if identity is None:
        raise ChatNotFoundError(f"chat {chat_id!r} does not exist")
    key = tuple(identity)
    branches = _branches.list_infos(conn, chat_id)
    checkpoints = _checkpoints.list_all(conn, chat_id)
    marked = {b.head_message_id for b in branches if b.head_message_id is not None}
    marked.update(point.message_id for point in checkpoints)
    marked.update(keep)
    runs = None if memory is None else memory.recall(chat_id, key)
    if runs is None:
        links = select(M.c.id, M.c.parent_id, M.c.type).where(M.c.chat_id == chat_id)
        runs = Runs.build(conn.execute(links).all())
        if memory is not None:
            memory.remember(chat_id, key, runs)
    shown, folds = runs.outline(marked, fold=fold, opened=set(opened))
    columns = select(
        M.c.id,
        M.c.parent_id,
        M.c.name,
        M.c.type,
        dialect.raw_json(M.c.data),
        dialect.raw_time(M.c.created_at),
    )
    decode_time = dialect.decode_time
    nodes: list[GraphNode] = []
    unique = list(dict.fromkeys(shown))
    for start in range(0, len(unique), _BATCH):
        batch = unique[start : start + _BATCH]
        for node_id, parent_id, name, kind, raw, created_at in conn.execute(
            columns.where(M.c.id.in_(batch))
        ):
            data = checked_data(dialect, raw, chat_id, node_id)
            nodes.append(
                _rows.build(
                    GraphNode,
                    {
                        "id": node_id,
                        "parent_id": parent_id,
                        "role": name,
                        "preview": _text.preview(data),
                        "created_at": decode_time(created_at),
                        "type": kind,
                    },
                )
            )
    nodes.sort(key=lambda node: (node.created_at, node.id))
    return _rows.build(
        GraphOutline,
        {
            "chat_id": chat_id,
            "nodes": nodes,
            "folds": folds,
            "branches": branches,
            "checkpoints": checkpoints,
            "message_count": runs.count,
        },
    )
