"""``chats``, ``show``, ``search`` and ``mermaid`` on data built with the Python API."""

from __future__ import annotations

import asyncio
import base64
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentcontext import ContextEngine, SqlContextStore, graph_to_mermaid, visualize_graph
from tests.cli.helpers import build_branched_chat, one_error_line, run_cli, save_turns, tsv
from tests.conftest import fresh_database


async def _seed_chats(url: str) -> None:
    """alice: c1..c5 (c5 newest), with metadata; bob: b1."""
    async with SqlContextStore(url) as store:
        for i in range(1, 6):
            context = ContextEngine(
                store=store,
                chat_id=f"c{i}",
                user_id="alice",
                metadata={"team": "red" if i % 2 else "blue", "n": i, "vip": i >= 4},
            )
            await save_turns(context, [(f"question {i}", f"answer {i}")] * i, prefix=f"c{i}-")
            await context.update_chat(title=f"Chat number {i}")
        await store.create_chat("b1", user_id="bob", metadata={"team": "red", "n": 3})


@pytest.fixture(params=["sqlite", "postgres", "mariadb"])
def seeded(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'chats.db'}"
        asyncio.run(_seed_chats(url))
        yield url
    else:
        with fresh_database(request.param, "accli") as url:
            asyncio.run(_seed_chats(url))
            yield url


