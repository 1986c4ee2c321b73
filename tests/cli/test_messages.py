"""What the command line says when the database is not where the URL points."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import make_url

from agentcontext.cli import main
from tests.cli.helpers import one_error_line, run_cli, sqlite_url
from tests.conftest import pg_admin_url, require_postgres


def test_a_missing_directory_is_not_mistaken_for_a_missing_file(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "nowhere" / "chat.db")
    result = run_cli("--url", url, "chats", cwd=tmp_path)
    assert result.returncode == 3
    line = one_error_line(result)
    assert f"the directory {tmp_path / 'nowhere'} does not exist" in line
    assert "migrate upgrade" not in line and "mkdir -p" in line
    missing_file = run_cli("--url", sqlite_url(tmp_path / "chat.db"), "chats", cwd=tmp_path)
    assert missing_file.returncode == 4
    assert "the file does not exist" in one_error_line(missing_file)
    assert "migrate upgrade" in one_error_line(missing_file)
    assert not (tmp_path / "nowhere").exists() and not (tmp_path / "chat.db").exists()


def test_a_missing_postgres_database_says_how_to_create_it(tmp_path: Path) -> None:
    require_postgres()
    url = make_url(pg_admin_url()).set(database="agentcontext_no_such_db")
    text = url.render_as_string(hide_password=False)
    for command in (["chats"], ["migrate", "upgrade"], ["migrate", "current"]):
        result = run_cli("--url", text, *command, cwd=tmp_path)
        assert result.returncode == 5, (command, result.stderr)
        line = one_error_line(result)
        assert "'agentcontext_no_such_db' does not exist" in line
        assert "createdb" in line and line.rstrip(")").endswith("migrate upgrade")


def test_demo_help_does_not_promise_the_environment_variable(capsys: object) -> None:
    assert main(["demo", "--help"]) == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "agentcontext-demo.db" in out
    assert "is not used" in out
