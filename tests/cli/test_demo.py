"""``agentcontext demo``: the README's main job, offline, on its own SQLite file."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest

from agentcontext import SqlContextStore
from tests.cli.helpers import ANSI, run_cli, run_cli_subprocess, sqlite_url
from tests.conftest import fresh_database

FORMATS = ("XML", "Markdown", "TOML", "TOON")


def _section(stdout: str, title: str) -> str:
    """The text between the heading ``== title ==`` and the next heading."""
    start = stdout.index(f"== {title}")
    body = stdout[stdout.index("\n", start) + 1 :]
    end = body.find("\n== ")
    return body if end < 0 else body[:end]


async def _stored(url: str) -> tuple[int, list[str], list[str], str | None, str]:
    async with SqlContextStore(url) as store:
        [info] = [c for c in await store.list_chats() if c.id == "demo"]
        branches = await store.list_branches("demo")
        checkpoints = await store.list_checkpoints("demo")
        active = await store.get_active_branch("demo")
        assert active is not None
        return (
            info.message_count,
            sorted(b.name for b in branches),
            [c.name for c in checkpoints],
            info.title,
            active.name,
        )


def test_demo_prints_tree_formats_and_estimate(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run_cli_subprocess("demo", cwd=tmp_path)  # the real entry point, in a process
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert elapsed < 15, f"demo took {elapsed:.1f}s"
    out = result.stdout
    assert ANSI not in out

    # The graph: every branch the demo made, the active one starred, the checkpoint.
    tree = _section(out, "Conversation graph")
    assert tree.startswith("[chat: demo]")
    assert "<- [main]" in tree
    assert "<- [main-v2]" in tree
    assert "<- [main-v3 *]" in tree
    assert "<- [main-v4]" in tree
    assert "{address-asked}" in tree
    assert tree.count("(user)") == 6 and tree.count("(assistant)") == 6

    # The system prompt in the four formats, each with a token count.
    tokens = {}
    for name in FORMATS:
        match = re.search(rf"== System prompt as {name} \((\d+) tokens\) ==", out)
        assert match, f"no {name} section"
        tokens[name] = int(match.group(1))
        assert tokens[name] > 100
    xml = _section(out, "System prompt as XML")
    assert "<guardrail>" in xml and "<workflow>" in xml and "<persona>" in xml
    assert "&apos;" not in xml and "customer's" in xml  # quotes reach the model as written
    # The other formats: their first lines only, so the prompt is not printed four times.
    for name in FORMATS[1:]:
        excerpt = _section(out, f"System prompt as {name}").strip().splitlines()
        assert len(excerpt) <= 9 and excerpt[-1].startswith("… ")
    assert _section(out, "System prompt as Markdown").startswith("## ")
    assert tokens["TOON"] < tokens["XML"]
    assert len(out.splitlines()) < 150

    # It ends by pointing at the viewer and the documentation.
    ending = out.strip().splitlines()
    assert ending[-3].endswith(" serve") and "agentcontext-demo.db" in ending[-3]
    assert ending[-1].startswith("Documentation: https://")

    # The estimate for a known model, offline.
    size = _section(out, "Prompt size per format for gpt-4o")
    assert [line.split("\t")[0] for line in size.strip().splitlines()] == ["format", *FORMATS]
    estimate = _section(out, "Estimate for gpt-4o")
    assert "model: gpt-4o (openai)" in estimate
    assert re.search(r"^input tokens: \d+$", estimate, re.M)
    assert re.search(r"^input cost: \$\d+\.\d{6} at \$\d+\.\d\d/Mtok", estimate, re.M)
    assert "context window: 128,000 (fits)" in estimate


def test_demo_uses_its_own_file_and_recreates_the_chat(tmp_path: Path) -> None:
    for _ in range(2):
        result = run_cli("demo", cwd=tmp_path, env={"AGENTCONTEXT_URL": "nonsense://"})
        assert result.returncode == 0, result.stderr
    assert (tmp_path / "agentcontext-demo.db").is_file()
    assert not (tmp_path / "agentcontext.db").exists()
    count, branches, checkpoints, title, active = asyncio.run(
        _stored(sqlite_url(tmp_path / "agentcontext-demo.db"))
    )
    # A second run starts over instead of piling up branches.
    assert count == 12
    assert branches == ["main", "main-v2", "main-v3", "main-v4"]
    assert checkpoints == ["address-asked"]
    assert title == "Order #1042: address change"
    assert active == "main-v3"


@pytest.mark.parametrize("server", ["postgres", "mariadb"])
def test_demo_on_a_server_with_url(tmp_path: Path, server: str) -> None:
    with fresh_database(server, "accli") as url:
        result = run_cli("--url", url, "demo", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "<- [main-v3 *]" in result.stdout
        assert not (tmp_path / "agentcontext-demo.db").exists()
        count, branches, *_ = asyncio.run(_stored(url))
        assert count == 12 and len(branches) == 4
