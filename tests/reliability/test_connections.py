"""Lost connections on PostgreSQL: killed backends, a save cut in the middle, a server that
goes away and comes back. The server "goes away" behind a small TCP proxy the test controls,
so the shared PostgreSQL server keeps running for everything else."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from agentcontext import (
    ContextEngine,
    SqlContextStore,
    StoreUnavailableError,
    assistant_text,
    user,
)
from tests.conftest import _dsn, fresh_pg_database, require_postgres


class Proxy:
    """A TCP proxy to PostgreSQL that can be stopped (refusing and cutting connections)."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.close()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.sleep(0)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        for task in (
            asyncio.create_task(pipe(reader, up_writer)),
            asyncio.create_task(pipe(up_reader, writer)),
        ):
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    require_postgres()
    with fresh_pg_database("acconn") as url:
        yield url


async def terminate_backends(url: str) -> int:
    database = make_url(url).database
    conn = await asyncpg.connect(_dsn(url))
    try:
        rows = await conn.fetch(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = $1 AND pid <> pg_backend_pid()",
            database,
        )
    finally:
        await conn.close()
    return len(rows)


async def test_terminated_backends_between_calls_are_invisible(pg_url: str) -> None:
    async with SqlContextStore(pg_url) as store:
        engine = ContextEngine(store=store, chat_id="c", user_id="u")
        for turn in range(5):
            engine.set(user(f"question {turn}"), assistant_text(f"answer {turn}"))
            await engine.save()
            assert await terminate_backends(pg_url) >= 1
            # The next call succeeds without the caller doing anything.
            assert len(await engine.get_messages()) == 2 * (turn + 1)
            fresh = ContextEngine(store=store, chat_id="c", user_id="u")
            assert len(await fresh.get_messages()) == 2 * (turn + 1)


async def test_a_save_cut_in_the_middle_is_all_or_nothing(pg_url: str) -> None:
    async with SqlContextStore(pg_url) as store:
        engine = ContextEngine(store=store, chat_id="c", user_id="u")
        outcomes = []
        for turn in range(30):
            engine.set(user(f"q{turn}"), assistant_text(f"a{turn}"))
            save = asyncio.create_task(engine.save())
            await asyncio.sleep((turn % 6) * 0.0015)
            await terminate_backends(pg_url)
            try:
                await save
                outcomes.append("saved")
            except StoreUnavailableError:
                outcomes.append("failed")
                assert len(engine.pending) == 2  # nothing lost from the queue
                engine = ContextEngine(store=store, chat_id="c", user_id="u")
            stored = [
                m.text
                for m in await ContextEngine(store=store, chat_id="c", user_id="u").get_messages()
            ]
            # Whole turns only, each at most once, in order.
            assert len(stored) % 2 == 0
            pairs = list(zip(stored[::2], stored[1::2], strict=True))
            assert all(q[1:] == a[1:] and q[0] == "q" and a[0] == "a" for q, a in pairs)
            assert len({q for q, _ in pairs}) == len(pairs)
            # The engine's own view agrees with the database.
            if outcomes[-1] == "saved":
                assert [m.text for m in await engine.get_messages()] == stored
        assert "saved" in outcomes


async def test_a_stopped_server_fails_fast_and_recovers(pg_url: str) -> None:
    target = make_url(pg_url)
    proxy = Proxy(target.host or "127.0.0.1", target.port or 5432)
    await proxy.start()
    url = target.set(port=proxy.port, password="hunter2-secret").render_as_string(
        hide_password=False
    )
    async with SqlContextStore(url, connect_timeout=3) as store:
        engine = ContextEngine(store=store, chat_id="c", user_id="u")
        engine.set(user("before"), assistant_text("ok"))
        await engine.save()
        await proxy.stop()
        for call in (engine.get_messages(), store.list_chats(), store.get_chat("c")):
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError) as caught:
                await call
            assert time.monotonic() - started < 10
            assert "hunter2-secret" not in str(caught.value)
            assert "cannot reach the database" in str(caught.value)
        engine.set(user("while down"), assistant_text("queued"))
        with pytest.raises(StoreUnavailableError):
            await engine.save()
        assert len(engine.pending) == 2
        await proxy.start()  # same port: the server is back
        assert [m.text for m in await engine.get_messages()][:2] == ["before", "ok"]
        await engine.save()
        texts = [
            m.text
            for m in await ContextEngine(store=store, chat_id="c", user_id="u").get_messages()
        ]
        assert texts == ["before", "ok", "while down", "queued"]
    await proxy.stop()
