"""Read replicas: ``SqlContextStore(url, read_replicas=[...])`` serves reads from a real
streaming standby of the test server (started on loopback for the session) once it has
replayed this store's writes to the chat read, and from the primary otherwise; a
`SaveResult.consistency_token` gives another process the same guarantee with
``ContextEngine(..., after=token)``. Replay is paused on the standby to make "the replica is
behind" certain rather than a matter of timing. A standby that is down is skipped with a
warning; SQLite refuses the option.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from agentcontext import (
    ContextEngine,
    InvalidInputError,
    InvalidTypeError,
    SqlContextStore,
    assistant_text,
    user,
)
from agentcontext.store._db.replicas import format_token, parse_token
from tests.conftest import (
    IN_CI,
    _dsn,
    create_pg_database,
    drop_pg_database,
    pg_admin_url,
    require_postgres,
    run_sync,
    through_pgbouncer,
)
from tests.store._standby import COPIED_SETTINGS, Standby, StandbyError, start_standby

ROOT = Path(__file__).resolve().parents[2]


# --- the standby --------------------------------------------------------------------------------


async def _settings() -> dict[str, str]:
    conn = await asyncpg.connect(_dsn(pg_admin_url()), timeout=5)
    try:
        rows = await conn.fetch(
            "SELECT name, setting FROM pg_settings WHERE name = ANY($1::text[])",
            list(COPIED_SETTINGS),
        )
        return {row["name"]: row["setting"] for row in rows}
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def standby() -> Iterator[Standby]:
    """A streaming standby of the test server, for the whole session."""
    require_postgres()
    try:
        server = start_standby(pg_admin_url(), run_sync(_settings))
    except StandbyError as exc:
        reason = f"cannot start a streaming standby of the test PostgreSQL server: {exc}"
        if IN_CI:
            pytest.fail(f"CI=true but {reason}", pytrace=False)
        pytest.skip(reason)
    try:
        yield server
    finally:
        server.remove()


async def _sql(url: str, statement: str, *args: Any) -> Any:
    conn = await asyncpg.connect(_dsn(url), timeout=5)
    try:
        return await conn.fetchval(statement, *args)
    finally:
        await conn.close()


async def _wait_for(url: str, *, within: float = 60.0) -> None:
    """Wait until ``url`` (a database on the standby) accepts connections: its creation on the
    primary was replayed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        try:
            await _sql(url, "SELECT 1")
            return
        except (OSError, asyncpg.PostgresError) as exc:
            if loop.time() > deadline:
                raise AssertionError(f"the standby never reached {url}: {exc}") from exc
            await asyncio.sleep(0.05)


