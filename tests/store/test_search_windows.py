"""PostgreSQL reads a large scope's common words by windows of the newest rows (the bitmap of
every match would cost what the scope matches): the hits, ranks and snippets are the ones the
bitmap gives, whatever the layout of the table (the scope's rows spread evenly, in bursts, or
only old ones), the query and the page size. The bounds are lowered here so that a scope of a
few hundred messages is "large"."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, event, text

from agentcontext.store import MessageRecord, SqlContextStore
from agentcontext.store._dialects import postgresql_search
from agentcontext.store._rows.terms import query_terms
from tests.conftest import fresh_pg_database, require_postgres

WORDS = ["common", "often", "rare", "fox", "den", "blue"]
"""The vocabulary: "common" in 9 messages of 10, "often" in 1 of 3, "rare" in 1 of 50."""


@pytest.fixture
def pg_url() -> Iterator[str]:
    require_postgres()
    with fresh_pg_database("acwindow") as url:
        yield url


def text_of(rng: random.Random) -> str:
    words = [rng.choice(WORDS[3:]) for _ in range(rng.randint(1, 5))]
    if rng.random() < 0.9:
        words.append("common")
    if rng.random() < 1 / 3:
        words.append("often")
    if rng.random() < 1 / 50:
        words.append("rare")
    rng.shuffle(words)
    return " ".join(words)


async def build(store: SqlContextStore, layout: str, seed: int, schema: str) -> None:
    """The big user's 4 chats and 600 messages and another user's 3 000: shuffled together
    (``spread``), the big user's oldest and the other's a burst at the newest end of the table
    (``burst``: the windows find nothing and the bitmap reads the rest), the big user's last
    200 spread thinly through the other's (``sparse``: windows partly filled), or the big
    user's newest (``newest``). A page of candidates is at least 200 rows: the first window
    (twice the page, at the density the planner expects) is a fraction of the table."""
    rng = random.Random(seed)
    for n in range(4):
        await store.create_chat(f"big-{n}", user_id="big")
    for n in range(3):
        await store.create_chat(f"other-{n}", user_id="other")
    big = [(f"big-{i % 4}", text_of(rng)) for i in range(600)]
    other = [(f"other-{i % 3}", text_of(rng)) for i in range(3000)]
    if layout == "spread":
        order = big + other
        rng.shuffle(order)
    elif layout == "burst":
        order = big + other
    elif layout == "sparse":
        tail = big[400:] + other
        rng.shuffle(tail)
        order = big[:400] + tail
    else:
        order = other + big
    heads: dict[str, str | None] = {}
    batch: list[MessageRecord] = []
    for i, (chat, words) in enumerate(order):
        message_id = f"{chat}-m{i}"
        batch.append(
            MessageRecord(
                id=message_id,
                chat_id=chat,
                parent_id=heads.get(chat),
                name="user",
                data={"id": message_id, "role": "user", "parts": [{"type": "text", "text": words}]},
            )
        )
        heads[chat] = message_id
        if len(batch) == 500:
            await store.add_messages(batch)
            batch = []
    await store.add_messages(batch)
    async with store.engine.begin() as conn:
        await conn.execute(text(f"ANALYZE {schema}.messages"))


@pytest.fixture
async def stores(pg_url: str) -> AsyncIterator[dict[str, SqlContextStore]]:
    made: dict[str, SqlContextStore] = {}
    for n, layout in enumerate(["spread", "burst", "sparse", "newest"]):
        schema = f"layout_{layout}"
        store = SqlContextStore(pg_url, schema=schema)
        await store.initialize()
        await build(store, layout, seed=n, schema=schema)
        made[layout] = store
    yield made
    for store in made.values():
        await store.close()


@pytest.fixture
def bounds() -> Iterator[None]:
    saved = postgresql_search.BITMAP_MATCHES
    yield
    postgresql_search.BITMAP_MATCHES = saved


@contextmanager
def window_statements(store: SqlContextStore) -> Iterator[list[str]]:
    """The window statements (`postgresql_search`'s walk) the store runs meanwhile."""
    windows: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "'{}'::int4[]" in statement:
            windows.append(statement)

    event.listen(store.engine.sync_engine, "before_cursor_execute", seen)
    try:
        yield windows
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", seen)


async def search(store: SqlContextStore, scope: str, query: str, limit: int) -> list[Any]:
    if scope == "user":
        hits = await store.search_user_messages("big", query, limit=limit)
    else:
        hits = await store.search_messages("big-1", query, limit=limit)
    return [(h.message.id, h.rank, h.snippet) for h in hits]


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    layout=st.sampled_from(["spread", "burst", "sparse", "newest"]),
    scope=st.sampled_from(["user", "chat"]),
    query=st.sampled_from(["common", "often", "rare", "common fox", "often den", "blue"]),
    limit=st.sampled_from([1, 5, 20, 60, 600]),
)
@example(layout="burst", scope="user", query="common", limit=20)
@example(layout="sparse", scope="user", query="common", limit=20)
@example(layout="sparse", scope="chat", query="often", limit=60)
async def test_windows_find_what_the_bitmap_finds(
    stores: dict[str, SqlContextStore],
    bounds: None,
    layout: str,
    scope: str,
    query: str,
    limit: int,
) -> None:
    store = stores[layout]
    postgresql_search.BITMAP_MATCHES = 10**9  # every search reads the bitmap
    expected = await search(store, scope, query, limit)
    postgresql_search.BITMAP_MATCHES = 10  # a scope (or a query) of more than 10 is large
    with window_statements(store) as windows:
        found = await search(store, scope, query, limit)
    assert found == expected
    if query == "common":  # in 9 of 10 messages: the planner expects hundreds
        assert windows, "a common word in a large scope was not read by windows"


