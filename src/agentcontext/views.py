"""Text views of a chat's conversation graph.

Two pure functions turn a `Graph` (as returned by
``store.get_graph(chat_id)``) into text:

- `visualize_graph` draws an ASCII tree: one line per message, branch heads after ``<-``
  with the active branch marked ``*``, checkpoints in braces.
- `graph_to_mermaid` writes a Mermaid ``flowchart`` in which every label is escaped, so
  no message text, branch name or checkpoint name can change the structure of the chart.

Their output is **linear in the chat and bounded by default**, however long it is:

- a linear run of messages stays at one indent: only a side branch (a rewind, a second
  answer) is indented, under the message it starts from, and the line that continues (the
  active path, else the oldest child) goes on at the same indent;
- long runs fold, as in the web viewer: ``fold`` or more plain messages in a row (one child,
  no branch head, no checkpoint, not a compaction) are one line ``… 511 messages``;
- side branches nested more than ``depth`` deep are summarised in one line;
- ``last=N`` draws only the newest N messages;
- Mermaid output stays under Mermaid's default text limit (`MERMAID_MAX_TEXT`): when the
  folded chart would not fit, only the newest messages are drawn and a note says how many
  older ones were left out.

A tool call reads ``tool get_weather({"city": "Paris"}) → sunny`` and a failed one is marked
``✗`` (the node previews, `GraphNode.preview`).

Both are deterministic: the same graph always gives the same text. Both walk the graph
iteratively, so chains of any length render without hitting Python's recursion limit, and a
malformed graph (a message whose parent is missing, or a cycle) still renders every node once.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from agentcontext._shape import DEFAULT_FOLD, Shape, run_folds, unfold
from agentcontext.errors import InvalidInputError
from agentcontext.store.records import Fold, Graph, GraphNode, GraphOutline

__all__ = [
    "DEFAULT_DEPTH",
    "DEFAULT_FOLD",
    "MERMAID_MAX_TEXT",
    "graph_to_mermaid",
    "visualize_graph",
]

DEFAULT_DEPTH = 8
"""Side branches nested deeper than this are summarised in one line."""

MERMAID_MAX_TEXT = 50_000
"""Mermaid's default ``maxTextSize``: a longer chart is refused. `graph_to_mermaid` stays
under it."""

_LEGEND = "Legend: * = active branch, {...} = checkpoint, … = folded messages"
_ID_PREFIX_LENGTH = 8
_NAME_LENGTH = 40
_MAX_LABELS = 5


def _sort_key(node: GraphNode) -> tuple[float, str]:
    return (node.created_at.timestamp(), node.id)


def _one_line(text: str) -> str:
    """Replace line breaks and other control characters with spaces."""
    return "".join(" " if unicodedata.category(ch) in ("Cc", "Zl", "Zp") else ch for ch in text)


def _short(text: str, length: int = _NAME_LENGTH) -> str:
    text = _one_line(text)
    return text if len(text) <= length else text[: length - 1] + "…"


def _messages(count: int) -> str:
    return f"{count} message" if count == 1 else f"{count} messages"


def _check(name: str, value: int | None, low: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{name} must be a whole number or None, got {value!r}")
    if value < low:
        raise InvalidInputError(f"{name} must be {low} or more (or None), got {value}")


# --- the walk both views share ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Item:
    """One drawn line: a message, a folded run, or a summary of a subtree too deep."""

    kind: str
    """``"node"``, ``"fold"`` (a run of plain messages) or ``"more"`` (a deep subtree)."""
    node: GraphNode
    """The message; for a fold or a summary, the first message it stands for."""
    parent: int | None
    """The index of the item this one hangs from (None for a root)."""
    line_prefix: str
    own_prefix: str
    count: int = 1
    """For a fold or a summary: how many messages it stands for."""
    last: GraphNode | None = None
    """For a fold: the last message of the run."""
    heads: int = 0
    """For a summary: how many branch heads it hides."""


class _Tree:
    """The graph's shape (or that of its newest ``last`` messages) as the views walk it."""

    def __init__(self, graph: Graph | GraphOutline, last: int | None) -> None:
        # A run the store folded already (an outline) is drawn by its first message.
        nodes, folded = unfold(graph)
        self.left_out = 0
        if last is not None and last < len(nodes):
            ordered = sorted(nodes, key=_sort_key)
            nodes = ordered[len(nodes) - last :]
            self.left_out = sum(_weight(folded, node) for node in ordered[: len(ordered) - last])
        self.shape = shape = Shape(graph, nodes, folded)
        self.heads = shape.heads
        self.points = shape.points
        for siblings in shape.children.values():
            siblings.sort(key=self._order)
        shape.roots.sort(key=_sort_key)

    def _order(self, node: GraphNode) -> tuple[bool, bool, float, str]:
        """The child that continues the line first: on the active path, not a compaction,
        then the oldest."""
        return (node.id not in self.shape.active, node.type == "compaction", *_sort_key(node))

    def sizes(self) -> dict[str, tuple[int, int]]:
        """Messages and branch heads in the subtree of every node reachable from a root."""
        shape = self.shape
        order: list[GraphNode] = []
        seen: set[str] = set()
        for root in shape.roots:
            stack = [root]
            while stack:
                node = stack.pop()
                if node.id in seen:
                    continue
                seen.add(node.id)
                order.append(node)
                stack.extend(shape.children.get(node.id, ()))
        sizes: dict[str, tuple[int, int]] = {}
        for node in reversed(order):
            count, heads = _weight(shape.folded, node), len(shape.heads.get(node.id, ()))
            for kid in shape.children.get(node.id, ()):
                if kid.id in sizes:
                    kid_count, kid_heads = sizes[kid.id]
                    count += kid_count
                    heads += kid_heads
            sizes[node.id] = (count, heads)
        return sizes

    def walk(self, fold: int | None, depth: int | None) -> Iterator[_Item]:
        """Pre-order: a node, its side branches (indented), then the child that continues.

        Every node is visited once; nodes no root reaches (they sit on a cycle) are drawn
        afterwards as roots of their own.
        """
        shape = self.shape
        children = shape.children
        sizes = self.sizes() if depth is not None else {}
        seen: set[str] = set()
        index = 0
        # (node, parent item, line prefix, own prefix, side-branch level)
        stack: list[tuple[GraphNode, int | None, str, str, int]] = []

        def pending() -> Iterator[GraphNode]:
            yield from shape.roots
            for node in sorted(shape.nodes, key=_sort_key):
                if node.id not in seen:
                    yield node

        for start in pending():
            if start.id in seen:
                continue
            stack.append((start, None, "", "", 0))
            while stack:
                node, parent, line_prefix, own_prefix, level = stack.pop()
                if node.id in seen:
                    continue
                if depth is not None and level > depth:
                    count, heads = sizes.get(node.id, (1, 0))
                    hidden = [node]
                    while hidden:
                        below = hidden.pop()
                        if below.id not in seen:
                            seen.add(below.id)
                            hidden.extend(children.get(below.id, ()))
                    yield _Item("more", node, parent, line_prefix, own_prefix, count, heads=heads)
                    index += 1
                    continue
                if node.id in shape.folded:
                    fold_of, last = shape.folded[node.id]
                    seen.add(node.id)
                    yield _Item("fold", node, parent, line_prefix, own_prefix, fold_of.count, last)
                    kids = children.get(node.id, [])
                    if kids:
                        stack.append((kids[0], index, own_prefix, own_prefix, level))
                    index += 1
                    continue
                run: list[GraphNode] = []
                after = node
                if fold and parent is not None:  # a node drawn from nowhere starts no run
                    run, after = shape.run(node, seen)
                if run_folds(len(run), fold):
                    seen.update(item.id for item in run)
                    yield _Item("fold", node, parent, line_prefix, own_prefix, len(run), run[-1])
                    stack.append((after, index, own_prefix, own_prefix, level))
                    index += 1
                    continue
                seen.add(node.id)
                yield _Item("node", node, parent, line_prefix, own_prefix)
                kids = [kid for kid in children.get(node.id, ()) if kid.id not in seen]
                if kids and kids[0].type != "compaction":
                    stack.append((kids[0], index, own_prefix, own_prefix, level))
                    kids = kids[1:]
                for kid in reversed(kids):
                    stack.append((kid, index, own_prefix + "├── ", own_prefix + "│   ", level + 1))
                index += 1


