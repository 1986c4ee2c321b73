"""The shape of a chat's conversation graph, shared by every drawing of it.

The store's outline (`ContextStore.graph_outline`, whose runs `store._ops.outline.Runs` finds),
the text views (`visualize_graph`, `graph_to_mermaid`) and the web viewer (`layout_graph`) all
draw the same thing, so what they draw is decided here, once:

- **the forest**: a message whose parent is missing from the graph (or is itself) is a root;
- **kept and plain messages** (`kept_messages`): a message is *kept* when it is a root, a
  compaction, the parent of a compaction, or has no child or several. A drawing adds its
  *marks* (branch heads, checkpoints, the selected message, the runs an outline folded
  already); every other message is *plain*: it has exactly one child, and it is drawn only as
  a member of the run it belongs to;
- **runs** (`find_runs`): a run is a maximal line of plain messages, from the child of a kept
  message down to the parent of the next kept one; a run of `DEFAULT_FOLD` or more messages
  folds into one node (`run_folds`), unless a viewer opened it;
- **unfolding** an outline (`unfold`): each `Fold` of a `GraphOutline` is drawn by its first
  message, the message after the run hanging from it;
- **what a drawing needs** (`Shape`): the forest of the messages it draws, the active branch's
  path, the branch heads and checkpoints on each message, and the runs.

This module imports nothing of the store but its records, and those only where it uses them
(`unfold`), so that the store can import it as it loads, whichever is imported first.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:  # (imported where used: the store imports this module as it loads)
    from agentcontext.store.records import Fold, Graph, GraphNode, GraphOutline

__all__ = ["DEFAULT_FOLD", "Shape", "find_runs", "kept_messages", "run_folds", "unfold"]

DEFAULT_FOLD = 6
"""Runs of at least this many plain messages fold into one node: the default of the text
views, of ``store.graph_outline`` and of the web viewer."""

Link = tuple[str, str | None, str]
"""A message as the shape sees it: ``(id, parent_id, type)``."""


def kept_messages(links: Iterable[Link]) -> tuple[dict[str, str | None], set[str]]:
    """Every message's parent, and the messages that are kept whatever the marks.

    Kept: a root (no parent, or one that is not in ``links``, or itself), a compaction and the
    parent of a compaction, and every message without exactly one child. A repeated id is
    one message (its last link counts). The rest, less the marks of a drawing, is plain.
    """
    parent_of: dict[str, str | None] = {}
    compactions: list[str] = []
    for node_id, parent_id, kind in links:
        parent_of[node_id] = parent_id
        if kind == "compaction":
            compactions.append(node_id)
    children = Counter(parent_of.values())
    kept = {
        node_id
        for node_id, parent_id in parent_of.items()
        if parent_id not in parent_of or parent_id == node_id
    }
    kept.update(compactions)
    for node_id in compactions:
        parent_id = parent_of[node_id]
        if parent_id in parent_of:
            kept.add(parent_id)
    kept.update(parent_of.keys() - children.keys())
    kept.update(
        node_id
        for node_id, count in children.items()
        if count > 1 and node_id is not None and node_id in parent_of
    )
    return parent_of, kept


def find_runs(
    parent_of: Mapping[str, str | None], kept: Collection[str]
) -> tuple[list[str], list[str], list[int], list[str]]:
    """The runs between ``kept`` messages (plain: every other one of ``parent_of``).

    Returns the kept messages (in the order of ``parent_of``), every run's messages one run
    after the other (each root to leaf), where each run begins in that list, and the kept
    message below each run (the child of its last message). A plain message that no kept
    message reaches (it sits on a cycle, in damaged data) is in no run.
    """
    total = len(parent_of)
    up = cast(Mapping[str, str], parent_of)  # followed from plain messages only: never None
    kept_ids: list[str] = []
    members: list[str] = []
    starts: list[int] = []
    below: list[str] = []
    for node_id in parent_of:
        if node_id not in kept:
            continue
        kept_ids.append(node_id)
        cursor = parent_of[node_id]
        if cursor is None or cursor not in parent_of or cursor in kept:
            continue
        run: list[str] = []
        # A plain message has one parent in the graph, so the walk ends at a kept message;
        # the bound only guards against a cycle in damaged data.
        for _ in range(total):
            run.append(cursor)
            cursor = up[cursor]
            if cursor in kept:
                break
        run.reverse()
        starts.append(len(members))
        members.extend(run)
        below.append(node_id)
    return kept_ids, members, starts, below


def run_folds(count: int, fold: int | None) -> bool:
    """Whether a run of ``count`` plain messages folds at the threshold ``fold`` (``None`` or
    ``0``: nothing folds)."""
    return fold is not None and fold > 0 and count >= fold


def unfold(
    graph: Graph | GraphOutline,
) -> tuple[list[GraphNode], dict[str, tuple[Fold, GraphNode]]]:
    """The messages to draw and the runs folded already, by their first message.

    For an outline, each fold's first message stands for its run: the last message of the
    run is left out and the message after the run hangs from the first. A graph has no folds.
    """
    from agentcontext.store.records import GraphOutline

    if not isinstance(graph, GraphOutline):
        return graph.nodes, {}
    by_id = {node.id: node for node in graph.nodes}
    folded: dict[str, tuple[Fold, GraphNode]] = {}
    skipped: set[str] = set()
    rewired: dict[str, str] = {}
    for fold in graph.folds:
        if fold.first_id in by_id and fold.last_id in by_id:
            folded[fold.first_id] = (fold, by_id[fold.last_id])
            if fold.last_id != fold.first_id:
                skipped.add(fold.last_id)
            rewired[fold.child_id] = fold.first_id
    nodes = [
        node.model_copy(update={"parent_id": rewired[node.id]}) if node.id in rewired else node
        for node in graph.nodes
        if node.id not in skipped
    ]
    return nodes, folded


class Shape:
    """What a drawing of ``nodes`` (messages of ``graph``, unfolded) needs to know.

    ``marked`` messages (the selected one) are kept besides the branch heads, the checkpoints
    and the runs folded already.
    """

    __slots__ = (
        "active",
        "by_id",
        "children",
        "folded",
        "heads",
        "kept",
        "nodes",
        "points",
        "roots",
    )

    def __init__(
        self,
        graph: Graph | GraphOutline,
        nodes: Sequence[GraphNode],
        folded: Mapping[str, tuple[Fold, GraphNode]],
        *,
        marked: Iterable[str] = (),
    ) -> None:
        self.nodes = nodes
        self.folded = folded
        """The runs an outline folded already, by their first message: the fold, its last
        message."""
        self.by_id = by_id = {node.id: node for node in nodes}
        self.roots: list[GraphNode] = []
        """The roots, in the order of ``nodes``."""
        self.children: dict[str, list[GraphNode]] = {}
        """Each message's children, in the order of ``nodes``."""
        for node in nodes:
            parent = node.parent_id
            if parent is None or parent not in by_id or parent == node.id:
                self.roots.append(node)
            else:
                self.children.setdefault(parent, []).append(node)
        self.heads: dict[str, list[tuple[str, bool]]] = {}
        """The branches whose head is a message: their name and whether it is active."""
        for branch in graph.branches:
            head = branch.head_message_id
            if head is not None and head in by_id:
                self.heads.setdefault(head, []).append((branch.name, branch.is_active))
        self.points: dict[str, list[str]] = {}
        """The names of the checkpoints on a message."""
        for point in graph.checkpoints:
            if point.message_id in by_id:
                self.points.setdefault(point.message_id, []).append(point.name)
        self.active: set[str] = set()
        """The active branch's path: its head and every message above it."""
        active = next((b for b in graph.branches if b.is_active), None)
        cursor = active.head_message_id if active is not None else None
        while cursor is not None and cursor in by_id and cursor not in self.active:
            self.active.add(cursor)
            cursor = by_id[cursor].parent_id
        _, self.kept = kept_messages((node.id, node.parent_id, node.type) for node in nodes)
        """The messages drawn on their own: kept, marked, or a run folded already."""
        self.kept.update(self.heads, self.points, folded, marked)

    def run(self, node: GraphNode, seen: Collection[str] = ()) -> tuple[list[GraphNode], GraphNode]:
        """The plain messages in a line from ``node`` down (none when ``node`` is kept), up
        to one in ``seen``, and the message after them."""
        kept, children = self.kept, self.children
        line: list[GraphNode] = []
        while node.id not in kept and node.id not in seen:
            line.append(node)
            node = children[node.id][0]
        return line, node
