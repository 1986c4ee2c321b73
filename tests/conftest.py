"""Shared fixtures: every store test runs against a real SQLite file, a real PostgreSQL and
a real MariaDB.

PostgreSQL comes from ``AGENTCONTEXT_TEST_POSTGRES_URL`` (an admin URL used to create the test
databases; default ``postgresql+asyncpg://postgres@127.0.0.1:5432/postgres``), MariaDB (or
MySQL) from ``AGENTCONTEXT_TEST_MARIADB_URL`` (default
``mysql+asyncmy://root@127.0.0.1:3306/``; its user creates and drops databases). Without a
reachable server its tests are skipped with the reason shown, except when ``CI=true``: then
they fail.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from agentcontext.store import SqlContextStore

DEFAULT_PG = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
DEFAULT_MARIADB = "mysql+asyncmy://root@127.0.0.1:3306/"
BACKENDS = ["sqlite", "postgres", "mariadb"]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pg_admin_url() -> str:
    return os.environ.get("AGENTCONTEXT_TEST_POSTGRES_URL", DEFAULT_PG)


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def _pg_exec(url: str, *statements: str) -> None:
    conn = await asyncpg.connect(_dsn(url), timeout=5)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


_pg_state: dict[str, str | None] = {}


def run_sync(coro_factory: Any) -> Any:
    """Run a coroutine to completion, also from inside a running event loop (in a thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro_factory())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(coro_factory())).result()


def postgres_unavailable() -> str | None:
    """None when PostgreSQL answers, else the reason (checked once per session)."""
    if "reason" not in _pg_state:
        try:
            run_sync(lambda: _pg_exec(pg_admin_url(), "SELECT 1"))
            _pg_state["reason"] = None
        except Exception as exc:
            _pg_state["reason"] = (
                f"PostgreSQL is not reachable at {make_url(pg_admin_url()).render_as_string()}: "
                f"{type(exc).__name__}: {exc}"
            )
    return _pg_state["reason"]


def require_postgres() -> None:
    reason = postgres_unavailable()
    if reason is None:
        return
    if IN_CI:
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason)


def create_pg_database(prefix: str = "actest") -> str:
    """Create an empty PostgreSQL database; returns its asyncpg URL."""
    require_postgres()
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    run_sync(lambda: _pg_exec(pg_admin_url(), f'CREATE DATABASE "{name}"'))
    return make_url(pg_admin_url()).set(database=name).render_as_string(hide_password=False)