def _weight(folded: Mapping[str, tuple[Fold, GraphNode]], node: GraphNode) -> int:
    """How many messages a drawn node stands for."""
    found = folded.get(node.id)
    return 1 if found is None else found[0].count


def _kind(node: GraphNode) -> str:
    """The role, or ``compaction`` for a compaction summary (see `ContextEngine.compact`)."""
    return "compaction" if node.type == "compaction" else node.role


def _labels(names: list[str]) -> str:
    shown = names[:_MAX_LABELS]
    extra = len(names) - len(shown)
    return ", ".join(shown) + (f", +{extra} more" if extra else "")


# --- ASCII ---------------------------------------------------------------------------------


def visualize_graph(
    graph: Graph | GraphOutline,
    *,
    fold: int | None = DEFAULT_FOLD,
    depth: int | None = DEFAULT_DEPTH,
    last: int | None = None,
) -> str:
    """Draw a chat's message graph as an ASCII tree whose size is linear in the chat.

    A ``[chat: ID]`` header, then one line per message (``ID8 (role): "preview"``, ids cut
    to 8 characters), the branches whose head is that message after ``<-`` in brackets (the
    active branch followed by ``*``), the checkpoints on it in braces, and a legend. A linear
    run stays at one indent; a side branch is drawn under the message it starts from, joined
    with ``├──`` and indented by ``│``, and the line that continues (the active path, else the
    oldest child) goes on at the same indent.

    For example:

    ```python
    [chat: chat-001]

    m1 (user): "Hello"
    m2 (assistant): "Hi there" {greeted}
    ├── m3 (user): "What is 2+2?" <- [main]
    m4 (user): "Tell me a joke" <- [main-v2 *]

    Legend: * = active branch, {...} = checkpoint, … = folded messages
    ```

    A run of ``fold`` or more plain messages in a row is one line
    ``… 511 messages (first8 … last8)``; side branches nested deeper than ``depth`` are one
    line ``… 40 messages, 2 branch heads below (nested deeper than 8)``; ``last=N`` draws
    only the newest N messages (a line says how many older ones are left out).

    Siblings are ordered by creation time, then id; line breaks and control characters in
    previews and names are shown as spaces so each message stays on one line.

    Args:
        graph: The graph, as returned by ``store.get_graph(chat_id)``, or its outline
            (a `GraphOutline`, what ``agentcontext show`` reads: the runs folded by the
            store, read without loading the whole chat).
        fold: Fold runs of at least this many plain messages (``None`` or ``0``: never).
        depth: How deep side branches nest before they are summarised (``None``: no limit).
        last: Draw only the newest N messages (``None``: all).

    Returns:
        The tree as a string, without a trailing newline.

    Raises:
        InvalidInputError: ``fold``, ``depth`` or ``last`` is negative or not an integer.
    """
    _check("fold", fold, 0)
    _check("depth", depth, 0)
    _check("last", last, 1)
    header = f"[chat: {_one_line(graph.chat_id)}]"
    if not graph.nodes:
        return f"{header}\n\n(empty)"
    tree = _Tree(graph, last)
    lines = [header, ""]
    if tree.left_out:
        lines.append(f"… {_messages(tree.left_out)} before these not shown (last={last})")
    for item in tree.walk(fold or None, depth):
        node = item.node
        if item.kind == "fold":
            assert item.last is not None
            lines.append(
                f"{item.line_prefix}… {_messages(item.count)} "
                f"({_one_line(node.id[:_ID_PREFIX_LENGTH])} … "
                f"{_one_line(item.last.id[:_ID_PREFIX_LENGTH])})"
            )
            continue
        if item.kind == "more":
            hidden = f", {item.heads} branch head{'s' if item.heads != 1 else ''}" * bool(
                item.heads
            )
            lines.append(
                f"{item.line_prefix}… {_messages(item.count)}{hidden} below "
                f"(nested deeper than {depth})"
            )
            continue
        line = (
            f"{item.line_prefix}{_one_line(node.id[:_ID_PREFIX_LENGTH])} "
            f'({_one_line(_kind(node))}): "{_one_line(node.preview)}"'
        )
        heads = tree.heads.get(node.id)
        if heads:
            labels = [_short(name) + (" *" if active else "") for name, active in heads]
            line += f" <- [{_labels(labels)}]"
        points = tree.points.get(node.id)
        if points:
            line += f" {{{_labels([_short(name) for name in points])}}}"
        lines.append(line)
    lines.append("")
    lines.append(_LEGEND)
    return "\n".join(lines)


