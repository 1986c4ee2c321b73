"""The schema under Alembic: one head, real downgrades, models == migrations, safe concurrency."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from agentcontext import errors
from agentcontext.store import InMemoryContextStore, SqlContextStore
from agentcontext.store._db import migrate as _migrate
from agentcontext.store._db.schema import VERSION_TABLE, Base
from tests.conftest import fresh_database, through_pgbouncer
from tests.helpers import chain, run_in_threads

ROOT = Path(__file__).resolve().parents[2]
OWN_TABLES = {"chats", "messages", "branches", "checkpoints"}


@pytest.fixture
def empty_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A database with nothing in it."""
    if backend == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}"
    else:
        with fresh_database("mariadb" if backend == "mariadb" else "postgres", "acmig") as url:
            if backend == "pgbouncer":
                url = through_pgbouncer(url, request.getfixturevalue("pgbouncer_port"))
            yield url


def _tables(connection: Connection) -> set[str]:
    return set(inspect(connection).get_table_names())


def _diff(connection: Connection) -> list[object]:
    context = MigrationContext.configure(
        connection,
        opts={
            "version_table": VERSION_TABLE,
            **_migrate.comparison_options(connection.dialect.name),
            "compare_type": True,
            "compare_server_default": False,
        },
    )
    return list(compare_metadata(context, Base.metadata))


def test_there_is_a_single_head() -> None:
    script = ScriptDirectory.from_config(_migrate.make_config())
    assert len(script.get_heads()) == 1
    assert _migrate.head_revision() == script.get_current_head()
    # A store opening an up-to-date database reads the revision without importing Alembic;
    # the revision it expects is written down, and must be the packaged migrations' head.
    assert _migrate.HEAD_REVISION == script.get_current_head()


@pytest.mark.filterwarnings("ignore:autogenerate skipping metadata-specified expression")
async def test_models_and_migrations_agree(empty_url: str) -> None:
    async with SqlContextStore(empty_url) as store, store.engine.connect() as conn:
        diff = await conn.run_sync(_diff)
    assert diff == []


async def test_upgrade_downgrade_upgrade_with_data(empty_url: str) -> None:
    async with SqlContextStore(empty_url) as store:
        await store.create_chat("c", user_id="u")
        main = await store.get_active_branch("c")
        assert main is not None
        await store.append_messages(main.id, chain("c", 3), expected_head=None)
        await store.create_checkpoint("c", "cp", "m1")
        engine = store.engine
        async with engine.connect() as conn:
            assert OWN_TABLES <= await conn.run_sync(_tables)
        await _migrate.run_in_write_transaction(
            engine, lambda c: _migrate.downgrade_in_transaction(c, "base")
        )
        async with engine.connect() as conn:
            left = await conn.run_sync(_tables)
            assert not (left & OWN_TABLES)
            assert not any(name.startswith("messages_fts") for name in left)
            assert await conn.run_sync(_migrate.current_revision) is None
    async with SqlContextStore(empty_url) as store:
        assert await store.list_chats() == []
        await store.create_chat("again", user_id="u")
        main = await store.get_active_branch("again")
        assert main is not None
        await store.append_messages(main.id, chain("again", 2), expected_head=None)
        assert [r.message.id for r in await store.search_messages("again", "message 1")] == ["m1"]


async def test_migrate_false_checks_and_names_the_command(empty_url: str) -> None:
    store = SqlContextStore(empty_url, migrate=False)
    with pytest.raises(errors.SchemaOutdatedError) as caught:
        await store.list_chats()
    message = str(caught.value)
    assert "agentcontext migrate upgrade --url" in message
    assert _migrate.head_revision() in message
    await store.close()
    async with SqlContextStore(empty_url):
        pass  # migrate="auto"
    async with SqlContextStore(empty_url, migrate=False) as checked:
        assert await checked.list_chats() == []


