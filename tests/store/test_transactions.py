"""``store.using()`` is exactly as safe as ``store.begin()``, with any connection of the store's
database, on SQLite, PostgreSQL, PgBouncer and the in-memory store.

- A caller's rollback leaves nothing of what the store wrote in the block (messages, branches,
  heads, search entries, reminder latches, compactions, checkpoints), also on SQLite with an
  engine of the caller's own (no BEGIN of its own before the store's SAVEPOINT).
- An engine that worked in a rolled-back block sees the database as it is afterwards.
- A writer of the same chat outside the block waits for the caller's commit or rollback and
  grafts; it never deadlocks with it, and gives up with `ChatBusyError` after ``lock_timeout``.
- Tasks started inside the block run their calls one at a time on the bound connection (every
  turn lands), and a task still running after the block refuses to write.
- A connection to another database, or one in AUTOCOMMIT, is refused before anything runs.
"""

from __future__ import annotations

import asyncio
import contextvars
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, select
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from agentcontext import (
    ChatBusyError,
    ContextEngine,
    InMemoryContextStore,
    InvalidInputError,
    Message,
    SqlContextStore,
    StoreError,
    assistant_text,
    reminder,
    user,
)
from agentcontext.store._db.options import StoreOptions
from agentcontext.store._dialects import PostgresDialect
from tests.conftest import fresh_database, require_backend

BACKENDS = ["sqlite", "postgres", "pgbouncer", "mariadb", "memory"]

APP = MetaData()
orders = Table(
    "tx_orders", APP, Column("id", Integer, primary_key=True), Column("note", String(255))
)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    require_backend(name)
    return name


@pytest.fixture
def store_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "memory":
        return "memory"
    url: str = request.getfixturevalue("store_url_of_backend")
    return url


@pytest.fixture
def store_url_of_backend(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    from tests.conftest import session_url, through_pgbouncer

    if backend == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'store.db'}"
    url = session_url("postgres" if backend == "pgbouncer" else backend, request)
    if backend == "pgbouncer":
        return through_pgbouncer(url, request.getfixturevalue("pgbouncer_port"))
    return url


def app_engine_for(store: SqlContextStore, url: str) -> AsyncEngine | None:
    """An engine of the application's own on the store's database (None: use the store's)."""
    if url == "memory":
        return None  # an in-memory database is reachable only through the store's engine
    parsed = make_url(url)
    if parsed.query.get("pgbouncer"):
        options = StoreOptions(pgbouncer=True)
        return PostgresDialect.from_url(parsed, options).make_engine(parsed, options, {})
    return create_async_engine(url)


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[SqlContextStore]:
    made = InMemoryContextStore() if store_url == "memory" else SqlContextStore(store_url)
    async with made as s:
        async with s.engine.begin() as conn:
            await conn.run_sync(APP.create_all)
        yield s
        async with s.engine.begin() as conn:
            await conn.run_sync(APP.drop_all)


@pytest.fixture
async def app_engine(store: SqlContextStore, store_url: str) -> AsyncIterator[AsyncEngine]:
    """The application's own engine (the store's, in memory)."""
    made = app_engine_for(store, store_url)
    yield store.engine if made is None else made
    if made is not None:
        await made.dispose()


async def summarize(messages: list[Message]) -> str:
    return f"summary of {len(messages)} messages"


def text_of(message: Message) -> str:
    part = message.parts[0] if message.parts else None
    return getattr(part, "text", "")


async def picture(store: SqlContextStore, chat_id: str) -> dict[str, Any]:
    """Everything of a chat the store shows (None for a chat that does not exist)."""
    chat = await store.get_chat(chat_id)
    if chat is None:
        return {"chat": None}
    graph = await store.get_graph(chat_id)
    return {
        "metadata": chat.metadata,
        "nodes": sorted((n.id, n.parent_id, n.role) for n in graph.nodes),
        "branches": sorted((b.name, b.head_message_id, b.is_active) for b in graph.branches),
        "checkpoints": sorted((c.name, c.message_id) for c in graph.checkpoints),
        "search": sorted(r.message.id for r in await store.search_messages(chat_id, "secret")),
    }


async def orders_of(store: SqlContextStore) -> list[str]:
    async with store.engine.connect() as conn:
        return list(await conn.scalars(select(orders.c.note).order_by(orders.c.id)))


# --- a rollback leaves nothing --------------------------------------------------------------


