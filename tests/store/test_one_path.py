"""One path to the database: every statement of a store runs on its one SQLAlchemy engine.

- What the drivers execute (sqlite3's trace callback, asyncpg's query logger) is exactly what
  SQLAlchemy's ``before_cursor_execute`` event saw, for a save, a resolve and a search.
- One store under 200 concurrent engines never holds more server connections than
  ``pool_size + max_overflow``.
- A caller's engine is used for every call, with its own connect arguments and listeners.
- ``store.using(connection)`` runs a turn in the caller's transaction: a rollback leaves nothing
  of it, a commit keeps it, and a head conflict inside is retried on a SAVEPOINT.
"""

from __future__ import annotations

import asyncio
import contextvars
import re
import uuid
from typing import Any

import asyncpg
import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, event, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.util import await_only

from agentcontext import (
    ChatNotFoundError,
    ContextEngine,
    InvalidInputError,
    InvalidTypeError,
    SqlContextStore,
    assistant_text,
    hint,
    role,
    user,
)
from tests.conftest import _dsn

_CONTROL = re.compile(
    r"^\s*(BEGIN(?!\s+NOT\s+ATOMIC)|COMMIT|ROLLBACK|SAVEPOINT|RELEASE|--)", re.IGNORECASE
)
# asyncpg's own introspection of types it meets for the first time, and the statements
# SQLite's FTS5 module runs by itself on its shadow tables (it reads its configuration again
# after the schema changed): the driver's and the database's, not ours.
_DRIVER_OWN = re.compile(
    r"typeinfo_tree|set_config\('jit'|^PRAGMA 'main'\.data_version$|'main'\.'messages_fts_"
)


