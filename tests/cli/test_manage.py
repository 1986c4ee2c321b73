"""`delete`, `branches`, `prune`, `show --branch/--full`, `--json`, `import --as`, malformed
exports, files left behind, and the demo's way back in: run in-process through `main(argv)`."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import update

from agentcontext import (
    ContextEngine,
    Message,
    MessageRecord,
    SqlContextStore,
    TextPart,
    ToolPart,
    assistant,
    user,
)
from agentcontext.cli._retention import parse_duration
from agentcontext.cli._transcript import mark_reminders
from agentcontext.store._db.schema import chats as C
from tests.cli.helpers import (
    build_branched_chat,
    one_error_line,
    run_cli,
    run_cli_subprocess,
    sqlite_url,
    tsv,
)

REMINDER = "<system-reminder>Be brief.</system-reminder>"


async def _chat_with_tools_reminder_and_compaction(url: str) -> None:
    """Chat `tools`: a tool call, a user text with a reminder inserted, a compaction node."""
    async with SqlContextStore(url) as store:
        context = ContextEngine(store=store, chat_id="tools", user_id="bob")
        question = "What is the weather in Porto? " + REMINDER
        start = question.index(REMINDER)
        context.set(
            user(
                Message(
                    id="t-u0",
                    role="user",
                    parts=[TextPart(text=question)],
                    metadata={"reminders": [{"start": start, "end": len(question), "part": 0}]},
                )
            ),
            assistant(
                Message(
                    id="t-a0",
                    role="assistant",
                    parts=[
                        ToolPart(
                            tool_call_id="call-7",
                            tool_name="weather",
                            input={"city": "Porto"},
                            state="output-available",
                            output={"sky": "clear"},
                        ),
                        ToolPart(
                            tool_call_id="call-8",
                            tool_name="weather",
                            input={"city": "Oslo"},
                            state="output-error",
                            error="timeout",
                        ),
                        TextPart(text="Clear skies. " + "Long answer. " * 20 + "THE-END"),
                    ],
                )
            ),
        )
        await context.save()
        await store.add_message(
            MessageRecord(
                id="t-c0",
                chat_id="tools",
                parent_id="t-a0",
                name="user",
                type="compaction",
                data={
                    "id": "t-c0",
                    "role": "user",
                    "parts": [{"type": "text", "text": "Summary: the user asked about Porto."}],
                },
            )
        )


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = sqlite_url(tmp_path / "db.sqlite")
    asyncio.run(build_branched_chat(url, "trip", "alice"))
    asyncio.run(build_branched_chat(url, "work", "carol"))
    asyncio.run(_chat_with_tools_reminder_and_compaction(url))
    return url


# --- branches and show --------------------------------------------------------------------


def test_branches_table_and_json(url: str, tmp_path: Path) -> None:
    result = run_cli("--url", url, "branches", "trip", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = tsv(result.stdout)
    assert [(r["branch"], r["active"], r["head"], r["messages"]) for r in rows] == [
        ("main", "", "trip-a1", "4"),
        ("main-v2", "*", "trip-pa0", "4"),
    ]
    data = json.loads(run_cli("--url", url, "branches", "trip", "--json", cwd=tmp_path).stdout)
    assert [b["name"] for b in data] == ["main", "main-v2"]
    assert all(len(b["id"]) == 32 and b["chat_id"] == "trip" for b in data)
    missing = run_cli("--url", url, "branches", "nope", cwd=tmp_path)
    assert missing.returncode == 3
    assert "nope" in one_error_line(missing)


def test_show_branch_transcript_short_and_full(url: str, tmp_path: Path) -> None:
    result = run_cli("--url", url, "show", "trip", "--branch", "main", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "chat trip · user alice · branch main · 4 messages"
    headers = [line for line in lines if line.startswith("[")]
    assert [h.split(" · ")[0] for h in headers] == [
        "[1] trip-u0",
        "[2] trip-a0",
        "[3] trip-u1",
        "[4] trip-a1",
    ]
    assert "Add a food tour" in result.stdout
    assert "Make it Porto" not in result.stdout  # another branch

    short = run_cli("--url", url, "show", "tools", "--branch", "main", cwd=tmp_path).stdout
    full = run_cli("--url", url, "show", "tools", "--full", cwd=tmp_path).stdout
    assert "THE-END" not in short and "…" in short
    assert "THE-END" in full
    for text in (short, full):
        assert 'tool weather({"city": "Porto"}) → {"sky": "clear"}  (call-7)' in text
        assert 'tool weather({"city": "Oslo"}) ✗ timeout  [failed]  (call-8)' in text
    # The reminder's text is marked, the user's own text is not.
    assert f"What is the weather in Porto? [reminder]{REMINDER}[/reminder]" in full
    # The compaction summary comes after the message it folds up to.
    assert "--- compaction t-c0 · summary of the messages up to t-a0" in full
    assert full.index("THE-END") < full.index("--- compaction") < full.index("Summary: the user")


def test_show_unknown_branch_lists_the_branches(url: str, tmp_path: Path) -> None:
    result = run_cli("--url", url, "show", "trip", "--branch", "nope", cwd=tmp_path)
    assert result.returncode == 3
    assert one_error_line(result) == (
        "error: chat 'trip' has no branch 'nope' (branches: main, main-v2)"
    )


def test_json_output_has_full_ids(url: str, tmp_path: Path) -> None:
    chats = json.loads(run_cli("--url", url, "chats", "--json", cwd=tmp_path).stdout)
    assert {c["id"] for c in chats} == {"trip", "work", "tools"}
    trip = next(c for c in chats if c["id"] == "trip")
    assert trip["message_count"] == 6 and trip["branch_count"] == 2 and trip["user_id"] == "alice"

    graph = json.loads(run_cli("--url", url, "show", "trip", "--json", cwd=tmp_path).stdout)
    assert graph["chat"]["title"] == "Trip planning"
    assert {n["id"] for n in graph["nodes"]} >= {"trip-u0", "trip-pa0"}
    assert [c["name"] for c in graph["checkpoints"]] == ["planned"]

    transcript = json.loads(
        run_cli("--url", url, "show", "tools", "--full", "--json", cwd=tmp_path).stdout
    )
    assert [m["id"] for m in transcript["messages"]] == ["t-u0", "t-a0", "t-c0"]
    assert transcript["messages"][2]["type"] == "compaction"
    assert transcript["branch"]["is_active"] is True

    hits = json.loads(
        run_cli("--url", url, "search", "--user", "alice", "Porto", "--json", cwd=tmp_path).stdout
    )
    assert {(h["chat_id"], h["message"]["id"]) for h in hits} == {
        ("trip", "trip-pu0"),
        ("trip", "trip-pa0"),
    }
    assert all("<mark>Porto</mark>" in hit["snippet"] for hit in hits)


# --- delete and prune ---------------------------------------------------------------------


def test_delete(url: str, tmp_path: Path) -> None:
    other_user = run_cli("--url", url, "delete", "trip", "--user", "carol", cwd=tmp_path)
    assert other_user.returncode == 3
    assert one_error_line(other_user) == "error: user 'carol' has no chat 'trip'"
    done = run_cli("--url", url, "delete", "trip", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "deleted chat trip (user alice)\n"
    again = run_cli("--url", url, "delete", "trip", cwd=tmp_path)
    assert again.returncode == 3
    left = tsv(run_cli("--url", url, "chats", cwd=tmp_path).stdout)
    assert {row["id"] for row in left} == {"work", "tools"}


def test_delete_never_creates_a_database(tmp_path: Path) -> None:
    result = run_cli("delete", "x", cwd=tmp_path)
    assert result.returncode == 4
    assert not (tmp_path / "agentcontext.db").exists()


async def _age(url: str, chat_id: str, days: int) -> None:
    """Move a chat's last activity `days` into the past (as if nobody wrote since)."""
    async with SqlContextStore(url) as store, store.engine.begin() as conn:
        chat = await store.get_chat(chat_id)
        assert chat is not None
        await conn.execute(
            update(C)
            .where(C.c.id == chat_id)
            .values(updated_at=chat.updated_at - timedelta(days=days))
        )


