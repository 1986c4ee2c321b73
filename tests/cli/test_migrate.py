"""``agentcontext migrate``: current, check, upgrade and downgrade on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import shlex
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import make_url

from agentcontext import SchemaOutdatedError, SqlContextStore
from agentcontext.store._db import migrate as _migrate
from tests.cli.helpers import one_error_line, run_cli, sqlite_url
from tests.conftest import fresh_database

HEAD = _migrate.head_revision()
REVISIONS = [
    script.revision
    for script in reversed(
        list(ScriptDirectory.from_config(_migrate.make_config()).walk_revisions())
    )
]


@pytest.fixture(params=["sqlite", "postgres", "mariadb"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield sqlite_url(tmp_path / "fresh.db")
    else:
        with fresh_database(request.param, "accli") as url:
            yield url


async def _usable(url: str) -> bool:
    """Whether the store accepts the schema without migrating it."""
    try:
        async with SqlContextStore(url, migrate=False) as store:
            await store.list_chats()
    except SchemaOutdatedError:
        return False
    return True


def test_migrate_lifecycle(empty_url: str, tmp_path: Path) -> None:
    def migrate(*args: str) -> tuple[int, str, str]:
        result = run_cli("--url", empty_url, "migrate", *args, cwd=tmp_path)
        return result.returncode, result.stdout.strip(), result.stderr.strip()

    assert migrate("current") == (0, "empty", "")
    code, out, err = migrate("check")
    assert code == 4 and out == ""
    assert "no agentcontext" in err
    # The command to run names the database; one with a password is not printed (masked, it
    # would be a command that cannot run).
    parsed = make_url(empty_url)
    shown = "<the same URL>" if parsed.password else shlex.quote(parsed.render_as_string())
    assert f"agentcontext --url {shown} migrate upgrade" in err

    code, out, _ = migrate("upgrade")
    assert code == 0 and out.endswith(f"from empty to {HEAD} (head)")
    assert migrate("current") == (0, HEAD, "")
    code, out, _ = migrate("check")
    assert code == 0 and "up to date" in out
    assert asyncio.run(_usable(empty_url))
    code, out, _ = migrate("upgrade")
    assert code == 0 and "already at revision" in out

    code, out, _ = migrate("downgrade", "base")
    assert code == 0 and out.endswith(f"from {HEAD} (head) to empty")
    assert migrate("current") == (0, "empty", "")
    assert not asyncio.run(_usable(empty_url))

    # Step by step: the first revision is behind head whenever there is more than one.
    code, _, _ = migrate("upgrade", REVISIONS[0])
    assert code == 0
    assert migrate("current")[1] == REVISIONS[0]
    if len(REVISIONS) > 1:
        code, _, err = migrate("check")
        assert code == 4 and f"is at revision {REVISIONS[0]}" in err
    code, _, _ = migrate("downgrade", "-1")
    assert code == 0
    assert migrate("current")[1] == "empty"


def test_bad_revisions_are_usage_errors(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "db.sqlite")
    assert run_cli("--url", url, "migrate", "upgrade", cwd=tmp_path).returncode == 0
    for args in (["upgrade", "nope"], ["downgrade", "nope"]):
        result = run_cli("--url", url, "migrate", *args, cwd=tmp_path)
        assert result.returncode == 2
        assert "nope" in one_error_line(result)
    result = run_cli("--url", url, "migrate", "downgrade", cwd=tmp_path)
    assert result.returncode == 2  # argparse: REVISION is required
    assert "REVISION" in result.stderr


def test_a_newer_schema_is_reported_not_touched(tmp_path: Path) -> None:
    path = tmp_path / "newer.db"
    url = sqlite_url(path)
    assert run_cli("--url", url, "migrate", "upgrade", cwd=tmp_path).returncode == 0
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE agentcontext_version SET version_num = 'fffffffff'")
    for action in ("check", "upgrade"):
        result = run_cli("--url", url, "migrate", action, cwd=tmp_path)
        assert result.returncode == 4
        assert "newer version" in one_error_line(result)
    assert run_cli("--url", url, "migrate", "current", cwd=tmp_path).stdout == "fffffffff\n"


def test_reading_never_creates_a_sqlite_file(tmp_path: Path) -> None:
    # The default URL is agentcontext.db in the working directory.
    assert run_cli("migrate", "current", cwd=tmp_path).stdout == "empty\n"
    result = run_cli("migrate", "check", cwd=tmp_path)
    assert result.returncode == 4
    # The URL came from the default, so the command to run needs no --url.
    assert one_error_line(result).endswith("create it with: agentcontext migrate upgrade")
    assert run_cli("migrate", "downgrade", "base", cwd=tmp_path).returncode == 4
    assert not (tmp_path / "agentcontext.db").exists()
    result = run_cli("migrate", "upgrade", cwd=tmp_path)
    assert result.returncode == 0
    assert (tmp_path / "agentcontext.db").is_file()


def test_url_from_the_environment(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "env.db")
    env = {"AGENTCONTEXT_URL": url}
    result = run_cli("migrate", "check", cwd=tmp_path, env=env)
    assert result.returncode == 4
    assert "agentcontext migrate upgrade" in result.stderr
    assert "--url" not in result.stderr
    assert run_cli("migrate", "upgrade", cwd=tmp_path, env=env).returncode == 0
    assert (tmp_path / "env.db").is_file()
    # --url after the command name works too, and wins over the environment.
    other = sqlite_url(tmp_path / "other.db")
    result = run_cli("migrate", "current", "--url", other, cwd=tmp_path, env=env)
    assert result.stdout == "empty\n"
    assert run_cli("migrate", "current", cwd=tmp_path, env=env).stdout == f"{HEAD}\n"
