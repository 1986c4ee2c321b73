"""The conversation tree laid out on the server and drawn as SVG.

One row per visible node (pre-order, the active branch first), one lane per leaf: like a
``git log --graph``. Long linear runs fold into one node that a link (or the script) opens:
the runs of the graph shape (`agentcontext._shape`), the ones the store's outline and the text
views fold too.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection
from dataclasses import dataclass, field

from agentcontext._shape import DEFAULT_FOLD, Shape, run_folds, unfold
from agentcontext.store.records import Graph, GraphNode, GraphOutline
from agentcontext.web._html import esc, href, preview_text

__all__ = ["FOLD_MIN", "Layout", "Row", "layout_graph", "render_svg"]

FOLD_MIN = DEFAULT_FOLD
"""Runs of at least this many plain messages fold into one node (the graph shape's
`DEFAULT_FOLD`)."""

ROW_H = 22
LANE_W = 16
PAD = 12
LABEL_GAP = 14


@dataclass
class Row:
    """One drawn node: a message, a compaction or a folded run."""

    kind: str
    """``"message"``, ``"compaction"`` or ``"fold"``."""
    node: GraphNode
    """The message (for a fold: the first message of the run)."""
    lane: int
    parent_row: int | None
    count: int = 1
    """For a fold: how many messages it hides."""
    last: GraphNode | None = None
    """For a fold: the last message of the run."""
    branches: list[tuple[str, bool]] = field(default_factory=list)
    checkpoints: list[str] = field(default_factory=list)
    active: bool = False
    run: str | None = None
    """For the messages of an opened run: the run's id (its first message)."""


@dataclass
class Layout:
    """Rows in drawing order and the number of lanes."""

    rows: list[Row]
    lanes: int
    folds: int
    """How many runs are folded."""


def layout_graph(
    graph: Graph | GraphOutline, *, opened: Collection[str] = (), selected: str | None = None
) -> Layout:
    """Lay out a chat's graph.

    Args:
        graph: The chat's graph (`ContextStore.get_graph`), or its outline with the long
            runs already folded (`ContextStore.graph_outline`, which reads only what is
            drawn).
        opened: Ids of runs (their first message) to show unfolded.
        selected: A message to keep visible (its run is opened).

    Returns:
        The rows and lanes to draw.
    """
    nodes, folded = unfold(graph)
    shape = Shape(graph, nodes, folded, marked=() if selected is None else (selected,))
    children, heads, points, active_path = shape.children, shape.heads, shape.points, shape.active

    def order(nodes: list[GraphNode]) -> list[GraphNode]:
        # The active path first, compactions last, otherwise oldest first.
        return sorted(
            nodes,
            key=lambda n: (
                n.id not in active_path,
                n.type == "compaction",
                n.created_at,
                n.id,
            ),
        )

    opened_set = set(opened)
    rows: list[Row] = []
    lanes = 0
    folds = 0
    free: list[int] = []  # released lanes (a min-heap), reused before new ones

    def take_lane() -> int:
        nonlocal lanes
        if free:
            return heapq.heappop(free)
        lanes += 1
        return lanes - 1

    # Iterative pre-order walk. A node's side children (each in a lane of its own, held until
    # its subtree is drawn) come right below it; the child that continues its lane (the one on
    # the active path, else the oldest) comes last. A lane of None releases that lane.
    stack: list[tuple[GraphNode | None, int, int | None]] = []
    for root in reversed(order(shape.roots)):
        lane = take_lane()
        stack.append((None, lane, None))
        stack.append((root, lane, None))
    while stack:
        item, lane, parent_row = stack.pop()
        if item is None:
            heapq.heappush(free, lane)
            continue
        node = item
        if node.id in folded:  # a run the store folded already
            fold, last = folded[node.id]
            rows.append(
                Row(
                    kind="fold",
                    node=node,
                    lane=lane,
                    parent_row=parent_row,
                    count=fold.count,
                    last=last,
                    active=node.id in active_path,
                )
            )
            folds += 1
            kids = children.get(node.id, [])
            if kids:
                stack.append((kids[0], lane, len(rows) - 1))
            continue
        # A run of plain messages starting here (none from a root: it is kept).
        run, after = shape.run(node)
        run_id = node.id
        is_run = run_folds(len(run), DEFAULT_FOLD)
        if is_run and run_id not in opened_set:
            rows.append(
                Row(
                    kind="fold",
                    node=node,
                    lane=lane,
                    parent_row=parent_row,
                    count=len(run),
                    last=run[-1],
                    active=node.id in active_path,
                )
            )
            folds += 1
            # The node after the run continues in the same lane.
            stack.append((after, lane, len(rows) - 1))
            continue
        members = run if is_run else [node]
        for member in members:
            rows.append(
                Row(
                    kind="compaction" if member.type == "compaction" else "message",
                    node=member,
                    lane=lane,
                    parent_row=parent_row,
                    branches=heads.get(member.id, []),
                    checkpoints=points.get(member.id, []),
                    active=member.id in active_path,
                    run=run_id if is_run else None,
                )
            )
            parent_row = len(rows) - 1
        kids = order(children.get(members[-1].id, []))
        # The first child continues the lane; a compaction always goes to a side lane.
        if kids and kids[0].type != "compaction":
            stack.append((kids[0], lane, parent_row))
            kids = kids[1:]
        side = [(kid, take_lane()) for kid in kids]
        for kid, kid_lane in reversed(side):
            stack.append((None, kid_lane, None))
            stack.append((kid, kid_lane, parent_row))
    return Layout(rows=rows, lanes=max(lanes, 1), folds=folds)