def test_prune_dry_run_user_and_delete(url: str, tmp_path: Path) -> None:
    asyncio.run(_age(url, "trip", 100))
    asyncio.run(_age(url, "work", 100))
    dry = run_cli("--url", url, "prune", "--older-than", "90d", "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    first, *table = dry.stdout.splitlines()
    assert first.startswith("would delete 2 chats with no activity since ")
    assert {row["id"] for row in tsv("\n".join(table))} == {"trip", "work"}
    assert len(tsv(run_cli("--url", url, "chats", cwd=tmp_path).stdout)) == 3  # nothing gone

    only = run_cli(
        "--url", url, "prune", "--older-than", "90d", "--user", "alice", "--json", cwd=tmp_path
    )
    report = json.loads(only.stdout)
    assert report["dry_run"] is False
    assert [c["id"] for c in report["chats"]] == ["trip"]
    assert report["deleted"]["chats"] == 1 and report["deleted"]["messages"] >= 1  # (a receipt)
    assert report["pruned_at"]
    too_long = run_cli(
        "--url", url, "prune", "--older-than", "999999d", "--dry-run", cwd=tmp_path
    )  # (the same refusal as without --dry-run, never a traceback)
    assert too_long.returncode == 2 and "reaches before year 1" in too_long.stderr
    assert "Traceback" not in too_long.stderr
    remaining = {row["id"] for row in tsv(run_cli("--url", url, "chats", cwd=tmp_path).stdout)}
    assert remaining == {"work", "tools"}

    nothing = run_cli("--url", url, "prune", "--older-than", "200d", cwd=tmp_path)
    assert nothing.stdout.startswith("deleted 0 chats")
    rest = run_cli("--url", url, "prune", "--older-than", "1w", cwd=tmp_path)
    assert rest.stdout.startswith("deleted 1 chat ")
    remaining = {row["id"] for row in tsv(run_cli("--url", url, "chats", cwd=tmp_path).stdout)}
    assert remaining == {"tools"}


@pytest.mark.parametrize("bad", ["", "90", "d", "0d", "-1d", "1.5d", "1y", "90 d", "1d-2h"])
def test_prune_refuses_bad_durations(bad: str, tmp_path: Path) -> None:
    result = run_cli("prune", "--older-than", bad, cwd=tmp_path)
    assert result.returncode == 2
    assert "--older-than" in result.stderr


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from("smhdw")), min_size=1))
def test_durations_add_up(parts: list[tuple[int, str]]) -> None:
    seconds = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    text = "".join(f"{n}{unit}" for n, unit in parts)
    total = sum(n * seconds[unit] for n, unit in parts)
    if total == 0:
        with pytest.raises(Exception, match="more than 0"):
            parse_duration(text)
    else:
        assert parse_duration(text) == timedelta(seconds=total)


