"""The store's contract tests run on SQLite, PostgreSQL, and PostgreSQL through PgBouncer."""

from __future__ import annotations

import pytest

from tests.conftest import require_postgres

STORE_BACKENDS = ["sqlite", "postgres", "pgbouncer"]


@pytest.fixture(params=STORE_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name in ("postgres", "pgbouncer"):
        require_postgres()
    return name
