"""SQLite stores made from a URL run each statement in one call on aiosqlite's thread, and
their cursor answers as SQLAlchemy's own adapter does: rows, descriptions, row counts, last
row ids, many-row statements, errors, streamed results. A statement that finds the database
locked by another connection is tried again in short steps, where SQLite's busy handler would
have waited."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiosqlite
import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from agentcontext import (
    ContextEngine,
    SqlContextStore,
    StoreUnavailableError,
    assistant_text,
    user,
)
from agentcontext.store._db import database
from agentcontext.store._dialects import sqlite_driver


def url(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


class Calls:
    """Calls made on aiosqlite's thread, and statements SQLAlchemy ran, while counting."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, engine: AsyncEngine) -> None:
        self.calls = 0
        self.statements = 0
        self.counting = False
        original = aiosqlite.Connection._execute

        async def counted(connection: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
            if self.counting:
                self.calls += 1
            return await original(connection, fn, *args, **kwargs)

        monkeypatch.setattr(aiosqlite.Connection, "_execute", counted)

        @event.listens_for(engine.sync_engine, "after_cursor_execute")
        def _after(*_: Any) -> None:
            if self.counting:
                self.statements += 1


async def test_a_statement_is_one_call_on_the_drivers_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SqlContextStore(url(tmp_path / "one.db")) as store:
        counter = Calls(monkeypatch, store.engine)
        engine = ContextEngine(store=store, chat_id="c", user_id="u")
        engine.set(user("question", id="q"))
        await engine.save()  # the chat is made here: not counted
        engine.set(assistant_text("answer", id="a"))
        counter.counting = True
        await engine.save()
        fresh = ContextEngine(store=store, chat_id="c", user_id="u")
        texts = [m.text for m in (await fresh.resolve()).messages]
        counter.counting = False
    assert texts == ["question", "answer"]
    assert counter.statements >= 2
    assert counter.calls == counter.statements


async def _answers(engine: AsyncEngine) -> list[Any]:
    """What a cursor gives back for each kind of statement, in order."""
    seen: list[Any] = []
    async with engine.connect() as conn:
        await conn.exec_driver_sql("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT UNIQUE)")
        inserted = await conn.exec_driver_sql("INSERT INTO t (name) VALUES ('a')")
        seen.append(("insert", inserted.rowcount, inserted.lastrowid))
        many = await conn.exec_driver_sql(
            "INSERT INTO t (name) VALUES (?)", [("b",), ("c",), ("d",)]
        )
        seen.append(("many", many.rowcount))
        updated = await conn.execute(
            text("UPDATE t SET name = name || '!' WHERE id > :low"), {"low": 2}
        )
        seen.append(("update", updated.rowcount))
        rows = await conn.execute(text("SELECT id, name FROM t ORDER BY id"))
        seen.append(("select", list(rows.keys()), [tuple(row) for row in rows]))
        empty = await conn.execute(text("SELECT id FROM t WHERE id < 0"))
        seen.append(("empty", list(empty.keys()), empty.all()))
        returned = await conn.execute(text("DELETE FROM t WHERE id = 4 RETURNING name"))
        seen.append(("returning", returned.scalars().all()))
        streamed = await conn.stream(text("SELECT name FROM t ORDER BY id"))
        seen.append(("stream", [row[0] async for row in streamed]))
        with pytest.raises(IntegrityError) as caught:
            await conn.exec_driver_sql("INSERT INTO t (name) VALUES ('a')")
        seen.append(("error", type(caught.value.orig).__name__))
        await conn.rollback()
    return seen


async def test_the_cursor_answers_as_sqlalchemys_own(tmp_path: Path) -> None:
    ours = create_async_engine(url(tmp_path / "ours.db"), module=sqlite_driver.DBAPI)
    theirs = create_async_engine(url(tmp_path / "theirs.db"))
    try:
        mine, reference = await _answers(ours), await _answers(theirs)
    finally:
        await ours.dispose()
        await theirs.dispose()
    assert mine == reference
    assert reference[0] == ("insert", 1, 1)
    assert ("many", 3) in reference


async def test_only_stores_made_from_a_url_use_it(tmp_path: Path) -> None:
    async with SqlContextStore(url(tmp_path / "url.db")) as store:
        assert store.engine.sync_engine.dialect.loaded_dbapi is sqlite_driver.DBAPI
    caller = create_async_engine(url(tmp_path / "caller.db"))
    try:
        async with SqlContextStore(caller) as store:
            assert store.engine.sync_engine.dialect.loaded_dbapi is not sqlite_driver.DBAPI
            engine = ContextEngine(store=store, chat_id="c", user_id="u")
            engine.set(user("hello", id="h"))
            await engine.save()
            fresh = ContextEngine(store=store, chat_id="c", user_id="u")
            assert [m.text for m in (await fresh.resolve()).messages] == ["hello"]
    finally:
        await caller.dispose()


class Holder:
    """Another connection to the file (another process, as far as SQLite can tell) holding
    a lock, and the pauses a store's statement makes while it waits for it: on the pause
    numbered ``release_at`` the holder ends its transaction."""

    def __init__(self, path: Path, monkeypatch: pytest.MonkeyPatch, release_at: int) -> None:
        self.connection = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.pauses: list[float] = []
        self.release_at = release_at

        def pause(seconds: float) -> None:
            self.pauses.append(seconds)
            if len(self.pauses) == self.release_at:
                self.connection.execute("COMMIT")

        monkeypatch.setattr(sqlite_driver, "_pause", pause)

    def close(self) -> None:
        if self.connection.in_transaction:
            self.connection.execute("ROLLBACK")
        self.connection.close()


@pytest.fixture
def holders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    made: list[Holder] = []

    def make(path: Path, release_at: int = 0) -> Holder:
        made.append(Holder(path, monkeypatch, release_at))
        return made[-1]

    yield make
    for holder in made:
        holder.close()


async def _chat(store: SqlContextStore) -> ContextEngine:
    engine = ContextEngine(store=store, chat_id="c", user_id="u")
    engine.set(user("question", id="q"))
    await engine.save()
    return engine


@pytest.mark.parametrize("release_at", [1, 3, 12])
async def test_a_save_waits_for_another_connections_lock_in_short_steps(
    tmp_path: Path, holders: Any, release_at: int
) -> None:
    path = tmp_path / "wait.db"
    async with SqlContextStore(url(path)) as store:
        engine = await _chat(store)
        holder = holders(path, release_at)
        holder.connection.execute("BEGIN IMMEDIATE")
        engine.set(assistant_text("answer", id="a"))
        await engine.save()
        fresh = ContextEngine(store=store, chat_id="c", user_id="u")
        texts = [m.text for m in (await fresh.resolve()).messages]
    assert texts == ["question", "answer"]
    # Refused until the holder let go, then in: SQLite's own handler would have slept
    # 1, 2, 5, 10 ... 100 ms between its tries.
    assert len(holder.pauses) == release_at
    assert holder.pauses[0] == pytest.approx(0.0005)
    assert holder.pauses == sorted(holder.pauses)
    assert max(holder.pauses) <= 0.002


async def test_a_lock_held_past_the_busy_timeout_is_a_clear_error_and_writes_nothing(
    tmp_path: Path, holders: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settled: list[object] = []

    async def settle(**kwargs: object) -> None:
        settled.append(kwargs)

    # A connection that failed to open makes the store wait (up to 2 s) for its driver
    # thread to stop; a locked database stops no thread, so there is nothing to wait for.
    monkeypatch.setattr(database, "settle_driver_threads", settle)
    path = tmp_path / "timeout.db"
    async with SqlContextStore(url(path), sqlite_busy_timeout=0.05) as store:
        engine = await _chat(store)
        holder = holders(path)
        holder.connection.execute("BEGIN IMMEDIATE")
        engine.set(assistant_text("answer", id="a"))
        with pytest.raises(StoreUnavailableError, match="sqlite_busy_timeout"):
            await engine.save()
        assert len(holder.pauses) > 1
        assert settled == []
        holder.connection.execute("COMMIT")
        await engine.save()  # the same call again, now the lock is free
        fresh = ContextEngine(store=store, chat_id="c", user_id="u")
        texts = [m.text for m in (await fresh.resolve()).messages]
    assert texts == ["question", "answer"]


async def test_a_transaction_waits_only_before_it_has_read(tmp_path: Path, holders: Any) -> None:
    """As SQLite's handler does: a transaction that has read would deadlock by waiting for a
    writer (whose commit makes its snapshot stale), so its write is refused at once."""
    path = tmp_path / "deferred.db"
    async with SqlContextStore(url(path)) as store:
        await _chat(store)
        async with store.engine.connect() as conn:
            await conn.exec_driver_sql("CREATE TABLE scratch (n INTEGER)")
            await conn.commit()
        holder = holders(path, release_at=2)
        holder.connection.execute("BEGIN IMMEDIATE")
        async with store.engine.connect() as conn:
            await conn.begin()  # a deferred BEGIN: nothing read yet
            await conn.exec_driver_sql("INSERT INTO scratch VALUES (1)")
            await conn.commit()
        assert len(holder.pauses) == 2
        holder.connection.execute("BEGIN IMMEDIATE")
        async with store.engine.connect() as conn:
            await conn.begin()
            await conn.exec_driver_sql("SELECT count(*) FROM scratch")
            with pytest.raises(OperationalError, match="locked"):
                await conn.exec_driver_sql("INSERT INTO scratch VALUES (2)")
            await conn.rollback()
        assert len(holder.pauses) == 2  # no pause: refused at once
        holder.connection.execute("COMMIT")
        async with store.engine.connect() as conn:
            assert (await conn.exec_driver_sql("SELECT n FROM scratch")).scalars().all() == [1]


async def test_streams_and_commits_wait_too(tmp_path: Path, holders: Any) -> None:
    """In a rollback journal (no WAL) readers wait for a writer, and a COMMIT for readers."""
    path = tmp_path / "journal.db"
    engine = create_async_engine(url(path), module=sqlite_driver.DBAPI)
    try:
        async with engine.connect() as conn:
            await conn.exec_driver_sql("CREATE TABLE t (n INTEGER)")
            await conn.exec_driver_sql("INSERT INTO t VALUES (1), (2)")
            await conn.commit()
        holder = holders(path, release_at=2)
        holder.connection.execute("BEGIN EXCLUSIVE")
        async with engine.connect() as conn:
            streamed = await conn.stream(text("SELECT n FROM t ORDER BY n"))
            assert [row[0] async for row in streamed] == [1, 2]
        assert len(holder.pauses) == 2
        holder.release_at = 3
        holder.connection.execute("BEGIN")
        holder.connection.execute("SELECT count(*) FROM t").fetchall()  # a reader
        async with engine.connect() as conn:
            await conn.exec_driver_sql("INSERT INTO t VALUES (3)")
            await conn.commit()  # waits for the reader to finish
        assert len(holder.pauses) == 3
        async with engine.connect() as conn:
            rows = (await conn.exec_driver_sql("SELECT n FROM t ORDER BY n")).scalars().all()
        assert rows == [1, 2, 3]
    finally:
        await engine.dispose()
