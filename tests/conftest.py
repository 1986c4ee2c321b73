"""Shared fixtures: every store test runs against a real SQLite file and a real PostgreSQL.

PostgreSQL comes from ``AGENTCONTEXT_TEST_POSTGRES_URL`` (an admin URL used to create the test
databases; default ``postgresql+asyncpg://postgres@127.0.0.1:5432/postgres``). Without a
reachable server the PostgreSQL tests are skipped with the reason shown, except when
``CI=true``: then they fail.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from agentcontext.store import SqlContextStore

DEFAULT_PG = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
BACKENDS = ["sqlite", "postgres"]
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


def postgres_unavailable() -> str | None:
    """None when PostgreSQL answers, else the reason (checked once per session)."""
    if "reason" not in _pg_state:
        try:
            asyncio.run(_pg_exec(pg_admin_url(), "SELECT 1"))
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
    asyncio.run(_pg_exec(pg_admin_url(), f'CREATE DATABASE "{name}"'))
    return make_url(pg_admin_url()).set(database=name).render_as_string(hide_password=False)


def drop_pg_database(url: str) -> None:
    name = make_url(url).database
    asyncio.run(_pg_exec(pg_admin_url(), f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


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

    asyncio.run(migrate())
    yield url
    drop_pg_database(url)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name == "postgres":
        require_postgres()
    return name


@pytest.fixture
def store_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A database URL with an empty agentcontext schema (or no schema yet, for SQLite)."""
    if backend == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'store.db'}"
    url: str = request.getfixturevalue("pg_session_url")
    asyncio.run(_truncate_all(url))
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
