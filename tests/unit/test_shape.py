"""The graph shape (`agentcontext._shape`), tested once against the definition of a fold.

`reference` below is the fold rule written plainly, in one walk of the graph: mark the plain
messages, then take, below each message that is not plain, the line of plain messages that
follows it; a line of ``fold`` or more folds (unless opened). The shape's runs must give exactly
that, for random forests with branch heads, checkpoints, compactions, parents outside the graph,
kept (selected) messages and opened runs; and its three users must agree with it and with each
other: the outline the store computes, unfolded by the shape, draws the same messages and folds
as the text views and the viewer draw from the whole graph, and they draw it identically.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

import agentcontext._shape as shape_module
from agentcontext import views
from agentcontext._shape import (
    DEFAULT_FOLD,
    Shape,
    find_runs,
    kept_messages,
    run_folds,
    unfold,
)
from agentcontext.store import ContextStore
from agentcontext.store._ops.outline import Runs
from agentcontext.store.base import outline_of
from agentcontext.store.records import BranchInfo, Checkpoint, Fold, Graph, GraphNode
from agentcontext.web import _layout

T0 = datetime(2025, 1, 1, tzinfo=UTC)

Link = tuple[str, str | None, str]
FoldEnds = tuple[str, str, int]
"""A folded run as drawn: its first message, its last one and how many it holds."""


# --- the definition ---------------------------------------------------------------------------


def reference(
    links: Iterable[Link], marked: Collection[str], *, fold: int, opened: Collection[str] = ()
) -> tuple[set[str], set[Fold]]:
    """What is drawn, by definition: the messages drawn on their own, and the folded runs.

    A message is *plain* when its parent is in the graph (and is not itself), it has exactly
    one child, which is not a compaction, and it is neither a compaction nor marked. Every
    other message is drawn; the plain messages below one of its children, down to the next
    message that is not plain, are a run; a run of ``fold`` or more messages folds into one
    node unless its first message is opened, and a shorter (or opened) one is drawn whole.
    """
    parent: dict[str, str | None] = {}
    kind: dict[str, str] = {}
    for node_id, parent_id, node_kind in links:
        parent[node_id] = parent_id
        kind[node_id] = node_kind
    children: dict[str, list[str]] = {}
    for node_id, parent_id in parent.items():
        if parent_id is not None and parent_id in parent and parent_id != node_id:
            children.setdefault(parent_id, []).append(node_id)

    def plain(node_id: str) -> bool:
        kids = children.get(node_id, [])
        return (
            parent[node_id] in parent
            and parent[node_id] != node_id
            and kind[node_id] != "compaction"
            and len(kids) == 1
            and kind[kids[0]] != "compaction"
            and node_id not in marked
        )

    drawn: set[str] = set()
    folds: set[Fold] = set()
    for node_id in parent:  # the one walk: each message not plain, and the runs below it
        if plain(node_id):
            continue
        drawn.add(node_id)
        for child in children.get(node_id, []):
            run: list[str] = []
            while plain(child):
                run.append(child)
                child = children[child][0]
            if run and len(run) >= fold and run[0] not in opened:
                folds.add(Fold(first_id=run[0], last_id=run[-1], count=len(run), child_id=child))
            else:
                drawn.update(run)
    return drawn, folds


def ends(folds: Iterable[Fold]) -> set[FoldEnds]:
    return {(fold.first_id, fold.last_id, fold.count) for fold in folds}


# --- random graphs ----------------------------------------------------------------------------


@dataclass
class Case:
    graph: Graph
    selected: str | None
    fold: int

    @property
    def links(self) -> list[Link]:
        return [(node.id, node.parent_id, node.type) for node in self.graph.nodes]

    @property
    def marks(self) -> set[str]:
        """The marks every drawing applies: the branch heads and the checkpoints."""
        marked = {b.head_message_id for b in self.graph.branches if b.head_message_id}
        return marked | {point.message_id for point in self.graph.checkpoints}


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """A forest: mostly long lines, some forks, roots, parents outside the graph, compactions
    (a summary beside the message it follows), branch heads and checkpoints, in any order."""
    size = draw(st.integers(0, 60))
    nodes: list[GraphNode] = []
    for index in range(size):
        roll = draw(st.integers(0, 99))
        parent: str | None
        if not nodes or roll < 4:
            parent = None
        elif roll < 7:
            parent = "outside"  # a parent that is not in the graph
        elif roll < 85:
            parent = nodes[-1].id
        else:
            parent = nodes[draw(st.integers(0, len(nodes) - 1))].id
        compaction = parent is not None and draw(st.integers(0, 99)) < 6
        nodes.append(
            GraphNode(
                id=f"m{index}",
                parent_id=parent,
                role="user" if index % 2 else "assistant",
                preview=f"text {index}",
                created_at=T0 + timedelta(seconds=draw(st.integers(0, 3 * size))),
                type="compaction" if compaction else "message",
            )
        )
    nodes = draw(st.permutations(nodes))
    ids = [node.id for node in nodes]
    somewhere = st.sampled_from([*ids, "gone"]) if ids else st.just("gone")
    heads = st.one_of(st.none(), somewhere)
    count = draw(st.integers(0, 4))
    active = draw(st.integers(-1, count - 1))
    branches = [
        BranchInfo(
            id=f"b{number}",
            chat_id="c",
            name=f"branch {number}",
            head_message_id=draw(heads),
            is_active=number == active,
            created_at=T0,
            message_count=0,
        )
        for number in range(count)
    ]
    checkpoints = [
        Checkpoint(
            id=f"c{number}",
            chat_id="c",
            name=f"point {number}",
            message_id=draw(somewhere),
            created_at=T0,
        )
        for number in range(draw(st.integers(0, 3)))
    ]
    selected = draw(st.one_of(st.none(), st.sampled_from(ids))) if ids else None
    graph = Graph(chat_id="c", nodes=nodes, branches=branches, checkpoints=checkpoints)
    return Case(graph=graph, selected=selected, fold=draw(st.integers(1, 8)))


def opened_runs(data: st.DataObject, folds: Collection[Fold]) -> list[str]:
    firsts = sorted(fold.first_id for fold in folds)
    return data.draw(st.lists(st.sampled_from(firsts), max_size=2)) if firsts else []


# --- what each user draws ---------------------------------------------------------------------


def drawn_by_the_views(graph: Graph, fold: int) -> tuple[set[str], set[FoldEnds]]:
    items = list(views._Tree(graph, None).walk(fold, None))
    nodes = {item.node.id for item in items if item.kind == "node"}
    folds: set[FoldEnds] = set()
    for item in items:
        if item.kind == "fold":
            assert item.last is not None
            folds.add((item.node.id, item.last.id, item.count))
    assert all(item.kind in ("node", "fold") for item in items)
    return nodes, folds


def drawn_by_the_viewer(
    graph: Graph, opened: Collection[str], selected: str | None
) -> tuple[set[str], set[FoldEnds]]:
    rows = _layout.layout_graph(graph, opened=opened, selected=selected).rows
    nodes = {row.node.id for row in rows if row.kind != "fold"}
    folds: set[FoldEnds] = set()
    for row in rows:
        if row.kind == "fold":
            assert row.last is not None
            folds.add((row.node.id, row.last.id, row.count))
    return nodes, folds


def drawn_from_the_outline(
    graph: Graph, fold: int, keep: Collection[str], opened: Collection[str]
) -> tuple[set[str], set[FoldEnds]]:
    """What the store's outline shows once the shape unfolds it."""
    outline = outline_of(graph, fold=fold, keep=list(keep), opened=list(opened))
    nodes, folded = unfold(outline)
    return {node.id for node in nodes if node.id not in folded}, ends(outline.folds)


