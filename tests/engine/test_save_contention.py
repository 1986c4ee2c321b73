"""A save the database keeps refusing over locks is run again by the store (up to 8 times, as
docs/production.md and docs/stores.md say), then raises `StoreUnavailableError` marked
``contended``, which the save does not run again itself: only a dropped connection (the write
may have committed) is tried again by the save."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event, select, text
from sqlalchemy.ext.asyncio import create_async_engine

from agentcontext import ContextEngine, StoreUnavailableError, user
from agentcontext.store import AppendResult, SqlContextStore
from agentcontext.store._db.database import TRANSIENT_ATTEMPTS
from agentcontext.store._db.schema import chats as C
from tests.conftest import fresh_mariadb_database, require_mariadb


class Refusing:
    """Wraps ``append_turn``: the first calls raise ``error`` without writing anything."""

    def __init__(self, store: SqlContextStore, error: StoreUnavailableError, times: int) -> None:
        self.real = store.append_turn
        self.error = error
        self.times = times
        self.calls = 0

    async def __call__(self, *args: Any, **kwargs: Any) -> AppendResult:
        self.calls += 1
        if self.calls <= self.times:
            raise self.error
        return await self.real(*args, **kwargs)


def contended() -> StoreUnavailableError:
    error = StoreUnavailableError("the server kept refusing over a row lock; nothing written")
    error.contended = True
    return error


async def texts(store: SqlContextStore, chat_id: str) -> list[str]:
    fresh = ContextEngine(store=store, chat_id=chat_id, user_id="u")
    return [m.text for m in await fresh.get_messages()]


async def test_a_contended_refusal_is_not_run_again_by_the_save(
    store: SqlContextStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = ContextEngine(store=store, chat_id="c", user_id="u")
    engine.set(user("first"))
    await engine.save()
    refusing = Refusing(store, contended(), times=100)
    monkeypatch.setattr(store, "append_turn", refusing)
    engine.set(user("blocked"))
    with pytest.raises(StoreUnavailableError) as caught:
        await engine.save()
    assert caught.value.contended
    assert refusing.calls == 1  # the store ran it again already: the save does not
    assert len(engine.pending) == 1  # the turn waits for the next save
    assert await texts(store, "c") == ["first"]
    refusing.times = 0
    await engine.save()  # the documented recovery: save again
    assert engine.pending == []
    assert await texts(store, "c") == ["first", "blocked"]


async def test_a_dropped_connection_is_still_tried_again_by_the_save(
    store: SqlContextStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = ContextEngine(store=store, chat_id="c", user_id="u")
    engine.set(user("first"))
    await engine.save()
    dropped = StoreUnavailableError("cannot reach the database")
    assert not dropped.contended
    refusing = Refusing(store, dropped, times=2)
    monkeypatch.setattr(store, "append_turn", refusing)
    engine.set(user("second"))
    await engine.save()
    assert refusing.calls == 3
    assert await texts(store, "c") == ["first", "second"]


# --- MariaDB: a row lock held by another connection ---------------------------------------------


@pytest.fixture
def url() -> Iterator[str]:
    require_mariadb()
    with fresh_mariadb_database("aclockwait") as made:
        yield made


@pytest.mark.parametrize("compound", [True, False], ids=["compound", "one-by-one"])
async def test_a_save_blocked_by_a_held_row_lock_waits_at_most_8_times(
    url: str, compound: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every lock wait of the store's connections times out at once; another connection holds
    the chat's row in an open transaction. The save is run at most 8 times (each one a lock
    wait that timed out, error 1205), then raises, with nothing written."""
    no_wait = create_async_engine(
        url, connect_args={"init_command": "SET SESSION innodb_lock_wait_timeout = 0"}
    )
    holder = create_async_engine(url)
    try:
        async with SqlContextStore(no_wait) as store:
            if not compound:
                monkeypatch.setattr(store.db.dialect, "compound_append", False)
            engine = ContextEngine(store=store, chat_id="c", user_id="u")
            engine.set(user("first"))
            await engine.save()
            waits: list[Any] = []

            def failed(context: Any) -> None:
                waits.append(context.original_exception.args[0])

            event.listen(store.engine.sync_engine, "handle_error", failed)
            async with holder.begin() as conn:
                await conn.execute(text("SELECT id FROM chats WHERE id = 'c' FOR UPDATE"))
                async with store.engine.connect() as reader:
                    query = select(C.c.version, C.c.updated_at, C.c.message_count)
                    before = (await reader.execute(query)).all()
                engine.set(user("blocked"))
                with pytest.raises(StoreUnavailableError, match="row lock") as caught:
                    await engine.save()
            event.remove(store.engine.sync_engine, "handle_error", failed)
            assert caught.value.contended
            assert set(waits) == {1205}
            assert 0 < len(waits) <= TRANSIENT_ATTEMPTS == 8
            async with store.engine.connect() as reader:
                assert (await reader.execute(query)).all() == before
            assert await texts(store, "c") == ["first"]
            await engine.save()  # the row is free again
            assert await texts(store, "c") == ["first", "blocked"]
    finally:
        await holder.dispose()
        await no_wait.dispose()


async def test_a_save_on_an_sqlite_file_another_process_holds_waits_one_busy_timeout(
    tmp_path: Any,
) -> None:
    """SQLite: a write lock held by another process (here a connection of its own) past the
    busy timeout is the same refusal, marked ``contended``: a save waits one
    ``sqlite_busy_timeout``, not three."""
    import sqlite3

    url = f"sqlite+aiosqlite:///{tmp_path / 'held.db'}"
    async with SqlContextStore(url, sqlite_busy_timeout=0.2) as store:
        engine = ContextEngine(store=store, chat_id="c", user_id="u")
        engine.set(user("first"))
        await engine.save()
        other = sqlite3.connect(tmp_path / "held.db", isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # the other process's write, not ending
            runs = 0

            def count(*_args: Any) -> None:
                nonlocal runs
                runs += 1

            event.listen(store.engine.sync_engine, "handle_error", count)
            engine.set(user("second"))
            with pytest.raises(StoreUnavailableError, match="busy timeout") as caught:
                await engine.save()
            event.remove(store.engine.sync_engine, "handle_error", count)
            assert caught.value.contended
            assert runs >= 1
            assert len(engine.pending) == 1  # nothing lost
        finally:
            other.execute("ROLLBACK")
            other.close()
        await engine.save()
        fresh = ContextEngine(store=store, chat_id="c", user_id="u")
        assert [str(m.text) for m in (await fresh.resolve()).messages] == ["first", "second"]