async def test_a_rollback_with_the_apps_own_engine_leaves_nothing_of_the_turn(
    store: SqlContextStore, app_engine: AsyncEngine
) -> None:
    before_turn = ContextEngine(store=store, chat_id="c", user_id="u")
    before_turn.set(user("hello", id="q0"), assistant_text("hi", id="a0"))
    await before_turn.save()
    before = await picture(store, "c")

    context = ContextEngine(store=store, chat_id="c", user_id="u")
    context.set(reminder("remember the secret", once="latch"))

    async def work_then_fail() -> None:
        async with app_engine.begin() as conn, store.using(conn):
            await conn.execute(orders.insert().values(id=1, note="paid"))
            context.set(user("the secret word is", id="q1"), assistant_text("secret kept"))
            await context.save()
            await context.checkpoint("cp")
            await context.compact(summarize, keep_last_turns=0)
            await context.rewind("q0")
            context.set(user("a secret on the new branch"))
            await context.save()
            assert len(await store.search_messages("c", "secret")) >= 2  # seen inside
            raise RuntimeError("the app failed")

    with pytest.raises(RuntimeError, match="the app failed"):
        await work_then_fail()

    assert await orders_of(store) == []
    assert await picture(store, "c") == before
    # The engine that worked inside sees the database as it is now, and goes on.
    resolved = await context.resolve()
    assert [m.id for m in resolved.messages] == ["q0", "a0"]
    assert context.branch == "main"
    context.set(user("again", id="q2"))
    saved = await context.save()
    assert saved.head_message_id == "q2"
    assert [m.id for m in await context.get_messages()] == ["q0", "a0", "q2"]


async def test_a_commit_with_the_apps_own_engine_keeps_the_turn_and_the_apps_rows(
    store: SqlContextStore, app_engine: AsyncEngine
) -> None:
    context = ContextEngine(store=store, chat_id="c", user_id="u")
    async with app_engine.begin() as conn, store.using(conn):
        await conn.execute(orders.insert().values(id=1, note="paid"))
        context.set(user("the secret is kept", id="q1"), assistant_text("ok", id="a1"))
        await context.save()
    assert await orders_of(store) == ["paid"]
    assert [
        m.id for m in await ContextEngine(store=store, chat_id="c", user_id="u").get_messages()
    ] == [
        "q1",
        "a1",
    ]
    assert [r.message.id for r in await store.search_messages("c", "secret")] == ["q1"]


async def test_a_chat_created_inside_a_rolled_back_block_does_not_exist_after(
    store: SqlContextStore, app_engine: AsyncEngine
) -> None:
    context = ContextEngine(store=store, chat_id="new", user_id="u", metadata={"k": 1})
    async with app_engine.connect() as conn:
        await conn.begin()
        async with store.using(conn):
            context.set(user("secret"))
            await context.save()
        await conn.rollback()
    assert await store.get_chat("new") is None
    # The engine creates it again, with its metadata, on its next call.
    await context.resolve()
    chat = await store.get_chat("new")
    assert chat is not None and chat.metadata == {"k": 1}


# --- writers inside and outside never deadlock -----------------------------------------------


