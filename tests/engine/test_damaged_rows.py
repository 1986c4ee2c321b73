"""Rows the store cannot decode are named errors, never raw decoding exceptions.

A message whose data is not JSON or not a Message, a timestamp that is not one, chat metadata
that is not JSON: `resolve`, `get_graph`, the searches, `export_chat` and the record reads raise
`CorruptDataError` (a `StoreError`) naming the table, the chat and the row, and what is wrong.
`list_chats` lists the other chats and marks the damaged one (``ChatInfo.damaged``). The
command line exits with its store-error code. SQLite can hold any text in any column; on
PostgreSQL only the shape of a message can be wrong (the column types refuse the rest).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agentcontext import (
    ContextEngine,
    CorruptDataError,
    StoreError,
    assistant_text,
    user,
)
from agentcontext.cli._common import EXIT_ERROR
from agentcontext.store import SqlContextStore
from tests.cli.helpers import clean_env, run_cli
from tests.engine.conftest import EngineFactory
from tests.engine.test_damaged_data import damage


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[SqlContextStore]:
    """The damage is done behind the store's back, which a store that remembers decoded
    chains (``cache_bytes``) does not see, as a warm engine does not: these stores read."""
    async with SqlContextStore(store_url, cache_bytes=0) as s:
        yield s


async def seeded(make_engine: EngineFactory, chat_id: str = "c1") -> ContextEngine:
    engine = make_engine(chat_id)
    engine.set(
        user("Root words", id=f"{chat_id}-1"),
        assistant_text("Middle words", id=f"{chat_id}-2"),
        user("Leaf words", id=f"{chat_id}-3"),
    )
    await engine.save()
    return engine


def names_the_row(error: CorruptDataError, table: str, chat: str, row: str) -> None:
    assert isinstance(error, StoreError)
    assert (error.table, error.chat_id, error.row_id) == (table, chat, row)
    assert repr(row) in str(error) and table in str(error)


def sqlite_only(store_url: str) -> None:
    if not store_url.startswith("sqlite"):
        pytest.skip("PostgreSQL's and MariaDB's columns cannot hold such a value")


def text_json_only(store_url: str) -> None:
    if store_url.startswith("postgresql"):
        pytest.skip("PostgreSQL's json and jsonb columns cannot hold text that is not JSON")


@pytest.fixture
def sqlite_url(store_url: str) -> str:
    sqlite_only(store_url)
    return store_url


async def test_message_data_that_is_not_json(
    store: SqlContextStore, store_url: str, make_engine: EngineFactory
) -> None:
    text_json_only(store_url)
    await seeded(make_engine)
    await damage(store_url, "UPDATE messages SET data = '{not json' WHERE id = 'c1-2'")
    calls = {
        "resolve": lambda: make_engine().resolve(),
        "get_graph": lambda: store.get_graph("c1"),
        "search": lambda: store.search_messages("c1", "middle"),
        "user search": lambda: store.search_user_messages("u1", "middle"),
        "export": lambda: store.export_chat("c1"),
        "chain": lambda: store.get_message_chain("c1-3"),
        "get_message": lambda: store.get_message("c1-2"),
        "active branch": lambda: store.get_messages("c1"),
    }
    for name, call in calls.items():
        with pytest.raises(CorruptDataError) as info:
            await call()
        names_the_row(info.value, "messages", "c1", "c1-2")
        assert "JSON" in str(info.value), name


async def test_message_text_that_is_not_utf8_is_a_damaged_row_of_the_chain(
    store: SqlContextStore, store_url: str, make_engine: EngineFactory
) -> None:
    # SQLite keeps whatever bytes it is given in a TEXT column. The engine reads a chain as
    # the bytes of its JSON, so such a row is named, not a failed read of the whole chain.
    sqlite_only(store_url)
    await seeded(make_engine)
    await damage(
        store_url, "UPDATE messages SET data = CAST(x'7b22ff22' AS TEXT) WHERE id = 'c1-2'"
    )
    with pytest.raises(CorruptDataError) as info:
        await make_engine().resolve()
    names_the_row(info.value, "messages", "c1", "c1-2")


async def test_message_data_that_is_not_a_message(
    store: SqlContextStore, store_url: str, make_engine: EngineFactory
) -> None:
    await seeded(make_engine)
    shape = json.dumps({"id": "c1-2", "role": "robot", "parts": []})
    await damage(store_url, f"UPDATE messages SET data = '{shape}' WHERE id = 'c1-2'")
    with pytest.raises(CorruptDataError, match="not a valid Message") as info:
        await make_engine().resolve()
    names_the_row(info.value, "messages", "c1", "c1-2")


async def test_a_timestamp_that_is_not_one(
    store: SqlContextStore, store_url: str, make_engine: EngineFactory
) -> None:
    sqlite_only(store_url)
    await seeded(make_engine)
    await damage(store_url, "UPDATE messages SET created_at = 'yesterday' WHERE id = 'c1-1'")
    for call in (
        lambda: store.get_graph("c1"),
        lambda: store.get_message("c1-1"),
        lambda: store.export_chat("c1"),
        lambda: store.get_message_chain("c1-3"),
    ):
        with pytest.raises(CorruptDataError, match="timestamp") as info:
            await call()
        names_the_row(info.value, "messages", "c1", "c1-1")


async def test_chat_metadata_that_is_not_json_lists_the_others(
    store: SqlContextStore, store_url: str, make_engine: EngineFactory
) -> None:
    text_json_only(store_url)
    for chat in ("c1", "c2", "c3"):
        await seeded(make_engine, chat)
    await damage(store_url, "UPDATE chats SET metadata = 'oops' WHERE id = 'c2'")
    listed = {info.id: info for info in await store.list_chats()}
    assert sorted(listed) == ["c1", "c2", "c3"]
    assert listed["c1"].damaged is None and listed["c3"].damaged is None
    reason = listed["c2"].damaged
    assert reason is not None and "'c2'" in reason and "chats" in reason
    assert listed["c2"].metadata == {} and listed["c2"].message_count == 3
    with pytest.raises(CorruptDataError) as info:
        await store.get_chat("c2")
    names_the_row(info.value, "chats", "c2", "c2")
    with pytest.raises(CorruptDataError):
        await make_engine("c2").resolve()
    # The other chats work as ever.
    assert len((await make_engine("c3").resolve()).messages) == 3


async def test_a_chat_timestamp_that_is_not_one_is_listed_as_damaged(
    store: SqlContextStore, store_url: str, make_engine: EngineFactory
) -> None:
    sqlite_only(store_url)
    for chat in ("c1", "c2"):
        await seeded(make_engine, chat)
    await damage(store_url, "UPDATE chats SET created_at = 42 WHERE id = 'c1'")
    listed = {info.id: info for info in await store.list_chats()}
    assert listed["c1"].damaged is not None and "timestamp" in listed["c1"].damaged
    assert listed["c2"].damaged is None


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    garbage=st.text(
        st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=40
    )
    | st.builds(
        json.dumps,
        st.recursive(
            st.none() | st.integers() | st.text(max_size=5),
            lambda c: (
                st.lists(c, max_size=3)
                | st.dictionaries(
                    st.sampled_from(["id", "role", "parts", "type", "text"]), c, max_size=3
                )
            ),
            max_leaves=8,
        ),
    )
)
@example(garbage="")
@example(garbage="[]")
@example(garbage='{"id": 1}')
@example(garbage="null")
@example(garbage='"text"')
async def test_any_garbage_in_a_message_is_a_named_error_or_a_message(
    store: SqlContextStore, sqlite_url: str, make_engine: EngineFactory, garbage: str
) -> None:
    """Whatever text sits in a message's data column, resolve gives messages or names it."""
    store_url = sqlite_url
    engine = make_engine("g")
    if not engine.pending and await store.get_chat("g") is None:
        engine.set(user("first", id="g-1"), assistant_text("second", id="g-2"))
        await engine.save()
    escaped = garbage.replace("'", "''")
    await damage(store_url, f"UPDATE messages SET data = '{escaped}' WHERE id = 'g-2'")
    try:
        result = await make_engine("g").resolve()
    except CorruptDataError as exc:
        names_the_row(exc, "messages", "g", "g-2")
    else:
        assert result.messages[0].id == "g-1"


async def test_the_command_line_names_a_damaged_row_and_exits_with_the_store_error_code(
    store: SqlContextStore, sqlite_url: str, make_engine: EngineFactory, tmp_path: Path
) -> None:
    await seeded(make_engine)
    await damage(sqlite_url, "UPDATE messages SET data = '{not json' WHERE id = 'c1-2'")
    for command in (["show", "c1"], ["export", "c1"], ["search", "c1", "words"]):
        result = await asyncio.to_thread(
            run_cli, "--url", sqlite_url, *command, cwd=tmp_path, env=clean_env()
        )
        assert result.returncode == EXIT_ERROR, (command, result.stderr)
        assert "'c1-2'" in result.stderr and "Traceback" not in result.stderr
