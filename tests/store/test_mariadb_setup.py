"""What a MariaDB store refuses up front, and the settings it copes with: a statement larger
than the server's packet, counted as the driver sends it (escapes and all); a character set
or a driver argument in the URL the store cannot use; a server in ORACLE mode; a caller's
connection in a tenant's database; a tenant database that exists already."""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncmy.converters
import pymysql.converters
import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from agentcontext import (
    ContextEngine,
    InvalidInputError,
    LocalKeyProvider,
    SqlContextStore,
    user,
)
from agentcontext._validate import MAX_MESSAGE_BYTES, dumps
from agentcontext.store._dialects import mysql_packet
from agentcontext.store._dialects.mysql_packet import (
    PACKET_NEEDED,
    PACKET_NEEDED_SEALED,
    check_packet,
    literal_size,
)
from tests.conftest import _my_exec, fresh_mariadb_database, require_mariadb
from tests.helpers import msg_data, rec
from tests.store.conftest import SMALL_PACKET
from tests.store.test_mariadb import turn


@pytest.fixture
def url() -> Iterator[str]:
    require_mariadb()
    with fresh_mariadb_database("acsetup") as made:
        yield made


# --- packets -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "\x01" * (640 * 1024),  # JSON 3.75 MiB (\u0001), 4.4 MiB as sent (\\u0001)
        "\\" * (1100 * 1024),  # JSON 2.1 MiB (\\), 4.3 MiB as sent (\\\\)
        "'\"" * (720 * 1024),  # JSON 2.1 MiB ('\"), 4.2 MiB as sent (\'\\\")
    ],
    ids=["control characters", "backslashes", "quotes"],
)
@pytest.mark.parametrize("path", ["statement", "one-by-one", "upsert"])
async def test_a_statement_is_counted_as_the_driver_sends_it(
    small_packet_url: str, text: str, path: str
) -> None:
    """A message whose JSON fits in the packet but whose statement, as the driver escapes it,
    does not: refused up front with the setting that would take it (the server would drop the
    connection, and the store would report it unreachable), nothing written."""
    url, small_packet = small_packet_url, SMALL_PACKET
    async with SqlContextStore(url) as store:
        await turn(store, "c", "small")
        if path == "one-by-one":
            store.db.dialect.compound_append = False  # type: ignore[attr-defined]
        engine = ContextEngine(store=store, chat_id="c", user_id="u")
        await engine.resolve()
        counts = "SELECT (SELECT COUNT(*) FROM messages), (SELECT COUNT(*) FROM message_terms)"
        before = await _my_exec(url, counts)
        if path == "upsert":
            branch = await store.get_active_branch("c")
            assert branch is not None
            big = rec("big", "c", branch.head_message_id, data=msg_data(text))
            with pytest.raises(InvalidInputError, match="max_allowed_packet") as caught:
                await store.add_messages([big])
        else:
            engine.set(user(text))
            with pytest.raises(InvalidInputError, match="max_allowed_packet") as caught:
                await engine.save()
        message = str(caught.value)
        assert f"max_allowed_packet = {small_packet}" in message
        setting = _named(message)
        assert small_packet < setting < 6 * 2**20
        assert f"{setting // 2**20}M" in message and str(PACKET_NEEDED) in message
        assert await _my_exec(url, counts) == before
        # The connection was not lost: the next save lands on the first try.
        fresh = ContextEngine(store=store, chat_id="c", user_id="u")
        fresh.set(user("after"))
        await fresh.save()
        assert [m.text for m in (await fresh.resolve()).messages][-1] == "after"


