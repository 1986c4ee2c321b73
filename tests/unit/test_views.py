"""Tests for the ASCII tree and Mermaid views of a chat graph."""

from __future__ import annotations

import random
import re
import unicodedata
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentcontext.errors import InvalidInputError
from agentcontext.store.records import BranchInfo, Checkpoint, Graph, GraphNode
from agentcontext.views import MERMAID_MAX_TEXT, graph_to_mermaid, visualize_graph

T0 = datetime(2025, 1, 1, tzinfo=UTC)
LEGEND = "Legend: * = active branch, {...} = checkpoint, … = folded messages"


def node(node_id: str, parent: str | None, role: str, preview: str, second: int) -> GraphNode:
    return GraphNode(
        id=node_id,
        parent_id=parent,
        role=role,
        preview=preview,
        created_at=T0 + timedelta(seconds=second),
    )


def branch(name: str, head: str | None, *, active: bool = False, count: int = 0) -> BranchInfo:
    return BranchInfo(
        id=f"branch-{name}",
        chat_id="chat-001",
        name=name,
        head_message_id=head,
        is_active=active,
        created_at=T0,
        message_count=count,
    )


def checkpoint(name: str, message_id: str) -> Checkpoint:
    return Checkpoint(
        id=f"cp-{name}", chat_id="chat-001", name=name, message_id=message_id, created_at=T0
    )


@pytest.fixture
def two_branch_graph() -> Graph:
    """user → assistant → (user on main, user on main-v2 [active]); checkpoint on the reply."""
    return Graph(
        chat_id="chat-001",
        nodes=[
            node("msg-0001-aaaa", None, "user", "Hello", 0),
            node("msg-0002-bbbb", "msg-0001-aaaa", "assistant", "Hi there!\nHow can I help?", 1),
            node("msg-0003-cccc", "msg-0002-bbbb", "user", "What is 2+2?", 2),
            node("msg-0004-dddd", "msg-0002-bbbb", "user", "Tell me a joke", 3),
        ],
        branches=[
            branch("main", "msg-0003-cccc", count=3),
            branch("main-v2", "msg-0004-dddd", active=True, count=3),
        ],
        checkpoints=[checkpoint("greeted", "msg-0002-bbbb")],
    )


# --- ASCII ----------------------------------------------------------------------------------------


def test_ascii_tree_exact_output(two_branch_graph: Graph) -> None:
    assert visualize_graph(two_branch_graph) == (
        "[chat: chat-001]\n"
        "\n"
        'msg-0001 (user): "Hello"\n'
        'msg-0002 (assistant): "Hi there! How can I help?" {greeted}\n'
        '├── msg-0003 (user): "What is 2+2?" <- [main]\n'
        'msg-0004 (user): "Tell me a joke" <- [main-v2 *]\n'
        "\n"
        f"{LEGEND}"
    )


def test_ascii_empty_graph() -> None:
    graph = Graph(chat_id="c", nodes=[], branches=[], checkpoints=[])
    assert visualize_graph(graph) == "[chat: c]\n\n(empty)"


def test_ascii_deeper_tree_prefixes_and_several_marks() -> None:
    graph = Graph(
        chat_id="c",
        nodes=[
            node("r", None, "user", "root", 0),
            node("a", "r", "assistant", "a", 1),
            node("a1", "a", "user", "a1", 2),
            node("a1x", "a1", "assistant", "a1x", 3),
            node("a2", "a", "user", "a2", 4),
            node("b", "r", "assistant", "b", 5),
        ],
        branches=[branch("main", "a1x", active=True), branch("alt", "a1x"), branch("empty", None)],
        checkpoints=[checkpoint("one", "a"), checkpoint("two", "a")],
    )
    # The active path goes on at one indent; each side branch hangs from its fork.
    assert visualize_graph(graph).splitlines()[2:8] == [
        'r (user): "root"',
        '├── b (assistant): "b"',
        'a (assistant): "a" {one, two}',
        '├── a2 (user): "a2"',
        'a1 (user): "a1"',
        'a1x (assistant): "a1x" <- [main *, alt]',
    ]
    side = Graph(
        chat_id="c",
        nodes=[
            node("r", None, "user", "root", 0),
            node("a", "r", "assistant", "a", 1),
            node("b", "r", "assistant", "b", 2),
            node("b1", "b", "user", "b1", 3),
            node("b1x", "b1", "assistant", "b1x", 4),
            node("b2", "b", "user", "b2", 5),
        ],
        branches=[branch("main", "a", active=True)],
        checkpoints=[],
    )
    assert visualize_graph(side).splitlines()[2:8] == [
        'r (user): "root"',
        '├── b (assistant): "b"',
        '│   ├── b2 (user): "b2"',
        '│   b1 (user): "b1"',
        '│   b1x (assistant): "b1x"',
        'a (assistant): "a" <- [main *]',
    ]


