"""Tenant schemas: ``SqlContextStore(url, schema="acme")`` keeps every table, index and the
Alembic version table in that PostgreSQL schema, or that MariaDB database of the server
(created under ``migrate="auto"``), and two
stores on two schemas of one database never see each other's chats, searches, blobs or
records — directly, through PgBouncer in transaction pooling mode, and with a caller's
engine inside ``store.using()``. On SQLite ``schema=`` is refused with advice, and so are
PostgreSQL's system schemas and libpq's ``options=-csearch_path=...`` (with the ``schema=`` to
pass instead), when the store is made.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import make_url, text
from sqlalchemy.ext.asyncio import create_async_engine

from agentcontext import (
    ContextEngine,
    ContextSnapshot,
    InvalidInputError,
    SchemaOutdatedError,
    SqlContextStore,
    assistant_text,
    user,
)
from agentcontext.snapshots import SelectionStrategy
from tests.conftest import (
    _my_exec,
    fresh_database,
    run_sync,
    through_pgbouncer,
)

ROOT = Path(__file__).resolve().parents[2]
TENANTS = ("tenant_a", "tenant_b", "tenant_c", "tenant_d", "tenant_cli", "tenant_x")


@contextmanager
def server_database(server: str) -> Iterator[str]:
    """A fresh database of a server; on MariaDB, where a schema is a database of the server,
    the tenants' databases the tests make are dropped after it."""
    with fresh_database(server, "actenant") as url:
        try:
            yield url
        finally:
            if server == "mariadb":
                drops = [f"DROP DATABASE IF EXISTS `{name}`" for name in TENANTS]
                run_sync(lambda: _my_exec(url, *drops))


