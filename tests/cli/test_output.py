"""Errors, exit codes, hidden passwords, rich versus plain output, and ``--help``."""

from __future__ import annotations

import asyncio
import os
import pty
import select
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agentcontext import Chat, ChatExport
from tests.cli.helpers import (
    ANSI,
    build_branched_chat,
    clean_env,
    one_error_line,
    run_cli,
    run_cli_subprocess,
    sqlite_url,
)

SECRET_URL = "postgresql+asyncpg://u:secret@127.0.0.1:1/x"
SHOWN_URL = "postgresql+asyncpg://u:***@127.0.0.1:1/x"
NOW = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)

COMMANDS = [
    ["demo"],
    ["migrate"],
    ["migrate", "upgrade"],
    ["migrate", "downgrade"],
    ["migrate", "current"],
    ["migrate", "check"],
    ["chats"],
    ["show"],
    ["search"],
    ["export"],
    ["import"],
    ["mermaid"],
]


@pytest.mark.parametrize(
    "args",
    [
        ["chats"],
        ["show", "c"],
        ["search", "c", "q"],
        ["export", "c"],
        ["mermaid", "c"],
        ["migrate", "current"],
        ["migrate", "check"],
        ["migrate", "upgrade"],
        ["migrate", "downgrade", "base"],
        ["demo"],
    ],
)
def test_unreachable_database_hides_the_password(tmp_path: Path, args: list[str]) -> None:
    result = run_cli("--url", SECRET_URL, *args, cwd=tmp_path)
    assert result.returncode == 5
    assert "secret" not in result.stdout + result.stderr
    line = one_error_line(result)
    assert f"cannot reach the database at {SHOWN_URL}" in line


def test_password_from_the_environment_is_hidden_too(tmp_path: Path) -> None:
    (tmp_path / "chat.json").write_text("{}", encoding="utf-8")
    env = {"AGENTCONTEXT_URL": SECRET_URL}
    for args in (["chats"], ["--help"], ["chats", "--help"]):
        result = run_cli(*args, cwd=tmp_path, env=env)
        assert "secret" not in result.stdout + result.stderr
    result = run_cli_subprocess("chats", cwd=tmp_path, env=env)  # from a real environment
    assert result.returncode == 5 and SHOWN_URL in result.stderr


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("nonsense", "cannot parse"),
        ("mssql+aioodbc://u:secret@h/db", "supports SQLite, PostgreSQL, MariaDB/MySQL"),
        ("mysql+pymysql://u:secret@h/db", "use the asyncmy or aiomysql driver"),
        ("sqlite:///plain.db", "use the aiosqlite driver"),
        ("postgresql://u:secret@127.0.0.1/x", "use the asyncpg driver"),
    ],
)
def test_bad_urls_are_usage_errors(tmp_path: Path, url: str, message: str) -> None:
    chat = Chat(id="c", user_id="u", created_at=NOW, updated_at=NOW)
    valid = ChatExport(chat=chat, messages=[], branches=[], checkpoints=[]).model_dump_json()
    for args in (["chats"], ["migrate", "current"], ["import", "-"], ["demo"]):
        result = run_cli("--url", url, *args, cwd=tmp_path, stdin=valid)
        assert result.returncode == 2, (args, result.stderr)
        line = one_error_line(result)
        assert message in line
        assert "secret" not in line
    assert not (tmp_path / "plain.db").exists()


def test_reading_commands_do_not_migrate(tmp_path: Path) -> None:
    # An SQLite file without the agentcontext schema: reported, left as it was.
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    result = run_cli("--url", sqlite_url(path), "chats", cwd=tmp_path)
    assert result.returncode == 4
    line = one_error_line(result)
    assert "has no agentcontext schema" in line and "agentcontext migrate upgrade" in line
    with sqlite3.connect(path) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert tables == {"notes"}
    # The default file is not created by a read.
    result = run_cli("show", "c", cwd=tmp_path)
    assert result.returncode == 4
    assert not (tmp_path / "agentcontext.db").exists()


