"""What a viewer's page shows, read without loading the whole chat.

- `chain_page`: ``limit`` messages of the chain that ends at a message, read by a recursive
  query that walks ``parent_id`` up from that message at most ``limit`` steps: the cost of a
  page does not depend on the length of the chain. The next (older) page starts at the
  parent of the page's first message: keyset paging, with no offset to count past.
- `graph_outline`: a chat's graph with its long linear runs folded, summarised in SQL. The
  messages that shape the drawing are *kept* (roots, leaves, forks, parents of compactions,
  compactions, branch heads, checkpoints, the selected message); every other message has
  exactly one child, so they form linear runs between kept messages. The database walks each
  run once and returns, per run, its length, its first and last message (every message of a
  run shorter than ``fold`` or of an opened run): rows and JSON decoding grow with what is
  drawn, not with the chat.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, String, and_, bindparam, literal, select, text

from agentcontext.store import _branches, _chats, _checkpoints, _rows, _text
from agentcontext.store._dialects import Dialect
from agentcontext.store._schema import messages as M
from agentcontext.store.records import ChainPage, Fold, GraphNode, GraphOutline

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


_OUTLINE = text(
    """
WITH RECURSIVE
multi AS (
    SELECT parent_id AS id FROM messages
    WHERE chat_id = :chat_id AND parent_id IS NOT NULL
    GROUP BY parent_id
    HAVING COUNT(*) > 1 OR MAX(CASE WHEN type = 'compaction' THEN 1 ELSE 0 END) = 1
),
kept AS (
    SELECT id FROM multi
    UNION
    SELECT head_message_id FROM branches
    WHERE chat_id = :chat_id AND head_message_id IS NOT NULL
    UNION
    SELECT message_id FROM checkpoints WHERE chat_id = :chat_id
    UNION
    SELECT m.id FROM messages AS m
    WHERE m.chat_id = :chat_id AND (
        m.parent_id IS NULL OR m.type = 'compaction' OR m.id IN :keep
        OR NOT EXISTS (SELECT 1 FROM messages AS c WHERE c.parent_id = m.id)
    )
),
up (start, id, parent_id, n) AS (
    SELECT k.id, p.id, p.parent_id, 1
    FROM kept AS k
    JOIN messages AS m ON m.id = k.id
    JOIN messages AS p ON p.id = m.parent_id
    WHERE m.chat_id = :chat_id AND p.chat_id = :chat_id
      AND p.id NOT IN (SELECT id FROM kept)
    UNION ALL
    SELECT up.start, p.id, p.parent_id, up.n + 1
    FROM up JOIN messages AS p ON p.id = up.parent_id
    WHERE p.chat_id = :chat_id AND p.id NOT IN (SELECT id FROM kept) AND up.n < :max_steps
),
runs AS (
    SELECT start, id, n,
           COUNT(*) OVER (PARTITION BY start) AS total,
           FIRST_VALUE(id) OVER (PARTITION BY start ORDER BY n DESC) AS first_id
    FROM up
),
shown AS (
    SELECT start, id, n, total, first_id FROM runs
    WHERE total < :fold OR n = 1 OR n = total OR first_id IN :opened
    UNION ALL
    SELECT k.id, k.id, 0, 0, NULL FROM kept AS k
)
SELECT s.start, s.n, s.total, s.first_id,
       m.id, m.parent_id, m.name, m.type, CAST(m.data AS TEXT), m.created_at
FROM shown AS s JOIN messages AS m ON m.id = s.id
WHERE m.chat_id = :chat_id
"""
).bindparams(
    bindparam("keep", expanding=True, type_=String()),
    bindparam("opened", expanding=True, type_=String()),
)


def graph_outline(
    conn: Connection,
    dialect: Dialect,
    chat_id: str,
    *,
    fold: int,
    keep: list[str],
    opened: list[str],
) -> GraphOutline:
    """The chat's graph with linear runs of ``fold`` or more messages folded (see the module
    docs); runs whose first message is in ``opened`` come whole, and ``keep`` messages are
    never folded away. Read in one transaction."""
    _chats.require(conn, chat_id)
    count = int(
        conn.execute(
            text("SELECT message_count FROM chats WHERE id = :chat_id"), {"chat_id": chat_id}
        ).scalar_one()
    )
    rows = conn.execute(
        _OUTLINE,
        {
            "chat_id": chat_id,
            "fold": fold,
            "keep": keep,
            "opened": opened,
            "max_steps": count + 1,
        },
    ).all()
    decode_json, decode_time = dialect.decode_json, dialect.decode_time
    nodes: dict[str, GraphNode] = {}
    long_runs: dict[str, dict[str, Any]] = {}
    for start, n, total, first_id, node_id, parent_id, name, kind, data, created_at in rows:
        if node_id not in nodes:
            nodes[node_id] = _rows.build(
                GraphNode,
                {
                    "id": node_id,
                    "parent_id": parent_id,
                    "role": name,
                    "preview": _text.preview(decode_json(data)),
                    "created_at": decode_time(created_at),
                    "type": kind,
                },
            )
        if n and total >= fold and first_id not in opened:
            run = long_runs.setdefault(start, {"count": total, "first": first_id})
            if n == 1:
                run["last"] = node_id
    folds = [
        _rows.build(
            Fold,
            {
                "first_id": run["first"],
                "last_id": run["last"],
                "count": run["count"],
                "child_id": start,
            },
        )
        for start, run in long_runs.items()
    ]
    return _rows.build(
        GraphOutline,
        {
            "chat_id": chat_id,
            "nodes": sorted(nodes.values(), key=lambda node: (node.created_at, node.id)),
            "folds": sorted(folds, key=lambda f: f.first_id),
            "branches": _branches.list_infos(conn, chat_id),
            "checkpoints": _checkpoints.list_all(conn, chat_id),
            "message_count": count,
        },
    )
