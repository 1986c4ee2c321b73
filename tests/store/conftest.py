"""The store's contract tests run on SQLite, PostgreSQL, PostgreSQL through PgBouncer, and
MariaDB."""

from __future__ import annotations

import pytest

from tests.conftest import require_backend

STORE_BACKENDS = ["sqlite", "postgres", "pgbouncer", "mariadb"]


@pytest.fixture(params=STORE_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    require_backend(name)
    return name
