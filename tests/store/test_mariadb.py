"""What MariaDB (and MySQL) make different, each handled by the dialect: binary collations on
a server whose default is not, deadlocks and lock waits retried, the packet limit named,
migrations that finish after an interruption, both drivers, and clear errors."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from agentcontext import (
    ContextEngine,
    InvalidInputError,
    SqlContextStore,
    StoreUnavailableError,
    assistant_text,
    user,
)
from agentcontext.store._dialects.mysql import PACKET_NEEDED
from agentcontext.store._dialects.mysql_search import unpack_terms
from tests.conftest import _my_exec, fresh_mariadb_database, require_mariadb
from tests.store.conftest import SMALL_PACKET


@pytest.fixture
def url() -> Iterator[str]:
    """An empty database, made with the server's default collation (case-insensitive)."""
    require_mariadb()
    with fresh_mariadb_database("acmaria") as made:
        yield made


@pytest.fixture
async def store(url: str) -> AsyncIterator[SqlContextStore]:
    async with SqlContextStore(url) as made:
        yield made


@contextmanager
def statements(store: SqlContextStore) -> Iterator[list[tuple[str, Any]]]:
    """The statements (with their parameters) the store runs meanwhile."""
    seen: list[tuple[str, Any]] = []

    def keep(conn: Any, cursor: Any, statement: str, params: Any, *rest: Any) -> None:
        seen.append((statement, params))

    event.listen(store.engine.sync_engine, "before_cursor_execute", keep)
    try:
        yield seen
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", keep)


async def turn(store: SqlContextStore, chat_id: str, words: str) -> None:
    engine = ContextEngine(store=store, chat_id=chat_id, user_id="u")
    await engine.resolve()
    engine.set(user(f"{words}?"), assistant_text(f"{words}."))
    await engine.save()


async def test_every_table_compares_bytes_whatever_the_database_default(
    store: SqlContextStore, url: str
) -> None:
    database = make_url(url).database
    [[default]] = await _my_exec(
        url,
        "SELECT default_collation_name FROM information_schema.schemata "
        f"WHERE schema_name = '{database}'",
    )
    assert not default.endswith("_bin")  # the server's default: case-insensitive, padding
    rows = await _my_exec(
        url,
        "SELECT table_name, table_collation FROM information_schema.tables "
        f"WHERE table_schema = '{database}' AND table_name <> 'agentcontext_version'",
    )
    assert {name for name, _ in rows} >= {"chats", "messages", "branches", "message_terms"}
    assert {collation for _, collation in rows} == {"utf8mb4_nopad_bin"}
    await turn(store, "Chat", "upper")
    await turn(store, "chat", "lower")
    await turn(store, "chat ", "padded")
    assert len(await store.list_chats()) == 3
    assert [h.message.chat_id for h in await store.search_user_messages("u", "padded")] == [
        "chat ",
        "chat ",
    ]


async def test_one_active_branch_per_chat_is_enforced_by_the_database(
    store: SqlContextStore, url: str
) -> None:
    await turn(store, "c", "first")
    await store.create_branch("c", "other")
    with pytest.raises(Exception, match="uq_branches_chat_id_active"):
        await _my_exec(url, "UPDATE branches SET is_active = 1 WHERE chat_id = 'c'")
    active = await store.get_active_branch("c")
    assert active is not None and active.name == "main"