_ROLE_CLASS = {"user": "user", "assistant": "assistant", "system": "system"}


def render_svg(
    layout: Layout,
    *,
    chat_id: str,
    opened: Collection[str] = (),
    selected: str | None = None,
) -> str:
    """The layout as an inline SVG; nodes are links (selection, folding) the script enhances."""
    rows = layout.rows
    label_x = PAD + layout.lanes * LANE_W + LABEL_GAP
    longest = 48  # characters of the longest label, to size the drawing
    height = PAD * 2 + max(len(rows), 1) * ROW_H
    opened_list = sorted(set(opened))

    def cx(lane: int) -> int:
        return PAD + lane * LANE_W + LANE_W // 2

    def cy(row: int) -> int:
        return PAD + row * ROW_H + ROW_H // 2

    edges: list[str] = []
    shapes: list[str] = []
    for index, row in enumerate(rows):
        x, y = cx(row.lane), cy(index)
        if row.parent_row is not None:
            parent = rows[row.parent_row]
            px, py = cx(parent.lane), cy(row.parent_row)
            css = "edge"
            if row.active and parent.active:
                css += " active"
            if row.kind == "compaction":
                css += " side"
            bend = f"V{py + ROW_H // 2}H{x}" if px != x else ""
            d = f"M{px} {py}{bend}V{y}"
            edges.append(f'<path class="{css}" d="{d}"/>')
        node = row.node
        node_id = esc(node.id)
        if row.kind == "fold":
            link = href(
                "/chat",
                [("id", chat_id), *[("open", o) for o in [*opened_list, node.id]]]
                + ([("m", selected)] if selected else []),
            )
            label = f"\u22ef {row.count} messages folded (click to open)"
            shapes.append(
                f'<a class="node fold" href="{link}" data-run="{node_id}">'
                f'<rect x="{x - 6}" y="{y - 8}" width="12" height="16" rx="3"/>'
                f'<text x="{label_x}" y="{y + 4}">{esc(label)}</text></a>'
            )
            continue
        link = href(
            "/chat",
            [("id", chat_id), *[("open", o) for o in opened_list], ("m", node.id)],
        )
        css = "node " + ("compaction" if row.kind == "compaction" else "msg")
        css += " " + _ROLE_CLASS.get(node.role, "other")
        if row.active:
            css += " active"
        if node.id == selected:
            css += " selected"
        if row.kind == "compaction":
            mark = (
                f'<rect x="{x - 7}" y="{y - 7}" width="14" height="14" '
                f'transform="rotate(45 {x} {y})"/>'
            )
            text = f"compaction \u00b7 {preview_text(node.preview, 48)}"
        else:
            mark = f'<circle cx="{x}" cy="{y}" r="5"/>'
            text = f"{node.role}: {preview_text(node.preview, 56)}"
        badges = ""
        chars = len(text)
        for name, is_active in row.branches:
            badge = preview_text(f"\u2605 {name} (active)" if is_active else f"\u2387 {name}", 40)
            chars += len(badge) + 3
            badges += (
                f'<tspan class="badge{" active" if is_active else ""}" '
                f'data-branch="{esc(name)}"> [{esc(badge)}]</tspan>'
            )
        for name in row.checkpoints:
            point = preview_text(name, 40)
            chars += len(point) + 3
            badges += f'<tspan class="checkpoint"> \u2691 {esc(point)}</tspan>'
        longest = max(longest, chars)
        run = f' data-in-run="{esc(row.run)}"' if row.run else ""
        shapes.append(
            f'<a class="{css}" href="{link}" data-id="{node_id}"{run}>{mark}'
            f'<text x="{label_x}" y="{y + 4}">{esc(text)}{badges}</text></a>'
        )
    width = label_x + longest * 9 + PAD  # at most about 9 px a character at 12 px
    return (
        f'<svg class="graph" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" aria-label="conversation graph" '
        f'data-rows="{len(rows)}" data-folds="{layout.folds}">'
        f'<g class="edges">{"".join(edges)}</g><g class="nodes">{"".join(shapes)}</g>'
        "</svg>"
    )