@given(st.text(max_size=60), st.lists(st.tuples(st.integers(-5, 70), st.integers(-5, 70))))
def test_reminder_marks_keep_the_text(text: str, ranges: list[tuple[int, int]]) -> None:
    marked = mark_reminders(text, ranges)
    assert marked.replace("[reminder]", "").replace("[/reminder]", "") == text.replace(
        "[reminder]", ""
    ).replace("[/reminder]", "")
    assert marked.count("[reminder]") - text.count("[reminder]") == marked.count(
        "[/reminder]"
    ) - text.count("[/reminder]")


# --- import --as and malformed exports ----------------------------------------------------


def test_import_as_a_copy_beside_the_original(url: str, tmp_path: Path) -> None:
    exported = run_cli("--url", url, "export", "trip", "-o", "trip.json", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    taken = run_cli("--url", url, "import", "trip.json", cwd=tmp_path)
    assert taken.returncode == 1
    message = one_error_line(taken)
    assert "--as NEW_ID" in message and "delete trip" in message

    copy = run_cli("--url", url, "import", "trip.json", "--as", "trip-copy", cwd=tmp_path)
    assert copy.returncode == 0, copy.stderr
    original = json.loads(run_cli("--url", url, "show", "trip", "--json", cwd=tmp_path).stdout)
    copied = json.loads(run_cli("--url", url, "show", "trip-copy", "--json", cwd=tmp_path).stdout)
    assert copied["chat"]["user_id"] == "alice" and copied["chat"]["title"] == "Trip planning"
    assert {n["id"] + "@trip-copy" for n in original["nodes"]} == {n["id"] for n in copied["nodes"]}
    assert [(b["name"], b["is_active"], b["message_count"]) for b in copied["branches"]] == [
        (b["name"], b["is_active"], b["message_count"]) for b in original["branches"]
    ]
    assert [c["message_id"] for c in copied["checkpoints"]] == ["trip-a1@trip-copy"]
    full = run_cli("--url", url, "show", "trip-copy", "--full", cwd=tmp_path).stdout
    assert "[3] trip-pu0@trip-copy · user" in full and "Make it Porto instead" in full
    # The original is untouched, and the copy exports to the same texts.
    assert json.loads(run_cli("--url", url, "show", "trip", "--json", cwd=tmp_path).stdout) == (
        original
    )


@pytest.mark.parametrize(
    ("new_id", "message"), [("", "must not be empty"), ("x" * 256, "the limit is 255")]
)
def test_import_as_refuses_a_bad_id(url: str, tmp_path: Path, new_id: str, message: str) -> None:
    run_cli("--url", url, "export", "trip", "-o", "trip.json", cwd=tmp_path)
    result = run_cli("--url", url, "import", "trip.json", "--as", new_id, cwd=tmp_path)
    assert result.returncode == 2
    line = one_error_line(result)
    assert "the chat id of --as" in line and message in line


def _export_text(url: str, tmp_path: Path) -> str:
    return run_cli("--url", url, "export", "trip", cwd=tmp_path).stdout


@pytest.mark.parametrize(
    ("change", "code", "message"),
    [
        (lambda d: d["branches"][0].update(head_message_id="zzz"), 2, "points at a missing"),
        (lambda d: [b.update(is_active=True) for b in d["branches"]], 2, "exactly one active"),
        (lambda d: d["messages"][0].update(chat_id="other"), 2, "is not in chat"),
        (lambda d: d["checkpoints"][0].update(message_id="zzz"), 2, "is not a valid chat export"),
        (lambda d: d["chat"].update(id=""), 2, "is not a valid chat export"),
        (lambda d: d.pop("messages"), 2, "first at messages: Field required"),
        (lambda d: d.update(format="x/1"), 2, "not an agentcontext chat export"),
    ],
)
def test_malformed_exports_exit_2_name_the_file_and_create_nothing(
    url: str, tmp_path: Path, change: object, code: int, message: str
) -> None:
    data = json.loads(_export_text(url, tmp_path))
    change(data)  # type: ignore[operator]
    (tmp_path / "bad.json").write_text(json.dumps(data), encoding="utf-8")
    target = tmp_path / "fresh.db"
    result = run_cli("--url", sqlite_url(target), "import", "bad.json", cwd=tmp_path)
    assert result.returncode == code, result.stderr
    line = one_error_line(result)
    assert "bad.json" in line and message in line
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("fresh")) == []


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe not utf-8", "is not UTF-8 text"),
        (b"{not json", "is not valid JSON"),
        (b"[" * 100_000, "nested too deeply"),
        (b"1" * 5000, "is not valid JSON"),
        (b"[]", "is not an agentcontext chat export"),
    ],
)
def test_unreadable_exports_exit_2_and_create_nothing(
    tmp_path: Path, content: bytes, message: str
) -> None:
    (tmp_path / "x.json").write_bytes(content)
    result = run_cli("import", "x.json", cwd=tmp_path)
    assert result.returncode == 2
    assert message in one_error_line(result)
    assert not (tmp_path / "agentcontext.db").exists()


