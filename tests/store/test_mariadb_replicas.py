"""Read replicas on MariaDB: ``SqlContextStore(url, read_replicas=[...])`` serves reads from a
real replica (a primary with a binary log and a replica of it, started on loopback for the
session: ``_mariadb_pair``) once it has applied this store's writes to the chat read, by the
sequence numbers of the primary's GTIDs; a `SaveResult.consistency_token` is that GTID
(``"0-1-42"``) and gives another store the same guarantee. Applying is stopped on the replica
(``STOP SLAVE SQL_THREAD``) to make "the replica is behind" certain rather than a matter of
timing. The logic shared with PostgreSQL's standbys (pins, back-offs, frozen servers) is tested
at length in ``test_replicas``; here, what MariaDB makes different.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from agentcontext import (
    ContextEngine,
    InvalidInputError,
    InvalidTypeError,
    SqlContextStore,
    user,
)
from agentcontext.store._dialects import MySQLDialect
from tests.conftest import IN_CI, create_mariadb_database, drop_mariadb_database
from tests.store._mariadb_pair import PairError, ServerPair, start_pair
from tests.store.test_replicas import _counted, _history, _history_after, _save_turn

_NAMES = itertools.count(1)


@pytest.fixture(scope="session")
def servers() -> Iterator[ServerPair]:
    """A MariaDB primary with a binary log and its replica, for the whole session."""
    try:
        pair = start_pair()
    except PairError as exc:
        reason = f"cannot start a MariaDB primary and replica on loopback: {exc}"
        if IN_CI:
            pytest.fail(f"CI=true but {reason}", pytrace=False)
        pytest.skip(reason)
    try:
        yield pair
    finally:
        pair.remove()


class Pair:
    """One test database on the primary, and the same database on the replica."""

    def __init__(self, servers: ServerPair, name: str) -> None:
        self.servers = servers
        self.primary = servers.primary.url(name)
        self.replica = servers.replica.url(name)

    async def pause(self) -> None:
        await asyncio.to_thread(self.servers.pause)

    async def resume(self) -> None:
        await asyncio.to_thread(self.servers.resume)

    async def caught_up(self) -> None:
        await asyncio.to_thread(self.servers.caught_up)


@pytest.fixture
async def pair(servers: ServerPair) -> AsyncIterator[Pair]:
    name = f"acreplica_{next(_NAMES)}"
    servers.primary.sql(f"CREATE DATABASE {name}")
    found = Pair(servers, name)
    async with SqlContextStore(found.primary):  # migrated on the primary
        pass
    await found.caught_up()
    try:
        yield found
    finally:
        if servers.replica.running:
            await found.resume()
        servers.primary.sql(f"DROP DATABASE IF EXISTS {name}")


async def test_reads_of_a_chat_run_on_the_replica(pair: Pair) -> None:
    async with SqlContextStore(pair.primary) as writer:
        token = await _save_turn(writer, "c1", "hello")
    assert token is None  # a store without replicas issues no tokens
    await pair.caught_up()
    async with SqlContextStore(pair.primary, read_replicas=[pair.replica]) as store:
        replica = store.db.replicas.replicas[0]  # type: ignore[union-attr]
        on_replica = _counted(replica.engine)
        on_primary = _counted(store.engine)
        assert await _history(store, "c1") == ["hello", "re: hello"]
        assert any("messages" in statement for statement in on_replica)
        assert not any("messages" in statement for statement in on_primary)
        assert replica.reads >= 2


async def test_a_store_reads_its_own_writes_however_far_behind_the_replica(
    pair: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    async with SqlContextStore(pair.primary, read_replicas=[pair.replica]) as store:
        first = await _save_turn(store, "c1", "one")
        await pair.pause()
        second = await _save_turn(store, "c1", "two")
        # Tokens are the primary's GTIDs, in the order of the commits.
        assert first is not None and second is not None
        dialect = store.db.dialect
        assert first.startswith("0-1-") and dialect.parse_token(second) > dialect.parse_token(first)
        with caplog.at_level(logging.WARNING, logger="agentcontext"):
            assert await _history(store, "c1") == ["one", "re: one", "two", "re: two"]
        assert "had not replayed position 0-1-" in caplog.text
        assert store.db.replicas.primary_reads > 0  # type: ignore[union-attr]
        # Applying again, the replica catches up and serves the same reads.
        await pair.resume()
        store.db.replicas.wait = 30.0  # type: ignore[union-attr]
        replica = store.db.replicas.replicas[0]  # type: ignore[union-attr]
        replica.behind_until = float("-inf")
        served = replica.reads
        assert await _history(store, "c1") == ["one", "re: one", "two", "re: two"]
        assert replica.reads > served


async def test_a_token_gives_another_store_the_writes_it_names(pair: Pair) -> None:
    async with SqlContextStore(pair.primary, read_replicas=[pair.replica]) as writer:
        await _save_turn(writer, "c1", "one")
        await pair.caught_up()
        await pair.pause()
        token = await _save_turn(writer, "c1", "two")
    assert token is not None
    # Without the token, another store may read the replica behind.
    async with SqlContextStore(pair.primary, read_replicas=[pair.replica]) as reader:
        assert await _history(reader, "c1") == ["one", "re: one"]
    # With it, the primary serves while the replica is behind...
    async with SqlContextStore(
        pair.primary, read_replicas=[pair.replica], replica_wait=0.05
    ) as reader:
        assert await _history_after(reader, "c1", token) == ["one", "re: one", "two", "re: two"]
        assert reader.db.replicas.primary_reads > 0  # type: ignore[union-attr]
    # ...and the replica once it has applied that far, with nothing sent to the primary.
    await pair.resume()
    async with SqlContextStore(
        pair.primary, read_replicas=[pair.replica], replica_wait=30
    ) as reader:
        assert await _history_after(reader, "c1", token) == ["one", "re: one", "two", "re: two"]
        replicas = reader.db.replicas
        assert replicas is not None
        assert replicas.primary_reads == 0
        assert replicas.replicas[0].reads >= 2


async def test_tokens_ahead_of_the_primary_or_of_another_domain_are_refused(pair: Pair) -> None:
    async with SqlContextStore(pair.primary) as writer:
        await _save_turn(writer, "c1", "one")
    await pair.caught_up()
    async with SqlContextStore(
        pair.primary, read_replicas=[pair.replica], replica_wait=0.05
    ) as store:
        replicas = store.db.replicas
        assert replicas is not None
        forged = ContextEngine(store=store, chat_id="c1", user_id="u", after="0-1-999999999")
        with pytest.raises(InvalidInputError, match="ahead of the primary"):
            await forged.resolve()
        served, primary_reads = replicas.replicas[0].reads, replicas.primary_reads
        assert await _history(store, "c1") == ["one", "re: one"]
        assert replicas.replicas[0].reads > served
        assert replicas.primary_reads == primary_reads, "a refused token slowed later reads"
        # Once the store knows its primary's domain, a token of another one is refused at once.
        await _save_turn(store, "c2", "two")
        with pytest.raises(InvalidInputError, match="replication domain 7"):
            ContextEngine(store=store, chat_id="c1", user_id="u", after="7-1-1")
        # "0-1-0" asks for nothing.
        context = ContextEngine(store=store, chat_id="unseen", user_id="u", after="0-1-0")
        assert (await context.resolve()).messages == []


async def test_a_stopped_replica_is_skipped_with_a_warning(
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
        await asyncio.to_thread(pair.servers.replica.stop)
        try:
            with caplog.at_level(logging.WARNING, logger="agentcontext"):
                await _save_turn(store, "c1", "two")
                for _ in range(3):
                    assert await _history(store, "c1") == ["one", "re: one", "two", "re: two"]
                assert await _history(store, "c2") == []
            assert "read replica" in caplog.text and "skipped" in caplog.text
            assert replicas.primary_reads > 0
        finally:
            await asyncio.to_thread(pair.servers.replica.start)
        # Back up, it applies what it missed and serves again.
        replicas.retry_seconds = 0.0
        for replica in replicas.replicas:
            replica.down_until = float("-inf")
        served = replicas.replicas[0].reads
        assert await _history(store, "c1") == ["one", "re: one", "two", "re: two"]
        assert replicas.replicas[0].reads > served


async def test_a_server_that_is_not_a_replica_is_skipped(
    pair: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    async with SqlContextStore(pair.primary, read_replicas=[pair.primary]) as store:
        with caplog.at_level(logging.WARNING, logger="agentcontext"):
            await _save_turn(store, "c1", "one")
            assert await _history(store, "c1") == ["one", "re: one"]
        assert "is not a replica of the primary" in caplog.text
        assert store.db.replicas.primary_reads > 0  # type: ignore[union-attr]


async def test_a_replica_url_of_another_database_is_never_read_from(
    pair: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    """A replica holds every database of its primary: a replica URL naming another of them
    (its GTID position says it is caught up) read another store's chats as the primary's."""
    other = f"acother_{next(_NAMES)}"
    pair.servers.primary.sql(f"CREATE DATABASE {other}")
    try:
        async with SqlContextStore(pair.servers.primary.url(other)) as elsewhere:
            await _save_turn(elsewhere, "c1", "wrong database")
        async with SqlContextStore(pair.primary) as writer:
            await _save_turn(writer, "c1", "right database")
        await pair.caught_up()
        wrong = pair.servers.replica.url(other)
        async with SqlContextStore(pair.primary, read_replicas=[wrong]) as store:
            with caplog.at_level(logging.WARNING, logger="agentcontext"):
                assert await _history(store, "c1") == ["right database", "re: right database"]
                assert [chat.id for chat in await store.list_chats()] == ["c1"]
            assert "is not a replica of the primary's database" in caplog.text
            assert store.db.replicas.replicas[0].reads == 0  # type: ignore[union-attr]
    finally:
        pair.servers.primary.sql(f"DROP DATABASE IF EXISTS {other}")


async def test_a_primary_without_a_binary_log_is_refused(pair: Pair) -> None:
    """The suite's own server runs without a binary log: no position to wait by."""
    url = create_mariadb_database("acnobinlog")
    try:
        with pytest.raises(InvalidInputError, match="log_bin"):
            async with SqlContextStore(url, read_replicas=[pair.replica]) as store:
                await store.list_chats()
    finally:
        drop_mariadb_database(url)