async def _replayed(primary: str, replica: str, *, within: float = 60.0) -> None:
    """Wait until the standby has replayed everything the primary committed so far."""
    target = await _sql(primary, "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while await _sql(replica, "SELECT pg_last_wal_replay_lsn() - '0/0'::pg_lsn") < target:
        assert loop.time() < deadline, "the standby did not catch up"
        await asyncio.sleep(0.02)


class Pair:
    """One test database on the primary and the same database on the standby."""

    def __init__(self, primary: str, replica: str, standby: Standby) -> None:
        self.primary = primary
        self.replica = replica
        self.standby = standby

    async def pause(self) -> None:
        """Stop replay on the standby: from now on it is behind every new commit."""
        await _sql(self.replica, "SELECT pg_wal_replay_pause()")

    async def resume(self) -> None:
        await _sql(self.replica, "SELECT pg_wal_replay_resume()")


@pytest.fixture
async def pair(standby: Standby) -> AsyncIterator[Pair]:
    primary = create_pg_database("acreplica")
    async with SqlContextStore(primary):  # migrated on the primary
        pass
    name = primary.rsplit("/", 1)[1]
    replica = standby.url(name)
    await _wait_for(replica)
    await _replayed(primary, replica)
    found = Pair(primary, replica, standby)
    try:
        yield found
    finally:
        if standby.running:
            await found.resume()
        drop_pg_database(primary)


def _counted(engine: AsyncEngine) -> list[str]:
    """The statements that reach ``engine`` (a real observation of where reads run)."""
    seen: list[str] = []

    @event.listens_for(engine.sync_engine, "before_cursor_execute")
    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    return seen


async def _history(store: SqlContextStore, chat_id: str) -> list[str]:
    context = ContextEngine(store=store, chat_id=chat_id, user_id="u")
    return [str(message.text) for message in (await context.resolve()).messages]


async def _history_after(store: SqlContextStore, chat_id: str, token: str | None) -> list[str]:
    context = ContextEngine(store=store, chat_id=chat_id, user_id="u", after=token)
    return [str(message.text) for message in (await context.resolve()).messages]


async def _save_turn(store: SqlContextStore, chat_id: str, words: str) -> str | None:
    context = ContextEngine(store=store, chat_id=chat_id, user_id="u")
    context.set(user(words), assistant_text(f"re: {words}"))
    return (await context.save()).consistency_token


# --- reads on the replica -------------------------------------------------------------------------


async def test_reads_of_a_chat_run_on_the_replica(pair: Pair) -> None:
    async with SqlContextStore(pair.primary) as writer:
        await _save_turn(writer, "c1", "hello")
    await _replayed(pair.primary, pair.replica)
    async with SqlContextStore(pair.primary, read_replicas=[pair.replica]) as store:
        replica = store.db.replicas.replicas[0]  # type: ignore[union-attr]
        on_replica = _counted(replica.engine)
        on_primary = _counted(store.engine)
        async with replica.engine.connect() as conn:
            assert (await conn.execute(text("SELECT pg_is_in_recovery()"))).scalar() is True
        on_replica.clear()
        assert await _history(store, "c1") == ["hello", "re: hello"]
        assert any("messages" in statement for statement in on_replica)
        assert not any("messages" in statement for statement in on_primary)
        assert replica.reads >= 2


async def test_a_store_reads_its_own_writes_however_far_behind_the_replica(
    pair: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    async with SqlContextStore(pair.primary, read_replicas=[pair.replica]) as store:
        await _save_turn(store, "c1", "one")
        await pair.pause()
        await _save_turn(store, "c1", "two")
        with caplog.at_level(logging.WARNING, logger="agentcontext"):
            # A fresh engine: nothing cached, every read goes through the store.
            assert await _history(store, "c1") == ["one", "re: one", "two", "re: two"]
        assert "had not replayed" in caplog.text
        assert store.db.replicas.primary_reads > 0  # type: ignore[union-attr]
        # Unpaused, the replica catches up and serves the same reads.
        await pair.resume()
        store.db.replicas.wait = 30.0  # type: ignore[union-attr]
        replica = store.db.replicas.replicas[0]  # type: ignore[union-attr]
        replica.behind_until = float("-inf")  # found behind a moment ago: not waited for
        served = replica.reads
        assert await _history(store, "c1") == ["one", "re: one", "two", "re: two"]
        assert replica.reads > served


async def test_a_task_reads_a_chat_where_it_last_read_it(pair: Pair) -> None:
    """One engine call reads a state, then the changes since it: never from two servers, the
    second behind the first. A task stays on the replica of its last read of a chat; other
    tasks spread over the replicas."""
    async with SqlContextStore(pair.primary) as writer:
        for chat_id in ("c1", "c2"):
            await _save_turn(writer, chat_id, "hello")
    await _replayed(pair.primary, pair.replica)
    twins = [create_async_engine(pair.replica) for _ in range(2)]  # two engines, one standby
    async with SqlContextStore(pair.primary, read_replicas=twins) as store:
        first, second = store.db.replicas.replicas  # type: ignore[union-attr]
        seen = {id(first): _counted(first.engine), id(second): _counted(second.engine)}
        for _ in range(4):
            assert await _history(store, "c1") == ["hello", "re: hello"]
        used = [key for key, statements in seen.items() if statements]
        assert len(used) == 1, "one task's reads of a chat went to two replicas"
        for statements in seen.values():
            statements.clear()

        async def reader(chat_id: str) -> list[str]:
            return await _history(store, chat_id)

        found = await asyncio.gather(*(reader(c) for c in ("c1", "c2", "c1", "c2", "c1")))
        assert found == [["hello", "re: hello"]] * 5
        assert all(seen.values()), "tasks of their own did not spread over the replicas"
    for engine in twins:
        await engine.dispose()


async def test_without_the_token_a_reader_may_see_the_replica_behind(pair: Pair) -> None:
    """The guarantee is the token's: a reader that has none reads the (paused) replica."""
    async with SqlContextStore(pair.primary, read_replicas=[pair.replica]) as writer:
        await _save_turn(writer, "c1", "one")
        await _replayed(pair.primary, pair.replica)
        await pair.pause()
        token = await _save_turn(writer, "c1", "two")
    assert token is not None
    async with SqlContextStore(pair.primary, read_replicas=[pair.replica]) as reader:
        assert await _history(reader, "c1") == ["one", "re: one"]  # stale, from the replica
    async with SqlContextStore(
        pair.primary, read_replicas=[pair.replica], replica_wait=0.05
    ) as reader:
        assert await _history_after(reader, "c1", token) == ["one", "re: one", "two", "re: two"]


async def test_token_from_another_process(pair: Pair) -> None:
    await pair.pause()
    script = textwrap.dedent(
        """
        import asyncio, json, sys
        from agentcontext import ContextEngine, SqlContextStore, assistant_text, user

        async def main():
            async with SqlContextStore(sys.argv[1], read_replicas=[sys.argv[2]]) as store:
                context = ContextEngine(store=store, chat_id="c1", user_id="u")
                context.set(user("from afar"), assistant_text("noted"))
                result = await context.save()
                print(json.dumps({"token": result.consistency_token}))

        asyncio.run(main())
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", script, pair.primary, pair.replica],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    token = json.loads(done.stdout.strip().splitlines()[-1])["token"]
    assert isinstance(token, str) and parse_token(token) > 0
    # The replica has not replayed the other process's save: the primary serves.
    async with SqlContextStore(
        pair.primary, read_replicas=[pair.replica], replica_wait=0.05
    ) as store:
        assert await _history_after(store, "c1", token) == ["from afar", "noted"]
        assert store.db.replicas.primary_reads > 0  # type: ignore[union-attr]
    # Once it has, the replica serves the reads of that chat, and nothing goes to the primary.
    await pair.resume()
    async with SqlContextStore(
        pair.primary, read_replicas=[pair.replica], replica_wait=30
    ) as store:
        assert await _history_after(store, "c1", token) == ["from afar", "noted"]
        replicas = store.db.replicas
        assert replicas is not None
        assert replicas.primary_reads == 0
        assert replicas.replicas[0].reads >= 2


async def test_a_stopped_standby_is_skipped_with_a_warning(
    pair: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    async with SqlContextStore(
        pair.primary, read_replicas=[pair.replica], replica_wait=30
    ) as store:
        replicas = store.db.replicas
        assert replicas is not None
        await _save_turn(store, "c1", "one")
        assert await _history(store, "c1") == ["one", "re: one"]
        assert replicas.replicas[0].reads > 0
        await asyncio.to_thread(pair.standby.stop)
        try:
            with caplog.at_level(logging.WARNING, logger="agentcontext"):
                await _save_turn(store, "c1", "two")
                assert await _history(store, "c1") == ["one", "re: one", "two", "re: two"]
                assert await _history(store, "c2") == []  # a chat this store never wrote
                for _ in range(5):
                    assert await _history(store, "c1") == ["one", "re: one", "two", "re: two"]
            warnings = [r.getMessage() for r in caplog.records if r.name == "agentcontext"]
            # Rate-limited: one line per replica and reason, however many reads were skipped.
            assert sum("cannot be reached" in line for line in warnings) <= 1
            assert sum("a read failed" in line for line in warnings) <= 1
            assert warnings
            assert "read replica" in caplog.text
            assert "skipped" in caplog.text
            assert replicas.primary_reads > 0
        finally:
            await asyncio.to_thread(pair.standby.start)
        # Back up: once its pause is over, it serves again.
        replicas.retry_seconds = 0.0
        for replica in replicas.replicas:
            replica.down_until = float("-inf")
        await _wait_for(pair.replica)
        served = replicas.replicas[0].reads
        assert await _history(store, "c1") == ["one", "re: one", "two", "re: two"]
        assert replicas.replicas[0].reads > served


def _positions_asked(statements: list[str]) -> int:
    return sum("pg_last_wal_replay_lsn" in statement for statement in statements)


async def test_a_replica_found_behind_is_waited_for_once(
    pair: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    """A replica behind this store's writes costs one read its ``replica_wait``; the reads
    right after it go to the primary without asking the replica again."""
    async with SqlContextStore(
        pair.primary, read_replicas=[pair.replica], replica_wait=0.2
    ) as store:
        replicas = store.db.replicas
        assert replicas is not None
        replica = replicas.replicas[0]
        replicas.lag_seconds = 3600.0  # "a moment" that outlasts the test however slow it runs
        seen = _counted(replica.engine)
        await pair.pause()
        await _save_turn(store, "c1", "one")
        with caplog.at_level(logging.WARNING, logger="agentcontext"):
            assert await _history(store, "c1") == ["one", "re: one"]
        assert "had not replayed" in caplog.text
        asked = _positions_asked(seen)
        assert asked >= 1
        primary_reads = replicas.primary_reads
        for _ in range(5):  # fresh engines: each reads the chat's state and its chain
            assert await _history(store, "c1") == ["one", "re: one"]
        assert _positions_asked(seen) == asked, "a replica known to be behind was asked again"
        assert replicas.primary_reads >= primary_reads + 5
        # Reads it can serve still go to it: another task's read of a chat this store never
        # wrote (this task's reads stay at least as new as the primary's it last read).
        served = replica.reads
        assert await asyncio.create_task(_history(store, "never-written")) == []
        assert replica.reads > served


async def test_a_frozen_replica_costs_a_bounded_wait_then_is_skipped(
    pair: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    """A standby whose processes are stopped (SIGSTOP: a hung host, a paused VM) answers
    nothing. A read gives up on it after ``replica_wait`` plus the connect bound, the primary
    serves, and the replica is skipped for its back-off: the reads after it do not try it.
    Before, a fresh engine's resolve() was still waiting after 150 s."""
    async with SqlContextStore(pair.primary) as writer:
        await _save_turn(writer, "c1", "one")
    await _replayed(pair.primary, pair.replica)
    async with SqlContextStore(
        pair.primary, read_replicas=[pair.replica], replica_wait=0.1
    ) as warm:
        replicas = warm.db.replicas
        assert replicas is not None
        replicas.retry_seconds = 3600.0
        assert await _history(warm, "c1") == ["one", "re: one"]  # a pooled connection now
        assert replicas.replicas[0].reads > 0
        seen = _counted(replicas.replicas[0].engine)
        pair.standby.freeze()
        try:
            with caplog.at_level(logging.WARNING, logger="agentcontext"):
                # Bounds far above the promise: the failure this guards against is a hang.
                await _save_turn(warm, "c1", "two")
                history = await asyncio.wait_for(_history(warm, "c1"), 60)
                assert history == ["one", "re: one", "two", "re: two"]
                tried = len(seen)
                for _ in range(5):
                    assert await asyncio.wait_for(_history(warm, "c1"), 60) == history
                    assert await asyncio.wait_for(warm.list_chats(), 60)
                assert len(seen) == tried, "a replica skipped for its back-off was tried again"
                # A store opened now: its first connection to the replica never completes.
                async with SqlContextStore(
                    pair.primary, read_replicas=[pair.replica], replica_wait=0.1
                ) as cold:
                    assert await asyncio.wait_for(_history(cold, "c1"), 60) == history
                    assert cold.db.replicas.primary_reads > 0  # type: ignore[union-attr]
                    await asyncio.wait_for(cold.close(), 60)  # gives up on what hangs
            assert "did not answer" in caplog.text or "cannot be reached" in caplog.text
        finally:
            pair.standby.thaw()
        # Thawed and past its back-off: it serves again.
        for replica in replicas.replicas:
            replica.down_until = float("-inf")
            replica.behind_until = float("-inf")
        replicas.wait = 30.0
        await _replayed(pair.primary, pair.replica)
        served = replicas.replicas[0].reads
        assert await _history(warm, "c1") == history
        assert replicas.replicas[0].reads > served


async def test_a_task_reads_on_one_replica_whatever_it_names(pair: Pair) -> None:
    """The reads of one task stay on the replica of its last read, the ones that name no chat
    (a branch the store has not seen, a message chain) included, so one engine call never
    reads a state from one replica and what changed since from another."""
    async with SqlContextStore(pair.primary) as writer:
        await _save_turn(writer, "c1", "hello")
    await _replayed(pair.primary, pair.replica)
    twins = [create_async_engine(pair.replica) for _ in range(3)]
    try:
        async with SqlContextStore(pair.primary, read_replicas=twins) as store:
            replicas = store.db.replicas
            assert replicas is not None
            seen = {id(r): _counted(r.engine) for r in replicas.replicas}
            for _ in range(3):
                context = ContextEngine(store=store, chat_id="c1", user_id="u")
                messages = (await context.resolve()).messages
                head = messages[-1].id
                assert [m.id for m in await store.get_message_chain(head)] == [
                    m.id for m in messages
                ]
                assert (await store.get_branch_state(context._conv.branch.id)) is not None  # type: ignore[union-attr]
                assert await context.first_user_message() is not None
            used = [key for key, statements in seen.items() if statements]
            assert len(used) == 1, "one task's reads went to several replicas"
    finally:
        for engine in twins:
            await engine.dispose()


async def test_a_forged_token_is_refused_and_slows_nothing(pair: Pair) -> None:
    """A well-formed token beyond the primary's log (forged, or from another database) is
    refused at the first read it would delay; it raises no floor, so the chat and every read
    naming no chat are served as before. Tokens at or behind the primary are floors of their
    own chat only."""
    async with SqlContextStore(pair.primary) as writer:
        await _save_turn(writer, "c1", "one")
        await _save_turn(writer, "c2", "two")
    await _replayed(pair.primary, pair.replica)
    async with SqlContextStore(
        pair.primary, read_replicas=[pair.replica], replica_wait=0.05
    ) as store:
        replicas = store.db.replicas
        assert replicas is not None
        replica = replicas.replicas[0]
        forged = ContextEngine(store=store, chat_id="c1", user_id="u", after="FFFFFFFF/FFFFFFFF")
        with pytest.raises(InvalidInputError, match="ahead of the primary"):
            await forged.resolve()
        served, primary_reads = replica.reads, replicas.primary_reads
        assert await _history(store, "c1") == ["one", "re: one"]
        assert len(await store.list_chats()) == 2
        assert await store.search_user_messages("u", "two")
        assert replica.reads > served
        assert replicas.primary_reads == primary_reads, "a refused token slowed later reads"
        # Every well-formed token gives a typed result: "0/0" asks for nothing.
        for token in ("0/0", "0/1"):
            engine = ContextEngine(store=store, chat_id="unseen", user_id="u", after=token)
            assert (await engine.resolve()).messages == []
        # A real token raises its own chat's floor, and no other.
        await pair.pause()
        token = await _save_turn(store, "c2", "three")
        assert token is not None
    async with SqlContextStore(
        pair.primary, read_replicas=[pair.replica], replica_wait=0.05
    ) as reader:
        replicas = reader.db.replicas
        assert replicas is not None
        after = await _history_after(reader, "c2", token)
        assert after[-2:] == ["three", "re: three"]
        served = replicas.replicas[0].reads
        # Another task (this one's reads stay as new as the primary's it last read): not held
        # to c2's token.
        assert await asyncio.create_task(_history(reader, "c1")) == ["one", "re: one"]
        assert replicas.replicas[0].reads > served
    await pair.resume()


async def test_a_writer_that_read_a_stale_replica_grafts_its_turn(pair: Pair) -> None:
    """Another process's write the replica has not replayed: this store's engine opens the chat
    from the replica (stale), its compare-and-swap is refused on the primary, and the re-read
    that follows sees the primary: the turn lands after the other one, nothing is lost."""
    async with SqlContextStore(pair.primary, read_replicas=[pair.replica]) as other:
        await _save_turn(other, "c1", "one")
        await _replayed(pair.primary, pair.replica)
        await pair.pause()
        await _save_turn(other, "c1", "two")
    async with SqlContextStore(
        pair.primary, read_replicas=[pair.replica], replica_wait=0.05
    ) as store:
        context = ContextEngine(store=store, chat_id="c1", user_id="u")
        assert [str(m.text) for m in (await context.resolve()).messages] == ["one", "re: one"]
        context.set(user("three"))
        result = await context.save()
        assert result.consistency_token is not None  # the retried write's position
        assert parse_token(result.consistency_token) > 0
        expected = ["one", "re: one", "two", "re: two", "three"]
        assert [str(m.text) for m in (await context.resolve()).messages] == expected
    async with SqlContextStore(pair.primary) as primary_only:
        assert await _history(primary_only, "c1") == expected


async def test_through_pgbouncer(pair: Pair, pgbouncer_port: int) -> None:
    """Behind PgBouncer in transaction pooling mode every statement runs in a transaction: the
    position after a commit is read that way too."""
    primary = through_pgbouncer(pair.primary, pgbouncer_port)
    async with SqlContextStore(primary, read_replicas=[pair.replica]) as store:
        first = await _save_turn(store, "c1", "one")
        await pair.pause()
        second = await _save_turn(store, "c1", "two")
        assert first is not None and second is not None
        assert parse_token(second) > parse_token(first)
        assert await _history(store, "c1") == ["one", "re: one", "two", "re: two"]


async def test_inside_begin_everything_runs_on_the_primary(pair: Pair) -> None:
    async with SqlContextStore(pair.primary, read_replicas=[pair.replica]) as store:
        replica = store.db.replicas.replicas[0]  # type: ignore[union-attr]
        await pair.pause()
        async with store.begin():
            await store.upsert_chat("c1", user_id="u")
            assert (await store.get_chat("c1")) is not None
            context = ContextEngine(store=store, chat_id="c1", user_id="u")
            context.set(user("inside"))
            result = await context.save()
            assert result.consistency_token is None  # the commit is the caller's
        assert replica.reads == 0
        # After the commit, the store asks the primary where it is before it reads.
        assert await _history(store, "c1") == ["inside"]
        assert store.consistency_token("c1") is not None


async def test_caller_engines_as_replicas_are_not_disposed(pair: Pair) -> None:
    mine = create_async_engine(pair.replica)
    try:
        seen = _counted(mine)
        async with SqlContextStore(pair.primary) as writer:
            await _save_turn(writer, "c1", "one")
        await _replayed(pair.primary, pair.replica)
        async with SqlContextStore(pair.primary, read_replicas=[mine]) as store:
            assert await _history(store, "c1") == ["one", "re: one"]
        assert any("messages" in statement for statement in seen)
        async with mine.connect() as conn:  # still usable: the store did not dispose it
            assert (await conn.execute(text("SELECT 1"))).scalar() == 1
    finally:
        await mine.dispose()


async def test_replica_engines_made_from_urls_share_the_options_and_are_disposed(
    pair: Pair,
) -> None:
    name = "acreplica_options"
    options = {"server_settings": {"application_name": name}}
    count = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1"
    async with SqlContextStore(
        pair.primary, read_replicas=[pair.replica], connect_args=options
    ) as store:
        assert await _history(store, "c1") == []
        assert await _sql(pair.replica, count, name) >= 1  # the primary's connect_args
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while await _sql(pair.replica, count, name):
        assert loop.time() < deadline, "the replica engine was not disposed by close()"
        await asyncio.sleep(0.05)


async def test_a_replica_of_another_database_is_never_read_from(
    pair: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    """A replica URL naming another database of the standby (a typo, a copied setting): its
    position is the server's log, ahead of every floor, and its chats were served as the
    primary's. The store asks both servers what a standby shares with its primary (the
    cluster and the database) and reads nothing there."""
    other = create_pg_database("acother")
    try:
        async with SqlContextStore(other) as elsewhere:
            await _save_turn(elsewhere, "c1", "wrong database")
        async with SqlContextStore(pair.primary) as writer:
            await _save_turn(writer, "c1", "right database")
        wrong = pair.standby.url(other.rsplit("/", 1)[1])
        await _wait_for(wrong)
        await _replayed(pair.primary, pair.replica)
        await _replayed(other, wrong)
        async with SqlContextStore(pair.primary, read_replicas=[wrong]) as store:
            with caplog.at_level(logging.WARNING, logger="agentcontext"):
                assert await _history(store, "c1") == ["right database", "re: right database"]
                assert [chat.id for chat in await store.list_chats()] == ["c1"]
                assert await _history(store, "c1") == ["right database", "re: right database"]
            assert "is not a replica of the primary's database" in caplog.text
            replica = store.db.replicas.replicas[0]  # type: ignore[union-attr]
            assert replica.reads == 0
    finally:
        drop_pg_database(other)


# --- without a standby ------------------------------------------------------------------------------


async def test_a_replica_that_is_not_a_standby_is_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = create_pg_database("acnotreplica")
    try:
        async with SqlContextStore(url, read_replicas=[url]) as store:
            with caplog.at_level(logging.WARNING, logger="agentcontext"):
                await _save_turn(store, "c1", "one")
                assert await _history(store, "c1") == ["one", "re: one"]
            assert "is not a standby" in caplog.text
            assert store.db.replicas.primary_reads > 0  # type: ignore[union-attr]
    finally:
        drop_pg_database(url)


def test_sqlite_refuses_read_replicas(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="SQLite") as caught:
        SqlContextStore(
            f"sqlite+aiosqlite:///{tmp_path / 'a.db'}",
            read_replicas=["postgresql+asyncpg://postgres@127.0.0.1/x"],
        )
    assert "PostgreSQL" in str(caught.value)
    assert not (tmp_path / "a.db").exists()
    with pytest.raises(InvalidInputError, match="SQLite"):
        SqlContextStore(f"sqlite+aiosqlite:///{tmp_path / 'a.db'}", replica_wait=1.0)
    # No replicas is the default, and an empty list says the same.
    SqlContextStore(f"sqlite+aiosqlite:///{tmp_path / 'a.db'}", read_replicas=[])


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"read_replicas": "postgresql+asyncpg://h/db"}, InvalidTypeError),
        ({"read_replicas": [42]}, InvalidTypeError),
        ({"read_replicas": ["not a url"]}, InvalidInputError),
        ({"read_replicas": ["sqlite+aiosqlite:///x.db"]}, InvalidInputError),
        ({"replica_wait": -1}, InvalidInputError),
        ({"replica_wait": float("nan")}, InvalidInputError),
        ({"replica_wait": "1"}, InvalidTypeError),
    ],
)
def test_bad_replica_options(options: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        SqlContextStore("postgresql+asyncpg://postgres@127.0.0.1/x", **options)


async def test_bad_tokens_are_refused(tmp_path: Path) -> None:
    async with SqlContextStore(f"sqlite+aiosqlite:///{tmp_path / 'a.db'}") as store:
        for bad in ("", "yesterday", "0/", "1/2/3", "G/1", "0/123456789"):
            with pytest.raises(InvalidInputError, match="consistency token"):
                ContextEngine(store=store, chat_id="c", user_id="u", after=bad)
        with pytest.raises(InvalidTypeError):
            ContextEngine(store=store, chat_id="c", user_id="u", after=12)  # type: ignore[arg-type]
        # A well-formed token on a store without replicas: nothing to wait for.
        context = ContextEngine(store=store, chat_id="c", user_id="u", after="0/16B3748")
        assert (await context.resolve()).messages == []
        context.set(user("hi"))
        assert (await context.save()).consistency_token is None
        assert store.consistency_token("c") is None


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_tokens_round_trip(position: int) -> None:
    token = format_token(position)
    assert parse_token(token) == position
    assert parse_token(token.lower()) == position


def test_a_replica_wait_of_zero_is_accepted() -> None:
    """``replica_wait=0`` (never wait for a replica: the primary serves at once) is what the
    docs offer; it was refused as not positive."""
    for wait in (0, 0.0, 60):
        SqlContextStore(
            "postgresql+asyncpg://postgres@127.0.0.1/x",
            read_replicas=["postgresql+asyncpg://postgres@127.0.0.1:2/x"],
            replica_wait=wait,
        )
    with pytest.raises(InvalidInputError, match="between 0 and 60"):
        SqlContextStore("postgresql+asyncpg://postgres@127.0.0.1/x", replica_wait=61)