# --- the properties ---------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(case=cases(), data=st.data())
def test_the_shapes_runs_are_the_runs_by_definition(case: Case, data: st.DataObject) -> None:
    marked = case.marks | ({case.selected} if case.selected else set())
    _, plain_folds = reference(case.links, marked, fold=case.fold)
    opened = opened_runs(data, plain_folds)
    expected = reference(case.links, marked, fold=case.fold, opened=opened)

    # The shape's runs, cut at the threshold.
    parent_of, kept = kept_messages(case.links)
    kept.update(marked)
    kept_ids, members, starts, below = find_runs(parent_of, kept)
    drawn, folds = set(kept_ids), set()
    for number, start in enumerate(starts):
        end = starts[number + 1] if number + 1 < len(starts) else len(members)
        run = members[start:end]
        if run_folds(len(run), case.fold) and run[0] not in opened:
            folds.add(
                Fold(first_id=run[0], last_id=run[-1], count=len(run), child_id=below[number])
            )
        else:
            drawn.update(run)
    assert (drawn, folds) == expected
    assert len(members) + len(kept_ids) == len(parent_of)  # every message once

    # The store's runs (found without marks, cut at them) give the same.
    shown, outline_folds = Runs.build(case.links).outline(marked, fold=case.fold, opened=opened)
    fold_ends = {node_id for fold in expected[1] for node_id in (fold.first_id, fold.last_id)}
    assert set(shown) == expected[0] | fold_ends
    assert outline_folds == sorted(expected[1], key=lambda fold: fold.first_id)

    # A whole-graph drawing's runs (what the views and the viewer walk) give the same.
    graph_shape = Shape(case.graph, case.graph.nodes, {}, marked=marked)
    walked: set[str] = set()
    walked_folds: set[Fold] = set()
    for node in case.graph.nodes:
        if node.id in graph_shape.kept:
            walked.add(node.id)
            for child in graph_shape.children.get(node.id, []):
                run_nodes, after = graph_shape.run(child)
                if run_folds(len(run_nodes), case.fold) and run_nodes[0].id not in opened:
                    first, last = run_nodes[0].id, run_nodes[-1].id
                    walked_folds.add(
                        Fold(first_id=first, last_id=last, count=len(run_nodes), child_id=after.id)
                    )
                else:
                    walked.update(item.id for item in run_nodes)
    assert (walked, walked_folds) == expected


