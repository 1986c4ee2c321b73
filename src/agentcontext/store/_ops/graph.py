"""The whole-graph view of a chat: every message (as a preview), branch and checkpoint."""

from __future__ import annotations

from sqlalchemy import Connection, select

from agentcontext.store._db.schema import messages as M
from agentcontext.store._dialects import Dialect
from agentcontext.store._ops import branches as _branches
from agentcontext.store._ops import chats as _chats
from agentcontext.store._ops import checkpoints as _checkpoints
from agentcontext.store._rows import decode as _rows
from agentcontext.store._rows import text as _text
from agentcontext.store._rows.codec import data_of
from agentcontext.store.records import Graph, GraphNode

__all__ = ["graph"]


def graph(conn: Connection, dialect: Dialect, chat_id: str) -> Graph:
    """Every message, branch and checkpoint of the chat (read in one transaction)."""
    _chats.require(conn, chat_id)
    rows = [
        (
            id_,
            parent,
            name,
            data_of(dialect, data, chat_id, id_),
            dialect.decode_time(created),
            type_,
        )
        for id_, parent, name, data, created, type_ in conn.execute(
            select(
                M.c.id,
                M.c.parent_id,
                M.c.name,
                dialect.raw_json(M.c.data),
                dialect.raw_time(M.c.created_at),
                M.c.type,
            )
            .where(M.c.chat_id == chat_id)
            .order_by(M.c.seq)
        )
    ]
    for row in rows:
        for value in (row[3], row[4]):
            if isinstance(value, _rows.Damaged):
                raise _rows.corrupt("messages", row[0], chat_id, value.reason, what="message")
    nodes = [
        _rows.build(
            GraphNode,
            {
                "id": row[0],
                "parent_id": row[1],
                "role": row[2],
                "preview": _text.preview(row[3]),
                "created_at": row[4],
                "type": row[5],
            },
        )
        for row in rows
    ]
    return _rows.build(
        Graph,
        {
            "chat_id": chat_id,
            "nodes": nodes,
            "branches": _branches.list_infos(conn, chat_id),
            "checkpoints": _checkpoints.list_all(conn, chat_id),
        },
    )
