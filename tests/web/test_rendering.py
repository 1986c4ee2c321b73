"""The viewer without a browser: layout, escaping, headers, read-only routes (both backends)."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from agentcontext.messages import Message, ReasoningPart, TextPart, ToolPart
from agentcontext.store import SqlContextStore
from agentcontext.store.records import (
    BranchInfo,
    Graph,
    GraphNode,
    MessageRecord,
)
from agentcontext.web import CSP, create_app
from agentcontext.web._html import snippet_html, text_html
from agentcontext.web._layout import FOLD_MIN, layout_graph, render_svg
from agentcontext.web._render import (
    message_body,
    message_panel,
    reminder_ranges,
    text_with_reminders,
)
from tests.web.seed import CHAT, HOSTILE, SECRET, USER, seed

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ROUTES = [
    "/",
    f"/chat?id={CHAT}",
    f"/graph?id={CHAT}",
    f"/message?chat={CHAT}&id=m-u1",
    f"/branch?chat={CHAT}&name=main",
    f"/snapshots?chat={CHAT}",
    f"/records?chat={CHAT}",
]

# --- markup checks ------------------------------------------------------------------------

ALLOWED_TAGS = {
    "html", "head", "meta", "title", "link", "script", "body", "header", "nav", "main", "a",
    "span", "h1", "h2", "p", "div", "section", "aside", "table", "thead", "tbody", "tr", "th",
    "td", "form", "label", "input", "button", "pre", "code", "details", "summary", "mark",
    "svg", "g", "path", "circle", "rect", "text", "tspan",
}  # fmt: skip


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def check_markup(html: str) -> _Tags:
    """Only the viewer's own tags, no event handlers, no script but the viewer's own, no
    javascript: links."""
    parser = _Tags()
    parser.feed(html)
    parser.close()
    for tag, attrs in parser.tags:
        assert tag in ALLOWED_TAGS, tag
        assert not [name for name in attrs if name.startswith("on")], (tag, attrs)
        if tag == "script":
            assert attrs.get("src") == "/static/viewer.js", attrs
        for name in ("href", "src", "action"):
            value = (attrs.get(name) or "").strip().lower()
            assert not value.startswith(("javascript:", "vbscript:", "http:", "https:", "//"))
            if name == "href" and value.startswith("data:"):
                assert tag == "link" and value == "data:,"
        assert "style" not in attrs
    return parser


hostile_text = st.one_of(
    st.text(max_size=200),
    st.sampled_from(
        [
            "<script>alert(1)</script>",
            '"><img src=x onerror=alert(1)>',
            "<svg/onload=alert(1)>",
            "javascript:alert(1)",
            "</pre></textarea><!--",
            "\u202egnp.exe",
            "<mark onclick=alert(1)>x</mark>",
            "&lt;script&gt;",
        ]
    ),
)


@given(text=hostile_text, reasoning=hostile_text, tool=hostile_text)
@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
def test_any_message_content_renders_as_text(text: str, reasoning: str, tool: str) -> None:
    message = Message(
        id="m1",
        role="assistant",
        parts=[
            ReasoningPart(text=reasoning),
            ToolPart(
                tool_call_id=tool or "c",
                tool_name=tool or "t",
                input={"q": tool},
                state="output-error",
                error=tool,
            ),
            TextPart(text=text),
        ],
        metadata={"reminders": [{"start": 0, "end": len(text), "part": 2}], "x": tool},
    )
    record = MessageRecord(
        id=text or "m1", chat_id="c", name="assistant", data=message.model_dump(mode="json")
    )
    parser = check_markup(message_panel(record))
    shown = "".join(parser.text)
    controls = (
        r"[\u061c\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"
    )
    expected = re.sub(controls, lambda m: f"U+{ord(m.group()):04X}", text)

    def lines(value: str) -> str:
        return value.replace("\r\n", "\n").replace("\r", "\n")

    assert lines(expected) in lines(shown)


@given(
    snippet=st.lists(
        st.sampled_from(["<mark>", "</mark>", "<b>", "a", "<", "&", "<script>"]), max_size=30
    ).map("".join)
)
def test_snippets_keep_only_mark(snippet: str) -> None:
    parser = check_markup(snippet_html(snippet))
    assert {tag for tag, _ in parser.tags} <= {"mark", "span"}


@given(
    metadata=st.recursive(
        st.none() | st.booleans() | st.integers(-5, 50) | st.text(max_size=3),
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(
                st.sampled_from(["reminders", "start", "end", "part"]), inner, max_size=4
            )
        ),
        max_leaves=20,
    ),
    text=st.text(max_size=40),
)
def test_malformed_reminders_are_ignored_never_trusted(metadata: Any, text: str) -> None:
    ranges = reminder_ranges(metadata, 0, text)
    last = 0
    for start, end in ranges:
        assert last <= start < end <= len(text)
        last = end
    check_markup(text_with_reminders(text, ranges))


def test_reminders_are_marked_at_their_ranges() -> None:
    text = "hello <system-reminder>x</system-reminder> bye"
    start = text.index("<system")
    end = text.index(" bye")
    meta = {"reminders": [{"start": start, "end": end, "part": 0}, {"start": 1, "end": 999}]}
    ranges = reminder_ranges(meta, 0, text)
    assert ranges == [(start, end)]
    html = text_with_reminders(text, ranges)
    assert html.startswith("hello ")
    assert '<mark class="reminder"' in html and "&lt;system-reminder&gt;x" in html
    assert reminder_ranges({"reminders": "nope"}, 0, "hello") == []
    assert reminder_ranges(None, 0, "hello") == []


def test_bidi_controls_become_visible_markers() -> None:
    assert text_html("a\u202eb") == 'a<span class="ctl">U+202E</span>b'
    assert text_html("<b>") == "&lt;b&gt;"


# --- layout -----------------------------------------------------------------------------


def _graph(parents: list[int | None], heads: list[int], compactions: set[int]) -> Graph:
    nodes = [
        GraphNode(
            id=f"n{i}",
            parent_id=None if p is None else f"n{p}",
            role="user" if i % 2 == 0 else "assistant",
            preview=f"<b>{i}</b>",
            created_at=T0 + timedelta(seconds=i),
            type="compaction" if i in compactions else "message",
        )
        for i, p in enumerate(parents)
    ]
    branches = [
        BranchInfo(
            id=f"b{k}",
            chat_id="c",
            name=f"b<{k}>",
            head_message_id=f"n{h}",
            is_active=k == 0,
            created_at=T0,
            message_count=0,
        )
        for k, h in enumerate(heads)
    ]
    return Graph(chat_id="c", nodes=nodes, branches=branches, checkpoints=[])


@st.composite
def trees(draw: st.DrawFn) -> Graph:
    size = draw(st.integers(1, 60))
    parents: list[int | None] = [None]
    for i in range(1, size):
        # Mostly linear (long runs), sometimes a fork.
        parents.append(i - 1 if draw(st.integers(0, 9)) < 8 else draw(st.integers(0, i - 1)))
    heads = draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=5))
    leaves = [i for i in range(size) if i not in {p for p in parents if p is not None}]
    compactions = set(draw(st.lists(st.sampled_from(leaves), max_size=2))) - set(heads) - {0}
    return _graph(parents, heads, compactions)


@given(graph=trees(), open_all=st.booleans())
@settings(max_examples=200)
def test_layout_draws_every_message_once(graph: Graph, open_all: bool) -> None:
    layout = layout_graph(graph)
    runs = [row.node.id for row in layout.rows if row.kind == "fold"]
    if open_all:
        layout = layout_graph(graph, opened=runs)
        assert layout.folds == 0
    drawn: list[str] = []
    for index, row in enumerate(layout.rows):
        if row.parent_row is not None:
            assert row.parent_row < index
            # The edge runs down the child's lane: no other node is drawn on it.
            between = layout.rows[row.parent_row + 1 : index]
            assert all(other.lane != row.lane for other in between)
        if row.kind == "fold":
            assert row.count >= FOLD_MIN
            drawn.append(f"fold:{row.count}")
        else:
            drawn.append(row.node.id)
    ids = [d for d in drawn if not d.startswith("fold:")]
    assert len(ids) == len(set(ids))
    folded = sum(int(d.split(":")[1]) for d in drawn if d.startswith("fold:"))
    assert len(ids) + folded == len(graph.nodes)
    heads = {b.head_message_id for b in graph.branches}
    assert heads <= set(ids)
    svg = render_svg(layout, chat_id="c<x>")
    check_markup(svg)
    assert svg.count("<a ") == len(layout.rows)


def test_a_long_chain_folds_and_a_selected_message_stays_visible() -> None:
    graph = _graph([None, *range(199)], heads=[199], compactions=set())
    layout = layout_graph(graph)
    assert [row.kind for row in layout.rows] == ["message", "fold", "message"]
    assert layout.rows[1].count == 198
    picked = layout_graph(graph, selected="n100")
    assert [row.node.id for row in picked.rows if row.kind != "fold"] == ["n0", "n100", "n199"]


def test_a_compaction_goes_to_a_side_lane() -> None:
    graph = _graph([None, 0, 1, 2], heads=[2], compactions={3})
    layout = layout_graph(graph)
    lanes = {row.node.id: row.lane for row in layout.rows}
    assert lanes["n3"] != lanes["n2"]
    assert 'class="node compaction' in render_svg(layout, chat_id="c")


# --- the app over a real store ------------------------------------------------------------


@pytest.fixture
def client(store_url: str) -> Any:
    asyncio.run(seed(store_url))
    with TestClient(create_app(store_url), base_url="http://localhost") as test_client:
        yield test_client, store_url


def test_every_response_carries_the_security_headers(client: Any) -> None:
    c, _ = client
    assert "unsafe-inline" not in CSP and "unsafe-eval" not in CSP
    for path in [*ROUTES, "/chat?id=nope", "/chat", "/static/viewer.js", "/static/nope"]:
        response = c.get(path)
        assert response.headers["content-security-policy"] == CSP, path
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["x-frame-options"] == "DENY"
    assert c.get("/chat?id=nope").status_code == 404
    assert c.get("/chat").status_code == 400
    assert c.get("/?page=zero").status_code == 400


def test_pages_are_well_formed_and_show_hostile_text_as_text(client: Any) -> None:
    c, _ = client
    paths = [
        *ROUTES,
        f"/chat?id={HOSTILE}",
        f"/branch?chat={HOSTILE}&name=main",
        f"/records?chat={HOSTILE}",
        f"/?user={USER}&q=pwned",
    ]
    for path in paths:
        response = c.get(path)
        assert response.status_code == 200, path
        check_markup(response.text)
    body = c.get(f"/branch?chat={HOSTILE}&name=main").text
    assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in body
    assert "<script>window" not in body


def test_no_route_writes(client: Any) -> None:
    c, url = client

    async def state() -> Any:
        async with SqlContextStore(url) as store:
            return (await store.export_chat(CHAT)).model_dump(), len(await store.list_chats())

    before = asyncio.run(state())
    for path in [*ROUTES, "/static/viewer.js"]:
        for method in ("POST", "PUT", "PATCH", "DELETE"):
            assert c.request(method, path).status_code == 405, (method, path)
    assert asyncio.run(state()) == before


def test_user_restriction_in_the_app(store_url: str) -> None:
    asyncio.run(seed(store_url))
    with TestClient(create_app(store_url, user=USER), base_url="http://localhost") as c:
        assert SECRET not in c.get("/").text
        assert SECRET not in c.get("/?user=mallory&q=secret").text
        assert c.get(f"/chat?id={SECRET}").status_code == 404
        assert c.get(f"/message?chat={CHAT}&id=s-u0").status_code == 404
        assert c.get(f"/chat?id={CHAT}").status_code == 200


def test_record_and_branch_lookups_are_scoped_to_the_chat(client: Any) -> None:
    c, _ = client
    records = re.findall(
        r"record\?chat=hostile&amp;id=([0-9a-f]+)", c.get(f"/records?chat={HOSTILE}").text
    )
    assert len(records) == 1
    assert c.get(f"/record?chat={HOSTILE}&id={records[0]}").status_code == 200
    assert c.get(f"/record?chat={CHAT}&id={records[0]}").status_code == 404
    assert c.get(f"/branch?chat={CHAT}&name=nope").status_code == 404
    assert c.get(f"/message?chat={HOSTILE}&id=m-u1").status_code == 404


def test_paging_and_metadata_filter(store_url: str) -> None:
    async def many() -> None:
        async with SqlContextStore(store_url) as store:
            for i in range(55):
                await store.create_chat(
                    f"c{i:02d}", user_id="u", metadata={"team": "red" if i % 2 else "blue", "n": i}
                )

    asyncio.run(many())
    with TestClient(create_app(store_url), base_url="http://localhost") as c:
        first = c.get("/?user=u").text
        assert first.count('href="/chat?id=c') == 50 and 'rel="next"' in first
        second = c.get("/?user=u&page=2").text
        assert second.count('href="/chat?id=c') == 5 and 'rel="prev"' in second
        red = c.get("/?meta=team%3Dred").text
        assert red.count('href="/chat?id=c') == 27
        assert c.get("/?meta=n%3D3").text.count('href="/chat?id=c') == 1
        assert c.get("/?meta=nonsense").status_code == 400
        for digits in (20, 4300, 4301, 5000):  # (int() of 4 301 digits raised: a 500 page)
            huge = c.get("/?meta=n%3D" + "9" * digits)
            assert huge.status_code == 400 and "64 bits" in huge.text
        assert "enter a user" in c.get("/?q=hello").text


def test_static_files_are_the_packaged_ones(client: Any) -> None:
    c, _ = client
    js = c.get("/static/viewer.js")
    assert js.headers["content-type"].startswith("text/javascript")
    assert "fetch(" in js.text and "eval(" not in js.text
    css = c.get("/static/viewer.css")
    assert css.headers["content-type"].startswith("text/css")
    assert "@import" not in css.text and "url(" not in css.text


QUERY_VALUES = st.one_of(
    st.text(max_size=20),
    st.sampled_from([CHAT, HOSTILE, SECRET, "m-u1", "main", "0", "-1", "99999999999999999999"]),
)


def test_any_query_string_gets_a_page_not_a_crash(tmp_path: Any) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'fuzz.db'}"
    asyncio.run(seed(url))
    paths = ["/", "/chat", "/graph", "/message", "/branch", "/snapshots", "/records", "/record"]
    names = ["id", "chat", "name", "m", "open", "page", "q", "user", "meta", "fragment"]
    with TestClient(
        create_app(url, user=USER), base_url="http://localhost", raise_server_exceptions=True
    ) as c:

        @given(
            path=st.sampled_from(paths),
            params=st.lists(st.tuples(st.sampled_from(names), QUERY_VALUES), max_size=5),
        )
        @settings(max_examples=120, deadline=None)
        def check(path: str, params: list[tuple[str, str]]) -> None:
            response = c.get(path, params=params)
            assert response.status_code in (200, 400, 404), (path, params, response.text[-500:])
            assert response.headers["content-security-policy"] == CSP
            if response.status_code == 200 and path != "/graph":
                check_markup(response.text)
            # Nothing of the other user's chat is ever shown: no link to it, none of its text.
            assert f"id={SECRET}" not in response.text.replace("&amp;", "&").split("<main>")[-1]
            assert "the other user" not in response.text

        check()


def test_reminders_the_original_package_recorded_are_marked() -> None:
    before = "weather 🌦 today"
    inserted = "<system-reminder>be brief</system-reminder>"
    start = len(before.encode("utf-16-le")) // 2  # JavaScript offsets count UTF-16 units
    end = start + len(inserted)
    record = {"id": "r", "text": "be brief", "target": "user", "mode": "inline"}
    meta = {"reminders": [{**record, "partIndex": 0, "start": start, "end": end}]}
    assert reminder_ranges(meta, 0, before + inserted) == [(len(before), len(before + inserted))]


def test_a_tool_call_reads_as_a_call_and_a_failure_is_marked() -> None:
    ok = ToolPart(
        tool_call_id="c1",
        tool_name="get_weather",
        input={"city": "Paris"},
        state="output-available",
        output="sunny",
    )
    failed = ok.model_copy(update={"state": "output-error", "output": None, "error": "timeout"})
    html = message_body(Message(id="a", role="assistant", parts=[ok, failed]))
    assert "tool get_weather({&quot;city&quot;: &quot;Paris&quot;}) → sunny" in html
    assert '<p class="tool-call failed"><code>tool get_weather(' in html
    assert '✗ timeout</code> <span class="tag failed">failed</span>' in html
    check_markup(html)
