"""Connections the MariaDB server closes (``KILL CONNECTION``, ``wait_timeout``, a restart)
while they wait in the store's pool: every call finds them dead, opens new ones, and does its
work once; none raises the driver's own error or hands a dead connection out again."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from agentcontext import ContextEngine, SqlContextStore, assistant_text, user
from tests.conftest import _my_exec, fresh_mariadb_database, require_mariadb


@pytest.fixture
def url() -> Iterator[str]:
    require_mariadb()
    with fresh_mariadb_database("acgone") as made:
        yield made


async def _close_idle_connections(url: str) -> int:
    """``KILL CONNECTION`` every other connection to the database (the pool's, idle)."""
    database = make_url(url).database
    found = await _my_exec(
        url,
        "SELECT id FROM information_schema.processlist "
        f"WHERE db = '{database}' AND id <> CONNECTION_ID()",
    )
    for (connection_id,) in found:
        await _my_exec(url, f"KILL CONNECTION {int(connection_id)}")
    return len(found)


async def test_every_call_after_the_server_closed_the_pooled_connections(url: str) -> None:
    """Before, the calls that read one snapshot (``get_messages``, the graph, exports, pages)
    raised ``asyncmy.errors.OperationalError`` and then ``InterfaceError: Not connected`` on
    every call after, until another kind of call cleared the pool."""
    async with SqlContextStore(url) as store:
        engine = ContextEngine(store=store, chat_id="c", user_id="u")
        engine.set(user("hello"), assistant_text("hi"))
        await engine.save()
        head = engine.head_message_id
        assert head is not None

        async def resolve() -> Any:
            return (await ContextEngine(store=store, chat_id="c", user_id="u").resolve()).messages

        async def save() -> Any:
            other = ContextEngine(store=store, chat_id="c", user_id="u")
            other.set(user("again"))
            return await other.save()

        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            "get_messages": lambda: store.get_messages("c"),
            "get_message_chain": lambda: store.get_message_chain(head),
            "get_graph": lambda: store.get_graph("c"),
            "export_chat": lambda: store.export_chat("c"),
            "get_chat": lambda: store.get_chat("c"),
            "list_chats": store.list_chats,
            "search_messages": lambda: store.search_messages("c", "hello"),
            "resolve": resolve,
            "save": save,
        }
        for call in calls.values():
            for _ in range(3):  # its first use after the kill, and the next ones
                assert await _close_idle_connections(url) > 0
                await call()
                await call()
        # Each save stored its message once, whatever it met.
        texts = [str(message.text) for message in await resolve()]
        assert texts == ["hello", "hi", *["again"] * 6]