# --- Mermaid -------------------------------------------------------------------------------------

# Characters written as themselves inside a quoted Mermaid label. Everything else, including
# every non-ASCII character, is written as a Mermaid entity code ``#<decimal>;``, which Mermaid
# turns into the HTML character reference ``&#<decimal>;`` and displays as the character.
# Quotes, brackets, pipes, ``#``, ``;``, ``%``, ``:``, ``<``, ``>``, ``&`` and backticks are
# therefore never raw in the output, so labels can neither close their shape, start a comment
# or a directive, inject HTML, nor be read as Markdown strings.
_MERMAID_SAFE = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,!?-_'+/=@"
)

_MERMAID_STYLES = (
    "classDef branch fill:#eef3ff,stroke:#4a6fd4",
    "classDef activeBranch fill:#e6f7e6,stroke:#2e8b2e,stroke-width:2px",
    "classDef checkpoint fill:#fff6db,stroke:#c79100",
    "classDef folded fill:#f2f2f2,stroke:#999999,stroke-dasharray:3",
)


def _mermaid_text(text: str) -> str:
    """Escape text for a double-quoted Mermaid label (see ``_MERMAID_SAFE``)."""
    escaped = "".join(ch if ch in _MERMAID_SAFE else f"#{ord(ch)};" for ch in _one_line(text))
    # Mermaid rejects an empty quoted label (``[""]``); a single space displays the same.
    return escaped or " "


