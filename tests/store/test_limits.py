"""What a database could make differ, held the same on every backend: ids compared byte for
byte, text beyond the Basic Multilingual Plane, chains longer than a recursive query's
default limit, messages of many MiB, and the refusal of what a server cannot store."""

from __future__ import annotations

import pytest

from agentcontext import ContextEngine, InvalidInputError, SqlContextStore, assistant_text, user
from agentcontext.store import MessageRecord
from tests.helpers import chain, msg_data

ASTRAL = "🦊 狐狸 \U0001d518\U0001d52b\U0001d526 é\u0301 \u200d👩‍👩‍👧 ﷽"


async def test_ids_and_names_compare_byte_for_byte(store: SqlContextStore) -> None:
    # A case-insensitive or space-padding collation would make these one id.
    ids = ["Abc", "abc", "abc ", "ABC", "a\u0301bc", "ábc"]
    for chat_id in ids:
        await store.create_chat(chat_id, user_id="u", metadata={"which": chat_id})
    listed = await store.list_chats(user_id="u")
    assert sorted(c.id for c in listed) == sorted(ids)
    for chat_id in ids:
        found = await store.get_chat(chat_id)
        assert found is not None and found.id == chat_id and found.metadata == {"which": chat_id}
    assert [c.id for c in await store.list_chats(metadata={"which": "abc "})] == ["abc "]

    # Message ids, branch and checkpoint names, user ids too.
    records = [
        MessageRecord(id=i, chat_id="Abc", parent_id=None, name="user", data=msg_data(i))
        for i in ("M", "m", "m ")
    ]
    await store.add_messages(records)
    for record in records:
        got = await store.get_message(record.id)
        assert got is not None and got.id == record.id and got.data == record.data
    for name in ("Side", "side", "side "):
        await store.create_branch("Abc", name, head_message_id="M")
    names = {b.name for b in await store.list_branches("Abc")}
    assert {"Side", "side", "side "} <= names
    for name in ("CP", "cp"):
        await store.create_checkpoint("Abc", name, "m")
    assert sorted(c.name for c in await store.list_checkpoints("Abc")) == ["CP", "cp"]
    await store.create_chat("x", user_id="U")
    assert [c.id for c in await store.list_chats(user_id="U")] == ["x"]
    assert await store.delete_chat("abc")
    assert await store.get_chat("Abc") is not None and await store.get_chat("abc ") is not None


async def test_text_beyond_the_basic_plane_is_kept_exactly(store: SqlContextStore) -> None:
    engine = ContextEngine(store=store, chat_id=f"chat {ASTRAL}", user_id=f"user {ASTRAL}")
    engine.set(user(f"where is the fox? {ASTRAL}"), assistant_text(f"in the den {ASTRAL}"))
    await engine.save()
    await engine.update_chat(title=ASTRAL, metadata={ASTRAL: ASTRAL})
    fresh = ContextEngine(store=store, chat_id=f"chat {ASTRAL}", user_id=f"user {ASTRAL}")
    texts = [m.text for m in (await fresh.resolve()).messages]
    assert texts == [f"where is the fox? {ASTRAL}", f"in the den {ASTRAL}"]
    chat = await store.get_chat(f"chat {ASTRAL}")
    assert chat is not None and chat.title == ASTRAL and chat.metadata == {ASTRAL: ASTRAL}
    assert [c.id for c in await store.list_chats(metadata={ASTRAL: ASTRAL})] == [chat.id]
    hits = await store.search_messages(chat.id, "狐狸")
    assert [h.message.name for h in hits] == ["assistant", "user"]


async def test_a_chain_past_a_thousand_messages_loads_whole(store: SqlContextStore) -> None:
    # Recursive queries stop at 1 000 steps by default on MariaDB and MySQL.
    await store.create_chat("long", user_id="u")
    records = chain("long", 2500)
    await store.add_messages(records)
    main = await store.get_active_branch("long")
    assert main is not None
    await store.update_branch_head(main.id, records[-1].id, expected_head=None)
    walked = await store.get_message_chain(records[-1].id)
    assert [m.id for m in walked] == [r.id for r in records]
    assert await store.is_ancestor(records[0].id, records[-1].id)
    engine = ContextEngine(store=store, chat_id="long", user_id="u")
    assert len((await engine.resolve()).messages) == 2500
    engine.set(user("one more"))
    await engine.save()
    fresh = ContextEngine(store=store, chat_id="long", user_id="u")
    messages = (await fresh.resolve()).messages
    assert len(messages) == 2501 and messages[-1].text == "one more"
    await fresh.rewind(records[1200].id)
    again = ContextEngine(store=store, chat_id="long", user_id="u")
    assert len((await again.resolve()).messages) == 1201


@pytest.mark.parametrize("mib", [4, 15])
async def test_a_message_of_many_mib_stores_and_loads(store: SqlContextStore, mib: int) -> None:
    # Multi-byte characters and characters JSON escapes, under the 16 MiB limit of text.
    unit = 'é🦊"\\\n' + "x" * 57  # 64 bytes of UTF-8
    text = unit * (mib * 2**20 // len(unit.encode()))
    assert mib * 2**20 - 64 < len(text.encode()) <= mib * 2**20
    engine = ContextEngine(store=store, chat_id="big", user_id="u")
    engine.set(user(text))
    await engine.save()
    fresh = ContextEngine(store=store, chat_id="big", user_id="u")
    [loaded] = (await fresh.resolve()).messages
    assert loaded.text == text


async def test_a_message_over_the_limit_is_refused_and_nothing_is_saved(
    store: SqlContextStore,
) -> None:
    record = MessageRecord(
        id="m", chat_id="huge", parent_id=None, name="user", data=msg_data("x" * (16 * 2**20))
    )
    await store.create_chat("huge", user_id="u")
    with pytest.raises(InvalidInputError, match=r"16\.00 MiB"):
        await store.add_messages([record])
    assert await store.get_messages("huge") == []
