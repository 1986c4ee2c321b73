"""Small builders shared by the tests."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import func, select

from agentcontext.store import MessageRecord, SqlContextStore
from agentcontext.store._db.schema import Base
from agentcontext.store._ops.retention import TABLES


def msg_data(text: str, role: str = "user", **extra: Any) -> dict[str, Any]:
    """Message JSON as the engine stores it."""
    return {
        "id": uuid.uuid4().hex,
        "role": role,
        "parts": [{"type": "text", "text": text}],
        **extra,
    }


def rec(
    id: str,
    chat_id: str,
    parent_id: str | None = None,
    text: str | None = None,
    role: str = "user",
    data: Any = None,
) -> MessageRecord:
    """A MessageRecord with message-shaped data (its id and role the record's, as the engine
    writes them)."""
    return MessageRecord(
        id=id,
        chat_id=chat_id,
        parent_id=parent_id,
        name=role,
        data=data if data is not None else msg_data(text if text is not None else id, role, id=id),
    )


def chain(
    chat_id: str, n: int, *, prefix: str = "m", parent: str | None = None
) -> list[MessageRecord]:
    """n messages chained one after another, the first one's parent being ``parent``."""
    out = []
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        out.append(rec(f"{prefix}{i}", chat_id, parent, f"{prefix} message {i}", role))
        parent = f"{prefix}{i}"
    return out


def run_in_threads(
    target: Callable[[int], object], indices: Iterable[int], seconds: float = 120
) -> list[threading.Thread]:
    """Run ``target(index)`` for each index in a daemon thread of its own, all at once, and
    wait for them together at most ``seconds``: the threads still running then (hung)."""
    threads = [threading.Thread(target=target, args=(i,), daemon=True) for i in indices]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + seconds
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    return [thread for thread in threads if thread.is_alive()]


async def table_counts(store: SqlContextStore) -> dict[str, int]:
    """Rows per table a retention report counts, as the database counts them."""
    tables = Base.metadata.tables
    async with store.engine.connect() as conn:
        return {
            name: int(await conn.scalar(select(func.count()).select_from(tables[name])) or 0)
            for name in TABLES
        }