@settings(max_examples=200, deadline=None)
@given(case=cases(), data=st.data())
def test_the_outline_the_views_and_the_viewer_draw_the_same_messages(
    case: Case, data: st.DataObject
) -> None:
    graph = case.graph

    # The text views (no selection, nothing opened) at any threshold.
    drawn, folds = reference(case.links, case.marks, fold=case.fold)
    by_definition = (drawn, ends(folds))
    assert drawn_by_the_views(graph, case.fold) == by_definition
    assert drawn_from_the_outline(graph, case.fold, (), ()) == by_definition
    outline = outline_of(graph, fold=case.fold)
    for depth in (None, 1, views.DEFAULT_DEPTH):
        assert views.visualize_graph(outline, fold=case.fold, depth=depth) == (
            views.visualize_graph(graph, fold=case.fold, depth=depth)
        )
    assert views.graph_to_mermaid(outline, fold=case.fold) == views.graph_to_mermaid(
        graph, fold=case.fold
    )

    # The viewer, at its threshold, with the selected message kept and runs opened.
    keep = [case.selected] if case.selected else []
    marked = case.marks | set(keep)
    _, closed = reference(case.links, marked, fold=DEFAULT_FOLD)
    opened = opened_runs(data, closed)
    drawn, folds = reference(case.links, marked, fold=DEFAULT_FOLD, opened=opened)
    by_definition = (drawn, ends(folds))
    assert drawn_by_the_viewer(graph, opened, case.selected) == by_definition
    assert drawn_from_the_outline(graph, DEFAULT_FOLD, keep, opened) == by_definition
    outline = outline_of(graph, fold=DEFAULT_FOLD, keep=keep, opened=opened)
    svg = _layout.render_svg(
        _layout.layout_graph(outline, opened=opened, selected=case.selected),
        chat_id="c",
        opened=opened,
        selected=case.selected,
    )
    assert svg == _layout.render_svg(
        _layout.layout_graph(graph, opened=opened, selected=case.selected),
        chat_id="c",
        opened=opened,
        selected=case.selected,
    )


# --- the parts --------------------------------------------------------------------------------


def _node(node_id: str, parent: str | None, second: int, kind: str = "message") -> GraphNode:
    return GraphNode(
        id=node_id,
        parent_id=parent,
        role="user",
        preview=node_id,
        created_at=T0 + timedelta(seconds=second),
        type=kind,
    )


