"""``--schema NAME`` / ``$AGENTCONTEXT_SCHEMA``: every command that opens a store works on one
tenant's PostgreSQL schema, as ``SqlContextStore(url, schema=NAME)`` does.

Two tenant schemas of one database are seeded with different chats (one chat id in both):
each command, given the schema by the option or by the environment, sees and changes only that
tenant's chats, and the database's default schema stays untouched. On SQLite, a schema is a
usage error (exit 2) that creates no file; PostgreSQL's system schemas and libpq's
``options=-csearch_path=...`` in a URL are refused with a message saying why.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from agentcontext import ContextEngine, SqlContextStore, assistant_text, user
from agentcontext.cli import build_parser
from agentcontext.store._db import migrate as _migrate
from agentcontext.store.records import utcnow
from tests.cli.helpers import clean_env, one_error_line, run_cli, sqlite_url
from tests.conftest import fresh_pg_database
from tests.web.conftest import _free_port

TENANTS = {"tenant_a": "apple", "tenant_b": "banana"}
"""Each tenant's schema and the word only its chats hold."""
OTHER = {"tenant_a": "tenant_b", "tenant_b": "tenant_a"}
BRANCHES = {"tenant_a": ["main", "side"], "tenant_b": ["main"]}
WAYS = ["option", "environment"]


async def _seed_schema(url: str, schema: str | None, word: str, branches: list[str]) -> None:
    async with SqlContextStore(url, schema=schema) as store:
        prefix = schema or "public"
        for chat_id in ("shared", f"{prefix}-only", f"{prefix}-old"):
            context = ContextEngine(store=store, chat_id=chat_id, user_id="alice")
            context.set(
                user(f"the {word} question", id=f"{prefix}-{chat_id}-q"),
                assistant_text(f"the {word} answer", id=f"{prefix}-{chat_id}-a"),
            )
            await context.save()
            await context.update_chat(title=f"{word} {chat_id}")
            if chat_id == "shared" and "side" in branches:
                await context.rewind(f"{prefix}-{chat_id}-q", name="side")
                context.set(assistant_text(f"another {word} answer", id=f"{prefix}-side-a"))
                await context.save()
        async with store.engine.begin() as conn:
            table = "chats" if schema is None else f"{schema}.chats"
            await conn.execute(
                text(f"UPDATE {table} SET updated_at = :old WHERE id = :id"),
                {"old": utcnow() - timedelta(days=200), "id": f"{prefix}-old"},
            )


async def _seed(url: str) -> None:
    for schema, word in TENANTS.items():
        await _seed_schema(url, schema, word, BRANCHES[schema])
    await _seed_schema(url, None, "cherry", ["main"])  # the database's default schema


@pytest.fixture
def tenants() -> Iterator[str]:
    """A PostgreSQL database with two seeded tenant schemas and a seeded default schema."""
    with fresh_pg_database("accli") as url:
        asyncio.run(_seed(url))
        yield url