async def test_a_lock_wait_timeout_is_a_lost_race_run_again(url: str) -> None:
    """A caller's transaction holds the chat's row past the server's lock wait timeout: the
    save is rolled back by the server (1205), run again, and lands once the row is free."""
    waits_one_second = create_async_engine(
        url, connect_args={"init_command": "SET SESSION innodb_lock_wait_timeout = 1"}
    )
    async with SqlContextStore(waits_one_second) as store:
        await turn(store, "c", "before")
        seen: list[int] = []

        @event.listens_for(store.engine.sync_engine, "handle_error")
        def _error(context: Any) -> None:
            seen.append(context.original_exception.args[0])

        app = create_async_engine(url)
        try:
            async with app.begin() as conn:
                await conn.execute(text("SELECT id FROM chats WHERE id = 'c' FOR UPDATE"))
                saving = asyncio.create_task(turn(store, "c", "after"))
                await asyncio.sleep(2.5)
                assert not saving.done()
            await asyncio.wait_for(saving, 30)
        finally:
            await app.dispose()
        assert 1205 in seen
        engine = ContextEngine(store=store, chat_id="c", user_id="u")
        texts = [m.text for m in (await engine.resolve()).messages]
        assert texts == ["before?", "before.", "after?", "after."]
    await waits_one_second.dispose()


async def test_a_deadlock_is_a_lost_race_run_again(url: str) -> None:
    """A caller locks the branch row, the store's save locks the chat row and waits for the
    branch, the caller then asks for the chat row: the server breaks the deadlock by rolling
    one of them back (1213). Whichever it was, the save lands exactly once."""
    async with SqlContextStore(url) as store:
        await turn(store, "c", "before")
        seen: list[int] = []

        @event.listens_for(store.engine.sync_engine, "handle_error")
        def _error(context: Any) -> None:
            seen.append(context.original_exception.args[0])

        app = create_async_engine(url)
        caller_lost: str | None = None
        try:
            try:
                async with app.begin() as conn:
                    await conn.execute(
                        text("SELECT id FROM branches WHERE chat_id = 'c' FOR UPDATE")
                    )
                    saving = asyncio.create_task(turn(store, "c", "after"))
                    await asyncio.sleep(0.5)  # the save holds the chat row, waits for ours
                    await conn.execute(text("SELECT id FROM chats WHERE id = 'c' FOR UPDATE"))
            except Exception as exc:  # the caller's transaction was the one rolled back
                caller_lost = str(exc)
            await asyncio.wait_for(saving, 30)
        finally:
            await app.dispose()
        assert (caller_lost is not None and "Deadlock" in caller_lost) or 1213 in seen
        engine = ContextEngine(store=store, chat_id="c", user_id="u")
        texts = [m.text for m in (await engine.resolve()).messages]
        assert texts == ["before?", "before.", "after?", "after."]


