"""A store reaching PgBouncer in transaction pooling mode without ``pgbouncer=true`` says so.

asyncpg prepares each statement under a name of its connection (``__asyncpg_stmt_11__``);
behind PgBouncer in transaction mode the next statement of that connection may run on another
server connection, where the name is unknown, or taken by another client. The store names the
condition and the fix instead of passing the server's words on as a bare `StoreError`.
"""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from agentcontext import ContextEngine, SqlContextStore, StoreError, assistant_text, user
from tests.conftest import fresh_pg_database, run_sync, through_pgbouncer

HINT = (
    "The server looks like PgBouncer in transaction pooling mode, where a prepared statement "
    "does not outlive its transaction: add ?pgbouncer=true to the URL (or pass pgbouncer=True "
    "to SqlContextStore)"
)


async def migrated(url: str) -> None:
    async with SqlContextStore(url):
        pass


async def workload(url: str, *, engines: int = 8, rounds: int = 20) -> list[Exception]:
    """Engines saving, resolving and searching side by side, each until its first error: the
    errors."""
    errors: list[Exception] = []
    async with SqlContextStore(url, pool_size=engines) as store:

        async def converse(n: int) -> None:
            engine = ContextEngine(store=store, chat_id=f"chat-{n}", user_id="u1")
            for i in range(rounds):
                try:
                    engine.set(user(f"question {i}"), assistant_text(f"answer {i}"))
                    await engine.save()
                    await engine.resolve()
                    await store.search_messages(f"chat-{n}", "question")
                except Exception as exc:
                    errors.append(exc)
                    return

        await asyncio.gather(*(converse(n) for n in range(engines)))
    return errors


def test_an_unflagged_pgbouncer_is_named(pgbouncer_port: int) -> None:
    with fresh_pg_database("acbouncer") as url:
        run_sync(lambda: migrated(url))
        bare = make_url(url).set(port=pgbouncer_port).render_as_string(hide_password=False)

        errors = run_sync(lambda: workload(bare))
        assert errors, "no statement met another server connection than its own"
        for error in errors:
            assert type(error) is StoreError, repr(error)
            message = str(error)
            assert message.startswith(f"database error on {make_url(bare)}: prepared statement ")
            assert message.endswith(HINT)
            assert "__asyncpg_stmt_" in message

        # What the message says to do works: the same workload runs clean.
        assert run_sync(lambda: workload(through_pgbouncer(url, pgbouncer_port))) == []


async def test_a_statement_name_already_taken_is_named() -> None:
    """The other way the same condition shows: a name another client prepared on the server
    connection (SQLSTATE 42P05, raised by a real server, here directly). A store told it is
    behind PgBouncer does not blame PgBouncer for it."""
    with fresh_pg_database("acbouncer") as url:
        async with SqlContextStore(url) as store:
            async with store.engine.connect() as conn:
                await conn.exec_driver_sql("PREPARE __asyncpg_stmt_1__ AS SELECT 1")
                with pytest.raises(DBAPIError) as raised:
                    await conn.exec_driver_sql("PREPARE __asyncpg_stmt_1__ AS SELECT 1")
            driver_error = raised.value.orig
            assert driver_error is not None
            assert type(driver_error.__cause__).__name__ == "DuplicatePreparedStatementError"
            named = store.db.translate(raised.value)
            assert type(named) is StoreError
            assert str(named) == (
                f"database error on {store.engine.url}: prepared statement "
                f'"__asyncpg_stmt_1__" already exists. {HINT}'
            )
        async with SqlContextStore(url, pgbouncer=True) as flagged:
            plain = flagged.db.translate(raised.value)
        assert type(plain) is StoreError
        assert "PgBouncer" not in str(plain)
        assert 'prepared statement "__asyncpg_stmt_1__" already exists' in str(plain)
