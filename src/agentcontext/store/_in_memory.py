"""`InMemoryContextStore`: an SQLite in-memory database behind the SQL store."""

from __future__ import annotations

from typing import Any

from agentcontext.store.sql import SqlContextStore

__all__ = ["InMemoryContextStore"]


class InMemoryContextStore(SqlContextStore):
    """An SQLite in-memory store for tests and notebooks; its data dies with it.

    Its one connection is shared by every call (they take turns), and a cancelled call never
    loses it.
    """

    def __init__(self, **options: Any) -> None:
        super().__init__("sqlite+aiosqlite:///:memory:", migrate="auto", **options)