async def test_a_small_packet_limit_is_named_when_the_store_opens_and_when_it_refuses(
    small_packet_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    url, small_packet = small_packet_url, SMALL_PACKET
    with caplog.at_level(logging.WARNING, logger="agentcontext"):
        async with SqlContextStore(url) as store:
            await store.initialize()
            warned = " ".join(r.getMessage() for r in caplog.records)
            assert "max_allowed_packet" in warned and str(PACKET_NEEDED) in warned
            await turn(store, "c", "small")
            engine = ContextEngine(store=store, chat_id="c", user_id="u")
            await engine.resolve()
            engine.set(user("é" * (3 * 2**20)))  # 6 MiB of UTF-8
            with pytest.raises(InvalidInputError, match="max_allowed_packet") as caught:
                await engine.save()
            assert f"max_allowed_packet = {small_packet}" in str(caught.value)
            fresh = ContextEngine(store=store, chat_id="c", user_id="u")
            assert len((await fresh.resolve()).messages) == 2


async def test_an_interrupted_migration_finishes_when_run_again(url: str) -> None:
    """DDL is not transactional here: a migration cut short leaves some tables made and the
    version behind; the next run makes the rest."""
    async with SqlContextStore(url) as store:
        await turn(store, "c", "kept")
    await _my_exec(
        url,
        "SET FOREIGN_KEY_CHECKS = 0",
        "DROP TABLE snapshot_items",
        "DROP TABLE record_messages",
        "UPDATE agentcontext_version SET version_num = '0010'",
    )
    async with SqlContextStore(url) as store:
        engine = ContextEngine(store=store, chat_id="c", user_id="u")
        assert [m.text for m in (await engine.resolve()).messages] == ["kept?", "kept."]
        result = await engine.resolve(record=True)
        assert result.record_id is not None
        assert await store.get_resolve_record(result.record_id) is not None


async def test_the_aiomysql_driver_and_mariadb_urls_work_too(url: str) -> None:
    given = make_url(url)
    for drivername in ("mysql+aiomysql", "mariadb+asyncmy"):
        other = given.set(drivername=drivername).render_as_string(hide_password=False)
        async with SqlContextStore(other) as store:
            await turn(store, f"via {drivername}", "driver")
            hits = await store.search_messages(f"via {drivername}", "driver")
            assert len(hits) == 2
            assert store.dialect_name == "mysql"


async def test_errors_name_what_to_do(url: str) -> None:
    given = make_url(url)
    missing = given.set(database="no_such_database_here").render_as_string(hide_password=False)
    with pytest.raises(StoreUnavailableError, match="CREATE DATABASE"):
        async with SqlContextStore(missing) as store:
            await store.list_chats()
    closed = given.set(port=1).render_as_string(hide_password=False)
    with pytest.raises(StoreUnavailableError, match="cannot reach"):
        async with SqlContextStore(closed, connect_timeout=2) as store:
            await store.list_chats()
    with pytest.raises(InvalidInputError, match="asyncmy"):
        SqlContextStore(given.set(drivername="mysql+pymysql").render_as_string())
    # Read replicas need the primary's binary log, which the suite's server runs without
    # (replicas themselves: test_mariadb_replicas).
    with pytest.raises(InvalidInputError, match="log_bin"):
        async with SqlContextStore(url, read_replicas=[url]) as store:
            await store.list_chats()
    for name in ("mysql", "information_schema", "performance_schema", "sys"):
        with pytest.raises(InvalidInputError, match="system database"):
            SqlContextStore(url, schema=name)


async def _entries_by_message(url: str) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """Each message's entries in the side table, and the terms its row keeps."""
    entries: dict[int, list[int]] = {}
    for term, seq in await _my_exec(url, "SELECT term, seq FROM message_terms ORDER BY term"):
        entries.setdefault(int(seq), []).append(int(term))
    kept = {
        int(seq): unpack_terms(packed)
        for seq, packed in await _my_exec(url, "SELECT seq, search_hashes FROM messages")
        if packed is not None
    }
    return entries, kept


async def test_the_search_table_is_one_tree_and_each_row_keeps_its_keys(
    store: SqlContextStore, url: str
) -> None:
    # Migration 0014: one B-tree, keyed (term, seq), where there were two (a key by seq to
    # delete by, an index by term to search by); a message's row keeps its keys instead.
    words = [f"word{i:04d}" for i in range(3000)]
    engine = ContextEngine(store=store, chat_id="c", user_id="u")
    said: list[str] = []
    for turn_ in range(15):
        texts = [
            " ".join(words[(turn_ * 977 + i * 61 + k * 37) % 3000] for k in range(60))
            for i in range(100)
        ]
        said += texts
        engine.set(*(user(text) for text in texts))
        await engine.save()
    engine.set(user("?!"))  # (no search terms)
    await engine.save()
    database = make_url(url).database
    keys = await _my_exec(
        url,
        "SELECT index_name, column_name FROM information_schema.statistics "
        f"WHERE table_schema = '{database}' AND table_name = 'message_terms' "
        "ORDER BY index_name, seq_in_index",
    )
    assert [tuple(row) for row in keys] == [("PRIMARY", "term"), ("PRIMARY", "seq")]
    entries, kept = await _entries_by_message(url)
    assert sum(map(len, entries.values())) == 180_000
    assert kept == entries  # in ascending order, as the table holds them
    [[messages]] = await _my_exec(url, "SELECT COUNT(*) FROM messages")
    assert messages == len(kept) + 1
    await _my_exec(url, "ANALYZE TABLE message_terms")
    [[pages, others]] = await _my_exec(
        url,
        "SELECT clust_index_size, other_index_size FROM information_schema.innodb_sys_tablestats "
        f"WHERE name = '{database}/message_terms'",
    )
    assert others <= 1
    assert 180_000 / pages > 220, pages  # (random inserts fill two thirds of a page)
    hits = await store.search_messages("c", words[0], limit=1000)
    assert len(hits) == sum(words[0] in text.split() for text in said)
    assert all(f"<mark>{words[0]}</mark>" in h.snippet for h in hits)


async def test_revision_0014_packs_the_keys_of_existing_entries_and_0013_gets_them_back(
    url: str,
) -> None:
    from agentcontext.store._db import migrate as _migrate

    words = ["otters", "hold", "hands", "while", "they", "sleep", "so", "do", "not", "drift"]
    mine: dict[str, str] = {}
    async with SqlContextStore(url) as store:
        for chat_id in ("a", "b"):
            engine = ContextEngine(store=store, chat_id=chat_id, user_id="u")
            for i in range(12):
                said = user(" ".join([*words[i % 7 :], f"{chat_id}{i}"]))
                mine[f"{chat_id}{i}"] = said.id
                engine.set(said, user("?"))
                await engine.save()
        after, kept = await _entries_by_message(url)
        await _migrate.run_in_write_transaction(
            store.engine, lambda c: _migrate.downgrade_in_transaction(c, "0013")
        )
    before, kept_before = await _entries_by_message(url)
    assert before == after and kept_before == {}
    [[index]] = await _my_exec(
        url,
        "SELECT COUNT(*) FROM information_schema.statistics WHERE table_schema = DATABASE() "
        "AND table_name = 'message_terms' AND index_name = 'ix_message_terms_term_seq'",
    )
    assert index == 2
    for attempt in range(2):  # (the second: an upgrade run again after it was cut short)
        if attempt:
            await _my_exec(url, "UPDATE agentcontext_version SET version_num = '0013'")
        async with SqlContextStore(url) as store:
            entries, kept = await _entries_by_message(url)
            assert entries == after and kept == after
            hits = await store.search_messages("a", "drift a11")
            assert [h.message.id for h in hits] == [mine["a11"]]
    async with SqlContextStore(url) as store:
        assert await store.delete_chat("a")
    entries, kept = await _entries_by_message(url)
    assert entries == kept and entries and len(entries) == len(after) // 2


async def test_search_entries_leave_with_their_messages_on_every_delete(
    store: SqlContextStore, url: str
) -> None:
    # The side table has no foreign key to delete them (migration 0012): the store does.
    from datetime import UTC, datetime, timedelta

    from tests.store.test_retention import _graph

    async def orphans() -> int:
        [[count]] = await _my_exec(
            url,
            "SELECT COUNT(*) FROM message_terms AS t WHERE NOT EXISTS "
            "(SELECT 1 FROM messages AS m WHERE m.seq = t.seq)",
        )
        return int(count)

    async def entries() -> int:
        [[count]] = await _my_exec(url, "SELECT COUNT(*) FROM message_terms")
        return int(count)

    [[keys]] = await _my_exec(
        url,
        "SELECT COUNT(*) FROM information_schema.referential_constraints "
        "WHERE constraint_schema = DATABASE() AND table_name = 'message_terms'",
    )
    assert keys == 0
    await _graph(store, "purged")
    for chat_id, owner in (("kept", "u"), ("deleted", "u"), ("erased", "gone"), ("old", "old")):
        engine = ContextEngine(store=store, chat_id=chat_id, user_id=owner)
        engine.set(user("otters hold hands?"), assistant_text("otters hold hands."))
        await engine.save()
    steps = [
        ("purge", lambda: store.purge("purged")),
        ("delete_chat", lambda: store.delete_chat("deleted")),
        ("erase_user", lambda: store.erase_user("gone")),
        (
            "prune",
            lambda: store.prune(older_than=datetime.now(UTC) + timedelta(days=1), user_id="old"),
        ),
    ]
    for name, step in steps:
        before = await entries()
        await step()
        assert await entries() < before, name
        assert await orphans() == 0, name
    hits = await store.search_messages("kept", "otters")
    assert len(hits) == 2
    assert await store.delete_chat("purged")
    assert await store.delete_chat("kept")
    assert await entries() == 0


async def test_a_save_is_one_statement_that_commits_itself(url: str) -> None:
    # No COMMIT after it, and no ROLLBACK when its connection goes back to the pool: the
    # server counts what the client sent (Questions), on the store's one connection.
    async def sent(store: SqlContextStore) -> int:
        async with store.engine.connect() as conn:
            found = await conn.exec_driver_sql("SHOW SESSION STATUS LIKE 'Questions'")
            return int(found.one()[1])

    async with SqlContextStore(url, pool_size=1) as store:
        engine = ContextEngine(store=store, chat_id="c", user_id="u")
        engine.set(user("first"))
        await engine.save()
        before = await sent(store)
        for i in range(10):
            engine.set(user(f"turn {i}"), assistant_text(f"reply {i}"))
            await engine.save()
        # 10 saves, the SHOW, and the ROLLBACK that closed the first reading.
        assert await sent(store) - before == 12
        stale = ContextEngine(store=store, chat_id="c", user_id="u")
        await stale.resolve()
        engine.set(user("moved on"))
        await engine.save()
        stale.set(user("grafted"))
        await stale.save()  # refused by the compare-and-swap, then grafted
    async with SqlContextStore(url) as other:  # another engine: what was committed
        reader = ContextEngine(store=other, chat_id="c", user_id="u")
        texts = [m.text for m in (await reader.resolve()).messages]
        assert texts[0] == "first" and texts[-2:] == ["moved on", "grafted"]
        assert len(texts) == 23
        # This database's connections only: other tests run on the same server meanwhile.
        [[open_transactions]] = await _my_exec(
            url,
            "SELECT COUNT(*) FROM information_schema.innodb_trx AS t "
            "JOIN information_schema.processlist AS p ON p.id = t.trx_mysql_thread_id "
            "WHERE p.db = DATABASE() AND p.id <> CONNECTION_ID()",
        )
        assert open_transactions == 0


async def test_a_page_after_a_deep_cursor_reads_one_page_of_the_index(
    store: SqlContextStore,
) -> None:
    # Left to choose, MariaDB reads a user's chats by equality on user_id and skips every chat
    # newer than the cursor row by row; the dialect holds it to the range that starts there.
    for index in range(400):
        await store.create_chat(f"c{index:03d}", user_id="many")
    for index in range(20):
        await store.create_chat(f"o{index:02d}", user_id=f"other{index}")
    [before] = await store.list_chats(user_id="many", limit=1, offset=299)
    with statements(store) as seen:
        page = await store.list_chats(user_id="many", limit=50, after=before.cursor)
    assert [chat.id for chat in page] == [f"c{index:03d}" for index in range(99, 49, -1)]
    [(statement, params)] = [(s, p) for s, p in seen if "FROM chats" in s]
    async with store.engine.connect() as conn:
        plan = (await conn.exec_driver_sql(f"ANALYZE {statement}", params)).mappings().all()
    [chats] = [row for row in plan if row["table"] == "chats"]
    assert chats["type"] == "range", plan
    assert float(chats["r_rows"]) <= 51, plan


async def test_a_search_joins_each_distinct_term_once(store: SqlContextStore) -> None:
    # A join repeating a term is a lookup of the side table per candidate for nothing.
    words = "otters hold hands while sleeping on calm water"
    await turn(store, "c", words)
    with statements(store) as seen:
        for query, joined in (
            ("otters", 1),
            ("otters otters OTTERS", 1),
            ("otters hold", 2),
            ("sleeping otters hold", 3),
            ("otters hold hands while sleeping", 4),
        ):
            seen.clear()
            hits = await store.search_messages("c", query)
            assert len(hits) == 2, query
            [statement] = [s for s, _ in seen if "message_terms" in s]
            assert statement.count("message_terms AS t") == joined, query
        assert await store.search_messages("c", "otters hold hands while swimming") == []