async def test_a_writer_that_read_a_stale_replica_grafts_its_turn(pair: Pair) -> None:
    async with SqlContextStore(pair.primary, read_replicas=[pair.replica]) as other:
        await _save_turn(other, "c1", "one")
        await pair.caught_up()
        await pair.pause()
        await _save_turn(other, "c1", "two")
    async with SqlContextStore(
        pair.primary, read_replicas=[pair.replica], replica_wait=0.05
    ) as store:
        context = ContextEngine(store=store, chat_id="c1", user_id="u")
        assert [str(m.text) for m in (await context.resolve()).messages] == ["one", "re: one"]
        context.set(user("three"))
        result = await context.save()
        assert result.consistency_token is not None
        expected = ["one", "re: one", "two", "re: two", "three"]
        assert [str(m.text) for m in (await context.resolve()).messages] == expected
    async with SqlContextStore(pair.primary) as primary_only:
        assert await _history(primary_only, "c1") == expected


async def test_inside_begin_everything_runs_on_the_primary(pair: Pair) -> None:
    async with SqlContextStore(pair.primary, read_replicas=[pair.replica]) as store:
        replica = store.db.replicas.replicas[0]  # type: ignore[union-attr]
        await pair.pause()
        async with store.begin():
            await store.upsert_chat("c1", user_id="u")
            context = ContextEngine(store=store, chat_id="c1", user_id="u")
            context.set(user("inside"))
            assert (await context.save()).consistency_token is None  # the caller commits
        assert replica.reads == 0
        assert await _history(store, "c1") == ["inside"]
        assert store.consistency_token("c1") is not None