class Tracer:
    """Statements as SQLAlchemy saw them and as the driver executed them."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.seen: list[str] = []
        self.executed: list[str] = []
        sync = engine.sync_engine

        @event.listens_for(sync, "before_cursor_execute")
        def _seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            self.seen.append(statement)

        @event.listens_for(sync, "connect")
        def _connect(dbapi_connection: Any, record: Any) -> None:
            raw = dbapi_connection.driver_connection
            if engine.dialect.name == "sqlite":
                await_only(raw.set_trace_callback(self.executed.append))
            elif engine.dialect.name in ("mysql", "mariadb"):
                # asyncmy has no query logger: every statement of its cursors is sent by
                # the connection's query().
                send = raw.query

                async def query(sql: Any, *args: Any, **kwargs: Any) -> Any:
                    self.executed.append(sql if isinstance(sql, str) else sql.decode())
                    return await send(sql, *args, **kwargs)

                raw.query = query
            else:
                raw.add_query_logger(lambda query: self.executed.append(query.query))

    def reset(self) -> None:
        self.seen.clear()
        self.executed.clear()


def _unseen(tracer: Tracer) -> list[str]:
    """Driver statements SQLAlchemy did not see (transaction control aside): each executed
    statement must start like a seen one, up to the seen one's first parameter. (SQLite's
    trace reports a statement again at each step of its triggers: executions are not
    counted, only matched.)"""
    seen = {_prefix(s) for s in tracer.seen if not _CONTROL.match(s)}
    return [
        statement
        for statement in dict.fromkeys(tracer.executed)
        if not _CONTROL.match(statement)
        and not _DRIVER_OWN.search(statement)
        and not any(" ".join(statement.split()).startswith(p) for p in seen)
    ]


def _prefix(statement: str) -> str:
    flat = " ".join(statement.split())
    return re.split(r"[?$']|%\(|%s", flat, maxsplit=1)[0]


async def test_every_statement_of_a_save_a_resolve_and_a_search_is_seen(store_url: str) -> None:
    store = SqlContextStore(store_url)
    tracer = Tracer(store.engine)
    try:
        await store.initialize()
        assert tracer.seen and _unseen(tracer) == []  # the schema check (and migrations) too
        engine = ContextEngine(store=store, chat_id="traced", user_id="u")
        engine.set(role("You are terse."), hint("Be brief."), user("where is the fox?"))
        tracer.reset()
        await engine.save()
        assert tracer.seen, "a save ran no statement SQLAlchemy saw"
        assert _unseen(tracer) == []
        engine.set(assistant_text("the fox is in the den"))
        tracer.reset()
        await engine.save()
        # A save of an open engine is one statement (plus transaction control, if any); on
        # MariaDB a compound one (the locking read of the chat and the branch, the message,
        # its search terms, the chat's activity and the head).
        statements = [s for s in tracer.seen if not _CONTROL.match(s)]
        assert len(statements) == 1, statements
        assert _unseen(tracer) == []
        tracer.reset()
        fresh = ContextEngine(store=store, chat_id="traced", user_id="u")
        assert [m.text for m in (await fresh.resolve()).messages][-1] == "the fox is in the den"
        assert tracer.seen and _unseen(tracer) == []
        tracer.reset()
        hits = await store.search_messages("traced", "fox den")
        assert [h.message.name for h in hits] == ["assistant"]
        assert tracer.seen and _unseen(tracer) == []
    finally:
        await store.close()


def test_the_tracer_sees_statements_sqlalchemy_does_not(tmp_path: Any) -> None:
    """The comparison above can fail: a statement sent around SQLAlchemy is reported."""

    async def run() -> list[str]:
        engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'x.db'}")
        tracer = Tracer(engine)
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
            raw = await conn.get_raw_connection()
            await raw.driver_connection.execute("SELECT 2")
        await engine.dispose()
        return _unseen(tracer)

    assert asyncio.run(run()) == ["SELECT 2"]


async def test_one_store_never_holds_more_connections_than_its_pool(pg_session_url: str) -> None:
    marker = f"agentcontext-budget-{uuid.uuid4().hex[:8]}"
    store = SqlContextStore(
        pg_session_url,
        pool_size=3,
        max_overflow=2,
        pool_timeout=60,
        connect_args={"server_settings": {"application_name": marker}},
    )
    admin = await asyncpg.connect(_dsn(pg_session_url))
    peak = 0
    done = asyncio.Event()

    async def watch() -> None:
        nonlocal peak
        while not done.is_set():
            count = await admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", marker
            )
            peak = max(peak, int(count))
            await asyncio.sleep(0.005)

    async def one(i: int) -> None:
        engine = ContextEngine(store=store, chat_id=f"budget-{i % 20}", user_id="u")
        engine.set(user(f"turn {i} about foxes"))
        await engine.save()
        await engine.resolve()
        await store.search_messages(f"budget-{i % 20}", "foxes")

    watcher = asyncio.create_task(watch())
    try:
        await asyncio.gather(*(one(i) for i in range(200)))
    finally:
        done.set()
        await watcher
        await admin.close()
        await store.close()
    assert 0 < peak <= 5
    for i in range(20):
        async with SqlContextStore(pg_session_url) as check:
            assert len(await check.get_messages(f"budget-{i}")) == 10
            await check.delete_chat(f"budget-{i}")


async def test_calls_waiting_for_a_connection_are_served_in_turn(store_url: str) -> None:
    """More callers than connections: calls run in the order they were made. In the pool
    alone, a call arriving just as a connection came back could take it before the call
    woken for it ran, and the overtaken call went to the back of the queue again (the long
    tail of turns at 64 agents on PostgreSQL)."""
    tasks, calls = 24, 6
    made: list[str] = []
    ran: list[str] = []
    async with SqlContextStore(store_url, pool_size=2, max_overflow=0) as store:
        ids = [f"t{i}-{k}" for i in range(tasks) for k in range(calls)]
        for chat_id in ids:
            await store.create_chat(chat_id, user_id="u")
        # Both connections open before the count starts (opening one takes a while).
        await asyncio.gather(*(store.get_chat(chat_id) for chat_id in ids[:8]))

        @event.listens_for(store.engine.sync_engine, "before_cursor_execute")
        def seen(_conn: Any, _cursor: Any, _sql: str, params: Any, *_: Any) -> None:
            values = params.values() if isinstance(params, dict) else params
            ran.extend(v for v in values if isinstance(v, str) and v in wanted)

        wanted = set(ids)

        async def caller(i: int) -> None:
            for k in range(calls):
                made.append(f"t{i}-{k}")
                assert await store.get_chat(f"t{i}-{k}") is not None
                for _ in range(i % 3):
                    await asyncio.sleep(0)  # callers that think a little between calls

        await asyncio.gather(*(caller(i) for i in range(tasks)))
    assert sorted(ran) == sorted(made)
    # A call may see the one call beside it on the other connection start first, no more.
    position = {chat_id: n for n, chat_id in enumerate(ran)}
    overtaken = [
        sum(1 for b in made[n + 1 :] if position[b] < position[a]) for n, a in enumerate(made)
    ]
    assert max(overtaken) <= 1, (made, ran)


async def test_a_callers_engine_is_used_for_every_call(store_url: str) -> None:
    url = make_url(store_url)
    pooled = url.query.get("pgbouncer") == "true"
    options: dict[str, Any] = {}
    if url.get_backend_name() == "postgresql":
        options["connect_args"] = {"server_settings": {"application_name": "caller-engine"}}
        if pooled:
            options["connect_args"].update(statement_cache_size=0, prepared_statement_cache_size=0)
            options["connect_args"].pop("server_settings")
    engine = create_async_engine(url.difference_update_query(["pgbouncer"]), **options)
    connects: list[object] = []
    event.listen(engine.sync_engine, "connect", lambda conn, record: connects.append(conn))
    try:
        store = SqlContextStore(engine, pgbouncer=pooled)
        # After the store's own connect hook (SQLite pragmas: connection set-up, run by the
        # driver when a connection opens, like SQLAlchemy's own dialect set-up).
        tracer = Tracer(engine)
        async with store:
            context = ContextEngine(store=store, chat_id="caller", user_id="u")
            context.set(user("a question about foxes"), assistant_text("an answer"))
            await context.save()
            assert len((await context.resolve()).messages) == 2
            assert len(await store.search_messages("caller", "foxes")) == 1
            if url.get_backend_name() == "postgresql" and not pooled:
                async with engine.connect() as conn:
                    name = await conn.scalar(text("SHOW application_name"))
                assert name == "caller-engine"
        assert connects, "the store opened no connection through the caller's engine"
        assert tracer.seen and _unseen(tracer) == []
    finally:
        await engine.dispose()


APP = MetaData()
orders = Table(
    "app_orders", APP, Column("id", Integer, primary_key=True), Column("note", String(255))
)


@pytest.fixture
async def app_store(store_url: str) -> Any:
    async with SqlContextStore(store_url) as store:
        async with store.engine.begin() as conn:
            await conn.run_sync(APP.create_all)
        yield store
        async with store.engine.begin() as conn:
            await conn.run_sync(APP.drop_all)


async def _orders(store: SqlContextStore) -> list[str]:
    async with store.engine.connect() as conn:
        return list(await conn.scalars(select(orders.c.note)))


async def test_a_rollback_of_the_callers_transaction_leaves_nothing_of_the_turn(
    app_store: SqlContextStore,
) -> None:
    store = app_store
    context = ContextEngine(store=store, chat_id="tx", user_id="u")
    async with store.begin() as conn:
        await conn.execute(orders.insert().values(id=1, note="paid"))
        context.set(user("order 1 is paid"), assistant_text("noted"))
        await context.save()
        assert len(await store.get_messages("tx")) == 2  # visible inside the transaction
        await conn.rollback()
    assert await store.get_chat("tx") is None
    assert await _orders(store) == []
    with pytest.raises(ChatNotFoundError):
        await store.search_messages("tx", "paid")
    # And committed, both stay.
    fresh = ContextEngine(store=store, chat_id="tx", user_id="u")
    async with store.begin() as conn:
        await conn.execute(orders.insert().values(id=2, note="shipped"))
        fresh.set(user("order 2 is shipped"), assistant_text("noted"))
        saved = await fresh.save()
    assert await _orders(store) == ["shipped"]
    assert [m.id for m in await store.get_messages("tx")][-1] == saved.head_message_id
    assert len(await store.search_messages("tx", "shipped")) == 1


async def test_using_a_connection_of_the_same_database(app_store: SqlContextStore) -> None:
    store = app_store
    async with store.engine.connect() as conn:
        with pytest.raises(InvalidInputError, match="inside a transaction"):
            async with store.using(conn):
                pass
        await conn.begin()
        async with store.using(conn):
            await store.create_chat("using", user_id="u")
            with pytest.raises(InvalidInputError, match="nested"):
                async with store.using(conn):
                    pass
        await conn.commit()
    with pytest.raises(InvalidTypeError):
        store.using("not a connection")  # type: ignore[arg-type]
    assert await store.get_chat("using") is not None


async def test_a_head_conflict_inside_the_callers_transaction_is_retried_on_a_savepoint(
    app_store: SqlContextStore, backend: str
) -> None:
    if backend == "sqlite":
        pytest.skip("SQLite has one writer: another connection cannot commit meanwhile")
    store = app_store
    first = ContextEngine(store=store, chat_id="race", user_id="u")
    first.set(user("start"))
    await first.save()
    other = ContextEngine(store=store, chat_id="race", user_id="u")
    await other.resolve()
    async with store.begin() as conn:
        await conn.execute(orders.insert().values(id=3, note="in the same transaction"))
        await first.resolve()
        # Another writer moves the head and commits before this transaction saves.
        other.set(user("from outside"))
        # A task of its own, outside this transaction (a fresh context: no using() binding).
        async with asyncio.timeout(10):
            outside = await asyncio.create_task(_save_outside(other), context=contextvars.Context())
        first.set(user("from inside"))
        await first.save()
    texts = [record.data["parts"][0]["text"] for record in await store.get_messages("race")]
    assert texts == ["start", "from outside", "from inside"]
    assert outside is not None
    assert await _orders(store) == ["in the same transaction"]


async def _save_outside(engine: ContextEngine) -> str | None:
    return (await engine.save()).head_message_id


async def test_sqlite_units_without_a_transaction_are_not_rolled_back(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A read or a one-statement write opens no transaction on SQLite: giving its connection
    # back to the pool needs no rollback, which through aiosqlite is a round trip to the
    # driver's thread. A transaction that is open is still rolled back, and leaves nothing.
    import aiosqlite

    rollbacks: list[bool] = []
    original = aiosqlite.Connection.rollback

    async def counted(self: aiosqlite.Connection) -> None:
        rollbacks.append(self.in_transaction)
        await original(self)

    monkeypatch.setattr(aiosqlite.Connection, "rollback", counted)
    async with SqlContextStore(f"sqlite+aiosqlite:///{tmp_path / 'r.db'}") as store:
        engine = ContextEngine(store=store, chat_id="c", user_id="u")
        for turn in range(3):
            engine.set(user(f"question {turn}"), assistant_text(f"answer {turn}"))
            await engine.save()
        fresh = ContextEngine(store=store, chat_id="c", user_id="u")
        assert len((await fresh.resolve()).messages) == 6
        await fresh.rewind((await fresh.resolve()).messages[1].id)
        assert rollbacks == []

        async def give_up() -> None:
            async with store.begin():
                engine.set(user("never kept"))
                await engine.save()
                raise RuntimeError("the caller gives up")

        with pytest.raises(RuntimeError):
            await give_up()
        assert rollbacks and all(rollbacks)  # each one inside the transaction it ended
        assert len(await store.get_messages("c")) == 2  # the branch rewound to
        assert await store.search_messages("c", "never kept") == []