def test_ascii_is_deterministic_whatever_the_input_order(two_branch_graph: Graph) -> None:
    expected = visualize_graph(two_branch_graph)
    nodes = list(two_branch_graph.nodes)
    for seed in range(5):
        random.Random(seed).shuffle(nodes)
        shuffled = Graph(
            chat_id=two_branch_graph.chat_id,
            nodes=nodes,
            branches=two_branch_graph.branches,
            checkpoints=two_branch_graph.checkpoints,
        )
        assert visualize_graph(shuffled) == expected


def test_ascii_long_chain_does_not_recurse() -> None:
    count = 5000
    nodes = [
        node(f"m{i:05d}", f"m{i - 1:05d}" if i else None, "user", str(i), i) for i in range(count)
    ]
    graph = Graph(chat_id="c", nodes=nodes, branches=[], checkpoints=[])
    lines = visualize_graph(graph, fold=None).splitlines()
    assert len(lines) == count + 4
    assert lines[-3] == f'm{count - 1:05d} (user): "{count - 1}"'
    assert max(len(line) for line in lines[2:-2]) < 30  # a linear run keeps one indent
    assert visualize_graph(graph).splitlines()[2:5] == [
        'm00000 (user): "0"',
        f"… {count - 2} messages (m00001 … m0{count - 2})",
        f'm0{count - 1} (user): "{count - 1}"',
    ]


def test_ascii_malformed_graph_shows_every_node_once() -> None:
    graph = Graph(
        chat_id="c",
        nodes=[
            node("ok", None, "user", "root", 0),
            node("orphan", "missing", "user", "lost parent", 1),
            node("x", "y", "user", "cycle x", 2),
            node("y", "x", "assistant", "cycle y", 3),
            node("self", "self", "user", "own parent", 4),
        ],
        branches=[],
        checkpoints=[],
    )
    body = visualize_graph(graph).splitlines()[2:-2]
    assert len(body) == 5
    for marker in ("root", "lost parent", "cycle x", "cycle y", "own parent"):
        assert sum(marker in line for line in body) == 1


def test_ascii_control_characters_stay_on_one_line() -> None:
    graph = Graph(
        chat_id="c\nd",
        nodes=[node("m1", None, "user", "a\r\nb\tc\u2028d\x00e", 0)],
        branches=[branch("br\nanch", "m1", active=True)],
        checkpoints=[checkpoint("c\np", "m1")],
    )
    assert visualize_graph(graph).splitlines() == [
        "[chat: c d]",
        "",
        'm1 (user): "a  b c d e" <- [br anch *] {c p}',
        "",
        LEGEND,
    ]


# --- Mermaid --------------------------------------------------------------------------------------

SAFE = r"[A-Za-z0-9 .,!?\-_'+/=@]"
LABEL = rf"(?:{SAFE}|#\d+;)+"
LINE_GRAMMAR = [
    re.compile(r"^flowchart TD$"),
    re.compile(rf'^    n\d+\["{LABEL}"\]$'),
    re.compile(rf'^    n\d+\(\["{LABEL}"\]\)$'),
    re.compile(rf'^    older\["{LABEL}"\]$'),
    re.compile(r"^    n\d+ --> n\d+$"),
    re.compile(rf'^    b\d+\(\["{LABEL}"\]\)$'),
    re.compile(r"^    b\d+ -\.-> n\d+$"),
    re.compile(rf'^    c\d+\{{\{{"{LABEL}"\}}\}}$'),
    re.compile(r"^    c\d+ -\.-> n\d+$"),
    re.compile(rf'^    empty\["{LABEL}"\]$'),
    re.compile(
        r"^    classDef (?:branch|activeBranch|checkpoint|folded) [a-z\-]+:#[0-9a-f]{6}"
        r"(?:,[a-z\-]+:[#0-9a-z]+)*$"
    ),
    re.compile(r"^    class [bcn]\d+(?:,[bcn]\d+)* (?:branch|activeBranch|checkpoint|folded)$"),
]
LABELLED = re.compile(r'^    (?:n\d+\[|b\d+\(\[|c\d+\{\{|empty\[)"(?P<label>[^"]*)"')


