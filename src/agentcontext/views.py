"""Text views of a chat's conversation graph.

Two pure functions turn a `Graph` (as returned by
``store.get_graph(chat_id)``) into text:

- `visualize_graph` draws the ASCII tree of the original package: one line per message,
  branch heads after ``<-`` with the active branch marked ``*``, checkpoints in braces.
- `graph_to_mermaid` writes a Mermaid ``flowchart`` in which every label is escaped, so
  no message text, branch name or checkpoint name can change the structure of the chart.

Both are deterministic: the same graph always gives the same text. Both walk the graph
iteratively, so chains of any length render without hitting Python's recursion limit, and a
malformed graph (a message whose parent is missing, or a cycle) still renders every node once.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass

from agentcontext.store.records import Graph, GraphNode

__all__ = ["graph_to_mermaid", "visualize_graph"]

_LEGEND = "Legend: * = active branch, {...} = checkpoint"
_ID_PREFIX_LENGTH = 8


@dataclass(frozen=True, slots=True)
class _Placed:
    """A node in drawing order, with the ASCII prefix of its line."""

    node: GraphNode
    prefix: str
    connector: str
    child_prefix: str


def _sort_key(node: GraphNode) -> tuple[float, str]:
    return (node.created_at.timestamp(), node.id)


def _children_map(graph: Graph) -> tuple[list[GraphNode], dict[str, list[GraphNode]]]:
    """Roots (no parent, or a parent missing from the graph) and children per node, sorted."""
    ids = {node.id for node in graph.nodes}
    roots: list[GraphNode] = []
    children: dict[str, list[GraphNode]] = {}
    for node in graph.nodes:
        if node.parent_id is None or node.parent_id not in ids or node.parent_id == node.id:
            roots.append(node)
        else:
            children.setdefault(node.parent_id, []).append(node)
    roots.sort(key=_sort_key)
    for siblings in children.values():
        siblings.sort(key=_sort_key)
    return roots, children


def _walk(graph: Graph) -> Iterator[_Placed]:
    """Depth-first, pre-order walk of the forest, visiting every node exactly once.

    Children are ordered by creation time, then id. Nodes that cannot be reached from a root
    (they sit on a cycle) are drawn afterwards as extra roots, so nothing is silently dropped.
    """
    roots, children = _children_map(graph)
    seen: set[str] = set()
    pending = sorted(graph.nodes, key=_sort_key)

    def tree(root: GraphNode) -> Iterator[_Placed]:
        # Each stack entry: (node, prefix, connector, prefix for its children).
        stack: list[_Placed] = [_Placed(root, "", "", "")]
        while stack:
            placed = stack.pop()
            if placed.node.id in seen:
                continue
            seen.add(placed.node.id)
            yield placed
            kids = [kid for kid in children.get(placed.node.id, []) if kid.id not in seen]
            for index in range(len(kids) - 1, -1, -1):
                last = index == len(kids) - 1
                stack.append(
                    _Placed(
                        node=kids[index],
                        prefix=placed.child_prefix,
                        connector="└── " if last else "├── ",
                        child_prefix=placed.child_prefix + ("    " if last else "│   "),
                    )
                )

    for root in roots:
        yield from tree(root)
    for node in pending:
        if node.id not in seen:
            yield from tree(node)


def _kind(node: GraphNode) -> str:
    """The role, or ``compaction`` for a compaction summary (see `ContextEngine.compact`)."""
    return "compaction" if node.type == "compaction" else node.role


def _one_line(text: str) -> str:
    """Replace line breaks and other control characters with spaces."""
    return "".join(" " if unicodedata.category(ch) in ("Cc", "Zl", "Zp") else ch for ch in text)


def visualize_graph(graph: Graph) -> str:
    """Draw a chat's message graph as an ASCII tree.

    The layout follows the original package: a ``[chat: ID]`` header, one line per message
    (``ID8 (role): "preview"``, ids cut to 8 characters), children below their parent joined with
    ``├──`` / ``└──``, the branches whose head is that message after ``<-`` in brackets (the
    active branch followed by ``*``), the checkpoints on that message in braces, and a legend.

    Example::

        [chat: chat-001]

        m1 (user): "Hello"
        └── m2 (assistant): "Hi there" {greeted}
            ├── m3 (user): "What is 2+2?" <- [main]
            └── m4 (user): "Tell me a joke" <- [main-v2 *]

        Legend: * = active branch, {...} = checkpoint

    Siblings are ordered by creation time, then id; line breaks and control characters in
    previews and names are shown as spaces so each message stays on one line.

    Args:
        graph: The graph, as returned by ``store.get_graph(chat_id)``.

    Returns:
        The tree as a string, without a trailing newline.
    """
    header = f"[chat: {_one_line(graph.chat_id)}]"
    if not graph.nodes:
        return f"{header}\n\n(empty)"

    heads: dict[str, list[str]] = {}
    for branch in graph.branches:
        if branch.head_message_id is not None:
            label = _one_line(branch.name) + (" *" if branch.is_active else "")
            heads.setdefault(branch.head_message_id, []).append(label)
    marks: dict[str, list[str]] = {}
    for checkpoint in graph.checkpoints:
        marks.setdefault(checkpoint.message_id, []).append(_one_line(checkpoint.name))

    lines = [header, ""]
    for placed in _walk(graph):
        node = placed.node
        line = (
            f"{placed.prefix}{placed.connector}{_one_line(node.id[:_ID_PREFIX_LENGTH])} "
            f'({_one_line(_kind(node))}): "{_one_line(node.preview)}"'
        )
        if node.id in heads:
            line += f" <- [{', '.join(heads[node.id])}]"
        if node.id in marks:
            line += f" {{{', '.join(marks[node.id])}}}"
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
)


def _mermaid_text(text: str) -> str:
    """Escape text for a double-quoted Mermaid label (see ``_MERMAID_SAFE``)."""
    escaped = "".join(ch if ch in _MERMAID_SAFE else f"#{ord(ch)};" for ch in _one_line(text))
    # Mermaid rejects an empty quoted label (``[""]``); a single space displays the same.
    return escaped or " "


def graph_to_mermaid(graph: Graph) -> str:
    """Write a chat's message graph as a Mermaid ``flowchart``.

    The chart reads top-down (``flowchart TD``):

    - each message is a box ``nK["role: preview"]`` and each parent has an arrow to its children;
    - each branch is a stadium ``bK(["name"])`` with a dotted arrow to its head message (the
      active branch is labelled ``name *`` and styled ``activeBranch``; a branch with no head
      has no arrow);
    - each checkpoint is a hexagon ``cK{{"name"}}`` with a dotted arrow to its message.

    Node ids are ``n0, n1, …`` for messages (in the drawing order of `visualize_graph`),
    ``b0, …`` for branches and ``c0, …`` for checkpoints, so no message id reaches the chart.
    Every label is double-quoted and every character outside ``[A-Za-z0-9]`` and
    `` .,!?-_'+/=@`` (every non-ASCII character too) is written as a Mermaid entity code
    ``#<decimal>;``: quotes, brackets, pipes, backticks, ``<script>``, ``%%``, ``;``, ``#``,
    ``end`` and newlines in message text cannot break the chart, and the output is pure ASCII.
    Line breaks in text are shown as spaces.

    Args:
        graph: The graph, as returned by ``store.get_graph(chat_id)``.

    Returns:
        The Mermaid source, one statement per line, without a trailing newline.
    """
    lines = ["flowchart TD"]
    placed_nodes = [placed.node for placed in _walk(graph)]
    message_ids = {node.id: f"n{index}" for index, node in enumerate(placed_nodes)}
    for node in placed_nodes:
        label = _mermaid_text(f"{_kind(node)}: {node.preview}")
        shape = ("{{", "}}") if node.type == "compaction" else ("[", "]")
        lines.append(f'    {message_ids[node.id]}{shape[0]}"{label}"{shape[1]}')
    edges = [
        f"    {message_ids[node.parent_id]} --> {message_ids[node.id]}"
        for node in placed_nodes
        if node.parent_id is not None
        and node.parent_id in message_ids
        and node.parent_id != node.id
    ]
    lines.extend(edges)

    if not graph.nodes and not graph.branches and not graph.checkpoints:
        lines.append(f'    empty["{_mermaid_text("(empty)")}"]')
        return "\n".join(lines)

    active: list[str] = []
    inactive: list[str] = []
    for index, branch in enumerate(graph.branches):
        branch_id = f"b{index}"
        label = _mermaid_text(branch.name + (" *" if branch.is_active else ""))
        lines.append(f'    {branch_id}(["{label}"])')
        if branch.head_message_id is not None and branch.head_message_id in message_ids:
            lines.append(f"    {branch_id} -.-> {message_ids[branch.head_message_id]}")
        (active if branch.is_active else inactive).append(branch_id)

    checkpoint_ids: list[str] = []
    for index, checkpoint in enumerate(graph.checkpoints):
        checkpoint_id = f"c{index}"
        lines.append(f'    {checkpoint_id}{{{{"{_mermaid_text(checkpoint.name)}"}}}}')
        if checkpoint.message_id in message_ids:
            lines.append(f"    {checkpoint_id} -.-> {message_ids[checkpoint.message_id]}")
        checkpoint_ids.append(checkpoint_id)

    if active or inactive or checkpoint_ids:
        lines.extend(f"    {style}" for style in _MERMAID_STYLES)
    if inactive:
        lines.append(f"    class {','.join(inactive)} branch")
    if active:
        lines.append(f"    class {','.join(active)} activeBranch")
    if checkpoint_ids:
        lines.append(f"    class {','.join(checkpoint_ids)} checkpoint")
    return "\n".join(lines)