async def test_a_token_of_another_domain_is_refused_by_a_store_not_yet_opened(pair: Pair) -> None:
    # Taken before the store knew its primary's domain, the token is checked at its first
    # read, as a token ahead of the primary is: the same call means the same, opened or not.
    async with SqlContextStore(pair.primary) as writer:
        await _save_turn(writer, "c1", "one")
    await pair.caught_up()
    store = SqlContextStore(pair.primary, read_replicas=[pair.replica], replica_wait=0.05)
    try:
        other = ContextEngine(store=store, chat_id="c1", user_id="u", after="7-1-1")
        with pytest.raises(InvalidInputError, match="replication domain 7"):
            await other.resolve()
        assert await _history(store, "c1") == ["one", "re: one"]
        own = ContextEngine(store=store, chat_id="c1", user_id="u", after="0-1-1")
        assert len((await own.resolve()).messages) == 2
    finally:
        await store.close()


async def test_using_takes_a_connection_to_the_primary_and_refuses_one_to_a_replica(
    pair: Pair,
) -> None:
    # The store's own database is the primary's, however far the replica is behind: the
    # replica's connection is another server's, where a write would break replication.
    from sqlalchemy.ext.asyncio import create_async_engine

    engines = {name: create_async_engine(url) for name, url in
               (("primary", pair.primary), ("replica", pair.replica))}  # fmt: skip
    try:
        async with SqlContextStore(pair.primary, read_replicas=[pair.replica]) as store:
            await _save_turn(store, "warm", "a read may go to the replica first")
            await pair.caught_up()
            assert await _history(store, "warm")
            async with engines["replica"].begin() as conn:
                with pytest.raises(InvalidInputError, match="another database"):
                    async with store.using(conn):
                        await _save_turn(store, "c1", "lost")
            async with engines["primary"].begin() as conn, store.using(conn):
                await _save_turn(store, "c1", "kept")
            assert await _history(store, "c1") == ["kept", "re: kept"]
        await pair.caught_up()  # (replication still runs: nothing was written on the replica)
    finally:
        for engine in engines.values():
            await engine.dispose()


