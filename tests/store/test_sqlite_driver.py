"""SQLite stores made from a URL run each statement in one call on aiosqlite's thread, and
their cursor answers as SQLAlchemy's own adapter does: rows, descriptions, row counts, last
row ids, many-row statements, errors, streamed results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiosqlite
import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from agentcontext import ContextEngine, SqlContextStore, assistant_text, user
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
