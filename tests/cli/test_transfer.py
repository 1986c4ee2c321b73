"""``export`` / ``import``: a chat moves between files and backends exactly."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from agentcontext import (
    ChatExport,
    ContextEngine,
    Message,
    SqlContextStore,
    TextPart,
    ToolPart,
    assistant,
    user,
)
from tests.cli.helpers import (
    build_branched_chat,
    one_error_line,
    run_cli,
    run_cli_subprocess,
    sqlite_url,
)
from tests.conftest import fresh_pg_database


async def _build(url: str) -> ChatExport:
    """A chat with branches, a checkpoint, tool calls, non-ASCII text and nested metadata."""
    await build_branched_chat(url, "trip", "alice")
    async with SqlContextStore(url) as store:
        context = ContextEngine(
            store=store,
            chat_id="trip",
            user_id="alice",
            metadata={"zeta": 1, "alpha": {"b": [1, 2.5, None], "a": True}, "ü": "naïve ☃"},
        )
        context.set(
            user("Météo à Porto ? 天气", id="tool-u"),
            assistant(
                Message(
                    id="tool-a",
                    role="assistant",
                    parts=[
                        ToolPart(
                            tool_call_id="call-1",
                            tool_name="weather",
                            input={"city": "Porto", "days": 3, "units": "metric"},
                            state="output-available",
                            output={"max": 21.5, "sky": "clear"},
                        ),
                        TextPart(text="21.5 °C and clear \U0001f31e"),
                    ],
                    metadata={"model": "gpt-4o"},
                )
            ),
        )
        await context.save()
        await context.checkpoint("weather")
        return await store.export_chat("trip")


async def _export(url: str) -> ChatExport:
    async with SqlContextStore(url) as store:
        return await store.export_chat("trip")


def test_round_trip_sqlite_postgres_sqlite(tmp_path: Path) -> None:
    first = sqlite_url(tmp_path / "first.db")
    original = asyncio.run(_build(first))
    exported = run_cli("--url", first, "export", "trip", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    text = exported.stdout
    assert ChatExport.model_validate(json.loads(text)) == original
    assert json.loads(text) == original.model_dump(mode="json")

    with fresh_pg_database("accli") as pg:
        # The target database is empty: import migrates it first.
        (tmp_path / "trip.json").write_text(text, encoding="utf-8")
        imported = run_cli("--url", pg, "import", "trip.json", cwd=tmp_path)
        assert imported.returncode == 0, imported.stderr
        assert imported.stdout.startswith("imported chat trip (8 messages, 2 branches, 2 ")
        assert asyncio.run(_export(pg)) == original
        again = run_cli("--url", pg, "export", "trip", "-o", "from-pg.json", cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        assert "exported chat trip" in again.stdout
        from_pg = (tmp_path / "from-pg.json").read_text(encoding="utf-8")
        # Byte for byte, although PostgreSQL's JSONB reorders object keys.
        assert from_pg == text

    second = sqlite_url(tmp_path / "second.db")
    # A real process reading a real pipe.
    back = run_cli_subprocess("--url", second, "import", "-", cwd=tmp_path, stdin=from_pg)
    assert back.returncode == 0, back.stderr
    assert asyncio.run(_export(second)) == original
    assert run_cli("--url", second, "export", "trip", cwd=tmp_path).stdout == text


def test_import_errors(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "db.sqlite")
    asyncio.run(build_branched_chat(url))
    text = run_cli("--url", url, "export", "trip", cwd=tmp_path).stdout

    # The chat id is taken: nothing changes.
    result = run_cli("--url", url, "import", "-", cwd=tmp_path, stdin=text)
    assert result.returncode == 1
    assert "trip" in one_error_line(result)

    result = run_cli("--url", url, "import", "missing.json", cwd=tmp_path)
    assert result.returncode == 3
    assert one_error_line(result) == "error: no such file: missing.json"

    result = run_cli("--url", url, "import", "-", cwd=tmp_path, stdin="{not json")
    assert result.returncode == 2
    assert "stdin is not valid JSON" in one_error_line(result)

    broken = json.loads(text)
    del broken["chat"]["user_id"]
    result = run_cli("--url", url, "import", "-", cwd=tmp_path, stdin=json.dumps(broken))
    assert result.returncode == 2
    assert "first at chat.user_id: Field required" in one_error_line(result)

    wrong_format = json.loads(text) | {"format": "something-else/9"}
    result = run_cli("--url", url, "import", "-", cwd=tmp_path, stdin=json.dumps(wrong_format))
    assert result.returncode == 2
    assert "not an agentcontext chat export" in one_error_line(result)


def test_export_to_an_unwritable_path(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "db.sqlite")
    asyncio.run(build_branched_chat(url))
    result = run_cli("--url", url, "export", "trip", "-o", "no/such/dir/x.json", cwd=tmp_path)
    assert result.returncode == 1
    assert one_error_line(result).startswith("error: cannot write no/such/dir/x.json")
    assert result.stdout == ""
