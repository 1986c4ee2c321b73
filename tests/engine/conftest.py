"""Fixtures for the engine tests: engines on the ``store`` fixture (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from agentcontext import ContextEngine
from agentcontext.store import SqlContextStore

EngineFactory = Callable[..., ContextEngine]


@pytest.fixture
def make_engine(store: SqlContextStore) -> EngineFactory:
    """Build engines on the test store; chat ``c1`` of user ``u1`` unless told otherwise."""

    def make(
        chat_id: str = "c1", user_id: str = "u1", *, on: Any = None, **options: Any
    ) -> ContextEngine:
        return ContextEngine(
            store=on if on is not None else store, chat_id=chat_id, user_id=user_id, **options
        )

    return make


@pytest.fixture
async def other_store(store: SqlContextStore, store_url: str) -> AsyncIterator[SqlContextStore]:
    """A second store on the same database (another process, as far as the engine can tell)."""
    async with SqlContextStore(store_url) as second:
        yield second
