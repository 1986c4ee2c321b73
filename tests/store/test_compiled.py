"""SQL compiled once per process: a fresh store reuses what an earlier store of the same kind
of database compiled, gets the same answers, and keeps apart from engines that compile
differently or asked for no cache."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine.interfaces import CacheStats
from sqlalchemy.ext.asyncio import create_async_engine

from agentcontext import ContextEngine, SqlContextStore, assistant_text, user
from agentcontext.store._db import compiled as _compiled


class Hits:
    """Whether each compiled statement an engine ran came from the cache."""

    def __init__(self, store: SqlContextStore) -> None:
        self.seen: list[tuple[CacheStats, str]] = []

        @event.listens_for(store.engine.sync_engine, "after_cursor_execute")
        def _after(
            conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: Any
        ) -> None:
            if context.compiled is not None:
                self.seen.append((context.cache_hit, statement))


async def turn(store: SqlContextStore, n: int) -> tuple[list[str], str, list[str]]:
    """A new chat's save, then a fresh engine's load, rewind and load of the rewound chain:
    the texts it sees, the branch it made, the texts after the rewind."""
    chat = f"c{n}"
    engine = ContextEngine(store=store, chat_id=chat, user_id="u")
    engine.set(user(f"question {n}", id=f"q{n}"), assistant_text(f"answer {n}", id=f"a{n}"))
    await engine.save()
    fresh = ContextEngine(store=store, chat_id=chat, user_id="u")
    texts = [m.text for m in (await fresh.resolve()).messages]
    branch = await fresh.rewind(f"q{n}")
    after = [m.text for m in (await fresh.resolve()).messages]
    return texts, branch.name, after


async def test_a_second_store_compiles_nothing_the_first_did(store_url: str) -> None:
    async with SqlContextStore(store_url) as first:
        assert await turn(first, 1) == (["question 1", "answer 1"], "main-v2", ["question 1"])
    async with SqlContextStore(store_url) as second:
        hits = Hits(second)
        assert await turn(second, 2) == (["question 2", "answer 2"], "main-v2", ["question 2"])
        seen = list(hits.seen)
        assert {c.id for c in await second.list_chats()} == {"c1", "c2"}
    assert seen, "the second store ran no compiled statement"
    missed = [statement for hit, statement in seen if hit is not CacheStats.CACHE_HIT]
    assert missed == []


def test_engines_that_compile_differently_keep_apart() -> None:
    def kind(url: str, **kwargs: Any) -> tuple[Any, ...]:
        return _compiled.dialect_kind(create_async_engine(url, **kwargs).sync_engine.dialect)

    sqlite = "sqlite+aiosqlite:///one.db"
    postgres = "postgresql+asyncpg://u@h/db"
    assert kind(sqlite) == kind("sqlite+aiosqlite:///another.db")
    assert kind(postgres) == kind("postgresql+asyncpg://v@elsewhere/other")
    assert kind(sqlite) != kind(postgres)
    assert kind(sqlite) != kind(sqlite, json_serializer=lambda value: json.dumps(value))
    assert kind(postgres) != kind(postgres, label_length=20)

    cache = _compiled.SharedCompiled(size=10)
    a = create_async_engine(sqlite).sync_engine.dialect
    b = create_async_engine(sqlite).sync_engine.dialect
    c = create_async_engine(postgres).sync_engine.dialect
    cache[(a, "statement", (), False, False)] = "compiled by a"
    assert cache.get((b, "statement", (), False, False)) == "compiled by a"
    assert cache.get((c, "statement", (), False, False)) is None
    assert len(cache) == 1


async def test_no_cache_and_a_callers_engine_keep_their_own(store_url: str, backend: str) -> None:
    async with SqlContextStore(store_url, engine_options={"query_cache_size": 0}) as uncached:
        hits = Hits(uncached)
        await turn(uncached, 1)
        assert "compiled_cache" not in uncached.engine.sync_engine.get_execution_options()
    assert hits.seen and {hit for hit, _ in hits.seen} == {CacheStats.CACHING_DISABLED}
    if backend == "pgbouncer":
        return  # a caller's engine through PgBouncer needs its own connect arguments

    engine = create_async_engine(store_url)
    try:
        async with SqlContextStore(engine) as theirs:
            await turn(theirs, 2)
        assert "compiled_cache" not in engine.sync_engine.get_execution_options()
        assert engine.sync_engine._compiled_cache  # their engine's own cache did the work
    finally:
        await engine.dispose()


def test_the_sqlite_append_of_many_rows_is_what_sqlalchemy_compiles_for_them() -> None:
    # The append of n rows repeats the row of the one-row statement SQLAlchemy compiled
    # (compiling n rows through SQLAlchemy took 15 ms for 100 rows, 0.3 s for 2 000): the text
    # must be the one SQLAlchemy gives for n rows, its parameters row after row.
    from sqlalchemy import bindparam, insert, literal_column, select
    from sqlalchemy.dialects import sqlite

    from agentcontext.store._dialects import sqlite as dialect

    written = dialect._WRITTEN
    version = (
        select(written.c.version)
        .where(written.c.id == literal_column("message_appends.id"))
        .scalar_subquery()
    )
    names = dialect._ROW_PARAMETERS
    for count in (1, 2, 3, 17, 100):
        rows = [{name: bindparam(f"{name}_{i}") for name in names} for i in range(count)]
        for returning in (False, True):
            statement = insert(dialect._APPENDS).values(rows)
            if returning:
                statement = statement.returning(version)
            compiled = statement.compile(dialect=sqlite.dialect(paramstyle="qmark"))
            assert dialect._sqlite_append(count, returning) == compiled.string, (count, returning)
            assert compiled.positiontup == [f"{name}_{i}" for i in range(count) for name in names]