def test_plain_output_when_piped_rich_when_forced(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "db.sqlite")
    asyncio.run(build_branched_chat(url))
    for args in (["chats"], ["show", "trip"], ["search", "trip", "Lisbon"], ["migrate", "current"]):
        plain = run_cli("--url", url, *args, cwd=tmp_path)
        assert plain.returncode == 0, plain.stderr
        assert ANSI not in plain.stdout
        forced = run_cli("--url", url, *args, cwd=tmp_path, env={"FORCE_COLOR": "1"})
        assert forced.returncode == 0, forced.stderr
        assert ANSI in forced.stdout, args
    # Rich tables draw boxes; plain ones are tab-separated.
    forced = run_cli("--url", url, "chats", cwd=tmp_path, env={"FORCE_COLOR": "1"})
    assert "┃" in forced.stdout and "\t" not in forced.stdout
    assert "\t" in run_cli("--url", url, "chats", cwd=tmp_path).stdout
    # Export and Mermaid are data: never styled, even on a terminal.
    for args in (["export", "trip"], ["mermaid", "trip"]):
        forced = run_cli("--url", url, *args, cwd=tmp_path, env={"FORCE_COLOR": "1"})
        assert forced.stdout == run_cli("--url", url, *args, cwd=tmp_path).stdout


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_rich_output_on_a_real_terminal(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "db.sqlite")
    asyncio.run(build_branched_chat(url))
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "agentcontext", "--url", url, "show", "trip"],
        cwd=tmp_path,
        env=clean_env({"TERM": "xterm-256color"}),
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=subprocess.PIPE,
    )
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([leader], [], [], 60)
        if not ready:
            break
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert process.wait(timeout=60) == 0
    assert process.stderr is not None
    process.stderr.close()
    out = b"".join(chunks).decode("utf-8")
    assert ANSI in out
    assert "main-v2 *" in out
    assert "┃" in out  # the branches table


@pytest.mark.parametrize("args", COMMANDS, ids=lambda args: " ".join(args))
def test_help_for_every_command(tmp_path: Path, args: list[str]) -> None:
    result = run_cli(*args, "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: agentcontext {' '.join(args)}")
    assert "--url URL" in result.stdout
    assert "exit codes:" in result.stdout
    assert "3    not found" in result.stdout
    assert result.stderr == ""


def test_top_level_help_lists_commands_and_exit_codes(tmp_path: Path) -> None:
    result = run_cli("--help", cwd=tmp_path)
    assert result.returncode == 0
    for command in ("demo", "migrate", "chats", "show", "search", "export", "import", "mermaid"):
        assert f"\n    {command} " in result.stdout
    for code in ("0", "1", "2", "3", "4", "5"):
        assert f"\n  {code}    " in result.stdout
    assert "AGENTCONTEXT_URL" in result.stdout


def test_no_command_and_unknown_command_are_usage_errors(tmp_path: Path) -> None:
    assert run_cli(cwd=tmp_path).returncode == 2
    result = run_cli("frobnicate", cwd=tmp_path)
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


def test_console_script_and_version(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "agentcontext"
    if not script.exists():
        pytest.skip("the console script is not installed in this environment")
    result = subprocess.run(
        [str(script), "--version"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0
    from agentcontext import __version__

    assert result.stdout.strip() == f"agentcontext {__version__}"


def test_ctrl_c_while_the_command_line_starts_is_one_line_and_exit_130() -> None:
    """Ctrl-C in the most of a second the command line spends importing its modules: it was a
    KeyboardInterrupt traceback and death by signal; now it is what Ctrl-C later gives. The
    signal is sent at the moment the command line imports its modules (an import hook), not
    after a guessed delay."""
    import subprocess
    import sys

    script = (
        "import os, signal, sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'agentcontext.cli._app':\n"
        "            os.kill(os.getpid(), signal.SIGINT)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "from agentcontext.cli import main\n"
        "sys.exit(main(['--help']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 130
    assert done.stderr.strip() == "interrupted"
