"""The built wheel carries its migrations: it migrates databases with no checkout present."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import fresh_database

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtualenv with the wheel built from this repository installed; its python."""
    work = tmp_path_factory.mktemp("wheel")
    dist = work / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(dist),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    wheels = list(dist.glob("agentcontext-*.whl"))
    assert len(wheels) == 1
    env_dir = work / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"{wheels[0]}[mysql]"],
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
    )
    yield python


def run_outside_checkout(python: Path, cwd: Path, code: str, *args: str) -> str:
    done = subprocess.run(
        [str(python), "-c", textwrap.dedent(code), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "HOME": str(cwd)},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


MIGRATE = """
    import asyncio, sys
    import agentcontext
    from agentcontext.store import SqlContextStore
    from agentcontext.store._db.migrate import script_location

    async def main():
        assert "site-packages" in str(script_location()), script_location()
        async with SqlContextStore(sys.argv[1]) as store:
            await store.create_chat("c", user_id="u")
            print(len(await store.list_chats()), store.dialect_name)

    asyncio.run(main())
"""


def test_wheel_contains_the_migrations(installed: Path) -> None:
    out = run_outside_checkout(
        installed,
        installed.parent,
        "import agentcontext.store._db.migrate as m; print(m.script_location())",
    )
    location = Path(out.strip())
    assert "site-packages" in str(location)
    assert (location / "env.py").is_file()
    assert list((location / "versions").glob("0001_*.py"))


def test_wheel_migrates_an_empty_sqlite_file(installed: Path, tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}"
    assert run_outside_checkout(installed, tmp_path, MIGRATE, url).split() == ["1", "sqlite"]


@pytest.mark.parametrize(("server", "dialect"), [("postgres", "postgresql"), ("mariadb", "mysql")])
def test_wheel_migrates_an_empty_server_database(
    installed: Path, tmp_path: Path, server: str, dialect: str
) -> None:
    with fresh_database(server, "acwheel") as url:
        assert run_outside_checkout(installed, tmp_path, MIGRATE, url).split() == ["1", dialect]


def test_installed_console_script_runs_demo_and_migrate(installed: Path, tmp_path: Path) -> None:
    script = installed.parent / "agentcontext"
    env = {"PATH": f"{installed.parent}:/usr/bin:/bin", "HOME": str(tmp_path)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(script), *args], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env
        )

    demo = run("demo")
    assert demo.returncode == 0, demo.stderr
    for expected in ("main-v2", "<role>", "as TOML", "as TOON", "Estimate for gpt-4o"):
        assert expected in demo.stdout
    url = f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}"
    assert run("migrate", "current", "--url", url).stdout.strip().endswith("empty")
    check = run("migrate", "check", "--url", url)
    assert check.returncode == 4
    assert "migrate upgrade" in check.stdout + check.stderr
    assert run("migrate", "upgrade", "--url", url).returncode == 0
    assert run("migrate", "check", "--url", url).returncode == 0
    assert run("--help").returncode == 0
