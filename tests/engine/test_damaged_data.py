"""Data damaged outside the library: dangling heads and parents, cycles, a missing branch row.

The engine must answer at once with a clear error (never hang, never a raw driver error), and
work again once the damage is repaired. On SQLite and PostgreSQL; the damage is done with the
raw driver and foreign-key checks switched off, as a careless migration script would.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiosqlite
import asyncpg
import pytest
from sqlalchemy.engine import make_url

from agentcontext import (
    ContextEngine,
    InvalidGraphError,
    MessageNotFoundError,
    assistant_text,
    user,
)
from agentcontext.store import SqlContextStore
from tests.conftest import _my_exec as my_exec
from tests.engine._util import ids
from tests.engine.conftest import EngineFactory


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[SqlContextStore]:
    """The damage is done behind the store's back, which a store that remembers decoded
    chains (``cache_bytes``) does not see, as a warm engine does not: these stores read."""
    async with SqlContextStore(store_url, cache_bytes=0) as s:
        yield s


async def damage(store_url: str, *statements: str) -> None:
    """Run SQL with foreign-key checks off, on a connection of its own."""
    url = make_url(store_url)
    if url.get_backend_name() == "sqlite":
        async with aiosqlite.connect(url.database or "") as db:
            await db.execute("PRAGMA foreign_keys = OFF")
            for statement in statements:
                await db.execute(statement)
            await db.commit()
        return
    if url.get_backend_name() == "mysql":
        await my_exec(store_url, "SET FOREIGN_KEY_CHECKS = 0", *statements)
        return
    dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute("SET LOCAL session_replication_role = replica")
            for statement in statements:
                await conn.execute(statement)
    finally:
        await conn.close()


async def seeded(make_engine: EngineFactory) -> ContextEngine:
    engine = make_engine()
    engine.set(
        user("Root", id="msg-1"), assistant_text("Middle", id="msg-2"), user("Leaf", id="msg-3")
    )
    await engine.save()
    return engine


async def test_a_head_pointing_at_a_missing_message(
    store: SqlContextStore, store_url: str, make_engine: EngineFactory
) -> None:
    await seeded(make_engine)
    await damage(store_url, "UPDATE branches SET head_message_id = 'missing' WHERE chat_id = 'c1'")
    engine = make_engine()
    with pytest.raises((MessageNotFoundError, InvalidGraphError), match="missing"):
        await engine.resolve()
    # Repaired (the head moved back by compare-and-swap), it works again.
    main = await store.get_branch("c1", "main")
    assert main is not None
    assert await store.update_branch_head(main.id, "msg-3", "missing")
    assert ids(await engine.get_messages()) == ["msg-1", "msg-2", "msg-3"]


async def test_a_dangling_parent(
    store: SqlContextStore, store_url: str, make_engine: EngineFactory
) -> None:
    await seeded(make_engine)
    await damage(store_url, "DELETE FROM messages WHERE id = 'msg-2'")
    with pytest.raises(InvalidGraphError, match="msg-3") as info:
        await make_engine().resolve()
    assert "outside agentcontext" in str(info.value)


async def test_a_cycle(store: SqlContextStore, store_url: str, make_engine: EngineFactory) -> None:
    await seeded(make_engine)
    await damage(store_url, "UPDATE messages SET parent_id = 'msg-3' WHERE id = 'msg-1'")
    engine = make_engine()
    with pytest.raises(InvalidGraphError):
        await engine.resolve()
    # Moving elsewhere does not walk the chain (it stays O(1)); reading it reports the cycle.
    await engine.rewind("msg-2")
    with pytest.raises(InvalidGraphError):
        await engine.get_messages()


async def test_a_chat_without_an_active_branch(
    store: SqlContextStore, store_url: str, make_engine: EngineFactory
) -> None:
    await seeded(make_engine)
    await damage(store_url, "UPDATE branches SET is_active = false WHERE chat_id = 'c1'")
    engine = make_engine()
    with pytest.raises(InvalidGraphError, match="no active branch") as info:
        await engine.resolve()
    assert "set_active_branch" in str(info.value)
    main = await store.get_branch("c1", "main")
    assert main is not None
    await store.set_active_branch("c1", main.id)
    assert ids(await engine.get_messages()) == ["msg-1", "msg-2", "msg-3"]
    assert engine.branch == "main"


async def test_a_chat_whose_branch_rows_are_gone(
    store: SqlContextStore, store_url: str, make_engine: EngineFactory
) -> None:
    warm = await seeded(make_engine)
    await damage(store_url, "DELETE FROM branches WHERE chat_id = 'c1'")
    with pytest.raises(InvalidGraphError, match="no active branch"):
        await make_engine().resolve()
    # The engine that had the branch open sees it gone.
    with pytest.raises(Exception, match="c1") as info:
        await warm.resolve()
    assert type(info.value).__module__.startswith("agentcontext")