def _mermaid(graph: Graph | GraphOutline, fold: int | None, last: int | None) -> str:
    tree = _Tree(graph, last)
    lines = ["flowchart TD"]
    if not graph.nodes and not graph.branches and not graph.checkpoints:
        lines.append(f'    empty["{_mermaid_text("(empty)")}"]')
        return "\n".join(lines)
    if tree.left_out:
        note = f"… {_messages(tree.left_out)} before these left out (last={last})"
        lines.append(f'    older["{_mermaid_text(note)}"]')
    items = list(tree.walk(fold or None, None))
    drawn: dict[str, str] = {}  # message id -> chart id of what shows it
    edges: list[str] = []
    folded: list[str] = []
    for index, item in enumerate(items):
        chart_id = f"n{index}"
        node = item.node
        if item.kind == "fold":
            assert item.last is not None
            label = _mermaid_text(f"… {_messages(item.count)}")
            lines.append(f'    {chart_id}(["{label}"])')
            folded.append(chart_id)
            drawn[item.last.id] = chart_id
        else:
            label = _mermaid_text(f"{_kind(node)}: {node.preview}")
            shape_open, shape_close = ("{{", "}}") if node.type == "compaction" else ("[", "]")
            lines.append(f'    {chart_id}{shape_open}"{label}"{shape_close}')
            drawn[node.id] = chart_id
        if item.parent is not None:
            edges.append(f"    n{item.parent} --> {chart_id}")
    lines.extend(edges)
    active: list[str] = []
    inactive: list[str] = []
    for index, branch in enumerate(graph.branches):
        head = branch.head_message_id
        if tree.left_out and head is not None and head not in drawn:
            continue  # its head is among the messages left out
        branch_id = f"b{index}"
        label = _mermaid_text(_short(branch.name) + (" *" if branch.is_active else ""))
        lines.append(f'    {branch_id}(["{label}"])')
        if branch.head_message_id is not None and branch.head_message_id in drawn:
            lines.append(f"    {branch_id} -.-> {drawn[branch.head_message_id]}")
        (active if branch.is_active else inactive).append(branch_id)
    checkpoint_ids: list[str] = []
    for index, checkpoint in enumerate(graph.checkpoints):
        if checkpoint.message_id not in drawn and tree.left_out:
            continue
        checkpoint_id = f"c{index}"
        lines.append(f'    {checkpoint_id}{{{{"{_mermaid_text(_short(checkpoint.name))}"}}}}')
        if checkpoint.message_id in drawn:
            lines.append(f"    {checkpoint_id} -.-> {drawn[checkpoint.message_id]}")
        checkpoint_ids.append(checkpoint_id)
    if active or inactive or checkpoint_ids or folded:
        lines.extend(f"    {style}" for style in _MERMAID_STYLES)
    if inactive:
        lines.append(f"    class {','.join(inactive)} branch")
    if active:
        lines.append(f"    class {','.join(active)} activeBranch")
    if checkpoint_ids:
        lines.append(f"    class {','.join(checkpoint_ids)} checkpoint")
    if folded:
        lines.append(f"    class {','.join(folded)} folded")
    return "\n".join(lines)