def drop_pg_database(url: str) -> None:
    name = make_url(url).database
    run_sync(lambda: _pg_exec(pg_admin_url(), f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@contextmanager
def fresh_pg_database(prefix: str = "actest") -> Iterator[str]:
    url = create_pg_database(prefix)
    try:
        yield url
    finally:
        drop_pg_database(url)


@pytest.fixture(scope="session")
def pg_session_url() -> Iterator[str]:
    """One migrated PostgreSQL database for the whole session (tables emptied per test)."""
    url = create_pg_database("acsession")

    async def migrate() -> None:
        async with SqlContextStore(url):
            pass

    run_sync(migrate)
    yield url
    drop_pg_database(url)


PGBOUNCER = shutil.which("pgbouncer") or (
    "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def pgbouncer_port() -> Iterator[int]:
    """A PgBouncer in transaction pooling mode in front of the test PostgreSQL server."""
    require_postgres()
    if PGBOUNCER is None:
        reason = "pgbouncer is not installed (Debian package 'pgbouncer')"
        if IN_CI:
            pytest.fail(f"CI=true but {reason}", pytrace=False)
        pytest.skip(reason)
    admin = make_url(pg_admin_url())
    # Not under pytest's private tmp dir: pgbouncer may run as another user.
    work = Path(tempfile.mkdtemp(prefix="agentcontext-pgbouncer-"))
    work.chmod(0o755)
    port = _free_port()
    (work / "users.txt").write_text(f'"{admin.username or "postgres"}" ""\n')
    (work / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={admin.host or '127.0.0.1'} port={admin.port or 5432}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\n"
        f"auth_type = trust\nauth_file = {work / 'users.txt'}\n"
        # The server allows ~100 connections: keep pools small and close idle ones fast, so
        # the many short-lived test databases never exhaust it.
        "pool_mode = transaction\nmax_client_conn = 1000\ndefault_pool_size = 8\n"
        "max_db_connections = 16\nserver_idle_timeout = 2\nserver_lifetime = 60\n"
        "log_connections = 0\nlog_disconnections = 0\n"
        "ignore_startup_parameters = extra_float_digits,statement_timeout\n"
    )
    command = [PGBOUNCER, str(work / "pgbouncer.ini")]
    if os.geteuid() == 0:  # pgbouncer refuses to run as root
        shutil.chown(work, "postgres")
        for path in work.iterdir():
            shutil.chown(path, "postgres")
        command[1:1] = ["-u", "postgres"]
    # Its log goes to a file we read only on failure: an unread pipe would fill up and
    # block pgbouncer (and every client) once it has logged 64 KiB.
    log = (work / "pgbouncer.log").open("wb")
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if process.poll() is not None:
                pytest.fail(f"pgbouncer exited: {(work / 'pgbouncer.log').read_text()}")
            time.sleep(0.1)
    else:
        process.kill()
        pytest.fail("pgbouncer did not start listening")
    yield port
    process.terminate()
    process.wait(timeout=10)
    log.close()
    shutil.rmtree(work, ignore_errors=True)


def through_pgbouncer(url: str, port: int) -> str:
    """The same database, reached through PgBouncer (with the store's pgbouncer option)."""
    return (
        make_url(url)
        .set(port=port, query={"pgbouncer": "true"})
        .render_as_string(hide_password=False)
    )


# --- MariaDB / MySQL --------------------------------------------------------------------------


def mariadb_admin_url() -> str:
    return os.environ.get("AGENTCONTEXT_TEST_MARIADB_URL", DEFAULT_MARIADB)


async def _my_exec(url: str, *statements: str, results: bool = False) -> list[Any]:
    """Run statements on a connection of their own: the last one's rows (``results``: every
    statement's)."""
    import asyncmy

    given = make_url(url)
    conn = await asyncmy.connect(
        host=given.host or "127.0.0.1",
        port=given.port or 3306,
        user=given.username or "root",
        password=given.password or "",
        database=given.database or None,
        connect_timeout=5,
        autocommit=True,
    )
    found: list[Any] = []
    try:
        async with conn.cursor() as cursor:
            for statement in statements:
                await cursor.execute(statement)
                found.append(list(await cursor.fetchall() or []))
    finally:
        conn.close()
    return found if results else found[-1]


_my_state: dict[str, str | None] = {}


def mariadb_unavailable() -> str | None:
    """None when MariaDB answers, else the reason (checked once per session)."""
    if "reason" not in _my_state:
        try:
            run_sync(lambda: _my_exec(mariadb_admin_url(), "SELECT 1"))
            _my_state["reason"] = None
        except Exception as exc:
            _my_state["reason"] = (
                f"MariaDB is not reachable at "
                f"{make_url(mariadb_admin_url()).render_as_string()}: {type(exc).__name__}: {exc}"
            )
    return _my_state["reason"]


def require_mariadb() -> None:
    reason = mariadb_unavailable()
    if reason is None:
        return
    if IN_CI:
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason)


def create_mariadb_database(prefix: str = "actest") -> str:
    """Create an empty MariaDB database; returns its asyncmy URL."""
    require_mariadb()
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    run_sync(lambda: _my_exec(mariadb_admin_url(), f"CREATE DATABASE `{name}`"))
    return make_url(mariadb_admin_url()).set(database=name).render_as_string(hide_password=False)


def drop_mariadb_database(url: str) -> None:
    """Drop the database, ending first the connections still in it (a failed test's, left
    in a transaction, would make the DROP wait for their metadata locks for ever)."""
    name = make_url(url).database

    async def drop() -> None:
        rows = await _my_exec(
            mariadb_admin_url(),
            "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = "
            f"'{name}' AND ID <> CONNECTION_ID()",
        )
        for (thread,) in rows:
            with contextlib.suppress(Exception):  # it ended meanwhile
                await _my_exec(mariadb_admin_url(), f"KILL CONNECTION {int(thread)}")
        await _my_exec(mariadb_admin_url(), f"DROP DATABASE IF EXISTS `{name}`")

    run_sync(drop)


@contextmanager
def fresh_mariadb_database(prefix: str = "actest") -> Iterator[str]:
    url = create_mariadb_database(prefix)
    try:
        yield url
    finally:
        drop_mariadb_database(url)


@pytest.fixture(scope="session")
def mariadb_session_url() -> Iterator[str]:
    """One migrated MariaDB database for the whole session (tables emptied per test)."""
    url = create_mariadb_database("acsession")

    async def migrate() -> None:
        async with SqlContextStore(url):
            pass

    run_sync(migrate)
    yield url
    drop_mariadb_database(url)


async def _truncate_mariadb(url: str) -> None:
    name = make_url(url).database
    rows = await _my_exec(
        url,
        "SELECT table_name FROM information_schema.tables WHERE table_schema = "
        f"'{name}' AND table_name <> 'agentcontext_version' AND table_rows IS NOT NULL",
    )
    statements = ["SET FOREIGN_KEY_CHECKS = 0"]
    statements += [f"TRUNCATE TABLE `{row[0]}`" for row in rows]
    await _my_exec(url, *statements, "SET FOREIGN_KEY_CHECKS = 1")


@contextmanager
def fresh_database(backend: str, prefix: str = "actest") -> Iterator[str]:
    """An empty database of a server backend (``postgres`` or ``mariadb``)."""
    if backend == "mariadb":
        with fresh_mariadb_database(prefix) as url:
            yield url
    else:
        with fresh_pg_database(prefix) as url:
            yield url


def require_backend(name: str) -> None:
    """Skip (or fail under CI) when the server of a backend does not answer."""
    if name in ("postgres", "pgbouncer"):
        require_postgres()
    elif name == "mariadb":
        require_mariadb()


def session_url(backend: str, request: pytest.FixtureRequest, *, empty: bool = True) -> str:
    """The session's migrated database of a server backend (``postgres``, ``pgbouncer``
    excepted, or ``mariadb``), emptied first unless ``empty`` is false."""
    if backend == "mariadb":
        url: str = request.getfixturevalue("mariadb_session_url")
        if empty:
            run_sync(lambda: _truncate_mariadb(url))
        return url
    url = request.getfixturevalue("pg_session_url")
    if empty:
        run_sync(lambda: _truncate_all(url))
    return url


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    require_backend(name)
    return name


@pytest.fixture
def store_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A database URL with an empty agentcontext schema (or no schema yet, for SQLite)."""
    if backend == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'store.db'}"
    url = session_url("postgres" if backend == "pgbouncer" else backend, request)
    if backend == "pgbouncer":
        return through_pgbouncer(url, request.getfixturevalue("pgbouncer_port"))
    return url


async def _truncate_all(url: str) -> None:
    conn = await asyncpg.connect(_dsn(url), timeout=5)
    try:
        names = [
            row["tablename"]
            for row in await conn.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                "AND tablename <> 'agentcontext_version'"
            )
        ]
        if names:
            quoted = ", ".join(f'"{name}"' for name in names)
            await conn.execute(f"TRUNCATE {quoted} RESTART IDENTITY CASCADE")
    finally:
        await conn.close()


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[SqlContextStore]:
    async with SqlContextStore(store_url) as s:
        yield s