async def test_an_unknown_newer_revision_is_reported(empty_url: str) -> None:
    async with SqlContextStore(empty_url) as store, store.engine.begin() as conn:
        await conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = 'from_the_future'"))
    with pytest.raises(errors.SchemaOutdatedError, match="newer"):
        async with SqlContextStore(empty_url) as store:
            await store.list_chats()


def test_four_processes_migrating_at_once(empty_url: str) -> None:
    script = textwrap.dedent(
        """
        import asyncio, sys
        from agentcontext.store import SqlContextStore

        async def main():
            async with SqlContextStore(sys.argv[1]) as store:
                await store.upsert_chat("shared", user_id="u")
                print(len(await store.list_chats()))

        asyncio.run(main())
        """
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, empty_url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
        assert out.strip() == "1"

    async def check() -> None:
        async with (
            SqlContextStore(empty_url, migrate=False) as store,
            store.engine.connect() as conn,
        ):
            rows = (await conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}"))).all()
        assert [r[0] for r in rows] == [_migrate.head_revision()]

    asyncio.run(check())


def test_alembic_command_line(empty_url: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def alembic(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "alembic", "-x", f"url={empty_url}", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout + done.stderr

    # alembic logs as alembic.ini says: each migration it runs is printed.
    assert "Running upgrade  -> 0001" in alembic("upgrade", "head")
    assert _migrate.head_revision() in alembic("current")
    alembic("downgrade", "base")
    assert _migrate.head_revision() not in alembic("current")
    alembic("upgrade", "head")

    async def use() -> None:
        async with SqlContextStore(empty_url, migrate=False) as store:
            await store.create_chat("c", user_id="u")

    asyncio.run(use())


async def test_unreachable_postgres_fails_fast_with_a_hidden_password() -> None:
    url = "postgresql+asyncpg://agent:s3cr3t-pw@127.0.0.1:1/nowhere"
    store = SqlContextStore(url, connect_timeout=3)
    started = time.monotonic()
    with pytest.raises(errors.StoreUnavailableError) as caught:
        await store.list_chats()
    assert time.monotonic() - started < 15
    assert "s3cr3t-pw" not in str(caught.value)
    assert "***" in str(caught.value)
    assert "s3cr3t-pw" not in repr(store)
    await store.close()


async def test_unopenable_sqlite_path_is_unavailable(tmp_path: Path) -> None:
    store = SqlContextStore(f"sqlite+aiosqlite:///{tmp_path / 'missing-dir' / 'x.db'}")
    with pytest.raises(
        errors.StoreUnavailableError, match="cannot open the SQLite database"
    ) as caught:
        await store.initialize()
    assert "server" not in str(caught.value)  # a file has no server to check
    await store.close()


async def test_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 100)
    store = SqlContextStore(f"sqlite+aiosqlite:///{path}")
    with pytest.raises(errors.StoreError, match="not a valid SQLite database"):
        await store.initialize()
    await store.close()
    assert path.read_bytes() == b"this is not sqlite" * 100


async def test_an_empty_existing_file_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    async with SqlContextStore(f"sqlite+aiosqlite:///{path}") as store:
        await store.create_chat("c", user_id="u")
        assert [c.id for c in await store.list_chats()] == ["c"]


async def test_the_store_closes_only_an_engine_it_created(tmp_path: Path) -> None:
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'own.db'}")
    async with SqlContextStore(engine) as store:
        await store.create_chat("c", user_id="u")
    async with engine.connect() as conn:
        assert await conn.scalar(text("SELECT count(*) FROM chats")) == 1
        # The store's pragmas apply to connections of an engine it was given, too.
        assert await conn.scalar(text("PRAGMA foreign_keys")) == 1
        assert await conn.scalar(text("PRAGMA journal_mode")) == "wal"
    await engine.dispose()
    with pytest.raises(errors.StoreError, match="closed"):
        await store.list_chats()


async def test_sqlite_synchronous_option(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'sync.db'}"
    for option, pragma in ((None, 1), ("normal", 1), ("full", 2), ("FULL", 2)):
        options = {} if option is None else {"sqlite_synchronous": option}
        async with SqlContextStore(url, **options) as store:
            await store.upsert_chat("c", user_id="u")
            async with store.engine.connect() as conn:
                assert await conn.scalar(text("PRAGMA synchronous")) == pragma
            await store.add_messages(chain("c", 2, prefix=f"{option}-"))
    for bad in ("off", "extra", 2, None):
        with pytest.raises(errors.InvalidInputError, match="sqlite_synchronous"):
            SqlContextStore(url, sqlite_synchronous=bad)


async def test_an_engine_you_built_is_used_for_every_call(store_url: str) -> None:
    # Its connect_args (ssl, a search_path, ...) are invisible from its URL, so on PostgreSQL
    # the store never opens connections of its own beside it; a plain SQLite file is safe.
    url = make_url(store_url)
    pooled = url.query.get("pgbouncer") == "true"  # as one would build it behind PgBouncer:
    engine = create_async_engine(
        url.difference_update_query(["pgbouncer"]),
        connect_args={"statement_cache_size": 0, "prepared_statement_cache_size": 0}
        if pooled
        else {},
    )
    try:
        async with SqlContextStore(engine, pgbouncer=pooled) as store:
            await store.create_chat("c", user_id="u")
            main = await store.get_active_branch("c")
            assert main is not None
            appended = await store.append_messages(main.id, chain("c", 3), expected_head=None)
            assert appended.ok
            assert len(await store.get_message_chain(appended.head_message_id or "")) == 3
            assert len(await store.search_messages("c", "message")) == 3
    finally:
        await engine.dispose()


async def test_bad_urls_are_named() -> None:
    with pytest.raises(errors.InvalidInputError, match="SQLite, PostgreSQL, MariaDB/MySQL"):
        SqlContextStore("mssql+aioodbc://root@localhost/db")
    with pytest.raises(errors.InvalidInputError, match="asyncmy or aiomysql"):
        SqlContextStore("mysql+pymysql://root@localhost/db")
    with pytest.raises(errors.InvalidInputError, match="aiosqlite"):
        SqlContextStore("sqlite:///x.db")
    with pytest.raises(errors.InvalidInputError, match="parse"):
        SqlContextStore("not a url")
    with pytest.raises(errors.InvalidTypeError):
        SqlContextStore(42)  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidInputError):
        SqlContextStore("sqlite+aiosqlite://", migrate="sometimes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "url",
    [
        "sqlite+aiosqlite:///x.db?timeout=soon",
        "postgresql+asyncpg://user:secret@localhost/db?prepared_statement_cache_size=many",
        "mysql+asyncmy://user:secret@localhost/db?read_timeout=soon",
    ],
)
def test_a_driver_setting_of_the_wrong_type_is_named(url: str) -> None:
    # SQLAlchemy reads the URL's query as the driver's settings when it makes the engine:
    # a value of the wrong type is the caller's input, not a raw ValueError.
    with pytest.raises(errors.InvalidInputError, match="query parameters") as caught:
        SqlContextStore(url)
    assert "secret" not in str(caught.value)
    with pytest.raises(errors.InvalidInputError, match="engine_options"):
        SqlContextStore(url.split("?")[0], engine_options={"no_such_option": 1})