def assert_grammar(chart: str) -> None:
    """Every line matches exactly one form of the small grammar the views emit."""
    assert chart.isascii()
    assert not chart.endswith("\n")
    lines = chart.split("\n")
    assert lines[0] == "flowchart TD"
    for line in lines:
        assert any(pattern.match(line) for pattern in LINE_GRAMMAR), line


def decode(label: str) -> str:
    return re.sub(r"#(\d+);", lambda match: chr(int(match.group(1))), label)


def one_line(text: str) -> str:
    return "".join(" " if unicodedata.category(ch) in ("Cc", "Zl", "Zp") else ch for ch in text)


def labels(chart: str) -> list[str]:
    found = []
    for line in chart.split("\n"):
        match = LABELLED.match(line)
        if match:
            found.append(decode(match.group("label")))
    return found


def test_mermaid_exact_output(two_branch_graph: Graph) -> None:
    assert graph_to_mermaid(two_branch_graph).split("\n") == [
        "flowchart TD",
        '    n0["user#58; Hello"]',
        '    n1["assistant#58; Hi there! How can I help?"]',
        '    n2["user#58; What is 2+2?"]',
        '    n3["user#58; Tell me a joke"]',
        "    n0 --> n1",
        "    n1 --> n2",
        "    n1 --> n3",
        '    b0(["main"])',
        "    b0 -.-> n2",
        '    b1(["main-v2 #42;"])',
        "    b1 -.-> n3",
        '    c0{{"greeted"}}',
        "    c0 -.-> n1",
        "    classDef branch fill:#eef3ff,stroke:#4a6fd4",
        "    classDef activeBranch fill:#e6f7e6,stroke:#2e8b2e,stroke-width:2px",
        "    classDef checkpoint fill:#fff6db,stroke:#c79100",
        "    classDef folded fill:#f2f2f2,stroke:#999999,stroke-dasharray:3",
        "    class b0 branch",
        "    class b1 activeBranch",
        "    class c0 checkpoint",
    ]


HOSTILE = [
    'say "hi"',
    "<script>alert(1)</script>",
    "a|b|c [x] {y} (z)",
    "`code` ```md```",
    "end",
    "%% not a comment",
    "a;b#c #quot; #35;",
    "--> n0",
    "style n0 fill:#f00;",
    "classDef x fill:#f00;",
    "click n0 call alert()",
    "&lt;b&gt; &amp;",
    "end\nsubgraph x\n",
    '"]; n9["pwned',
    "é漢字🙂\u202e\u200b",
    "",
    "\\",
]


def test_mermaid_hostile_labels_are_escaped() -> None:
    nodes = [node("root", None, "user", "start", 0)]
    for index, text in enumerate(HOSTILE):
        nodes.append(node(f'id "{index}" ]; end', "root", "assistant", text, index + 1))
    graph = Graph(
        chat_id="chat",
        nodes=nodes,
        branches=[branch(text, nodes[1].id, active=i == 0) for i, text in enumerate(HOSTILE)],
        checkpoints=[checkpoint(text, "root") for text in HOSTILE],
    )
    chart = graph_to_mermaid(graph)
    assert_grammar(chart)
    lines = chart.split("\n")
    # One box per message, one stadium per branch, one hexagon per checkpoint, and the edges.
    assert sum(bool(re.match(r"^    n\d+\[", line)) for line in lines) == len(nodes)
    assert sum(bool(re.match(r"^    b\d+\(\[", line)) for line in lines) == len(HOSTILE)
    assert sum(bool(re.match(r"^    c\d+\{\{", line)) for line in lines) == len(HOSTILE)
    assert sum(" --> " in line for line in lines) == len(HOSTILE)
    assert sum(" -.-> " in line for line in lines) == 2 * len(HOSTILE)
    # No raw special character reaches a label; decoding gives back the text.
    for line in lines:
        match = LABELLED.match(line)
        if match:
            assert re.fullmatch(rf"{SAFE}*", re.sub(r"#\d+;", "", match.group("label")))
    decoded = labels(chart)
    messages = ["user: start"] + [f"assistant: {one_line(text)}" for text in HOSTILE]
    assert sorted(decoded[: len(messages)]) == sorted(messages)
    expected = [one_line(text) + (" *" if i == 0 else "") or " " for i, text in enumerate(HOSTILE)]
    expected += [one_line(text) or " " for text in HOSTILE]
    assert decoded[len(messages) :] == expected
    # Message ids never reach the chart.
    assert "id " not in chart


