"""save(): chaining, atomicity, activity, update-branching, in-place updates, failures.

On SQLite and PostgreSQL.
"""

from __future__ import annotations

import math

import pytest

from agentcontext import (
    EmptyConversationError,
    InvalidGraphError,
    Message,
    SaveResult,
    SerializationError,
    TextPart,
    assistant,
    assistant_text,
    last_assistant_message,
    user,
)
from agentcontext.store import SqlContextStore
from tests.engine._util import ids, texts
from tests.engine.conftest import EngineFactory
from tests.helpers import rec


async def test_save_chains_messages_and_moves_the_head(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(user("Hello", id="m1"), assistant_text("Hi!", id="m2"), user("How?", id="m3"))
    result = await engine.save()
    assert result == SaveResult(head_message_id="m3")
    assert engine.pending == []
    assert engine.head_message_id == "m3"
    parents = {m: (await store.get_message(m)).parent_id for m in ("m1", "m2", "m3")}  # type: ignore[union-attr]
    assert parents == {"m1": None, "m2": "m1", "m3": "m2"}
    branch = await store.get_active_branch("c1")
    assert branch is not None and (branch.name, branch.head_message_id) == ("main", "m3")

    engine.set(assistant_text("Fine.", id="m4"))
    assert (await engine.save()).head_message_id == "m4"
    assert (await store.get_message("m4")).parent_id == "m3"  # type: ignore[union-attr]
    assert [r.id for r in await store.get_messages("c1")] == ["m1", "m2", "m3", "m4"]


async def test_stored_record_matches_the_message(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(user(Message(id="u1", role="user", parts=[TextPart(text="q")], metadata={"k": 1})))
    await engine.save()
    record = await store.get_message("u1")
    assert record is not None
    assert (record.chat_id, record.name, record.type) == ("c1", "user", "message")
    assert record.data == {
        "id": "u1",
        "role": "user",
        "parts": [{"type": "text", "text": "q"}],
        "metadata": {"k": 1},
    }


async def test_save_with_nothing_pending_changes_nothing(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    empty = await engine.save()
    assert empty == SaveResult(head_message_id=None)
    assert empty.head is None
    with pytest.raises(EmptyConversationError, match="no head"):
        _ = empty.head_message_id
    engine.set(user("q", id="m1"))
    await engine.save()
    before = await store.get_chat("c1")
    assert await engine.save() == SaveResult(head_message_id="m1")
    assert await store.get_chat("c1") == before


async def test_a_save_counts_as_chat_activity(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    first, second = make_engine("c1"), make_engine("c2")
    first.set(user("a"))
    await first.save()
    second.set(user("b"))
    await second.save()
    assert [c.id for c in await store.list_chats(user_id="u1")] == ["c2", "c1"]
    before = await store.get_chat("c1")
    first.set(user("again"))
    await first.save()
    listed = await store.list_chats(user_id="u1")
    assert [c.id for c in listed] == ["c1", "c2"]
    assert listed[0].message_count == 2
    after = await store.get_chat("c1")
    assert before is not None and after is not None and after.updated_at > before.updated_at


async def test_resending_a_stored_message_branches_with_a_fresh_id(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(user("What is the weather?", id="u1"))
    assert (await engine.save()).head_message_id == "u1"
    engine.set(assistant_text("calling the tool…", id="a1"))
    await engine.save()
    assert engine.branch == "main"

    engine.set(assistant_text("It is sunny.", id="a1"))
    result = await engine.save()
    new_id = result.head_message_id
    assert new_id is not None and new_id != "a1"
    assert engine.branch == "main-v2"
    assert engine.head_message_id == new_id
    assert [b.name for b in await store.list_branches("c1")] == ["main", "main-v2"]

    record = await store.get_message(new_id)
    assert record is not None
    assert record.parent_id == "u1"
    assert record.data["id"] == new_id  # the same fresh id in the record and in the message

    warm = await engine.resolve()
    assert ids(warm.messages) == ["u1", new_id]
    assert texts(warm.messages) == ["What is the weather?", "It is sunny."]
    assert (await make_engine().resolve()).messages == warm.messages

    # The original is intact on main.
    original = await store.get_message("a1")
    assert original is not None and original.data["parts"][0]["text"] == "calling the tool…"
    await engine.switch_branch("main")
    assert texts(await engine.get_messages()) == ["What is the weather?", "calling the tool…"]


async def test_resending_the_first_message_branches_from_the_root(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(user("v1", id="u1"), assistant_text("a", id="a1"))
    await engine.save()
    engine.set(user("v2", id="u1"))
    result = await engine.save()
    assert engine.branch == "main-v2"
    assert texts(await engine.get_messages()) == ["v2"]
    record = await store.get_message(result.head_message_id)  # type: ignore[arg-type]
    assert record is not None and record.parent_id is None


async def test_resending_a_message_with_new_ones_after_it(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(user("q", id="u1"), assistant_text("a", id="a1"), user("q2", id="u2"))
    await engine.save()
    engine.set(assistant_text("a, better", id="a1"), user("q2, better", id="u9"))
    await engine.save()
    messages = await engine.get_messages()
    assert texts(messages) == ["q", "a, better", "q2, better"]
    assert messages[0].id == "u1"
    for message in messages[1:]:
        record = await store.get_message(message.id)
        assert record is not None and record.data["id"] == message.id
        assert message.id != "a1"
    assert (await make_engine().get_messages()) == messages


async def test_branch_false_updates_in_place(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(user("Hello", id="u1"))
    await engine.save()
    for text in ("Step 1", "Step 1 + 2", "Step 1 + 2 + 3"):
        engine.set(assistant_text(text, id="a1"))
        assert (await engine.save(branch=False)).head_message_id == "a1"
    assert engine.branch == "main"
    assert len(await store.list_branches("c1")) == 1
    record = await store.get_message("a1")
    assert record is not None and record.parent_id == "u1"
    assert record.data["parts"][0]["text"] == "Step 1 + 2 + 3"
    assert [r.id for r in await store.get_message_chain("a1")] == ["u1", "a1"]
    assert texts(await engine.get_messages()) == ["Hello", "Step 1 + 2 + 3"]
    assert texts(await make_engine().get_messages()) == ["Hello", "Step 1 + 2 + 3"]


async def test_branch_false_updates_a_message_mid_chain_and_appends_the_rest(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(user("q1", id="u1"), assistant_text("a1", id="a1"), user("q2", id="u2"))
    await engine.save()
    before = await store.get_chat("c1")
    engine.set(assistant_text("a1 fixed", id="a1"))
    assert (await engine.save(branch=False)).head_message_id == "u2"
    after = await store.get_chat("c1")
    assert before is not None and after is not None and after.updated_at > before.updated_at

    engine.set(user("q1 fixed", id="u1"), assistant_text("a2", id="a2"))
    assert (await engine.save(branch=False)).head_message_id == "a2"
    assert texts(await engine.get_messages()) == ["q1 fixed", "a1 fixed", "q2", "a2"]
    assert (await store.get_message("a2")).parent_id == "u2"  # type: ignore[union-attr]
    assert (await store.get_message("u1")).parent_id is None  # type: ignore[union-attr]
    assert texts(await make_engine().get_messages()) == ["q1 fixed", "a1 fixed", "q2", "a2"]


async def test_branch_false_updates_a_message_of_another_branch_without_moving(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(user("q", id="u1"), assistant_text("a", id="a1"))
    await engine.save()
    await engine.rewind("u1")
    engine.set(assistant_text("a (main)", id="a1"))
    assert (await engine.save(branch=False)).head_message_id == "u1"
    assert texts(await engine.get_messages()) == ["q"]
    record = await store.get_message("a1")
    assert record is not None and record.data["parts"][0]["text"] == "a (main)"
    assert record.parent_id == "u1"


async def test_last_assistant_message_prefers_pending_then_stored(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    # No assistant message yet: a fresh id.
    engine.set(user("q", id="u1"), last_assistant_message("first try"))
    await engine.save()
    stored = await engine.get_messages()
    assert texts(stored) == ["q", "first try"] and stored[1].id not in ("u1", "")
    first_id = stored[1].id

    # Stored: the retry updates that message (in place with branch=False).
    engine.set(last_assistant_message("second try"))
    assert (await engine.save(branch=False)).head_message_id == first_id
    assert texts(await engine.get_messages()) == ["q", "second try"]

    # Pending first: the retry replaces the pending assistant message, saved once.
    engine.set(user("q2", id="u2"), assistant_text("draft", id="a2"))
    engine.set(last_assistant_message("final"))
    preview = await engine.get_messages()
    assert ids(preview) == ["u1", first_id, "u2", "a2"]
    assert texts(preview) == ["q", "second try", "q2", "final"]
    assert (await engine.save()).head_message_id == "a2"
    assert texts(await make_engine().get_messages()) == ["q", "second try", "q2", "final"]


async def test_last_assistant_message_with_branching_save(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(user("q", id="u1"), assistant_text("answer", id="a1"))
    await engine.save()
    engine.set(last_assistant_message("better answer"))
    result = await engine.save()
    assert engine.branch == "main-v2"
    assert result.head_message_id != "a1"
    assert texts(await engine.get_messages()) == ["q", "better answer"]
    assert (await store.get_message("a1")).data["parts"][0]["text"] == "answer"  # type: ignore[union-attr]


async def test_two_pending_messages_with_one_id_are_saved_once(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()
    engine.set(user("q", id="u1"), assistant_text("v1", id="a1"), assistant_text("v2", id="a1"))
    assert ids(await engine.get_messages()) == ["u1", "a1"]
    await engine.save()
    assert texts(await make_engine().get_messages()) == ["q", "v2"]


# --- failures ---------------------------------------------------------------------------


async def _snapshot(store: SqlContextStore) -> tuple[object, ...]:
    return (
        await store.get_chat("c1"),
        await store.list_branches("c1"),
        await store.get_graph("c1"),
        await store.list_chats(),
    )


async def test_nan_in_metadata_fails_and_changes_nothing(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(user("q", id="u1"))
    await engine.save()
    before = await _snapshot(store)
    bad = Message(
        id="a1", role="assistant", parts=[TextPart(text="x")], metadata={"score": math.nan}
    )
    engine.set(user("fine", id="u2"), assistant(bad))
    with pytest.raises(SerializationError, match=r"NaN|nan"):
        await engine.save()
    assert await _snapshot(store) == before
    assert await store.get_message("u2") is None
    assert [f.id for f in engine.pending] == ["u2", "a1"]
    assert ids(await engine.get_messages()) == ["u1", "u2", "a1"]
    # Still failing on retry, still nothing written.
    with pytest.raises(SerializationError):
        await engine.save(branch=False)
    assert await _snapshot(store) == before


async def test_infinity_in_an_update_fails_without_forking(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    engine.set(user("q", id="u1"), assistant_text("a", id="a1"))
    await engine.save()
    before = await _snapshot(store)
    bad = Message(id="a1", role="assistant", parts=[TextPart(text="y")], metadata={"t": math.inf})
    engine.set(assistant(bad))
    with pytest.raises(SerializationError):
        await engine.save()  # would fork main-v2
    with pytest.raises(SerializationError):
        await engine.save(branch=False)  # would update in place
    assert await _snapshot(store) == before
    assert engine.branch == "main"
    assert len(engine.pending) == 1


@pytest.mark.parametrize("branch", [True, False])
async def test_an_id_of_another_chat_fails_and_changes_nothing(
    store: SqlContextStore, make_engine: EngineFactory, branch: bool
) -> None:
    await store.create_chat("other", user_id="u2")
    await store.add_message(rec("taken", "other", text="not yours"))
    engine = make_engine()
    engine.set(user("q", id="u1"))
    await engine.save()
    before = await _snapshot(store)
    other_before = await store.get_graph("other")

    engine.set(user("fine", id="u2"), assistant_text("clash", id="taken"))
    with pytest.raises(InvalidGraphError, match="ids are global"):
        await engine.save(branch=branch)
    assert await _snapshot(store) == before
    assert await store.get_graph("other") == other_before
    assert await store.get_message("u2") is None
    assert [f.id for f in engine.pending] == ["u2", "taken"]

    # Once the cause is gone, the same pending messages save.
    assert await store.delete_chat("other")
    assert (await engine.save(branch=branch)).head_message_id == "taken"
    assert ids(await engine.get_messages()) == ["u1", "u2", "taken"]