def graph_to_mermaid(
    graph: Graph | GraphOutline,
    *,
    fold: int | None = DEFAULT_FOLD,
    last: int | None = None,
    max_chars: int = MERMAID_MAX_TEXT,
) -> str:
    """Write a chat's message graph as a Mermaid ``flowchart`` that Mermaid will render.

    The chart reads top-down (``flowchart TD``):

    - each message is a box ``nK["role: preview"]`` (a compaction summary a hexagon) and
      each drawn parent has an arrow to its children;
    - a run of ``fold`` or more plain messages is one stadium ``nK(["… 511 messages"])``;
    - each branch is a stadium ``bK(["name"])`` with a dotted arrow to its head message (the
      active branch is labelled ``name *`` and styled ``activeBranch``; a branch with no head
      has no arrow);
    - each checkpoint is a hexagon ``cK{{"name"}}`` with a dotted arrow to its message.

    The chart is shorter than ``max_chars`` (Mermaid's default limit, `MERMAID_MAX_TEXT`):
    when the folded chart of the whole graph is longer, only the newest messages are drawn
    (as with ``last``), with a first node ``older`` saying how many were left out.

    Node ids are ``n0, n1, …`` for what is drawn (in the order of `visualize_graph`),
    ``b0, …`` for branches and ``c0, …`` for checkpoints, so no message id reaches the chart.
    Every label is double-quoted and every character outside ``[A-Za-z0-9]`` and
    `` .,!?-_'+/=@`` (every non-ASCII character too) is written as a Mermaid entity code
    ``#<decimal>;``: quotes, brackets, pipes, backticks, ``<script>``, ``%%``, ``;``, ``#``,
    ``end`` and newlines in message text cannot break the chart, and the output is pure ASCII.
    Line breaks in text are shown as spaces.

    Args:
        graph: The graph, as returned by ``store.get_graph(chat_id)``, or its outline
            (a `GraphOutline`).
        fold: Fold runs of at least this many plain messages (``None`` or ``0``: never).
        last: Draw only the newest N messages (``None``: as many as fit).
        max_chars: The chart stays shorter than this (at least 2 000).

    Returns:
        The Mermaid source, one statement per line, without a trailing newline.

    Raises:
        InvalidInputError: ``fold``, ``last`` or ``max_chars`` is out of range.
    """
    _check("fold", fold, 0)
    _check("last", last, 1)
    _check("max_chars", max_chars, 2_000)
    out = _mermaid(graph, fold, last)
    keep = min(last or len(graph.nodes), len(graph.nodes))  # drawn nodes (an outline's few)
    while len(out) >= max_chars and keep > 1:
        # Shrink in proportion to the overshoot, then step down until it fits.
        guess = int(keep * (max_chars / len(out)) * 0.9)
        keep = max(1, min(keep - 1, guess))
        out = _mermaid(graph, fold, keep)
    return out