@pytest.fixture(params=["postgres", "pgbouncer", "mariadb"])
def tenant_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database (its default schema empty): PostgreSQL, directly or through PgBouncer,
    or MariaDB."""
    with server_database("mariadb" if request.param == "mariadb" else "postgres") as url:
        if request.param == "pgbouncer":
            yield through_pgbouncer(url, request.getfixturevalue("pgbouncer_port"))
        else:
            yield url


def default_schema(url: str) -> str:
    """Where unqualified tables go: PostgreSQL's public schema, MariaDB's database of the URL."""
    return make_url(url).database or "" if url.startswith("mysql") else "public"


async def tables_of(url: str, schema: str) -> set[str]:
    engine = create_async_engine(url.split("?")[0])
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                text("SELECT table_name FROM information_schema.tables WHERE table_schema = :s"),
                {"s": schema},
            )
            return {row[0] for row in rows}
    finally:
        await engine.dispose()


async def fill(store: SqlContextStore, word: str) -> str:
    engine = ContextEngine(store=store, chat_id="shared-id", user_id="u")
    engine.set(user(f"the {word} question", id=f"{word}-q"), assistant_text(f"{word} answer"))
    await engine.save()
    snapshot = ContextSnapshot(selection=SelectionStrategy.EXPLICIT)
    snapshot.add_snippet(f"{word}.txt", f"{word} content")
    await engine.snapshot(snapshot)
    result = await engine.resolve(record=True)
    assert result.record_id is not None
    return result.record_id


async def test_two_tenant_schemas_side_by_side_see_only_their_own(tenant_url: str) -> None:
    async with (
        SqlContextStore(tenant_url, schema="tenant_a") as a,
        SqlContextStore(tenant_url, schema="tenant_b") as b,
    ):
        record_a = await fill(a, "apple")
        record_b = await fill(b, "banana")
        for store, mine, theirs, record, other in (
            (a, "apple", "banana", record_a, record_b),
            (b, "banana", "apple", record_b, record_a),
        ):
            chats = await store.list_chats()
            assert [c.id for c in chats] == ["shared-id"] and chats[0].message_count == 2
            texts = [m.text for m in await ContextEngine(
                store=store, chat_id="shared-id", user_id="u"
            ).get_messages()]  # fmt: skip
            assert texts == [f"the {mine} question", f"{mine} answer"]
            assert len(await store.search_messages("shared-id", mine)) == 2
            assert await store.search_messages("shared-id", theirs) == []
            assert await store.search_user_messages("u", theirs) == []
            snapshots = await store.list_snapshots("shared-id")
            assert [i.path for i in snapshots[0].items] == [f"{mine}.txt"]
            assert await store.get_resolve_record(record) is not None
            assert await store.get_resolve_record(other) is None
    expected = {"chats", "messages", "branches", "checkpoints", "agentcontext_version"}
    for schema in ("tenant_a", "tenant_b"):
        assert expected <= await tables_of(tenant_url, schema)
    assert await tables_of(tenant_url, default_schema(tenant_url)) == set()


async def test_a_callers_engine_writes_a_turn_into_the_tenant_schema(tenant_url: str) -> None:
    async with SqlContextStore(tenant_url, schema="tenant_c") as store:
        await store.initialize()
        engine = ContextEngine(store=store, chat_id="c", user_id="u")
        if "pgbouncer" in tenant_url:
            app = SqlContextStore(tenant_url).engine  # the options a pooled client needs
        else:
            app = create_async_engine(tenant_url)
        try:
            async with app.begin() as conn, store.using(conn):
                engine.set(user("inside the caller's transaction", id="in"))
                await engine.save()
            async with app.connect() as conn:
                found = await conn.scalar(text("SELECT count(*) FROM tenant_c.messages"))
            assert found == 1
        finally:
            await app.dispose()
        assert [m.id for m in await engine.get_messages()] == ["in"]
    assert "messages" not in await tables_of(tenant_url, default_schema(tenant_url))


async def test_an_unmigrated_tenant_schema_says_how_to_create_it(tenant_url: str) -> None:
    store = SqlContextStore(tenant_url, schema="tenant_d", migrate=False)
    try:
        with pytest.raises(SchemaOutdatedError, match="--schema tenant_d"):
            await store.initialize()
    finally:
        await store.close()


@pytest.mark.parametrize("server", ["postgres", "mariadb"])
def test_the_command_line_and_alembic_migrate_a_tenant_schema(tmp_path: Path, server: str) -> None:
    with server_database(server) as url:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        done = subprocess.run(
            [sys.executable, "-m", "agentcontext", "--url", url, "migrate", "upgrade",
             "--schema", "tenant_cli"],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        done = subprocess.run(
            [sys.executable, "-m", "alembic", "-x", f"url={url}", "-x", "schema=tenant_x",
             "upgrade", "head"],
            capture_output=True, text=True, env=env, timeout=120, cwd=ROOT,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        import asyncio

        async def check() -> None:
            for schema in ("tenant_cli", "tenant_x"):
                async with SqlContextStore(url, schema=schema, migrate=False) as store:
                    await store.initialize()  # up to date: no SchemaOutdatedError
                    await store.create_chat("c", user_id="u")
                assert "agentcontext_version" in await tables_of(url, schema)

        asyncio.run(check())


def test_sqlite_refuses_a_schema_with_advice(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="file of its own"):
        SqlContextStore(f"sqlite+aiosqlite:///{tmp_path / 'x.db'}", schema="acme")


@pytest.mark.parametrize("name", ["Acme", "1st", "pg_catalog", "a-b", "x" * 64, ""])
def test_a_schema_name_is_checked(name: str) -> None:
    with pytest.raises(InvalidInputError, match="schema name"):
        SqlContextStore("postgresql+asyncpg://u@localhost/db", schema=name)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("pg_catalog", "reserves names starting with 'pg_'"),
        ("pg_toast", "reserves names starting with 'pg_'"),
        ("pg_temp_1", "reserves names starting with 'pg_'"),
        ("pg_acme", "reserves names starting with 'pg_'"),
        ("information_schema", "system schema"),
    ],
)
def test_system_schemas_are_refused_when_the_store_is_made(name: str, reason: str) -> None:
    # The server is never reached: the name is refused before any connection.
    with pytest.raises(InvalidInputError, match=reason) as refused:
        SqlContextStore("postgresql+asyncpg://u@127.0.0.1:1/db", schema=name)
    assert name in str(refused.value) and "tenant_acme" in str(refused.value)


@pytest.mark.parametrize(
    ("url", "connect_args"),
    [
        ("postgresql+asyncpg://u@127.0.0.1:1/db?options=-csearch_path%3Dacme", None),
        ("postgresql+asyncpg://u@127.0.0.1:1/db?options=-c%20search_path%3Dacme,public", None),
        ("postgresql+asyncpg://u@127.0.0.1:1/db", {"options": "-c search_path=acme"}),
    ],
)
def test_a_search_path_in_libpq_options_points_to_the_schema_option(
    url: str, connect_args: dict[str, str] | None
) -> None:
    with pytest.raises(InvalidInputError) as refused:
        SqlContextStore(url, connect_args=connect_args)
    message = str(refused.value)
    assert "schema='acme'" in message and "--schema acme" in message
    assert "unexpected keyword" not in message


def test_other_libpq_options_are_refused_with_the_asyncpg_way() -> None:
    with pytest.raises(InvalidInputError, match="server_settings"):
        SqlContextStore("postgresql+asyncpg://u@127.0.0.1:1/db?options=-c%20statement_timeout%3D5s")
    # Read replicas are made with the same checks.
    with pytest.raises(InvalidInputError, match="schema='acme'"):
        SqlContextStore(
            "postgresql+asyncpg://u@127.0.0.1:1/db",
            read_replicas=["postgresql+asyncpg://u@127.0.0.1:2/db?options=-csearch_path%3Dacme"],
        )


@pytest.mark.parametrize(
    ("url", "connect_args"),
    [
        ("postgresql+asyncpg://u@127.0.0.1:1/db?bogus=1", None),
        ("postgresql+asyncpg://u@127.0.0.1:1/db?sslmode=require&bogus=1", None),
        ("postgresql+asyncpg://u@127.0.0.1:1/db", {"statement_timeout": 5}),
    ],
)
def test_an_argument_asyncpg_does_not_take_is_refused_when_the_store_is_made(
    url: str, connect_args: dict[str, object] | None
) -> None:
    """Before, the store was made, and its first call failed with a generic database error
    ("connect() got an unexpected keyword argument")."""
    with pytest.raises(InvalidInputError, match="takes no argument") as refused:
        SqlContextStore(url, connect_args=connect_args)
    assert "unexpected keyword" not in str(refused.value)
    # What asyncpg and SQLAlchemy's adapter do take is accepted.
    SqlContextStore(
        "postgresql+asyncpg://u@127.0.0.1:1/db?ssl=require&prepared_statement_cache_size=0",
        connect_args={"server_settings": {"application_name": "x"}, "command_timeout": 5},
    )