async def test_stores_of_several_new_databases_opened_at_once_all_migrate(
    tmp_path: Path,
) -> None:
    """Alembic keeps the migration it runs in module globals: migrations interleaved in one
    event loop (a file per tenant, opened together) ran their steps in each other's database
    ('table chats already exists', or a KeyError 'config'). They now run one at a time."""

    async def open_one(index: int) -> int:
        async with SqlContextStore(f"sqlite+aiosqlite:///{tmp_path / f'tenant{index}.db'}") as s:
            await s.create_chat(f"c{index}", user_id="u")
            return len(await s.list_chats())

    assert await asyncio.gather(*(open_one(index) for index in range(4))) == [1, 1, 1, 1]
    for index in range(4):
        async with SqlContextStore(
            f"sqlite+aiosqlite:///{tmp_path / f'tenant{index}.db'}", migrate=False
        ) as store:
            assert [chat.id for chat in await store.list_chats()] == [f"c{index}"]


def test_stores_of_new_databases_opened_at_once_in_threads_all_migrate(tmp_path: Path) -> None:
    """The same across threads, each with an event loop of its own (``asyncio.run`` per
    worker thread): the migrations ran each other's steps ('config', 'script') or hung on a
    connection of another loop ('bound to a different event loop'), until they took turns
    in the process, not only in a loop."""
    failures: list[str] = []

    def worker(index: int) -> None:
        async def open_one() -> None:
            url = f"sqlite+aiosqlite:///{tmp_path / f'thread{index}.db'}"
            async with SqlContextStore(url) as store:
                await store.create_chat(f"c{index}", user_id="u")

        try:
            asyncio.run(open_one())
        except Exception as exc:  # every failure is reported below
            failures.append(f"{index}: {type(exc).__name__}: {exc}")

    assert not run_in_threads(worker, range(6)), "a migration hung"
    assert failures == []

    async def chats(index: int) -> list[str]:
        url = f"sqlite+aiosqlite:///{tmp_path / f'thread{index}.db'}"
        async with SqlContextStore(url, migrate=False) as store:
            return [chat.id for chat in await store.list_chats()]

    for index in range(6):
        assert asyncio.run(chats(index)) == [f"c{index}"]