def test_the_shape_of_an_outline() -> None:
    """a → [b … e folded] → f → g (head of the active branch), f → s (a side branch, with a
    checkpoint), g → z (a compaction summary)."""
    nodes = [
        _node("a", None, 0),
        _node("b", "a", 1),
        _node("e", "d", 4),
        _node("f", "e", 5),
        _node("g", "f", 6),
        _node("s", "f", 7),
        _node("z", "g", 8, "compaction"),
    ]
    graph = outline_of(
        Graph(
            chat_id="c",
            nodes=[*nodes[:2], _node("c", "b", 2), _node("d", "c", 3), *nodes[2:]],
            branches=[
                BranchInfo(
                    id="b1",
                    chat_id="c",
                    name="main",
                    head_message_id="g",
                    is_active=True,
                    created_at=T0,
                    message_count=5,
                ),
                BranchInfo(
                    id="b2",
                    chat_id="c",
                    name="side",
                    head_message_id="s",
                    is_active=False,
                    created_at=T0,
                    message_count=5,
                ),
            ],
            checkpoints=[
                Checkpoint(id="p", chat_id="c", name="here", message_id="s", created_at=T0)
            ],
        ),
        fold=4,
    )
    assert graph.folds == [Fold(first_id="b", last_id="e", count=4, child_id="f")]
    drawn, folded = unfold(graph)
    assert [node.id for node in drawn] == ["a", "b", "f", "g", "s", "z"]
    assert next(node for node in drawn if node.id == "f").parent_id == "b"  # hangs from the fold
    assert folded["b"][0].count == 4 and folded["b"][1].id == "e"
    shape = Shape(graph, drawn, folded)
    assert [node.id for node in shape.roots] == ["a"]
    assert {key: [kid.id for kid in kids] for key, kids in shape.children.items()} == {
        "a": ["b"],
        "b": ["f"],
        "f": ["g", "s"],
        "g": ["z"],
    }
    assert shape.active == {"a", "b", "f", "g"}
    assert shape.heads == {"g": [("main", True)], "s": [("side", False)]}
    assert shape.points == {"s": ["here"]}
    # b stands for a run; f forks; g is the parent of a compaction, and a head; s a head, a
    # checkpoint and a leaf; z a compaction: nothing is plain.
    assert shape.kept == {"a", "b", "f", "g", "s", "z"}


def test_a_message_that_is_its_own_parent_is_a_root() -> None:
    links: list[Link] = [("a", "a", "message"), ("b", "a", "message"), ("c", "b", "message")]
    parent_of, kept = kept_messages(links)
    assert kept == {"a", "c"}
    assert find_runs(parent_of, kept) == (["a", "c"], ["b"], [0], ["c"])
    nodes = [_node(node_id, parent, second) for second, (node_id, parent, _) in enumerate(links)]
    shape = Shape(Graph(chat_id="c", nodes=nodes, branches=[], checkpoints=[]), nodes, {})
    assert [node.id for node in shape.roots] == ["a"]


def test_the_threshold() -> None:
    assert run_folds(DEFAULT_FOLD, DEFAULT_FOLD)
    assert not run_folds(DEFAULT_FOLD - 1, DEFAULT_FOLD)
    assert not run_folds(100, None) and not run_folds(100, 0)
    # One constant: the defaults of the views, the viewer and the store's outline.
    assert views.DEFAULT_FOLD is DEFAULT_FOLD
    assert _layout.FOLD_MIN is DEFAULT_FOLD
    for function in (views.visualize_graph, views.graph_to_mermaid):
        assert inspect.signature(function).parameters["fold"].default == DEFAULT_FOLD
    assert inspect.signature(ContextStore.graph_outline).parameters["fold"].default == DEFAULT_FOLD


def test_the_shape_imports_nothing_of_the_store_but_its_records() -> None:
    """So the store can use it without an import circle."""
    tree = ast.parse(Path(inspect.getfile(shape_module)).read_text(encoding="utf-8"))
    imported = {
        node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
    } | {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    ours = {name for name in imported if name.startswith("agentcontext")}
    assert ours == {"agentcontext.store.records"}