async def test_a_statement_that_fits_as_sent_is_stored(small_packet_url: str) -> None:
    """Counted as sent, not refused for more than it takes: control characters up to the
    packet but for the statement's room."""
    url, small_packet = small_packet_url, SMALL_PACKET
    text = "\x01" * ((small_packet - 100 * 1024) // 7)
    async with SqlContextStore(url) as store:
        engine = ContextEngine(store=store, chat_id="c", user_id="u")
        engine.set(user(text))
        await engine.save()
        assert (await engine.get_messages())[0].text == text


async def test_a_message_too_large_for_the_server_names_a_larger_setting(
    small_packet_url: str,
) -> None:
    """At the server's own setting, a message of control characters over it is refused
    naming a setting above it (never the one the server has)."""
    url = small_packet_url
    [[limit]] = await _my_exec(url, "SELECT @@GLOBAL.max_allowed_packet")
    if limit // 6 > MAX_MESSAGE_BYTES - 100:
        pytest.skip(f"the server takes any message (max_allowed_packet = {limit})")
    async with SqlContextStore(url) as store:
        engine = ContextEngine(store=store, chat_id="c", user_id="u")
        engine.set(user("\x01" * (limit // 6 + 1)))  # 6 bytes of JSON each: more than the limit
        with pytest.raises(InvalidInputError, match="max_allowed_packet") as caught:
            await engine.save()
        assert _named(str(caught.value)) > limit
        assert await _my_exec(url, "SELECT COUNT(*) FROM messages") == [(0,)]


async def test_an_encrypted_store_names_the_setting_it_needs(
    small_packet_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Sealed JSON is sent in hexadecimal digits: an encrypted store asks for 256M."""
    url, small_packet = small_packet_url, SMALL_PACKET
    async with (
        LocalKeyProvider(secrets.token_bytes(32), tmp_path / "keyring.db") as provider,
        SqlContextStore(url, encryption=provider) as store,
    ):
        with caplog.at_level(logging.WARNING, logger="agentcontext"):
            await store.initialize()
        assert f"Raise max_allowed_packet to {PACKET_NEEDED_SEALED} (256M)" in caplog.text
        engine = ContextEngine(store=store, chat_id="c", user_id="u")
        engine.set(user("a" * (small_packet * 6 // 10)))  # twice as many hex digits
        with pytest.raises(InvalidInputError, match="max_allowed_packet") as caught:
            await engine.save()
        assert f"or to {PACKET_NEEDED_SEALED} (256M)" in str(caught.value)
        assert await _my_exec(url, "SELECT COUNT(*) FROM messages") == [(0,)]


def test_a_string_is_counted_as_the_drivers_escape_it() -> None:
    for text in ["plain", "", "é😀中", "\x00\n\r\x1a\\'\"", "\\u0001" * 10, "a'b\"c\\d\x1a"]:
        for escape in (asyncmy.converters.escape_string, pymysql.converters.escape_string):
            assert literal_size(text) == len(escape(text).encode()) + 2  # (in quotes)


def test_the_packet_named_takes_the_largest_message() -> None:
    """16 MiB of control characters, each 6 bytes of JSON (\\u0001) sent as 7: under
    PACKET_NEEDED with room for the statement; sealed (hex of the JSON), under
    PACKET_NEEDED_SEALED."""
    data = msg_data("\x01" * (MAX_MESSAGE_BYTES - 100))
    json = dumps(data)
    assert literal_size(json) > 7 * (MAX_MESSAGE_BYTES - 100)
    assert literal_size(json) + 256 * 1024 < PACKET_NEEDED
    assert 2 * (len(json.encode()) + 64) + 256 * 1024 < PACKET_NEEDED_SEALED
    assert PACKET_NEEDED == 128 * 2**20 and PACKET_NEEDED_SEALED <= 2**30


class _Connection:
    """What `check_packet` reads of a connection: the server's limit, read when it opened."""

    def __init__(self, limit: int) -> None:
        self.info = {"max_allowed_packet": limit}


def _refusal(limit: int, values: list[object]) -> str:
    conn: Any = _Connection(limit)
    with pytest.raises(InvalidInputError) as caught:
        check_packet(conn, values, rows=len(values), needed=PACKET_NEEDED)
    return str(caught.value)


def _named(message: str) -> int:
    found = re.search(r"raise max_allowed_packet to (\d+)", message)
    assert found is not None, message
    return int(found[1])


def test_the_setting_named_takes_the_statement_and_is_more_than_the_server_has() -> None:
    """12 MiB of control characters at the 64M the store once asked for: the setting named is
    what this statement takes (more than 64M), then the one that takes any message."""
    json = dumps(msg_data("\x01" * (12 * 2**20)))
    message = _refusal(64 * 2**20, [json])
    assert 64 * 2**20 < _named(message) <= literal_size(json) + 2**20
    assert f"or to {PACKET_NEEDED} (128M)" in message and "nothing was written" in message
    # At PACKET_NEEDED already, two such messages in one save: their own size, no 128M.
    message = _refusal(PACKET_NEEDED, [json, json])
    assert _named(message) > PACKET_NEEDED
    assert "(128M)" not in message and "a few at a time" in message


def test_a_statement_no_setting_takes_says_to_split(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mysql_packet, "PACKET_MAX", 8 * 2**20)
    message = _refusal(4 * 2**20, [dumps(msg_data("\x01" * 2 * 2**20))])
    assert "no setting of the server" in message and "split the message" in message


# --- the URL -----------------------------------------------------------------------------------


@pytest.mark.parametrize("charset", ["utf8", "latin1", "utf8mb3"])
async def test_a_charset_other_than_utf8mb4_is_refused_when_the_store_is_made(
    url: str, charset: str
) -> None:
    with pytest.raises(InvalidInputError, match=f"charset={charset}: .*utf8mb4") as caught:
        SqlContextStore(f"{url}?charset={charset}")
    assert "drop charset from the URL's query" in str(caught.value)
    assert make_url(url).render_as_string(hide_password=True) in str(caught.value)
    with pytest.raises(InvalidInputError, match="connect_args"):
        SqlContextStore(url, connect_args={"charset": charset})
    # utf8mb4, in any case, is what the store sets anyway.
    for given in ("utf8mb4", "UTF8MB4"):
        async with SqlContextStore(f"{url}?charset={given}") as store:
            engine = ContextEngine(store=store, chat_id=f"emoji 😀 {given}", user_id="u")
            engine.set(user("emoji 😀"))
            await engine.save()
            assert (await engine.get_messages())[0].text == "emoji 😀"


@pytest.mark.parametrize("driver", ["mysql+asyncmy", "mysql+aiomysql"])
async def test_a_driver_argument_the_driver_does_not_take_is_refused_when_the_store_is_made(
    url: str, driver: str
) -> None:
    given = make_url(url).set(drivername=driver).render_as_string(hide_password=False)
    for query in ("?bogus=1", "?ssl_mode=REQUIRED", "?connect_timeout=5&bogus=1"):
        with pytest.raises(InvalidInputError, match=r"'bogus'|'ssl_mode'") as caught:
            SqlContextStore(given + query)
        message = str(caught.value)
        assert "remove it from the URL's query" in message
        assert make_url(given).render_as_string(hide_password=True) in message  # (no password)
        assert driver.split("+")[1] in message
    with pytest.raises(InvalidInputError, match=r"'bogus'.*connect_args"):
        SqlContextStore(given, connect_args={"bogus": 1})
    # What the driver takes works, from the URL and from connect_args.
    fine = make_url(given).update_query_dict(
        {"connect_timeout": "5", "init_command": "SET @agentcontext_test = 1"}
    )
    async with SqlContextStore(fine, connect_args={"read_default_group": None}) as store:
        await turn(store, "c", "fine")
        assert len(await store.get_messages("c")) == 2


# --- the session ---------------------------------------------------------------------------------


async def test_a_server_in_oracle_mode_stores_and_reads(url: str) -> None:
    """MariaDB's ORACLE mode parses another language (the compound statement of a save would
    not parse): the store's connections leave it, and keep the rest of the server's mode."""
    oracle = {"init_command": "SET SESSION sql_mode = 'ORACLE'"}
    async with SqlContextStore(url, connect_args=oracle) as store:
        await turn(store, "c", "oracle")
        await turn(store, "c", "again")
        hits = await store.search_messages("c", "oracle")
        assert len(hits) == 2
        async with store.engine.connect() as conn:
            mode = (await conn.exec_driver_sql("SELECT @@SESSION.sql_mode")).scalar_one()
        modes = set(mode.split(","))
        assert "ORACLE" not in modes
        assert {"ANSI_QUOTES", "PIPES_AS_CONCAT", "STRICT_TRANS_TABLES"} <= modes
    async with SqlContextStore(url) as plain:
        engine = ContextEngine(store=plain, chat_id="c", user_id="u")
        texts = [m.text for m in (await engine.resolve()).messages]
        assert texts == ["oracle?", "oracle.", "again?", "again."]


async def test_a_server_that_reads_empty_strings_as_null_keeps_them(url: str) -> None:
    """Under ``EMPTY_STRING_IS_NULL`` an empty title read back as none (SQLite and PostgreSQL
    give it back): the store's connections leave that mode too."""
    mode = {"init_command": "SET SESSION sql_mode = 'EMPTY_STRING_IS_NULL,STRICT_TRANS_TABLES'"}
    async with SqlContextStore(url, connect_args=mode) as store:
        await store.create_chat("c", user_id="u", title="")
        found = await store.get_chat("c")
        assert found is not None and found.title == ""
        assert [chat.title for chat in await store.list_chats()] == [""]


# --- tenants -------------------------------------------------------------------------------------


@pytest.fixture
def tenant() -> Iterator[str]:
    """A database of the server for a tenant, made beforehand (as an operator would)."""
    with fresh_mariadb_database("actenant") as made:
        yield make_url(made).database  # type: ignore[misc]


@pytest.fixture
async def tenant_store(url: str, tenant: str) -> AsyncIterator[SqlContextStore]:
    async with SqlContextStore(url, schema=tenant) as store:
        yield store


async def test_a_tenant_database_that_exists_is_migrated_without_a_warning(
    url: str, tenant: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        async with SqlContextStore(url, schema=tenant) as store:
            await turn(store, "c", "tenant")
    assert not [r.getMessage() for r in caplog.records if "database exists" in r.getMessage()]
    tables = await _my_exec(
        url, f"SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = '{tenant}'"
    )
    assert tables[0][0] > 5


async def test_a_caller_connection_in_the_tenant_database_joins(
    url: str, tenant: str, tenant_store: SqlContextStore
) -> None:
    """A tenant store names its tables in its database: a caller's connection whose URL
    opens that database (or the store's URL's) is a connection to the store's tables."""
    await turn(tenant_store, "c", "first")
    for database in (tenant, make_url(url).database):
        caller = create_async_engine(make_url(url).set(database=database))
        try:
            engine = ContextEngine(store=tenant_store, chat_id="c", user_id="u")
            await engine.resolve()
            async with caller.connect() as conn:
                await conn.begin()
                async with tenant_store.using(conn):
                    engine.set(user(f"rolled back in {database}"))
                    await engine.save()
                await conn.rollback()
            async with caller.begin() as conn, tenant_store.using(conn):
                engine = ContextEngine(store=tenant_store, chat_id="c", user_id="u")
                await engine.resolve()
                engine.set(user(f"kept in {database}"))
                await engine.save()
        finally:
            await caller.dispose()
    texts = [
        m.text
        for m in await ContextEngine(store=tenant_store, chat_id="c", user_id="u").get_messages()
    ]
    assert texts == ["first?", "first.", f"kept in {tenant}", f"kept in {make_url(url).database}"]
    # The URL's own database holds none of the tenant's rows.
    assert await _my_exec(url, "SHOW TABLES") == []


async def test_every_statement_too_large_for_the_server_is_refused_before_it_is_sent(
    url: str,
) -> None:
    """Not only messages: a chat's metadata or a blob over ``max_allowed_packet`` made the
    server drop the connection, reported as "cannot reach the database". Now the statement
    is refused before it is sent, naming the setting, and nothing is written. (The store's
    one connection is told a 4 MiB limit, as a server of that setting would tell it.)"""
    async with SqlContextStore(url, pool_size=1, max_overflow=0) as store:
        async with store.engine.connect() as conn:
            (await conn.get_raw_connection()).info["max_allowed_packet"] = 4 * 2**20
        calls = {
            "create_chat": lambda: store.create_chat(
                "big",
                user_id="u",
                metadata={"k": "\x01" * 700_000},  # 6 bytes of JSON each
            ),
            "put_blob": lambda: store.put_blob(b"\\" * 3_000_000),  # each byte escaped
        }
        for name, call in calls.items():
            with pytest.raises(InvalidInputError, match="max_allowed_packet") as caught:
                await call()
            assert "cannot reach" not in str(caught.value), name
        assert await store.get_chat("big") is None
        await store.create_chat("small", user_id="u", metadata={"k": "\x01" * 1000})
        assert (await store.get_chat("small")) is not None
