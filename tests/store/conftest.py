"""The store's contract tests run on SQLite, PostgreSQL, PostgreSQL through PgBouncer, and
MariaDB."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator

import pytest

from tests.conftest import IN_CI, require_backend
from tests.store._mariadb_pair import PairError, Server, start_server

STORE_BACKENDS = ["sqlite", "postgres", "pgbouncer", "mariadb"]


@pytest.fixture(params=STORE_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    require_backend(name)
    return name


SMALL_PACKET = 4 * 2**20
"""The ``max_allowed_packet`` of `small_packet_url`'s server."""


@pytest.fixture(scope="session")
def small_packet_server() -> Iterator[Server]:
    """A MariaDB server of its own that allows statements of 4 MiB (`SMALL_PACKET`), for the
    whole session: setting that on the shared server would impose it on every test running
    meanwhile in the other workers (a message of many MiB refused there)."""
    try:
        server = start_server("4M")
    except PairError as exc:
        reason = f"cannot start a MariaDB server of its own on loopback: {exc}"
        if IN_CI:
            pytest.fail(f"CI=true but {reason}", pytrace=False)
        pytest.skip(reason)
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.data.parent, ignore_errors=True)


@pytest.fixture
def small_packet_url(small_packet_server: Server) -> Iterator[str]:
    """An empty database on `small_packet_server`."""
    name = f"acsmall_{uuid.uuid4().hex[:12]}"
    small_packet_server.sql(f"CREATE DATABASE {name}")
    try:
        yield small_packet_server.url(name)
    finally:
        small_packet_server.sql(f"DROP DATABASE IF EXISTS {name}")