async def test_a_server_logging_statements_is_refused_when_the_store_opens(pair: Pair) -> None:
    # InnoDB cannot log the store's READ COMMITTED writes as statements: every write failed
    # with a raw server error; the store now says what to set when it opens.
    pair.servers.primary.sql("SET GLOBAL binlog_format = 'STATEMENT'")
    try:
        store = SqlContextStore(pair.primary)
        with pytest.raises(InvalidInputError, match="binlog_format=ROW"):
            await store.list_chats()
        await store.close()
    finally:
        pair.servers.primary.sql("SET GLOBAL binlog_format = 'MIXED'")
    async with SqlContextStore(pair.primary) as store:
        await _save_turn(store, "c1", "logged as rows")
        assert await _history(store, "c1") == ["logged as rows", "re: logged as rows"]


# --- tokens, without a server -------------------------------------------------------------------


@given(
    st.integers(min_value=0, max_value=2**32 - 1),
    st.integers(min_value=0, max_value=2**32 - 1),
    st.integers(min_value=0, max_value=2**64 - 1),
)
@example(0, 1, 0)
@example(2**32 - 1, 2**32 - 1, 2**64 - 1)
def test_tokens_round_trip(domain: int, server: int, sequence: int) -> None:
    dialect = MySQLDialect()
    dialect.domain.domain, dialect.domain.server = domain, server
    token = dialect.format_token(sequence)
    assert token == f"{domain}-{server}-{sequence}"
    assert dialect.parse_token(token) == sequence


@pytest.mark.parametrize(
    "bad",
    ["", "0/16B3748", "0-1", "0-1-2-3", "a-b-c", "-1-1-1", "0-1-18446744073709551616",
     "4294967296-1-1", " 0-1-2", "0-1-2\n", "\u0660-\u0661-\u0661", "\uff10-\uff11-\uff11", "0-1-\u0665"],
)  # fmt: skip
def test_bad_tokens_are_refused(bad: str) -> None:
    with pytest.raises(InvalidInputError, match="GTID like '0-1-42'"):
        MySQLDialect().parse_token(bad)


def test_a_replica_url_of_another_database_kind_is_refused_as_such() -> None:
    with pytest.raises(
        InvalidInputError, match="a SQLite database cannot be a replica of a MariaDB"
    ):
        SqlContextStore(
            "mysql+asyncmy://u:p@127.0.0.1:1/db", read_replicas=["sqlite+aiosqlite:///r.db"]
        )


def test_a_token_that_is_not_a_str_is_refused() -> None:
    with pytest.raises(InvalidTypeError, match="consistency token"):
        MySQLDialect().parse_token(42)


async def test_erasure_and_retention_find_what_the_replica_has_not_applied(pair: Pair) -> None:
    """``erase_user`` and ``prune`` list what they delete on the primary: a chat another
    process saved a moment ago is deleted too, though the replica has not applied it."""
    async with SqlContextStore(pair.primary, read_replicas=[pair.replica]) as store:
        await _save_turn(store, "mine", "one")
        await pair.caught_up()
        await pair.pause()
        async with SqlContextStore(pair.primary) as other:  # another process, no replicas
            await _save_turn(other, "theirs", "two")
        later = datetime.now(UTC) + timedelta(days=1)
        pruned = await store.prune(older_than=later, user_id="u")
        assert sorted(pruned.chat_ids) == ["mine", "theirs"]
        async with SqlContextStore(pair.primary) as other:
            await _save_turn(other, "late", "three")
        report = await store.erase_user("u")
        assert report.chat_ids == ["late"]
    async with SqlContextStore(pair.primary) as primary_only:
        assert await primary_only.list_chats() == []