async def test_a_small_scope_or_a_rare_word_reads_the_bitmap(
    stores: dict[str, SqlContextStore], bounds: None
) -> None:
    store = stores["spread"]
    postgresql_search.BITMAP_MATCHES = 1000  # the big user's 600 messages are "small"
    with window_statements(store) as windows:
        assert await store.search_user_messages("big", "common", limit=5)
        postgresql_search.BITMAP_MATCHES = 100  # a large scope, but "rare" is expected rare
        await store.search_user_messages("big", "rare", limit=5)
    assert windows == []


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    layout=st.sampled_from(["spread", "burst", "sparse", "newest"]),
    scope=st.sampled_from(["user", "chat"]),
    word=st.sampled_from(["common", "often", "fox"]),
    page=st.integers(min_value=1, max_value=400),
    before=st.one_of(st.just(2**62), st.integers(min_value=1, max_value=3700)),
)
@example(layout="sparse", scope="user", word="common", page=5, before=2**62)
@example(layout="sparse", scope="user", word="common", page=30, before=2**62)  # two windows
@example(layout="sparse", scope="user", word="common", page=60, before=3400)
@example(layout="sparse", scope="chat", word="common", page=10, before=2**62)
@example(layout="burst", scope="user", word="often", page=30, before=3000)
async def test_a_page_of_windows_is_the_page_of_the_bitmap(
    stores: dict[str, SqlContextStore],
    bounds: None,
    layout: str,
    scope: str,
    word: str,
    page: int,
    before: int,
) -> None:
    """Candidates page by page, as the search asks for them (any page size, any bound):
    the windows give the bitmap's rows, in its order."""
    store = stores[layout]
    dialect = store.db.dialect
    scope_id = "big" if scope == "user" else "big-1"
    statement = dialect.search_candidates(scope, False)  # type: ignore[arg-type]
    params = {
        "scope_id": scope_id,
        "search_limit": page,
        "before_seq": before,
        **dialect.search_params(*query_terms([word], scope, scope_id)),
    }
    postgresql_search.BITMAP_MATCHES = 10

    def both(conn: Connection) -> tuple[list[Any], list[Any]]:
        prepared = dialect.prepare_search(conn, scope, scope_id)  # type: ignore[arg-type]
        walked = list(dialect.fetch_candidates(conn, statement, params, prepared))
        return walked, list(conn.execute(statement, params).all())

    walked, bitmap = await store.db.run("snapshot", both)
    assert [row[0] for row in walked] == [row[0] for row in bitmap]
