"""PostgreSQL reads a long chain through its index: the chain's rows are picked in a subquery
the planner cannot merge, so the cast of their JSON to text (which the planner guesses 32
bytes wide) does not make a sort of the whole table on disk look cheaper."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, text

from agentcontext.store import MessageRecord, SqlContextStore
from agentcontext.store._dialects.postgresql import PostgresDialect
from agentcontext.store._ops.chain import _statement
from tests.conftest import fresh_pg_database, require_postgres

SIZE = 10_000


@pytest.fixture
def pg_url() -> Iterator[str]:
    require_postgres()
    with fresh_pg_database("acplan") as url:
        yield url


def _plan(conn: Connection, shape: str) -> list[str]:
    statement = _statement(PostgresDialect(), shape, "scan")
    compiled = statement.compile(dialect=conn.dialect)
    params = compiled.construct_params({"chat_id": "long", "stop_depth": 0, "head_depth": SIZE})
    assert compiled.positiontup is not None
    explain = "EXPLAIN (FORMAT JSON) " + compiled.string
    row = conn.exec_driver_sql(explain, tuple(params[n] for n in compiled.positiontup)).one()
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    kinds: list[str] = []

    def walk(node: dict[str, object]) -> None:
        kinds.append(str(node["Node Type"]))
        for child in node.get("Plans", []):  # type: ignore[attr-defined]
            walk(child)

    walk(plan[0]["Plan"])
    return kinds


async def test_a_long_chain_is_read_through_the_depth_index(pg_url: str) -> None:
    text_of = "word " * 90  # about the size of a real message
    records = [
        MessageRecord(
            id=f"m{i}",
            chat_id="long",
            parent_id=f"m{i - 1}" if i else None,
            name="user",
            data={"id": f"m{i}", "role": "user", "parts": [{"type": "text", "text": text_of}]},
        )
        for i in range(SIZE)
    ]
    async with SqlContextStore(pg_url) as store:
        await store.create_chat("long", user_id="u")
        for start in range(0, SIZE, 2_500):
            await store.add_messages(records[start : start + 2_500])
        async with store.engine.connect() as conn:
            await conn.execute(text("ANALYZE messages"))
            for shape in ("rows", "records"):
                kinds = await conn.run_sync(_plan, shape)
                assert "Sort" not in kinds and "Seq Scan" not in kinds, (shape, kinds)
                assert "Index Scan" in kinds, (shape, kinds)
        chain = await store.get_message_chain(f"m{SIZE - 1}")
        assert [m.id for m in chain] == [r.id for r in records]