def test_failed_migration_removes_the_file_it_created(tmp_path: Path) -> None:
    result = run_cli("migrate", "upgrade", "nosuchrev", cwd=tmp_path)
    assert result.returncode == 2
    assert list(tmp_path.iterdir()) == []


def test_sqlite_errors_speak_of_a_file_not_a_server(tmp_path: Path) -> None:
    # In real processes: a connection that failed to open leaves an aiosqlite worker thread
    # that may report to the closed event loop after `main` returned.
    url = sqlite_url(tmp_path / "missing-dir" / "chat.db")
    for args in (["migrate", "upgrade"], ["demo"], ["import", "-"]):
        result = run_cli_subprocess("--url", url, *args, cwd=tmp_path, stdin="{}")
        assert result.returncode in (2, 5), result.stderr
        line = one_error_line(result)
        assert "server" not in line, line
    upgrade = run_cli_subprocess("--url", url, "migrate", "upgrade", cwd=tmp_path)
    assert upgrade.returncode == 5
    assert "missing-dir/chat.db" in one_error_line(upgrade)
    assert "directory exists" in one_error_line(upgrade)


# --- the demo, and output without rich ----------------------------------------------------


def test_demo_prints_commands_that_open_what_it_stored(tmp_path: Path) -> None:
    demo = run_cli("demo", cwd=tmp_path)
    assert demo.returncode == 0, demo.stderr
    tail = demo.stdout.split("== Explore what the demo stored (from this directory) ==\n")[1]
    commands = tail.split("\n\n")[0].splitlines()
    assert commands[0] == "agentcontext --url sqlite+aiosqlite:///agentcontext-demo.db show demo"
    assert len(commands) == 4
    for command in commands:
        words = command.split()
        assert words[0] == "agentcontext"
        result = run_cli(*words[1:], cwd=tmp_path)
        assert result.returncode == 0, (command, result.stderr)
        assert "demo" in result.stdout
    assert not (tmp_path / "agentcontext.db").exists()  # nothing opened the wrong file