def test_mermaid_empty_graph() -> None:
    chart = graph_to_mermaid(Graph(chat_id="c", nodes=[], branches=[], checkpoints=[]))
    assert chart == 'flowchart TD\n    empty["#40;empty#41;"]'
    assert_grammar(chart)


def test_mermaid_branch_without_head_and_dangling_pointers() -> None:
    graph = Graph(
        chat_id="c",
        nodes=[node("m1", None, "user", "hi", 0)],
        branches=[branch("fresh", None, active=True), branch("lost", "gone")],
        checkpoints=[checkpoint("old", "gone")],
    )
    chart = graph_to_mermaid(graph)
    assert_grammar(chart)
    assert " -.-> " not in chart
    assert '    b0(["fresh #42;"])' in chart.split("\n")


def test_mermaid_is_deterministic(two_branch_graph: Graph) -> None:
    nodes = list(reversed(two_branch_graph.nodes))
    reordered = Graph(
        chat_id="chat-001",
        nodes=nodes,
        branches=two_branch_graph.branches,
        checkpoints=two_branch_graph.checkpoints,
    )
    assert graph_to_mermaid(reordered) == graph_to_mermaid(two_branch_graph)


texts = st.text(max_size=40)


@st.composite
def graphs(draw: st.DrawFn) -> Graph:
    size = draw(st.integers(min_value=0, max_value=8))
    nodes: list[GraphNode] = []
    for index in range(size):
        parent = None
        linked: bool = draw(st.booleans())
        if nodes and linked:
            parent = draw(st.sampled_from(nodes)).id
        nodes.append(
            node(
                draw(texts) + f"#{index}",
                parent,
                draw(st.one_of(st.sampled_from(["user", "assistant", "system"]), texts)),
                draw(texts),
                draw(st.integers(min_value=0, max_value=3)),
            )
        )
    ids = [item.id for item in nodes]
    heads = st.one_of(st.none(), st.sampled_from(ids)) if ids else st.none()
    branches = [
        branch(draw(texts), draw(heads), active=index == 0)
        for index in range(draw(st.integers(min_value=0, max_value=3)))
    ]
    checkpoints = (
        [
            checkpoint(draw(texts), draw(st.sampled_from(ids)))
            for _ in range(draw(st.integers(0, 3)))
        ]
        if ids
        else []
    )
    return Graph(chat_id=draw(texts), nodes=nodes, branches=branches, checkpoints=checkpoints)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(graphs())
def test_mermaid_random_graphs_never_break_the_chart(graph: Graph) -> None:
    assert_grammar(graph_to_mermaid(graph))
    chart = graph_to_mermaid(graph, fold=None)
    assert_grammar(chart)
    lines = chart.split("\n")
    parented = sum(item.parent_id is not None for item in graph.nodes)
    assert sum(" --> " in line for line in lines) == parented
    heads = sum(item.head_message_id is not None for item in graph.branches)
    assert sum(" -.-> " in line for line in lines) == heads + len(graph.checkpoints)
    node_labels = labels(chart)[: len(graph.nodes)]
    expected = sorted(one_line(f"{item.role}: {item.preview}") for item in graph.nodes)
    assert sorted(node_labels) == expected


@settings(max_examples=200, deadline=None)
@given(graphs())
def test_ascii_random_graphs_have_one_line_per_message(graph: Graph) -> None:
    text = visualize_graph(graph, fold=None, depth=None)
    lines = text.split("\n")
    if not graph.nodes:
        assert lines[-1] == "(empty)"
        return
    assert len(lines) == len(graph.nodes) + 4
    assert lines[-1] == LEGEND
    assert len(visualize_graph(graph).split("\n")) <= len(lines)


