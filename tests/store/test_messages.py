"""Messages: upserts, batches, chains, parents — on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import select, text, update

from agentcontext import ContextEngine, Message, assistant_text, errors, user
from agentcontext.store import MessageRecord, SqlContextStore
from agentcontext.store._db.schema import messages
from tests.helpers import chain, msg_data, rec


@pytest.fixture
async def chat(store: SqlContextStore) -> str:
    await store.create_chat("c1", user_id="u1")
    await store.create_chat("c2", user_id="u1")
    return "c1"


async def count_messages(store: SqlContextStore) -> int:
    async with store.engine.connect() as conn:
        return int(await conn.scalar(text("SELECT count(*) FROM messages")) or 0)


async def test_add_and_get_message(store: SqlContextStore, chat: str) -> None:
    stored = await store.add_message(rec("m1", chat, text="hello"))
    got = await store.get_message("m1")
    assert got == stored
    assert got.data["parts"][0]["text"] == "hello"
    assert got.created_at.tzinfo is not None
    assert await store.get_message("missing") is None


async def test_upsert_changes_data_but_never_parent_chat_or_created_at(
    store: SqlContextStore, chat: str
) -> None:
    await store.add_messages(chain(chat, 3))
    before = await store.get_message("m2")
    assert before is not None
    again = MessageRecord(id="m2", chat_id=chat, parent_id="m0", name="assistant", data={"v": 2})
    returned = await store.add_message(again)
    after = await store.get_message("m2")
    assert after is not None
    assert (after.parent_id, after.chat_id, after.created_at) == ("m1", chat, before.created_at)
    assert after.data == {"v": 2} and after.name == "assistant"
    assert returned == after
    assert [m.id for m in await store.get_message_chain("m2")] == ["m0", "m1", "m2"]


async def test_add_messages_is_one_transaction(store: SqlContextStore, chat: str) -> None:
    batch = [*chain(chat, 3), rec("bad", chat, parent_id="nowhere")]
    with pytest.raises(errors.MessageNotFoundError, match="nowhere"):
        await store.add_messages(batch)
    assert await count_messages(store) == 0
    await store.add_messages(chain(chat, 3))
    assert await count_messages(store) == 3


async def test_batch_parent_must_come_first(store: SqlContextStore, chat: str) -> None:
    with pytest.raises(errors.InvalidInputError, match="parents first"):
        await store.add_messages([rec("b", chat, "a"), rec("a", chat)])
    assert await count_messages(store) == 0


async def test_graph_rules(store: SqlContextStore, chat: str) -> None:
    await store.add_messages(chain(chat, 2))
    await store.add_message(rec("x0", "c2"))
    with pytest.raises(errors.InvalidGraphError, match="own parent"):
        await store.add_message(rec("self", chat, parent_id="self"))
    with pytest.raises(errors.InvalidGraphError, match="chat"):
        await store.add_message(rec("cross", chat, parent_id="x0"))
    with pytest.raises(errors.InvalidGraphError, match="belongs to chat"):
        await store.add_message(rec("x0", chat))
    with pytest.raises(errors.ChatNotFoundError):
        await store.add_message(rec("lost", "no-such-chat"))
    with pytest.raises(errors.InvalidInputError, match="twice"):
        await store.add_messages([rec("d", chat), rec("d", chat)])
    assert await count_messages(store) == 3


async def test_chain_is_root_first_and_after_gives_the_suffix(
    store: SqlContextStore, chat: str
) -> None:
    await store.add_messages(chain(chat, 6))
    assert [m.id for m in await store.get_message_chain("m5")] == [f"m{i}" for i in range(6)]
    assert [m.id for m in await store.get_message_chain("m5", after="m2")] == ["m3", "m4", "m5"]
    assert await store.get_message_chain("m5", after="m5") == []
    await store.add_message(rec("side", chat, parent_id="m1"))
    with pytest.raises(errors.InvalidGraphError, match="not an ancestor"):
        await store.get_message_chain("m5", after="side")
    # DESIGN.md §2.5: an unknown head has an empty chain (the original's behaviour).
    assert await store.get_message_chain("nope") == []


async def test_chain_of_100_000_messages_loads_completely(
    store: SqlContextStore, chat: str
) -> None:
    n = 100_000
    parent = None
    for start in range(0, n, 5000):
        batch = []
        for i in range(start, start + 5000):
            batch.append(
                MessageRecord(id=f"m{i}", chat_id=chat, parent_id=parent, name="user", data=i)
            )
            parent = f"m{i}"
        await store.add_messages(batch)
    loaded = await store.get_message_chain(f"m{n - 1}")
    assert len(loaded) == n
    assert loaded[0].id == "m0" and loaded[0].parent_id is None
    assert all(loaded[i].parent_id == loaded[i - 1].id for i in range(1, n))
    assert [m.data for m in loaded[:3]] == [0, 1, 2]
    branches = await store.list_branches(chat)
    assert branches[0].message_count == 0


async def test_a_stored_cycle_raises_instead_of_looping(store: SqlContextStore, chat: str) -> None:
    await store.add_messages(chain(chat, 4))
    # Corrupt the data behind the store's back: m0 -> m3 closes a loop.
    async with store.engine.begin() as conn:
        await conn.execute(update(messages).where(messages.c.id == "m0").values(parent_id="m3"))
    with pytest.raises(errors.InvalidGraphError, match="inconsistent"):
        await store.get_message_chain("m3")


async def test_get_messages_follows_the_active_branch(store: SqlContextStore, chat: str) -> None:
    assert await store.get_messages(chat) == []
    branch = await store.get_active_branch(chat)
    assert branch is not None
    await store.append_messages(branch.id, chain(chat, 3), expected_head=None)
    assert [m.id for m in await store.get_messages(chat)] == ["m0", "m1", "m2"]
    forked = await store.fork_branch(chat, "main", head_message_id="m0", activate=True)
    assert forked.name == "main-v2"
    assert [m.id for m in await store.get_messages(chat)] == ["m0"]
    with pytest.raises(errors.ChatNotFoundError):
        await store.get_messages("nope")


async def test_has_children(store: SqlContextStore, chat: str) -> None:
    await store.add_messages(chain(chat, 2))
    assert await store.has_children("m0") is True
    assert await store.has_children("m1") is False
    assert await store.has_children("unknown") is False


async def test_set_message_parent_moves_a_subtree_and_refuses_cycles(
    store: SqlContextStore, chat: str
) -> None:
    await store.add_messages(chain(chat, 4))  # m0 <- m1 <- m2 <- m3
    await store.add_message(rec("r", chat))  # a second root
    await store.set_message_parent("m2", "r")  # r <- m2 <- m3
    assert [m.id for m in await store.get_message_chain("m3")] == ["r", "m2", "m3"]
    await store.set_message_parent("m2", None)
    assert [m.id for m in await store.get_message_chain("m3")] == ["m2", "m3"]
    await store.set_message_parent("m2", "m1")
    assert [m.id for m in await store.get_message_chain("m3")] == ["m0", "m1", "m2", "m3"]
    with pytest.raises(errors.InvalidGraphError, match="cycle"):
        await store.set_message_parent("m1", "m3")
    with pytest.raises(errors.InvalidGraphError, match="own parent"):
        await store.set_message_parent("m1", "m1")
    await store.add_message(rec("x0", "c2"))
    with pytest.raises(errors.InvalidGraphError, match="chat"):
        await store.set_message_parent("m1", "x0")
    with pytest.raises(errors.MessageNotFoundError):
        await store.set_message_parent("m1", "ghost")
    with pytest.raises(errors.MessageNotFoundError):
        await store.set_message_parent("ghost", "m1")
    assert [m.id for m in await store.get_message_chain("m3")] == ["m0", "m1", "m2", "m3"]
    async with store.engine.connect() as conn:
        depths = dict((await conn.execute(select(messages.c.id, messages.c.depth))).all())
    assert depths == {"m0": 1, "m1": 2, "m2": 3, "m3": 4, "r": 1, "x0": 1}


async def test_is_ancestor(store: SqlContextStore, chat: str) -> None:
    await store.add_messages(chain(chat, 3))
    await store.add_message(rec("side", chat, parent_id="m0"))
    assert await store.is_ancestor("m0", "m2")
    assert await store.is_ancestor("m2", "m2")
    assert not await store.is_ancestor("m2", "m0")
    assert not await store.is_ancestor("side", "m2")
    assert not await store.is_ancestor("ghost", "m2")


async def test_search_text_is_only_message_text(store: SqlContextStore, chat: str) -> None:
    data = msg_data("visible words", "assistant")
    data["parts"].append({"type": "reasoning", "text": "pondering deeply"})
    data["parts"].append(
        {
            "type": "tool",
            "tool_call_id": "t1",
            "tool_name": "weather_lookup",
            "input": {"secretkey": "hiddenvalue"},
            "state": "input-available",
        }
    )
    await store.add_message(MessageRecord(id="m", chat_id=chat, name="assistant", data=data))
    for word in ("visible", "pondering", "weather_lookup"):
        assert [r.message.id for r in await store.search_messages(chat, word)] == ["m"], word
    for word in ("parts", "type", "text", "secretkey", "hiddenvalue", "tool_call_id"):
        assert await store.search_messages(chat, word) == [], word


@pytest.mark.parametrize(
    "data",
    [0, 2**70, -(2**63), 1.0, 0.1, 1.5e-7, "123", "", True, None, [1, "1", 1.5], {"n": 2**64}],
)
async def test_json_round_trips_exactly(store: SqlContextStore, chat: str, data: object) -> None:
    await store.add_message(MessageRecord(id="m", chat_id=chat, name="user", data=data))
    got = await store.get_message("m")
    assert got is not None
    assert got.data == data
    assert type(got.data) is type(data)
    (loaded,) = await store.get_message_chain("m")
    assert loaded.data == data
    assert type(loaded.data) is type(data)


async def _compacted(store: SqlContextStore) -> tuple[str, list[str]]:
    """Chat ``k``: three turns compacted through the second answer; the summary's id and the
    ids of the branch's messages, root first."""
    engine = ContextEngine(store=store, chat_id="k", user_id="u1")
    for turn in range(3):
        engine.set(user(f"question {turn}"), assistant_text(f"answer {turn}"))
        await engine.save()

    async def summarize(folded: list[Message]) -> str:
        return f"{len(folded)} messages"

    compaction = await engine.compact(summarize, keep_last_turns=1)
    return compaction.id, [m.id for m in await store.get_messages("k")]


