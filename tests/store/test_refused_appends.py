"""A refused append writes nothing, on every backend: not a message, not the branch head, and
not the chat's row either (its version, its time of activity, its message count).

The single-statement append of a save is refused when the branch was deleted (or belongs to
another chat), when its head moved (the compare-and-swap was lost), or when the chat belongs
to another user than the one the search terms were made for (deleted and created again).
Each refusal is checked twice: the statement itself, with the reason it names, and the public
call that meets it."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select

from agentcontext import ContextEngine, errors, user
from agentcontext.store import MessageRecord, SqlContextStore
from agentcontext.store._db.database import unit
from agentcontext.store._db.schema import branches as B
from agentcontext.store._db.schema import chats as C
from agentcontext.store._db.schema import messages as M
from agentcontext.store._dialects import AppendRefused
from agentcontext.store._ops import branches as _branches
from agentcontext.store._rows.codec import message_rows
from tests.helpers import chain, rec


@pytest.fixture(params=["statement", "one-by-one"])
def compound(request: pytest.FixtureRequest, backend: str) -> bool:
    """The dialect's append statement (MariaDB's compound one), or MySQL's statements one by
    one (MariaDB only)."""
    if request.param == "one-by-one" and backend != "mariadb":
        pytest.skip("the statements of an append one by one are MySQL's (and MariaDB's)")
    return bool(request.param == "statement")


@pytest.fixture
async def chat(store: SqlContextStore, compound: bool, monkeypatch: pytest.MonkeyPatch) -> str:
    if not compound:
        monkeypatch.setattr(store.db.dialect, "compound_append", False)
    await store.create_chat("c1", user_id="u1")
    main = await store.get_active_branch("c1")
    assert main is not None
    assert (await store.append_turn(main.id, chain("c1", 2), expected_head=None)).ok
    return "c1"


async def picture(store: SqlContextStore, chat: str) -> dict[str, Any]:
    """The chat's row, its branches' heads and how many messages it holds."""
    async with store.engine.connect() as conn:
        row = (
            await conn.execute(
                select(C.c.user_id, C.c.version, C.c.updated_at, C.c.message_count).where(
                    C.c.id == chat
                )
            )
        ).one()
        heads = (
            await conn.execute(
                select(B.c.id, B.c.head_message_id, B.c.head_depth)
                .where(B.c.chat_id == chat)
                .order_by(B.c.id)
            )
        ).all()
        stored = (
            await conn.execute(select(func.count()).select_from(M).where(M.c.chat_id == chat))
        ).scalar_one()
    return {"chat": list(row), "heads": [list(h) for h in heads], "messages": stored}


async def refusal(
    store: SqlContextStore, branch_id: str, records: list[MessageRecord], owner: str
) -> str:
    """The reason the single-statement append of a save gives for refusing ``records``, run
    as the store runs it (`_appends._fast`)."""
    db, dialect = store.db, store.db.dialect
    rows = message_rows(dialect, records, {records[0].chat_id: owner})
    atomic = dialect.atomic_append and len(rows) <= dialect.append_chunk
    append = unit(_branches.append_rows, dialect, branch_id, rows, rows[-1].id, owner, True)
    with pytest.raises(AppendRefused) as refused:
        await db.run("atomic" if atomic else "write", append, idempotent=True, chat="c1")
    return refused.value.reason


async def deleted_branch(store: SqlContextStore, chat: str) -> str:
    topic = await store.create_branch(chat, "topic", head_message_id="m1")
    assert await store.delete_branch(chat, "topic")
    return topic.id


async def main_id(store: SqlContextStore, chat: str) -> str:
    main = await store.get_branch(chat, "main")
    assert main is not None
    return main.id


# --- the statement ------------------------------------------------------------------------------


async def test_an_append_to_a_deleted_branch_changes_nothing(
    store: SqlContextStore, chat: str
) -> None:
    gone = await deleted_branch(store, chat)
    before = await picture(store, chat)
    assert await refusal(store, gone, [rec("x", chat, "m1")], "u1") == "branch"
    assert await picture(store, chat) == before


async def test_an_append_to_another_chats_branch_changes_nothing(
    store: SqlContextStore, chat: str
) -> None:
    await store.create_chat("c2", user_id="u1")
    other = await store.get_active_branch("c2")
    assert other is not None
    before = await picture(store, chat), await picture(store, "c2")
    assert await refusal(store, other.id, [rec("x", chat, None)], "u1") == "branch"
    assert (await picture(store, chat), await picture(store, "c2")) == before


async def test_an_append_after_a_head_that_moved_changes_nothing(
    store: SqlContextStore, chat: str
) -> None:
    main = await main_id(store, chat)
    before = await picture(store, chat)
    assert await refusal(store, main, [rec("x", chat, "m0"), rec("y", chat, "x")], "u1") == (
        "moved"
    )
    assert await picture(store, chat) == before


async def test_an_append_for_another_owner_changes_nothing(
    store: SqlContextStore, chat: str
) -> None:
    main = await main_id(store, chat)
    before = await picture(store, chat)
    assert await refusal(store, main, [rec("x", chat, "m1")], "u2") == "owner"
    assert await picture(store, chat) == before


# --- the public calls ---------------------------------------------------------------------------


async def test_append_turn_on_a_deleted_branch_raises_and_changes_nothing(
    store: SqlContextStore, chat: str
) -> None:
    gone = await deleted_branch(store, chat)
    before = await picture(store, chat)
    with pytest.raises(errors.BranchNotFoundError, match="no branch with id"):
        await store.append_turn(gone, [rec("x", chat, "m1")], expected_head="m1")
    assert await picture(store, chat) == before


async def test_append_turn_after_a_moved_head_reports_it_and_changes_nothing(
    store: SqlContextStore, chat: str
) -> None:
    main = await main_id(store, chat)
    before = await picture(store, chat)
    result = await store.append_turn(main, [rec("x", chat, "m0")], expected_head="m0")
    assert (result.ok, result.head_message_id) == (False, "m1")
    assert await picture(store, chat) == before


async def test_a_save_on_a_branch_another_store_deleted_changes_nothing(
    store: SqlContextStore, store_url: str, chat: str
) -> None:
    """The first save of an engine on a branch that another process deleted meanwhile."""
    engine = ContextEngine(store=store, chat_id=chat, user_id="u1")
    engine.set(user("before the delete", id="m2"))
    await engine.save()
    await engine.rewind("m2", name="topic")  # the engine's branch, from its own save
    async with SqlContextStore(store_url) as other:
        await other.set_active_branch(chat, await main_id(other, chat))
        assert await other.delete_branch(chat, "topic")
    before = await picture(store, chat)
    engine.set(user("after the delete"))
    with pytest.raises(errors.ChatNotFoundError, match="branch 'topic'"):
        await engine.save()
    assert await picture(store, chat) == before
