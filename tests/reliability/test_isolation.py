"""Users are isolated: nothing that takes a user id reads, lists, searches or deletes
another user's chat — on every backend."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from agentcontext import (
    ChatOwnershipError,
    ContextEngine,
    SqlContextStore,
    assistant_text,
    user,
)


@pytest.fixture
async def two_users(store: SqlContextStore) -> SqlContextStore:
    for owner in ("alice", "bob"):
        engine = ContextEngine(store=store, chat_id=f"{owner}-chat", user_id=owner)
        engine.set(user(f"secret of {owner}: pineapple"), assistant_text("noted"))
        await engine.save()
        await engine.checkpoint("cp")
    return store


async def test_listing_is_per_user(two_users: SqlContextStore) -> None:
    assert [c.id for c in await two_users.list_chats(user_id="bob")] == ["bob-chat"]
    assert [c.id for c in await two_users.list_chats(user_id="Bob")] == []
    assert await two_users.list_chats(user_id="carol") == []


async def test_user_search_is_per_user(two_users: SqlContextStore) -> None:
    hits = await two_users.search_user_messages("bob", "pineapple")
    assert {h.chat_id for h in hits} == {"bob-chat"}
    assert all("alice" not in h.snippet for h in hits)
    assert await two_users.search_user_messages("carol", "pineapple") == []


async def test_deleting_needs_the_owner(two_users: SqlContextStore) -> None:
    assert await two_users.delete_chat("alice-chat", user_id="bob") is False
    assert await two_users.delete_chat("alice-chat", user_id="ALICE") is False
    assert await two_users.get_chat("alice-chat") is not None
    assert len(await two_users.get_messages("alice-chat")) == 2


ENGINE_CALLS: dict[str, Callable[[ContextEngine], Awaitable[Any]]] = {
    "resolve": lambda e: e.resolve(),
    "get_messages": lambda e: e.get_messages(),
    "save": lambda e: e.set(user("intruder")).save(),
    "checkpoint": lambda e: e.checkpoint("mine"),
    "restore": lambda e: e.restore("cp"),
    "switch_branch": lambda e: e.switch_branch("main"),
    "btw": lambda e: e.btw(),
    "update_chat": lambda e: e.update_chat(title="taken"),
    "track_usage": lambda e: e.track_usage({"input_tokens": 1}),
    "inspect": lambda e: e.inspect(),
    "begin_turn": lambda e: e.begin_turn(user("intruder")),
}


@pytest.mark.parametrize("call", ENGINE_CALLS, ids=list(ENGINE_CALLS))
async def test_an_engine_refuses_another_users_chat(two_users: SqlContextStore, call: str) -> None:
    before = await two_users.export_chat("alice-chat")
    intruder = ContextEngine(store=two_users, chat_id="alice-chat", user_id="bob")
    with pytest.raises(ChatOwnershipError):
        await ENGINE_CALLS[call](intruder)
    assert await two_users.export_chat("alice-chat") == before