async def test_a_compaction_summary_is_never_made_a_parent(store: SqlContextStore) -> None:
    summary, ids = await _compacted(store)
    engine = ContextEngine(store=store, chat_id="k", user_id="u1")
    resolved = [m.id for m in (await engine.resolve()).messages]
    assert resolved == [summary, *ids[4:]]
    before = await store.export_chat("k")
    refusal = f"{summary!r} is a compaction summary, which sits beside a branch"
    with pytest.raises(errors.InvalidInputError, match=refusal):
        await store.set_message_parent(ids[4], summary)
    with pytest.raises(errors.InvalidInputError, match=refusal):
        await store.add_message(rec("x", "k", summary))
    with pytest.raises(errors.InvalidInputError, match=refusal):  # one transaction: y neither
        await store.add_messages([rec("y", "k", ids[-1]), rec("x", "k", summary)])
    again = MessageRecord(  # a summary and its child in one batch
        id="s2", chat_id="k", parent_id=ids[-1], name="user", type="compaction",
        data={"id": "s2", "role": "user", "parts": [{"type": "text", "text": "s"}]},
    )  # fmt: skip
    with pytest.raises(errors.InvalidInputError, match="'s2' is a compaction summary"):
        await store.add_messages([again, rec("x", "k", "s2")])
    with pytest.raises(errors.InvalidInputError, match="type 'message'"):  # never turned into one
        await store.add_message(again.model_copy(update={"id": ids[-1], "parent_id": ids[-2]}))
    main = await store.get_active_branch("k")
    assert main is not None and main.head_message_id == ids[-1]
    with pytest.raises(errors.InvalidInputError, match="'s2' is a compaction summary"):
        await store.append_messages(main.id, [again, rec("x", "k", "s2")], expected_head=ids[-1])
    with pytest.raises(errors.InvalidInputError, match="cannot be its head"):
        await store.append_messages(main.id, [again], expected_head=ids[-1])
    with pytest.raises(errors.InvalidInputError, match="no compaction summary"):
        await store.append_turn(main.id, [again], expected_head=ids[-1])
    assert await store.export_chat("k") == before
    fresh = ContextEngine(store=store, chat_id="k", user_id="u1")
    assert [m.id for m in (await fresh.resolve()).messages] == resolved
