"""Viewer reads that cost what a page shows: chain pages and the folded graph outline.

The outline the database summarises in SQL must equal the one computed from the whole graph
(`outline_of`), for random trees with branches, checkpoints and compactions.
"""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentcontext.errors import ChatNotFoundError, InvalidInputError
from agentcontext.store import MessageRecord, SqlContextStore
from agentcontext.store.base import outline_of
from agentcontext.views import DEFAULT_FOLD, graph_to_mermaid, visualize_graph
from agentcontext.web._layout import FOLD_MIN, layout_graph, render_svg
from tests.helpers import chain, rec


async def _linear(store: SqlContextStore, chat_id: str, count: int) -> list[MessageRecord]:
    await store.create_chat(chat_id, user_id="u")
    main = await store.get_active_branch(chat_id)
    assert main is not None
    records = chain(chat_id, count, prefix=f"{chat_id}-")
    await store.append_messages(main.id, records, expected_head=None)
    return records


async def test_a_chain_page_is_the_end_of_the_chain_root_first(store: SqlContextStore) -> None:
    records = await _linear(store, "c", 25)
    page = await store.chain_page("c", records[-1].id, limit=10)
    assert [m.id for m in page.messages] == [r.id for r in records[-10:]]
    assert page.depths == list(range(16, 26))
    assert page.older
    older = await store.chain_page("c", page.messages[0].parent_id or "", limit=10)
    assert [m.id for m in older.messages] == [r.id for r in records[5:15]]
    first = await store.chain_page("c", records[4].id, limit=10)
    assert [m.id for m in first.messages] == [r.id for r in records[:5]]
    assert first.depths == [1, 2, 3, 4, 5] and not first.older
    assert first.messages[0].data == records[0].data
    assert (await store.chain_page("c", "nope", limit=10)).messages == []
    await _linear(store, "other", 3)
    assert (await store.chain_page("c", "other-2", limit=10)).messages == []
    with pytest.raises(InvalidInputError):
        await store.chain_page("c", records[0].id, limit=0)


_CHATS = itertools.count()


async def _tree(store: SqlContextStore, chat_id: str, seed: int, size: int) -> None:
    """A random tree: mostly long linear stretches, some forks, heads, checkpoints and a
    compaction."""
    rng = random.Random(seed)
    await store.create_chat(chat_id, user_id="u")
    records: list[MessageRecord] = []
    for index in range(size):
        parent = None
        if records:
            parent = records[-1].id if rng.random() < 0.85 else rng.choice(records).id
        records.append(rec(f"{chat_id}-{index}", chat_id, parent, f"text {index}"))
    if size > 3 and rng.random() < 0.5:
        target = rng.choice(records[1:])
        records.append(
            MessageRecord(
                id=f"{chat_id}-summary",
                chat_id=chat_id,
                parent_id=target.id,
                name="user",
                type="compaction",
                data={"id": "s", "role": "user", "parts": [{"type": "text", "text": "sum"}]},
            )
        )
    await store.add_messages(records)
    plain = [r for r in records if r.type == "message"]
    for number in range(rng.randint(0, 3)):
        await store.fork_branch(
            chat_id,
            "main",
            head_message_id=rng.choice(plain).id,
            activate=False,
            name=f"b{number}",
        )
    for number in range(rng.randint(0, 2)):
        await store.create_checkpoint(chat_id, f"cp{number}", rng.choice(plain).id)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(seed=st.integers(0, 10_000), size=st.integers(1, 60), fold=st.integers(2, 8))
async def test_the_sql_outline_equals_the_one_from_the_whole_graph(
    store: SqlContextStore, seed: int, size: int, fold: int
) -> None:
    chat_id = f"t{next(_CHATS)}"
    await _tree(store, chat_id, seed, size)
    graph = await store.get_graph(chat_id)
    rng = random.Random(seed)
    keep = [rng.choice(graph.nodes).id] if rng.random() < 0.3 else []
    expected = outline_of(graph, fold=fold, keep=keep)
    assert await store.graph_outline(chat_id, fold=fold, keep=keep) == expected
    if expected.folds:
        opened = [expected.folds[0].first_id]
        assert await store.graph_outline(chat_id, fold=fold, opened=opened) == outline_of(
            graph, fold=fold, opened=opened
        )


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(seed=st.integers(0, 10_000), size=st.integers(1, 60))
async def test_the_viewer_draws_the_outline_as_it_draws_the_whole_graph(
    store: SqlContextStore, seed: int, size: int
) -> None:
    """The chat page reads the outline; its drawing is the one of the whole graph."""
    chat_id = f"v{next(_CHATS)}"
    await _tree(store, chat_id, seed, size)
    graph = await store.get_graph(chat_id)
    rng = random.Random(seed)
    selected = rng.choice(graph.nodes).id if rng.random() < 0.3 else None
    keep = [selected] if selected else []
    whole = layout_graph(graph, selected=selected)
    outline = await store.graph_outline(chat_id, fold=FOLD_MIN, keep=keep)
    drawn = layout_graph(outline, selected=selected)
    assert render_svg(drawn, chat_id=chat_id, selected=selected) == render_svg(
        whole, chat_id=chat_id, selected=selected
    )
    # The CLI's tree and chart too: from the outline exactly as from the whole graph.
    plain = await store.graph_outline(chat_id, fold=DEFAULT_FOLD)
    assert visualize_graph(plain) == visualize_graph(graph)
    assert visualize_graph(plain, depth=1) == visualize_graph(graph, depth=1)
    assert graph_to_mermaid(plain) == graph_to_mermaid(graph)
    runs = [row.node.id for row in whole.rows if row.kind == "fold"]
    if runs:
        opened = [runs[0]]
        outline = await store.graph_outline(chat_id, fold=FOLD_MIN, keep=keep, opened=opened)
        assert render_svg(
            layout_graph(outline, opened=opened, selected=selected),
            chat_id=chat_id,
            opened=opened,
            selected=selected,
        ) == render_svg(
            layout_graph(graph, opened=opened, selected=selected),
            chat_id=chat_id,
            opened=opened,
            selected=selected,
        )


async def test_a_long_chat_outline_reads_only_what_is_drawn(store: SqlContextStore) -> None:
    records = await _linear(store, "long", 2_000)
    await store.fork_branch("long", "main", head_message_id=records[999].id, activate=False)
    outline = await store.graph_outline("long")
    assert outline.message_count == 2_000
    # Drawn: the root, the fork, each run's first and last message, the head.
    assert len(outline.nodes) <= 8
    assert sorted(f.count for f in outline.folds) == [998, 999]
    with pytest.raises(ChatNotFoundError):
        await store.graph_outline("missing")