def _migrate_in_child(path: str) -> None:
    async def open_one() -> None:
        async with SqlContextStore(f"sqlite+aiosqlite:///{path}") as store:
            await store.create_chat("forked", user_id="u")

    asyncio.run(open_one())


def test_a_process_forked_while_another_thread_migrates_can_migrate(tmp_path: Path) -> None:
    """The process's migration lock, held by a thread of the parent when it forks, is not
    held in the child (which has no such thread): the child's migrations run."""
    migrating = _migrate._MIGRATING
    assert migrating.acquire(blocking=False)
    try:
        child = multiprocessing.get_context("fork").Process(
            target=_migrate_in_child, args=(str(tmp_path / "child.db"),)
        )
        child.start()
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
            child.join()
    finally:
        migrating.release()
    assert child.exitcode == 0


async def test_in_memory_store_is_isolated_and_serialises_transactions() -> None:
    async with InMemoryContextStore() as one, InMemoryContextStore() as two:
        await one.create_chat("c", user_id="u")
        assert await two.get_chat("c") is None
        main = await one.get_active_branch("c")
        assert main is not None

        async def add(i: int) -> None:
            await one.add_messages(chain("c", 3, prefix=f"p{i}-"))

        await asyncio.gather(*(add(i) for i in range(10)))
        info = await one.list_chats()
        assert info[0].message_count == 30


async def test_sqlite_search_index_pages_are_small(tmp_path: Path) -> None:
    """Revision 0013 sets FTS5's page size (what each merge quantum costs a writer); down to
    0012 it is FTS5's default again, and messages indexed under either size are found."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'pages.db'}"

    async def page_size(engine: AsyncEngine) -> int | None:
        async with engine.connect() as conn:
            found = await conn.scalar(text("SELECT v FROM messages_fts_config WHERE k = 'pgsz'"))
            return None if found is None else int(found)

    async with SqlContextStore(url) as store:
        assert await page_size(store.engine) == 1000
        await store.upsert_chat("c", user_id="u")
        await store.add_messages(chain("c", 3, prefix="new-"))
        await _migrate.run_in_write_transaction(
            store.engine, lambda c: _migrate.downgrade_in_transaction(c, "0012")
        )
        assert await page_size(store.engine) == 4050
        async with store.engine.connect() as conn:
            assert await conn.run_sync(_migrate.current_revision) == "0012"
    async with SqlContextStore(url) as store:
        assert await page_size(store.engine) == 1000
        await store.add_messages(chain("c", 2, prefix="again-"))
        found = await store.search_messages("c", "message 1")
        assert sorted(r.message.id for r in found) == ["again-1", "new-1"]