def cli(
    url: str, schema: str, way: str, *args: str, cwd: Path, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``agentcontext --url URL ARGS`` on ``schema``, given by ``--schema`` or the environment."""
    if way == "option":
        return run_cli("--url", url, *args, "--schema", schema, cwd=cwd, stdin=stdin)
    return run_cli("--url", url, *args, cwd=cwd, stdin=stdin, env={"AGENTCONTEXT_SCHEMA": schema})


def _json(result: subprocess.CompletedProcess[str]) -> object:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


async def _chat_ids(url: str, schema: str | None) -> set[str]:
    async with SqlContextStore(url, schema=schema, migrate=False) as store:
        return {chat.id for chat in await store.list_chats()}


@pytest.mark.parametrize("way", WAYS)
def test_reading_commands_see_only_the_tenants_chats(
    tenants: str, tmp_path: Path, way: str
) -> None:
    url = tenants
    for schema, word in TENANTS.items():
        other, theirs = OTHER[schema], TENANTS[OTHER[schema]]

        def run(*args: str, schema: str = schema) -> subprocess.CompletedProcess[str]:
            return cli(url, schema, way, *args, cwd=tmp_path)

        listed = _json(run("chats", "--json"))
        assert isinstance(listed, list)
        assert {c["id"] for c in listed} == {"shared", f"{schema}-only", f"{schema}-old"}
        assert {c["title"].split()[0] for c in listed} == {word}

        shown = _json(run("show", "shared", "--json"))
        assert isinstance(shown, dict)
        assert shown["chat"]["title"] == f"{word} shared"
        assert all(theirs not in node["preview"] for node in shown["nodes"])
        assert any(word in node["preview"] for node in shown["nodes"])
        assert run("show", f"{other}-only").returncode == 3
        transcript = run("show", "shared", "--full").stdout
        assert f"the {word} question" in transcript and theirs not in transcript

        hits = _json(run("search", "shared", word, "--json"))
        assert isinstance(hits, list) and hits
        assert all(word in hit["snippet"].replace("<mark>", "").lower() for hit in hits)
        assert _json(run("search", "shared", theirs, "--json")) == []
        everywhere = _json(run("search", "--user", "alice", word, "--json"))
        assert isinstance(everywhere, list)
        assert {hit["chat_id"] for hit in everywhere} == {
            "shared",
            f"{schema}-only",
            f"{schema}-old",
        }
        assert _json(run("search", "--user", "alice", theirs, "--json")) == []

        branches = _json(run("branches", "shared", "--json"))
        assert isinstance(branches, list)
        assert sorted(b["name"] for b in branches) == BRANCHES[schema]

        chart = run("mermaid", "shared")
        assert chart.returncode == 0 and chart.stdout.startswith("flowchart")
        assert word in chart.stdout and theirs not in chart.stdout
        assert run("mermaid", f"{other}-only").returncode == 3

        exported = _json(run("export", "shared"))
        assert isinstance(exported, dict)
        assert exported["chat"]["title"] == f"{word} shared"
        assert {m["id"] for m in exported["messages"]} >= {f"{schema}-shared-q"}
        assert run("export", f"{other}-only").returncode == 3

    # Without a schema: the database's default schema, none of the tenants' chats.
    plain = json.loads(run_cli("--url", url, "chats", "--json", cwd=tmp_path).stdout)
    assert {c["id"] for c in plain} == {"shared", "public-only", "public-old"}


@pytest.mark.parametrize("way", WAYS)
def test_writing_commands_change_only_the_tenants_chats(
    tenants: str, tmp_path: Path, way: str
) -> None:
    url = tenants
    before = {schema: asyncio.run(_chat_ids(url, schema)) for schema in (*TENANTS, None)}

    # export from tenant_a, import into tenant_b (as it is, and as a copy)
    exported = cli(url, "tenant_a", way, "export", "tenant_a-only", "-o", "a.json", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    imported = cli(url, "tenant_b", way, "import", "a.json", cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr
    assert "(schema tenant_b)" in imported.stdout
    copied = cli(url, "tenant_b", way, "import", "a.json", "--as", "a-copy", cwd=tmp_path)
    assert copied.returncode == 0, copied.stderr
    taken = cli(url, "tenant_b", way, "import", "a.json", cwd=tmp_path)
    assert taken.returncode == 1
    if way == "option":  # the commands it suggests repeat the schema given on the command line
        assert "--schema tenant_b import a.json --as NEW_ID" in one_error_line(taken)
    assert asyncio.run(_chat_ids(url, "tenant_b")) == before["tenant_b"] | {
        "tenant_a-only",
        "a-copy",
    }

    # delete: the same chat id in the other tenant stays
    deleted = cli(url, "tenant_a", way, "delete", "shared", cwd=tmp_path)
    assert deleted.returncode == 0, deleted.stderr
    assert cli(url, "tenant_a", way, "delete", "shared", cwd=tmp_path).returncode == 3
    assert "shared" in asyncio.run(_chat_ids(url, "tenant_b"))

    # prune: only the tenant's idle chat
    prune = ("prune", "--older-than", "90d", "--json")
    dry = _json(cli(url, "tenant_b", way, *prune, "--dry-run", cwd=tmp_path))
    assert isinstance(dry, dict) and [c["id"] for c in dry["chats"]] == ["tenant_b-old"]
    pruned = _json(cli(url, "tenant_a", way, *prune, cwd=tmp_path))
    assert isinstance(pruned, dict) and [c["id"] for c in pruned["chats"]] == ["tenant_a-old"]

    assert asyncio.run(_chat_ids(url, "tenant_a")) == before["tenant_a"] - {
        "shared",
        "tenant_a-old",
    }
    assert asyncio.run(_chat_ids(url, "tenant_b")) == before["tenant_b"] | {
        "tenant_a-only",
        "a-copy",
    }
    assert asyncio.run(_chat_ids(url, None)) == before[None]


def test_the_schema_option_goes_before_or_after_the_command(tenants: str, tmp_path: Path) -> None:
    for args in (
        ["--url", tenants, "--schema", "tenant_b", "chats", "--json"],
        ["--url", tenants, "chats", "--json", "--schema", "tenant_b"],
        # the option wins over the environment
        ["--url", tenants, "chats", "--schema", "tenant_b", "--json"],
    ):
        result = run_cli(*args, cwd=tmp_path, env={"AGENTCONTEXT_SCHEMA": "tenant_a"})
        assert {c["id"] for c in json.loads(result.stdout)} == {
            "shared",
            "tenant_b-only",
            "tenant_b-old",
        }


def test_a_schema_without_agentcontext_tables_gives_the_command_to_run(
    tenants: str, tmp_path: Path
) -> None:
    result = run_cli("--url", tenants, "chats", "--schema", "tenant_new", cwd=tmp_path)
    assert result.returncode == 4
    assert "--schema tenant_new" in one_error_line(result)


@pytest.mark.parametrize("way", WAYS)
def test_migrate_takes_the_schema_from_the_environment_too(tmp_path: Path, way: str) -> None:
    with fresh_pg_database("accli") as url:
        upgrade = cli(url, "tenant_m", way, "migrate", "upgrade", cwd=tmp_path)
        assert upgrade.returncode == 0, upgrade.stderr
        assert "(schema tenant_m)" in upgrade.stdout
        current = cli(url, "tenant_m", way, "migrate", "current", cwd=tmp_path)
        assert current.stdout.strip() == _migrate.head_revision()
        assert cli(url, "tenant_m", way, "migrate", "check", cwd=tmp_path).returncode == 0
        # the default schema was not touched
        assert run_cli("--url", url, "migrate", "current", cwd=tmp_path).stdout.strip() == "empty"
        listed = cli(url, "tenant_m", way, "chats", "--json", cwd=tmp_path)
        assert json.loads(listed.stdout) == []


def test_demo_writes_into_the_schema_given_and_ignores_the_environment(tmp_path: Path) -> None:
    with fresh_pg_database("accli") as url:
        demo = run_cli("--url", url, "demo", "--schema", "tenant_demo", cwd=tmp_path)
        assert demo.returncode == 0, demo.stderr
        assert "--schema tenant_demo show demo" in demo.stdout
        assert "demo" in asyncio.run(_chat_ids(url, "tenant_demo"))
        assert run_cli("--url", url, "migrate", "current", cwd=tmp_path).stdout.strip() == "empty"
    # Like $AGENTCONTEXT_URL, $AGENTCONTEXT_SCHEMA never reaches the demo's own SQLite file.
    local = run_cli("demo", cwd=tmp_path, env={"AGENTCONTEXT_SCHEMA": "tenant_demo"})
    assert local.returncode == 0, local.stderr
    assert (tmp_path / "agentcontext-demo.db").exists()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.mark.parametrize("way", WAYS)
def test_serve_shows_the_tenants_chats(tenants: str, tmp_path: Path, way: str) -> None:
    port = _free_port()
    args = [sys.executable, "-m", "agentcontext", "--url", tenants, "serve", "--port", str(port)]
    extra = {}
    if way == "option":
        args += ["--schema", "tenant_b"]
    else:
        extra["AGENTCONTEXT_SCHEMA"] = "tenant_b"
    process = subprocess.Popen(
        args,
        cwd=tmp_path,
        env=clean_env(extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                status, body = _get(base + "/")
                break
            except (urllib.error.URLError, ConnectionError):
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"serve did not start: {process.communicate()}")
                time.sleep(0.2)
        assert status == 200
        assert "tenant_b-only" in body and "banana shared" in body
        assert "tenant_a-only" not in body and "public-only" not in body
        assert _get(base + "/chat?id=tenant_b-only")[0] == 200
        assert _get(base + "/chat?id=tenant_a-only")[0] == 404
        page = _get(base + "/chat?id=shared")[1]
        assert "banana" in page and "apple" not in page
    finally:
        process.terminate()
        out, _ = process.communicate(timeout=30)
    assert "(schema tenant_b)" in out


# --- refusals (no server needed) -------------------------------------------------------------


def _an_export(tmp_path: Path) -> Path:
    """A valid export file (so `import` reaches the store)."""
    source = sqlite_url(tmp_path / "source.db")

    async def build() -> str:
        async with SqlContextStore(source) as store:
            await store.create_chat("c", user_id="u")
            return (await store.export_chat("c")).model_dump_json()

    path = tmp_path / "c.json"
    path.write_text(asyncio.run(build()), encoding="utf-8")
    return path


STORE_COMMANDS: dict[str, list[str]] = {
    "chats": ["chats"],
    "show": ["show", "c"],
    "search": ["search", "c", "words"],
    "branches": ["branches", "c"],
    "mermaid": ["mermaid", "c"],
    "export": ["export", "c"],
    "import": ["import", "c.json"],
    "delete": ["delete", "c"],
    "prune": ["prune", "--older-than", "1d"],
    "serve": ["serve"],
    "demo": ["demo"],
    "migrate": ["migrate", "upgrade"],
}
"""Every command, with the arguments that make it open its store."""
MIGRATE_ACTIONS = ["upgrade", "downgrade", "current", "check", "encrypt"]


def test_every_command_takes_a_schema() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command")
    assert commands.choices is not None
    assert set(commands.choices) == set(STORE_COMMANDS)  # a new command: add it above
    for name, sub in commands.choices.items():
        assert "--schema" in sub.format_help(), name
    migrate = commands.choices["migrate"]
    actions = next(a for a in migrate._actions if a.dest == "action")
    assert actions.choices is not None and set(actions.choices) == set(MIGRATE_ACTIONS)
    for action in actions.choices.values():
        assert "AGENTCONTEXT_SCHEMA" in action.format_help()


@pytest.mark.parametrize(
    "args",
    [*STORE_COMMANDS.values(), *(["migrate", action] for action in MIGRATE_ACTIONS[1:])],
    ids=[*STORE_COMMANDS, *(f"migrate-{action}" for action in MIGRATE_ACTIONS[1:])],
)
def test_a_schema_on_sqlite_is_a_usage_error_that_creates_nothing(
    tmp_path: Path, args: list[str]
) -> None:
    _an_export(tmp_path)
    if args == ["migrate", "downgrade"]:
        args = [*args, "base"]
    if args == ["migrate", "encrypt"]:
        args = [*args, "--keyring", str(tmp_path / "keyring.db")]
    url = sqlite_url(tmp_path / "chat.db")
    # The demo never reads $AGENTCONTEXT_SCHEMA (a test below shows it).
    for way in ["option"] if args == ["demo"] else WAYS:
        result = cli(url, "acme", way, *args, cwd=tmp_path)
        assert result.returncode == 2, (way, result.stdout, result.stderr)
        line = one_error_line(result)
        assert "SQLite has none" in line
        if way == "environment":
            assert "$AGENTCONTEXT_SCHEMA" in line
        assert not (tmp_path / "chat.db").exists()
        assert not (tmp_path / "agentcontext-demo.db").exists()


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        ("pg_catalog", "reserves names starting with 'pg_'"),
        ("pg_toast", "reserves names starting with 'pg_'"),
        ("pg_mine", "reserves names starting with 'pg_'"),
        ("information_schema", "system schema"),
    ],
)
@pytest.mark.parametrize("way", WAYS)
def test_system_schemas_are_refused(tmp_path: Path, schema: str, reason: str, way: str) -> None:
    url = "postgresql+asyncpg://app@127.0.0.1:1/agents"  # never reached
    _an_export(tmp_path)
    for args in (["chats"], ["migrate", "upgrade"], ["import", "c.json"]):
        result = cli(url, schema, way, *args, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        line = one_error_line(result)
        assert schema in line and reason in line


def test_a_search_path_in_the_url_says_to_use_the_schema_option(tmp_path: Path) -> None:
    url = "postgresql+asyncpg://app@127.0.0.1:1/agents?options=-csearch_path%3Dacme"
    result = run_cli("--url", url, "chats", cwd=tmp_path)
    assert result.returncode == 2
    line = one_error_line(result)
    assert "--schema acme" in line and "options=" in line
    assert "unexpected keyword" not in line