def test_plain_text_without_rich_even_on_a_terminal(tmp_path: Path) -> None:
    """With rich unavailable every command works; tables are aligned on a terminal."""
    url = sqlite_url(tmp_path / "db.sqlite")
    asyncio.run(build_branched_chat(url))
    code = (
        "import sys; sys.modules['rich'] = None\n"
        "from agentcontext.cli._output import Output\n"
        "import io\n"
        "class Tty(io.StringIO):\n"
        "    def isatty(self): return True\n"
        "out = Tty()\n"
        "o = Output(file=out)\n"
        "assert o.rich is False and o.terminal is True\n"
        "o.table(['id', 'n'], [['a-long-chat-id', '1'], ['b', '22']], numeric=('n',))\n"
        "o.heading('H'); o.line('x', style='bold')\n"
        "sys.stdout.write(out.getvalue())\n"
        "from agentcontext.cli import main\n"
        f"sys.exit(main(['--url', {url!r}, 'show', 'trip']))\n"
    )
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        "id               n\na-long-chat-id   1\nb               22\n\n== H ==\nx\n"
    )
    assert "trip-pa0 (assistant)" in done.stdout and "\x1b[" not in done.stdout


def test_subprocess_prune_and_delete_from_a_real_process(url: str, tmp_path: Path) -> None:
    asyncio.run(_age(url, "work", 10))
    result = run_cli_subprocess("--url", url, "prune", "--older-than", "5d", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("deleted 1 chat ")
    result = run_cli_subprocess("--url", url, "delete", "work", cwd=tmp_path)
    assert result.returncode == 3


def test_ids_are_never_cut_in_a_narrow_terminal(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "db.sqlite")
    chat_id = "newcomer-onboarding-chat-0001"
    asyncio.run(build_branched_chat(url, chat_id, "a-user-with-a-long-name"))
    narrow = {"FORCE_COLOR": "1", "COLUMNS": "60"}
    for args in (["chats"], ["branches", chat_id], ["search", chat_id, "Porto"]):
        result = run_cli("--url", url, *args, cwd=tmp_path, env=narrow)
        assert result.returncode == 0, result.stderr
        assert "\x1b[" in result.stdout  # the rich form
        assert chat_id in result.stdout or f"{chat_id}-pa0" in result.stdout, result.stdout
    hits = run_cli("--url", url, "search", chat_id, "Porto", cwd=tmp_path, env=narrow).stdout
    assert f"{chat_id}-pu0" in hits