def _ids(url: str, tmp_path: Path, *args: str) -> list[str]:
    result = run_cli("--url", url, "chats", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return [row["id"] for row in tsv(result.stdout)]


def test_chats_table_filters_and_pages(seeded: str, tmp_path: Path) -> None:
    result = run_cli("--url", seeded, "chats", "--user", "alice", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = tsv(result.stdout)
    assert list(rows[0]) == ["id", "title", "messages", "branches", "last activity"]
    assert [row["id"] for row in rows] == ["c5", "c4", "c3", "c2", "c1"]
    assert rows[0]["title"] == "Chat number 5"
    assert rows[0]["messages"] == "10" and rows[4]["messages"] == "2"
    assert {row["branches"] for row in rows} == {"1"}
    assert rows[0]["last activity"] > rows[1]["last activity"]  # ISO-8601, UTC

    assert _ids(seeded, tmp_path, "--user", "alice", "--limit", "2") == ["c5", "c4"]
    assert _ids(seeded, tmp_path, "--user", "alice", "--limit", "2", "--offset", "1") == [
        "c4",
        "c3",
    ]
    assert _ids(seeded, tmp_path, "--user", "alice", "--offset", "4") == ["c1"]
    assert _ids(seeded, tmp_path, "--user", "alice", "--offset", "9") == []
    # Values that look like ints and bools are matched as such; quotes keep a string.
    assert _ids(seeded, tmp_path, "--user", "alice", "--meta", "n=3") == ["c3"]
    assert _ids(seeded, tmp_path, "--user", "alice", "--meta", 'n="3"') == []
    assert _ids(seeded, tmp_path, "--user", "alice", "--meta", "vip=true") == ["c5", "c4"]
    assert _ids(seeded, tmp_path, "--user", "alice", "--meta", "vip=FALSE") == ["c3", "c2", "c1"]
    assert _ids(
        seeded, tmp_path, "--user", "alice", "--meta", "team=red", "--meta", "vip=true"
    ) == ["c5"]
    assert _ids(seeded, tmp_path, "--user", "nobody") == []

    # Without --user: every chat, with a user column.
    result = run_cli("--url", seeded, "chats", "--meta", "n=3", cwd=tmp_path)
    rows = tsv(result.stdout)
    assert {(row["id"], row["user"]) for row in rows} == {("c3", "alice"), ("b1", "bob")}


@pytest.mark.parametrize("args", [["--meta", "novalue"], ["--limit", "-1"], ["--offset", "x"]])
def test_chats_usage_errors(tmp_path: Path, args: list[str]) -> None:
    result = run_cli("chats", *args, cwd=tmp_path)
    assert result.returncode == 2
    assert "usage: agentcontext chats" in result.stderr


async def _graph_text(url: str, chat_id: str) -> tuple[str, str]:
    async with SqlContextStore(url) as store:
        graph = await store.get_graph(chat_id)
    return visualize_graph(graph), graph_to_mermaid(graph)


def test_show_tree_branches_and_checkpoints(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'show.db'}"
    asyncio.run(build_branched_chat(url))
    result = run_cli("--url", url, "show", "trip", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.splitlines()[0] == (
        "chat trip · user alice · Trip planning · 6 messages · 2 branches · 1 checkpoint"
    )
    tree, _ = asyncio.run(_graph_text(url, "trip"))
    assert tree in out
    assert "<- [main-v2 *]" in tree and "{planned}" in tree

    branches = tsv(out.split("== Branches ==")[1].split("== Checkpoints ==")[0])
    assert [(b["branch"], b["active"], b["head"], b["messages"]) for b in branches] == [
        ("main", "", "trip-a1", "4"),
        ("main-v2", "*", "trip-pa0", "4"),
    ]
    [checkpoint] = tsv(out.split("== Checkpoints ==")[1])
    assert (checkpoint["checkpoint"], checkpoint["message"]) == ("planned", "trip-a1")


def test_mermaid_prints_the_flowchart(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'm.db'}"
    asyncio.run(build_branched_chat(url))
    result = run_cli("--url", url, "mermaid", "trip", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    _, mermaid = asyncio.run(_graph_text(url, "trip"))
    assert result.stdout == mermaid + "\n"
    assert result.stdout.startswith("flowchart TD")


@pytest.mark.parametrize("command", ["show", "mermaid", "export"])
def test_unknown_chat_is_not_found(tmp_path: Path, command: str) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"
    asyncio.run(build_branched_chat(url))
    result = run_cli("--url", url, command, "no-such-chat", cwd=tmp_path)
    assert result.returncode == 3
    assert result.stdout == ""
    assert one_error_line(result) == "error: chat 'no-such-chat' does not exist"


async def _seed_search(url: str) -> None:
    async with SqlContextStore(url) as store:
        await build_branched_chat(url, "trip", "alice")
        context = ContextEngine(store=store, chat_id="work", user_id="alice")
        await save_turns(
            context,
            [("Summarise the Lisbon office budget", "The Lisbon office spends 40% on rent.")],
            prefix="work-",
        )
        other = ContextEngine(store=store, chat_id="bobs", user_id="bob")
        await save_turns(other, [("Lisbon or Madrid?", "Lisbon.")], prefix="bob-")


@pytest.fixture(params=["sqlite", "postgres", "mariadb"])
def search_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'search.db'}"
        asyncio.run(_seed_search(url))
        yield url
    else:
        with fresh_database(request.param, "accli") as url:
            asyncio.run(_seed_search(url))
            yield url


def _hits(url: str, tmp_path: Path, *args: str) -> list[dict[str, str]]:
    result = run_cli("--url", url, "search", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return tsv(result.stdout)


def test_search_one_chat_roles_limit_and_user(search_url: str, tmp_path: Path) -> None:
    hits = _hits(search_url, tmp_path, "trip", "Lisbon")
    assert [hit["message"] for hit in hits] == ["trip-u0"]
    assert hits[0]["snippet"] == "Plan a trip to <mark>Lisbon</mark>"
    assert hits[0]["chat"] == "trip" and hits[0]["role"] == "user"
    assert float(hits[0]["rank"]) > 0

    # Every branch is searched; results come best first.
    hits = _hits(search_url, tmp_path, "trip", "tour")
    assert {hit["message"] for hit in hits} == {"trip-u1", "trip-a1"}
    ranks = [float(hit["rank"]) for hit in hits]
    assert ranks == sorted(ranks, reverse=True)
    assert [h["message"] for h in _hits(search_url, tmp_path, "trip", "tour", "--limit", "1")] == [
        hits[0]["message"]
    ]
    hits = _hits(search_url, tmp_path, "trip", "tour", "--role", "assistant")
    assert [hit["message"] for hit in hits] == ["trip-a1"]
    hits = _hits(search_url, tmp_path, "trip", "tour", "--role", "assistant", "--role", "user")
    assert len(hits) == 2
    assert _hits(search_url, tmp_path, "trip", "Madrid") == []

    # All of a user's chats: each hit names its chat; other users' chats are left out.
    hits = _hits(search_url, tmp_path, "--user", "alice", "Lisbon")
    assert sorted((hit["chat"], hit["message"]) for hit in hits) == [
        ("trip", "trip-u0"),
        ("work", "work-a0"),
        ("work", "work-u0"),
    ]
    hits = _hits(search_url, tmp_path, "--user", "alice", "Lisbon", "--role", "assistant")
    assert [(hit["chat"], hit["message"]) for hit in hits] == [("work", "work-a0")]
    # A chat and a user: the chat must be that user's.
    assert [h["message"] for h in _hits(search_url, tmp_path, "--user", "bob", "bobs", "Lisbon")]
    result = run_cli("--url", search_url, "search", "--user", "bob", "trip", "Lisbon", cwd=tmp_path)
    assert result.returncode == 3
    assert one_error_line(result) == "error: user 'bob' has no chat 'trip'"
    # Plain text never raises a syntax error.
    assert _hits(search_url, tmp_path, "trip", 'AND "(" OR -*') == []


def test_search_usage_errors(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 's.db'}"
    asyncio.run(build_branched_chat(url))
    result = run_cli("--url", url, "search", "Lisbon", cwd=tmp_path)
    assert result.returncode == 2
    assert "--user" in one_error_line(result)
    result = run_cli("--url", url, "search", "trip", "Lisbon", "--role", "robot", cwd=tmp_path)
    assert result.returncode == 2
    assert "invalid choice: 'robot'" in result.stderr
    result = run_cli("--url", url, "search", "nope", "Lisbon", cwd=tmp_path)
    assert result.returncode == 3
    assert one_error_line(result) == "error: chat 'nope' does not exist"


def test_chats_shows_a_page_and_says_how_to_see_more(tmp_path: Path) -> None:
    """`agentcontext chats` lists 50 chats unless told otherwise, and says (on standard error
    when piped) the command that shows the next ones; --all lists every chat."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'many.db'}"

    async def seed() -> None:
        async with SqlContextStore(url) as store:
            for i in range(57):
                await store.create_chat(f"c{i:02d}", user_id="u")

    asyncio.run(seed())
    first = run_cli("--url", url, "chats", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert len(tsv(first.stdout)) == 50
    hint = next(line for line in first.stderr.splitlines() if line.startswith("More chats:"))
    cursor = hint.split("--after ", 1)[1].split()[0]
    rest = run_cli("--url", url, "chats", "--after", cursor, cwd=tmp_path)
    assert [row["id"] for row in tsv(rest.stdout)] == [f"c{i:02d}" for i in range(6, -1, -1)]
    assert "More chats" not in rest.stderr
    everything = run_cli("--url", url, "chats", "--all", cwd=tmp_path)
    assert len(tsv(everything.stdout)) == 57 and "More chats" not in everything.stderr
    bad = run_cli("--url", url, "chats", "--after", "nonsense", cwd=tmp_path)
    assert bad.returncode == 2 and "cursor" in bad.stderr


def test_chats_refuses_a_limit_of_0_and_a_crafted_cursor(tmp_path: Path) -> None:
    """`--limit 0` is a usage error like every other limit of 0 (`search --limit`), and a
    cursor no chat can have is refused like any malformed one: exit 2, no traceback."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'one.db'}"

    async def seed() -> None:
        async with SqlContextStore(url) as store:
            await store.create_chat("c1", user_id="u")

    asyncio.run(seed())
    result = run_cli("--url", url, "chats", "--limit", "0", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "argument --limit: must be 1 or more, got 0" in result.stderr
    assert "Traceback" not in result.stderr
    crafted = base64.urlsafe_b64encode(b"0001-01-01T00:00:00+14:00\nc1").decode()
    result = run_cli("--url", url, "chats", "--after", crafted, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "is not a cursor of list_chats" in one_error_line(result)


def test_a_suggested_command_never_shows_a_url_with_its_password_masked() -> None:
    """The hint of ``chats`` repeats ``--url``: a URL with a password became one with '***'
    for it, a command line that could not run as printed."""
    from agentcontext.cli._common import Env

    secret = Env("mysql+asyncmy://user:s3cret@db:3306/app", True, None)  # type: ignore[arg-type]
    shown = secret.command("chats", "--after", "X")
    assert "s3cret" not in shown and "***" not in shown
    assert shown == "agentcontext --url <the same URL> chats --after X"
    plain = Env("sqlite+aiosqlite:///data.db", True, None)  # type: ignore[arg-type]
    assert plain.command("chats") == "agentcontext --url sqlite+aiosqlite:///data.db chats"
    spaced = Env("sqlite+aiosqlite:///my data.db", True, None)  # type: ignore[arg-type]
    assert shlex.split(spaced.command("delete", "abc ")) == [
        "agentcontext", "--url", "sqlite+aiosqlite:///my data.db", "delete", "abc ",
    ]  # fmt: skip