# --- scale: linear and bounded output -------------------------------------------------------


def comb(count: int, every: int) -> Graph:
    """A main line of ``count`` messages with a one-message side branch every ``every``."""
    nodes = [
        node(f"m{i:06d}", f"m{i - 1:06d}" if i else None, "user", f"say {i}", i)
        for i in range(count)
    ]
    branches = [branch("main", f"m{count - 1:06d}", active=True)]
    for i in range(every, count, every):
        nodes.append(node(f"s{i:06d}", f"m{i:06d}", "user", f"side {i}", count + i))
        branches.append(branch(f"main-v{i}", f"s{i:06d}"))
    return Graph(chat_id="c", nodes=nodes, branches=branches, checkpoints=[])


def test_a_long_chat_with_branches_draws_lines_of_bounded_width() -> None:
    graph = comb(10_000, 100)
    text = visualize_graph(graph, fold=None)
    lines = text.split("\n")
    assert len(lines) == len(graph.nodes) + 4
    assert max(len(line) for line in lines) < 120  # every fork is one indent, never deeper
    folded = visualize_graph(graph)
    assert len(folded.split("\n")) < 700  # 99 forks, each: a fold, the fork, its side branch
    assert "… 99 messages (m000001 … m000099)" in folded
    assert len(folded) < len(text) // 10


def test_side_branches_nested_deeper_than_depth_are_summarised() -> None:
    # A staircase: each branch forks from the previous branch's first message.
    nodes = [node("r", None, "user", "root", 0), node("main", "r", "assistant", "main", 1)]
    parent = "r"
    for level in range(12):
        # The older child continues the line, so each next side branch nests one deeper.
        nodes.append(node(f"s{level}", parent, "assistant", f"side {level}", 2 * level + 2))
        nodes.append(node(f"s{level}x", f"s{level}", "user", "next", 2 * level + 3))
        parent = f"s{level}"
    graph = Graph(
        chat_id="c", nodes=nodes, branches=[branch("main", "main", active=True)], checkpoints=[]
    )
    lines = visualize_graph(graph, depth=3).split("\n")[2:-2]
    assert sum(line.startswith("│   " * 3 + "├── … ") for line in lines) == 1
    summary = next(line for line in lines if "nested deeper than 3" in line)
    assert "… 18 messages below" in summary
    whole = visualize_graph(graph, depth=None, fold=None).split("\n")[2:-2]
    assert len(whole) == len(nodes)
    assert max(len(line) for line in lines) < max(len(line) for line in whole)


def test_last_draws_only_the_newest_messages() -> None:
    graph = comb(50, 10)
    lines = visualize_graph(graph, last=5, fold=None).split("\n")
    assert lines[2] == f"… {len(graph.nodes) - 5} messages before these not shown (last=5)"
    assert sum('"side' in line or '"say' in line for line in lines) == 5
    with pytest.raises(InvalidInputError, match="last"):
        visualize_graph(graph, last=0)
    with pytest.raises(InvalidInputError, match="fold"):
        visualize_graph(graph, fold=-1)


@pytest.mark.parametrize(("count", "every"), [(10_000, 1), (100_000, 50), (3_000, 10**9)])
def test_mermaid_stays_under_its_default_limit(count: int, every: int) -> None:
    graph = comb(count, every)
    chart = graph_to_mermaid(graph)
    assert len(chart) < MERMAID_MAX_TEXT
    assert_grammar(chart)
    if len(graph.nodes) > 3_000:  # too many heads to draw: the note says what was left out
        assert "older" in chart.split("\n")[1]
        assert "left out" in decode(chart.split("\n")[1])
    smaller = graph_to_mermaid(graph, max_chars=10_000)
    assert len(smaller) < 10_000
    assert_grammar(smaller)


def test_folded_runs_are_one_mermaid_node() -> None:
    chart = graph_to_mermaid(comb(1000, 10**9))
    assert '    n1(["#8230; 998 messages"])' in chart.split("\n")
    assert "    class n1 folded" in chart
