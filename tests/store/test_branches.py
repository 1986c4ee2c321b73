"""Branches and checkpoints — on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agentcontext import errors
from agentcontext.store import SqlContextStore
from agentcontext.store._ops import branches as _branches
from tests.helpers import chain, rec


@pytest.fixture
async def chat(store: SqlContextStore) -> str:
    await store.create_chat("c1", user_id="u1")
    branch = await store.get_active_branch("c1")
    assert branch is not None
    assert (await store.append_messages(branch.id, chain("c1", 4), expected_head=None)).ok
    return "c1"


async def active_names(store: SqlContextStore, chat: str) -> list[str]:
    return [b.name for b in await store.list_branches(chat) if b.is_active]


async def test_create_branch_and_duplicate_name(store: SqlContextStore, chat: str) -> None:
    branch = await store.create_branch(chat, "feature", head_message_id="m1")
    assert (branch.name, branch.head_message_id, branch.is_active) == ("feature", "m1", False)
    assert await store.get_branch(chat, "feature") == branch
    assert await store.get_branch_by_id(branch.id) == branch
    with pytest.raises(errors.BranchExistsError):
        await store.create_branch(chat, "feature")
    with pytest.raises(errors.MessageNotFoundError):
        await store.create_branch(chat, "x", head_message_id="ghost")
    with pytest.raises(errors.ChatNotFoundError):
        await store.create_branch("nope", "x")
    assert await store.get_branch(chat, "x") is None
    assert await active_names(store, chat) == ["main"]


async def test_create_branch_with_activate_switches(store: SqlContextStore, chat: str) -> None:
    await store.create_branch(chat, "b", head_message_id="m0", activate=True)
    assert await active_names(store, chat) == ["b"]
    active = await store.get_active_branch(chat)
    assert active is not None and active.name == "b"


async def test_set_active_branch_leaves_exactly_one(store: SqlContextStore, chat: str) -> None:
    created = [await store.create_branch(chat, f"b{i}", head_message_id="m0") for i in range(6)]
    await asyncio.gather(*(store.set_active_branch(chat, b.id) for b in created))
    assert len(await active_names(store, chat)) == 1
    result = await store.set_active_branch(chat, created[2].id)
    assert result.is_active and result.name == "b2"
    assert await active_names(store, chat) == ["b2"]
    with pytest.raises(errors.BranchNotFoundError):
        await store.set_active_branch(chat, "no-such-id")
    assert await active_names(store, chat) == ["b2"]


async def test_update_branch_head_is_compare_and_swap(store: SqlContextStore, chat: str) -> None:
    main = await store.get_branch(chat, "main")
    assert main is not None and main.head_message_id == "m3"
    assert await store.update_branch_head(main.id, "m1", "m0") is False
    assert await store.update_branch_head(main.id, "m1", "m3") is True
    assert (await store.get_branch(chat, "main")).head_message_id == "m1"  # type: ignore[union-attr]
    assert await store.update_branch_head(main.id, None, "m1") is True
    assert (await store.get_branch(chat, "main")).head_message_id is None  # type: ignore[union-attr]
    with pytest.raises(errors.BranchNotFoundError):
        await store.update_branch_head("nope", "m1", None)


async def test_concurrent_cas_lets_exactly_one_writer_win(
    store: SqlContextStore, chat: str
) -> None:
    main = await store.get_branch(chat, "main")
    assert main is not None
    results = await asyncio.gather(
        *(store.update_branch_head(main.id, f"m{i % 3}", "m3") for i in range(10))
    )
    assert sum(results) == 1


async def test_append_messages_is_atomic_compare_and_swap(
    store: SqlContextStore, chat: str
) -> None:
    main = await store.get_branch(chat, "main")
    assert main is not None
    stale = await store.append_messages(main.id, [rec("n1", chat, "m2")], expected_head="m2")
    assert (stale.ok, stale.head_message_id) == (False, "m3")
    assert await store.get_message("n1") is None
    ok = await store.append_messages(
        main.id, [rec("n1", chat, "m3"), rec("n2", chat, "n1")], expected_head="m3"
    )
    assert (ok.ok, ok.head_message_id) == (True, "n2")
    with pytest.raises(errors.MessageNotFoundError):
        await store.append_messages(main.id, [rec("n3", chat, "ghost")], expected_head="n2")
    assert (await store.get_branch(chat, "main")).head_message_id == "n2"  # type: ignore[union-attr]
    assert await store.get_message("n3") is None


async def test_concurrent_appends_never_lose_a_message(store: SqlContextStore, chat: str) -> None:
    main = await store.get_branch(chat, "main")
    assert main is not None

    async def writer(w: int) -> None:
        for turn in range(5):
            while True:
                head = (await store.get_branch_by_id(main.id)).head_message_id  # type: ignore[union-attr]
                mid = f"w{w}t{turn}"
                result = await store.append_messages(
                    main.id, [rec(mid, chat, head)], expected_head=head
                )
                if result.ok:
                    break

    await asyncio.gather(*(writer(w) for w in range(4)))
    ids = [m.id for m in await store.get_messages(chat)]
    assert len(ids) == 4 + 20
    assert sorted(ids[4:]) == sorted(f"w{w}t{t}" for w in range(4) for t in range(5))


async def test_fork_branch_names_are_sequential_and_collision_free(
    store: SqlContextStore, chat: str
) -> None:
    b2 = await store.fork_branch(chat, "main", head_message_id="m1", activate=True)
    assert (b2.name, b2.head_message_id, b2.is_active) == ("main-v2", "m1", True)
    b3 = await store.fork_branch(chat, "main", head_message_id="m2", activate=False)
    assert b3.name == "main-v3"
    flat = await store.fork_branch(chat, "main-v2", head_message_id="m1", activate=False)
    assert flat.name == "main-v4"
    assert await active_names(store, chat) == ["main-v2"]
    forks = await asyncio.gather(
        *(store.fork_branch(chat, "main", head_message_id="m0", activate=False) for _ in range(8))
    )
    assert sorted(f.name for f in forks) == sorted(f"main-v{i}" for i in range(5, 13))


async def test_fork_branch_with_messages_is_atomic(store: SqlContextStore, chat: str) -> None:
    forked = await store.fork_branch(
        chat,
        "main",
        head_message_id="m1",
        activate=True,
        messages=[rec("f1", chat, "m1"), rec("f2", chat, "f1")],
    )
    assert forked.head_message_id == "f2"
    assert [m.id for m in await store.get_messages(chat)] == ["m0", "m1", "f1", "f2"]
    with pytest.raises(errors.MessageNotFoundError):
        await store.fork_branch(
            chat,
            "main",
            head_message_id="m1",
            activate=True,
            messages=[rec("g1", chat, "m1"), rec("g2", chat, "ghost")],
        )
    assert [b.name for b in await store.list_branches(chat)] == ["main", "main-v2"]
    assert await store.get_message("g1") is None


async def test_list_branches_reports_chain_lengths(store: SqlContextStore, chat: str) -> None:
    await store.fork_branch(chat, "main", head_message_id="m1", activate=False)
    await store.create_branch(chat, "empty")
    info = {b.name: b.message_count for b in await store.list_branches(chat)}
    assert info == {"main": 4, "main-v2": 2, "empty": 0}
    with pytest.raises(errors.ChatNotFoundError):
        await store.list_branches("nope")


async def test_checkpoints_upsert_by_name_and_list_newest_first(
    store: SqlContextStore, chat: str
) -> None:
    first = await store.create_checkpoint(chat, "a", "m1")
    await store.create_checkpoint(chat, "b", "m2")
    moved = await store.create_checkpoint(chat, "a", "m3")
    assert moved.id == first.id and moved.message_id == "m3"
    assert moved.created_at >= first.created_at
    assert [c.name for c in await store.list_checkpoints(chat)] == ["a", "b"]
    assert (await store.get_checkpoint(chat, "a")).message_id == "m3"  # type: ignore[union-attr]
    assert await store.get_checkpoint(chat, "zzz") is None
    assert await store.delete_checkpoint(chat, "a") is True
    assert await store.delete_checkpoint(chat, "a") is False
    assert [c.name for c in await store.list_checkpoints(chat)] == ["b"]


async def test_checkpoint_errors_leave_nothing_behind(store: SqlContextStore, chat: str) -> None:
    await store.create_chat("other", user_id="u1")
    await store.add_message(rec("x", "other"))
    with pytest.raises(errors.MessageNotFoundError):
        await store.create_checkpoint(chat, "cp", "ghost")
    with pytest.raises(errors.InvalidGraphError):
        await store.create_checkpoint(chat, "cp", "x")
    with pytest.raises(errors.ChatNotFoundError):
        await store.create_checkpoint("nope", "cp", "m1")
    with pytest.raises(errors.InvalidInputError):
        await store.create_checkpoint(chat, "", "m1")
    with pytest.raises(errors.InvalidInputError):
        await store.create_checkpoint(chat, "x" * 1000, "m1")
    assert await store.list_checkpoints(chat) == []


async def test_change_versions_let_a_reader_catch_up(store: SqlContextStore, chat: str) -> None:
    main = await store.get_branch(chat, "main")
    assert main is not None
    state = await store.get_branch_state(main.id)
    assert state is not None
    assert state.branch == main
    before = state.version
    assert await store.get_changes(chat, before) == []
    # An in-place update and an append are both changes; a failed append is not.
    await store.add_message(rec("m1", chat, "m0", "edited"))
    failed = await store.append_messages(main.id, [rec("x", chat, "m1")], expected_head="m1")
    assert failed.ok is False
    assert failed.version == before + 1
    ok = await store.append_messages(main.id, [rec("n1", chat, "m3")], expected_head="m3")
    assert ok.ok and ok.version == before + 2
    changes = await store.get_changes(chat, before)
    assert [m.id for m in changes] == ["m1", "n1"]
    assert changes[0].data["parts"][0]["text"] == "edited"
    assert [m.id for m in await store.get_changes(chat, ok.version)] == []
    after = await store.get_branch_state(main.id)
    assert after is not None
    assert (after.version, after.branch.head_message_id) == (ok.version, "n1")
    assert await store.get_branch_state("nope") is None


async def test_append_with_updates_moves_the_head_to_new_head(
    store: SqlContextStore, chat: str
) -> None:
    main = await store.get_branch(chat, "main")
    assert main is not None
    result = await store.append_messages(
        main.id,
        [rec("m3", chat, None, "placeholder filled"), rec("n1", chat, "m3")],
        expected_head="m3",
        new_head="n1",
    )
    assert result.ok and result.head_message_id == "n1"
    chain = await store.get_messages(chat)
    assert [m.id for m in chain] == ["m0", "m1", "m2", "m3", "n1"]
    assert chain[3].data["parts"][0]["text"] == "placeholder filled"
    assert chain[3].parent_id == "m2"
    with pytest.raises(errors.InvalidInputError, match="new_head"):
        await store.append_messages(
            main.id, [rec("q", chat, "n1")], expected_head="n1", new_head="zz"
        )


# --- automatic names ----------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    base=st.text(st.sampled_from("ab-v12_é"), min_size=1, max_size=300).filter(str.strip),
    taken=st.sets(st.text(st.sampled_from("ab-v12"), max_size=12), max_size=20),
)
@example(base="main-v2-v2", taken={"main", "main-v2", "main-v2-v2"})
@example(base="-v2", taken=set())
@example(base="x" * 255, taken={"x" * 252 + "-v2"})
def test_automatic_names_are_flat_short_and_free(base: str, taken: set[str]) -> None:
    name = _branches.next_name(base, taken)
    root = _branches.root_name(base)
    assert name not in taken
    assert 0 < len(name) <= 255
    assert re.fullmatch(r"(?:-v\d+)+", root) is None or root == base  # suffixes only: kept
    number = int(name.rsplit("-v", 1)[1])
    assert number >= 2
    assert name == root[: 255 - len(f"-v{number}")] + f"-v{number}"
    # The smallest free number: every smaller one is taken.
    for smaller in range(2, number):
        suffix = f"-v{smaller}"
        assert root[: 255 - len(suffix)] + suffix in taken


async def test_a_regenerate_loop_keeps_names_short(store: SqlContextStore, chat: str) -> None:
    base = "main"
    for n in range(2, 120):
        forked = await store.fork_branch(chat, base, head_message_id="m0", activate=True)
        assert forked.name == f"main-v{n}"
        base = forked.name  # the next rewind starts from the branch just made
    long = "y" * 255
    await store.create_branch(chat, long, head_message_id="m0")
    forked = await store.fork_branch(chat, long, head_message_id="m0", activate=False)
    assert forked.name == "y" * 252 + "-v2"
