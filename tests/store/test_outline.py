"""The chat's runs, found once per chat version (`_outline.Runs`) and kept by the store.

`Runs.outline` cuts structural runs at a page's marks; it must give exactly what one walk of
the whole chat with the marks applied gives (the model below, the definition of an outline),
for random forests, marks, fold sizes and opened runs. The store's memory of runs must never
serve an outline older than the chat: after appends, forks, re-parenting, purges, a chat
deleted and created again, and writes rolled back inside a caller's transaction, the outline
still equals the one computed from the whole graph.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable

from hypothesis import example, given, settings
from hypothesis import strategies as st

from agentcontext.store import MessageRecord, SqlContextStore
from agentcontext.store._memory import OutlineMemory
from agentcontext.store._ops.outline import Runs
from agentcontext.store.base import outline_of
from agentcontext.store.records import Branch, Fold
from tests.helpers import rec


def model(
    nodes: Iterable[tuple[str, str | None, str]],
    marked: Collection[str],
    *,
    fold: int,
    opened: Collection[str] = (),
) -> tuple[set[str], list[Fold]]:
    """The outline by definition: every message kept or in the run of the kept message below
    it, with the marks applied before the walk."""
    parent_of: dict[str, str | None] = {}
    children: dict[str, int] = {}
    always = set(marked)
    for node_id, parent_id, kind in nodes:
        parent_of[node_id] = parent_id
        if parent_id is not None:
            children[parent_id] = children.get(parent_id, 0) + 1
            if kind == "compaction":
                always.update((parent_id, node_id))

    def kept(node_id: str) -> bool:
        parent = parent_of[node_id]
        return (
            parent is None
            or parent not in parent_of
            or node_id in always
            or children.get(node_id, 0) != 1
        )

    shown: set[str] = set()
    folds: list[Fold] = []
    for node_id in parent_of:
        if not kept(node_id):
            continue
        shown.add(node_id)
        run: list[str] = []
        cursor = parent_of[node_id]
        while cursor is not None and cursor in parent_of and not kept(cursor):
            run.append(cursor)
            cursor = parent_of[cursor]
        run.reverse()
        if len(run) >= fold and run[0] not in opened:
            shown.update((run[0], run[-1]))
            folds.append(Fold(first_id=run[0], last_id=run[-1], count=len(run), child_id=node_id))
        else:
            shown.update(run)
    return shown, sorted(folds, key=lambda f: f.first_id)


def _forest(seed: int, size: int) -> list[tuple[str, str | None, str]]:
    """Mostly long linear stretches, some forks, roots, compactions and a parent outside."""
    rng = random.Random(seed)
    nodes: list[tuple[str, str | None, str]] = []
    for index in range(size):
        roll = rng.random()
        if not nodes or roll < 0.03:
            parent = None
        elif roll < 0.05:
            parent = "elsewhere"  # a parent that is not a message of the chat
        elif roll < 0.85:
            parent = nodes[-1][0]
        else:
            parent = rng.choice(nodes)[0]
        kind = "compaction" if parent is not None and rng.random() < 0.03 else "message"
        nodes.append((f"m{index}", parent, kind))
    rng.shuffle(nodes)  # the rows come in any order
    return nodes


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 100_000),
    size=st.integers(1, 120),
    fold=st.integers(2, 9),
    marks=st.integers(0, 12),
    opens=st.integers(0, 3),
)
@example(seed=0, size=1, fold=2, marks=1, opens=0)
def test_cutting_structural_runs_at_the_marks_is_the_outline(
    seed: int, size: int, fold: int, marks: int, opens: int
) -> None:
    nodes = _forest(seed, size)
    rng = random.Random(seed + 1)
    ids = [node[0] for node in nodes]
    marked = {rng.choice(ids) for _ in range(marks)} | {"not-a-message"}
    runs = Runs.build(nodes)
    _, plain = model(nodes, marked, fold=fold)
    opened = {rng.choice(plain).first_id for _ in range(opens)} if plain else set()
    shown, folds = runs.outline(marked, fold=fold, opened=opened)
    assert (set(shown), folds) == model(nodes, marked, fold=fold, opened=opened)
    assert runs.count == size


def test_the_memory_is_bounded_in_bytes_and_chats() -> None:
    small = Runs.build([("a", None, "message"), ("b", "a", "message")])
    memory = OutlineMemory(max_bytes=small.size * 3)
    for number in range(5):
        memory.remember(f"c{number}", ("t", 1), small)
    assert memory.recall("c0", ("t", 1)) is None  # the least recently used went first
    assert memory.recall("c4", ("t", 1)) is small
    assert memory.recall("c4", ("t", 2)) is None  # another version
    big = Runs.build((f"m{i}", f"m{i - 1}" if i else None, "message") for i in range(10))
    memory.remember("big", ("t", 1), big)
    assert memory.recall("big", ("t", 1)) is None  # larger than the whole bound
    memory.forget("c4")
    assert memory.recall("c4", ("t", 1)) is None


async def _check(store: SqlContextStore, chat_id: str, fold: int = 3) -> None:
    graph = await store.get_graph(chat_id)
    keep = [graph.nodes[len(graph.nodes) // 2].id] if graph.nodes else []
    for marks in ([], keep):
        assert await store.graph_outline(chat_id, fold=fold, keep=marks) == outline_of(
            graph, fold=fold, keep=marks
        )


async def _chat_with_chain(
    store: SqlContextStore, chat: str, prefix: str, count: int
) -> tuple[Branch, list[MessageRecord]]:
    """A new chat whose main branch holds ``count`` messages in a line (``{prefix}0`` first)."""
    await store.create_chat(chat, user_id="u")
    main = await store.get_active_branch(chat)
    assert main is not None
    records = [rec(f"{prefix}{i}", chat, f"{prefix}{i - 1}" if i else None) for i in range(count)]
    await store.append_messages(main.id, records, expected_head=None)
    return main, records


async def test_the_store_never_serves_runs_older_than_the_chat(store: SqlContextStore) -> None:
    chat = "kept"
    main, records = await _chat_with_chain(store, chat, "k", 40)
    await _check(store, chat)
    hits = store._memory.outlines.hits
    await _check(store, chat)
    assert store._memory.outlines.hits > hits  # unchanged: served from memory
    more = [rec(f"k{i}", chat, f"k{i - 1}") for i in range(40, 50)]
    await store.append_messages(main.id, more, expected_head=records[-1].id)
    await _check(store, chat)
    await store.fork_branch(chat, "main", head_message_id="k20", activate=False, name="side")
    await store.add_messages([rec("s0", chat, "k20"), rec("s1", chat, "s0")])
    await _check(store, chat)
    await store.set_message_parent("k30", "s1")
    await _check(store, chat)
    await store.delete_branch(chat, "side")
    await store.purge(chat)
    await _check(store, chat)
    # Deleted and created again: the same id and version, another chat.
    await store.delete_chat(chat)
    await _chat_with_chain(store, chat, "n", 7)
    await _check(store, chat)


async def test_runs_seen_inside_a_rolled_back_transaction_are_not_kept(
    store: SqlContextStore,
) -> None:
    chat = "rolled"
    await _chat_with_chain(store, chat, "r", 12)
    version = (await store.open_chat(chat, user_id="u")).version
    try:
        async with store.begin():
            extra: list[MessageRecord] = [rec("x0", chat, "r3"), rec("x1", chat, "x0")]
            await store.add_messages(extra)
            inside = await store.graph_outline(chat, fold=3)
            assert inside.message_count == 14
            raise RuntimeError("roll back")
    except RuntimeError:
        pass
    assert (await store.open_chat(chat, user_id="u")).version == version
    # The same version number is taken again by a different change, committed this time.
    await store.add_messages([rec("y0", chat, "r5")])
    await _check(store, chat)
