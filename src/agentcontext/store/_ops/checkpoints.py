"""Checkpoints: named pointers to any message of a chat. Plain functions of a connection."""

from __future__ import annotations

from sqlalchemy import Connection, delete, select

from agentcontext.store._db.schema import checkpoints as K
from agentcontext.store._dialects import Dialect
from agentcontext.store._ops import branches as _branches
from agentcontext.store._ops import chats as _chats
from agentcontext.store._rows import decode as _rows
from agentcontext.store._rows.checks import new_id
from agentcontext.store.records import Checkpoint, utcnow

__all__ = ["CHECKPOINT_COLS", "create", "get", "list_all", "remove"]

CHECKPOINT_COLS = (
    K.c.id,
    K.c.chat_id,
    K.c.name,
    K.c.message_id,
    K.c.created_at,
    K.c.branch_id,
)


def create(
    conn: Connection,
    dialect: Dialect,
    chat_id: str,
    name: str,
    message_id: str,
    branch_id: str | None = None,
) -> Checkpoint:
    """Create a checkpoint, or move the one of that name (write transaction). ``branch_id``:
    the branch it is made on, if known."""
    now = utcnow()
    _chats.touch(conn, dialect, chat_id)
    _branches.check_head(conn, chat_id, message_id)
    row = dialect.upsert_returning(
        conn,
        K,
        {
            "id": new_id(),
            "chat_id": chat_id,
            "name": name,
            "message_id": message_id,
            "created_at": now,
            "branch_id": branch_id,
        },
        [K.c.chat_id, K.c.name],
        {"message_id": "excluded", "created_at": now, "branch_id": "excluded"},
        CHECKPOINT_COLS,
    )
    return _rows.checkpoint(row)


def get(conn: Connection, chat_id: str, name: str) -> Checkpoint | None:
    """The checkpoint of that name, or None."""
    row = conn.execute(
        select(*CHECKPOINT_COLS).where(K.c.chat_id == chat_id, K.c.name == name)
    ).first()
    return None if row is None else _rows.checkpoint(row)


def list_all(conn: Connection, chat_id: str) -> list[Checkpoint]:
    """The chat's checkpoints, newest first."""
    rows = conn.execute(
        select(*CHECKPOINT_COLS)
        .where(K.c.chat_id == chat_id)
        .order_by(K.c.created_at.desc(), K.c.name)
    ).all()
    if not rows:
        _chats.require(conn, chat_id)
    return [_rows.checkpoint(row) for row in rows]


def remove(conn: Connection, chat_id: str, name: str) -> bool:
    """Delete a checkpoint; False if there was none of that name (write transaction)."""
    result = conn.execute(delete(K).where(K.c.chat_id == chat_id, K.c.name == name))
    return bool(result.rowcount)