async def _outside(factory: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``factory()`` in a task of its own, outside any using() block."""
    return await asyncio.create_task(factory(), context=contextvars.Context())  # type: ignore[arg-type]


async def test_a_writer_outside_waits_for_the_callers_commit_and_grafts(
    store: SqlContextStore,
) -> None:
    inside = ContextEngine(store=store, chat_id="c", user_id="u")
    outside = ContextEngine(store=store, chat_id="c", user_id="u")
    await outside.resolve()
    started = asyncio.Event()

    async def save_outside() -> str | None:
        outside.set(user("from outside", id="out"))
        started.set()
        return (await outside.save()).head_message_id

    async with asyncio.timeout(60):
        async with store.begin():
            inside.set(user("first inside", id="in1"))
            await inside.save()
            writer = asyncio.create_task(save_outside(), context=contextvars.Context())
            await started.wait()
            await asyncio.sleep(0.2)  # the outside writer is waiting for this transaction
            assert not writer.done()
            inside.set(user("second inside", id="in2"))
            await inside.save()
        assert await writer == "out"
    ids = [m.id for m in await ContextEngine(store=store, chat_id="c", user_id="u").get_messages()]
    assert ids == ["in1", "in2", "out"]


async def test_the_same_store_gives_up_after_its_lock_timeout(store: SqlContextStore) -> None:
    store.db.lock_timeout = 0.3
    inside = ContextEngine(store=store, chat_id="c", user_id="u")
    outside = ContextEngine(store=store, chat_id="c", user_id="u")
    await outside.resolve()
    async with asyncio.timeout(60):
        async with store.begin():
            inside.set(user("inside", id="in1"))
            await inside.save()
            outside.set(user("outside", id="out"))
            with pytest.raises(ChatBusyError, match="did not commit or roll back"):
                await _outside(outside.save)
            with pytest.raises(ChatBusyError):
                await _outside(lambda: store.update_chat("c", lambda chat: None))
        assert [f.name for f in outside.pending] == ["user"]  # still queued
        await outside.save()  # after the commit: grafted onto the new head
    ids = [m.id for m in await outside.get_messages()]
    assert ids == ["in1", "out"]


# --- tasks started inside the block --------------------------------------------------------


async def test_tasks_started_inside_the_block_take_turns_on_its_connection(
    store: SqlContextStore, app_engine: AsyncEngine
) -> None:
    engines = [ContextEngine(store=store, chat_id=f"c{i}", user_id="u") for i in range(3)]
    same = [ContextEngine(store=store, chat_id="shared", user_id="u") for _ in range(3)]

    async def turn(engine: ContextEngine, i: int) -> None:
        engine.set(user(f"question {i}", id=f"{engine.chat_id}-q{i}"), assistant_text(f"a {i}"))
        await engine.save()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        async with asyncio.timeout(60), app_engine.begin() as conn, store.using(conn):
            await asyncio.gather(*(turn(e, i) for i, e in enumerate(engines + same)))
    for i, engine in enumerate(engines):
        assert (await engine.get_messages())[0].id == f"c{i}-q{i}"
    shared = await ContextEngine(store=store, chat_id="shared", user_id="u").get_messages()
    assert sorted(m.id for m in shared if m.role == "user") == [
        "shared-q3",
        "shared-q4",
        "shared-q5",
    ]
    assert len(shared) == 6

    # The same, rolled back: nothing of any of them.
    late = [ContextEngine(store=store, chat_id=f"late{i}", user_id="u") for i in range(3)]

    async def rolled_back() -> None:
        async with app_engine.begin() as conn, store.using(conn):
            await asyncio.gather(*(turn(e, i) for i, e in enumerate(late)))
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        await rolled_back()
    for engine in late:
        assert await store.get_chat(engine.chat_id) is None


async def test_a_task_still_running_after_the_block_refuses_to_write(
    store: SqlContextStore,
) -> None:
    go = asyncio.Event()
    context = ContextEngine(store=store, chat_id="c", user_id="u")

    async def later() -> None:
        await go.wait()
        context.set(user("too late"))
        await context.save()

    async with store.begin():
        task = asyncio.create_task(later())
    go.set()
    with pytest.raises(StoreError, match="block that has ended"):
        await task
    assert await store.get_chat("c") is None


# --- connections that cannot join ----------------------------------------------------------


async def test_a_connection_to_another_database_is_refused(
    store: SqlContextStore, store_url: str, tmp_path: Path
) -> None:
    if store_url == "memory":
        async with InMemoryContextStore() as other:
            await _refused(store, other.engine)
    elif store_url.startswith("sqlite"):
        elsewhere = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'other.db'}")
        try:
            await _refused(store, elsewhere)
        finally:
            await elsewhere.dispose()
    else:
        server = "mariadb" if store_url.startswith("mysql") else "postgres"
        with fresh_database(server, "acother") as url:
            elsewhere = create_async_engine(url)
            try:
                await _refused(store, elsewhere)
            finally:
                await elsewhere.dispose()


async def _refused(store: SqlContextStore, elsewhere: AsyncEngine) -> None:
    context = ContextEngine(store=store, chat_id="c", user_id="u")

    async def save_there() -> None:
        async with elsewhere.begin() as conn, store.using(conn):
            context.set(user("lost"))
            await context.save()

    with pytest.raises(InvalidInputError, match="another database") as info:
        await save_there()
    assert store.url in str(info.value)
    assert await store.get_chat("c") is None


async def test_an_autocommit_connection_is_refused(
    store: SqlContextStore, app_engine: AsyncEngine
) -> None:
    async with app_engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.begin()
        with pytest.raises(InvalidInputError, match="AUTOCOMMIT"):
            async with store.using(conn):
                pass


async def test_a_connection_whose_transaction_ended_inside_the_block_refuses_to_write(
    store: SqlContextStore, app_engine: AsyncEngine
) -> None:
    context = ContextEngine(store=store, chat_id="c", user_id="u")
    async with app_engine.connect() as conn:
        await conn.begin()
        async with store.using(conn):
            context.set(user("kept", id="k"))
            await context.save()
            await conn.commit()
            context.set(user("not in a transaction"))
            with pytest.raises(StoreError, match="no longer in a transaction"):
                await context.save()
    assert [
        m.id for m in await ContextEngine(store=store, chat_id="c", user_id="u").get_messages()
    ] == ["k"]


def test_lock_timeout_is_a_checked_option() -> None:
    with pytest.raises(InvalidInputError, match="lock_timeout"):
        SqlContextStore("sqlite+aiosqlite:///x.db", lock_timeout=-1)
    with pytest.raises(InvalidInputError, match="lock_timeout"):
        SqlContextStore("sqlite+aiosqlite:///x.db", lock_timeout=float("nan"))
