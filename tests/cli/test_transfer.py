"""``export`` / ``import``: a chat moves between files and backends exactly."""

from __future__ import annotations

import asyncio
import json
import shlex
from pathlib import Path

import pytest

from agentcontext import (
    ChatExport,
    ContextEngine,
    ContextSnapshot,
    Message,
    SqlContextStore,
    TextPart,
    ToolPart,
    assistant,
    assistant_text,
    user,
)
from agentcontext.snapshots import SelectionStrategy
from agentcontext.store.records import MessageRecord, compaction_id
from tests.cli.helpers import (
    build_branched_chat,
    one_error_line,
    run_cli,
    run_cli_subprocess,
    sqlite_url,
)
from tests.conftest import fresh_database


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


@pytest.mark.parametrize("server", ["postgres", "mariadb"])
def test_round_trip_sqlite_server_sqlite(tmp_path: Path, server: str) -> None:
    first = sqlite_url(tmp_path / "first.db")
    original = asyncio.run(_build(first))
    exported = run_cli("--url", first, "export", "trip", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    text = exported.stdout
    assert ChatExport.model_validate(json.loads(text)) == original
    assert json.loads(text) == original.model_dump(mode="json")

    with fresh_database(server, "accli") as pg:
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


def test_import_of_values_no_backend_stores_exits_2(tmp_path: Path) -> None:
    """A NUL or a lone surrogate (a JSON escape) in a snapshot or a checkpoint is a malformed
    export: exit 2, one error line naming the field, nothing written."""
    source = sqlite_url(tmp_path / "source.db")

    async def build() -> ChatExport:
        await build_branched_chat(source)
        async with SqlContextStore(source) as store:
            context = ContextEngine(store=store, chat_id="trip", user_id="alice")
            snapshot = ContextSnapshot(summary="seen")
            snapshot.add_snippet("a note", "some text")
            await context.snapshot(snapshot)
            return await store.export_chat("trip")

    exported = asyncio.run(build()).model_dump(mode="json")
    target = tmp_path / "target.db"
    cases = [
        (("snapshots", 0, "summary"), "\ud800", "snapshots[0].summary contains a lone surrogate"),
        (
            ("snapshots", 0, "items", 0, "path"),
            "a\x00b",
            "snapshots[0].items[0].path contains a NUL",
        ),
        (("checkpoints", 0, "branch_id"), "\ud800", "branch_id contains a lone surrogate"),
    ]
    for path, value, message in cases:
        data = json.loads(json.dumps(exported))
        holder = data
        for key in path[:-1]:
            holder = holder[key]
        holder[path[-1]] = value
        stdin = json.dumps(data)  # ASCII: the surrogate and the NUL as escapes
        result = run_cli("--url", sqlite_url(target), "import", "-", cwd=tmp_path, stdin=stdin)
        assert result.returncode == 2, result.stderr
        assert message in one_error_line(result)
        assert not target.exists()


def test_import_of_a_graph_no_save_writes_exits_2(tmp_path: Path) -> None:
    """A branch head at a compaction summary, or a message whose parent is a summary, is a
    malformed export: exit 2, one error line, no database file (with --as NEW_ID too)."""
    source = sqlite_url(tmp_path / "source.db")

    async def build() -> ChatExport:
        async with SqlContextStore(source) as store:
            context = ContextEngine(store=store, chat_id="long", user_id="alice")
            for turn in range(3):
                context.set(user(f"question {turn}"), assistant_text(f"answer {turn}"))
                await context.save()

            async def summarize(messages: list[Message]) -> str:
                return "the story so far"

            await context.compact(summarize, keep_last_turns=1)
            return await store.export_chat("long")

    exported = asyncio.run(build()).model_dump(mode="json")
    (summary,) = [m["id"] for m in exported["messages"] if m["type"] == "compaction"]
    at_summary = json.loads(json.dumps(exported))
    at_summary["branches"][0]["head_message_id"] = summary
    under_summary = json.loads(json.dumps(exported))
    [last] = [
        m
        for m in under_summary["messages"]
        if m["id"] == exported["branches"][0]["head_message_id"]
    ]
    last["parent_id"] = summary
    target = tmp_path / "target.db"
    for data, message in [
        (at_summary, "branch 'main' points at the compaction summary"),
        (under_summary, "points at the compaction summary"),
    ]:
        for extra in ([], ["--as", "copy"]):
            stdin = json.dumps(data)  # (the summary's id changes --as copy)
            result = run_cli(
                "--url", sqlite_url(target), "import", "-", *extra, cwd=tmp_path, stdin=stdin
            )
            assert result.returncode == 2, result.stderr
            line = one_error_line(result)
            assert "stdin is not a valid chat export" in line
            assert message in line
            assert not target.exists()


def test_export_to_an_unwritable_path(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "db.sqlite")
    asyncio.run(build_branched_chat(url))
    result = run_cli("--url", url, "export", "trip", "-o", "no/such/dir/x.json", cwd=tmp_path)
    assert result.returncode == 1
    assert one_error_line(result).startswith("error: cannot write no/such/dir/x.json")
    assert result.stdout == ""


# --- import --as copies by the rule of store.copy_chat ---------------------------------------


async def _summarize(messages: list[Message]) -> str:
    return "summary of " + " / ".join(m.text for m in messages)


async def _build_compacted(url: str) -> dict[str, str]:
    """Chat ``trip`` with branches, a checkpoint, two nested compactions and a snapshot; then
    ``store.copy_chat("trip", "by-api")``, whose mapping is returned."""
    async with SqlContextStore(url) as store:
        engine = ContextEngine(store=store, chat_id="trip", user_id="alice")
        for i in range(4):
            engine.set(user(f"day {i}?", id=f"q{i}"), assistant_text(f"plan {i}", id=f"a{i}"))
            await engine.save()
        await engine.compact(_summarize, keep_last_turns=2)
        await engine.checkpoint("planned")
        engine.set(user("day 4?", id="q4"), assistant_text("plan 4", id="a4"))
        await engine.save()
        await engine.compact(_summarize, keep_last_turns=1)
        snapshot = ContextSnapshot(selection=SelectionStrategy.EXPLICIT)
        snapshot.add_snippet("notes.txt", "bring a hat")
        await engine.snapshot(snapshot)
        await engine.rewind("a2", name="side")
        engine.set(user("a day trip?", id="sq"), assistant_text("Sintra", id="sa"))
        await engine.save()
        return await store.copy_chat("trip", "by-api")


def _graph(export: ChatExport) -> list[tuple[str, str | None, str, object]]:
    return [(m.id, m.parent_id, m.type, m.data) for m in export.messages]


def _folded(record: MessageRecord) -> dict[str, object]:
    assert isinstance(record.data, dict)
    meta = record.data["metadata"]["compaction"]
    assert isinstance(meta, dict)
    return meta


async def _resolved(store: SqlContextStore, chat_id: str, branch: str) -> list[Message]:
    engine = ContextEngine(store=store, chat_id=chat_id, user_id="alice")
    await engine.switch_branch(branch)
    return (await engine.resolve()).messages


def test_import_as_and_copy_chat_map_ids_by_one_rule(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "chat.db")
    elsewhere = sqlite_url(tmp_path / "elsewhere.db")
    by_api = asyncio.run(_build_compacted(url))
    exported = run_cli("--url", url, "export", "trip", "-o", "trip.json", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    for target, new_id in ((url, "by-cli"), (elsewhere, "by-api")):
        done = run_cli("--url", target, "import", "trip.json", "--as", new_id, cwd=tmp_path)
        assert done.returncode == 0, done.stderr

    async def check() -> None:
        async with SqlContextStore(url) as store, SqlContextStore(elsewhere) as other:
            source = await store.export_chat("trip")
            copies = {name: await store.export_chat(name) for name in ("by-api", "by-cli")}
            # Imported under the id copy_chat used, a copy has copy_chat's ids exactly.
            assert _graph(await other.export_chat("by-api")) == _graph(copies["by-api"])
            summaries = [m for m in source.messages if m.type == "compaction"]
            assert len(summaries) == 2
            for chat_id, copy in copies.items():
                by_id = {m.id: m for m in copy.messages}
                mapping: dict[str, str] = {}
                for message in source.messages:  # parents first
                    if message.type == "compaction":
                        assert message.parent_id is not None
                        new = compaction_id(chat_id, mapping[message.parent_id])
                    else:
                        new = f"{message.id}@{chat_id}"
                    mapping[message.id] = new
                    assert by_id[new].parent_id == (
                        None if message.parent_id is None else mapping[message.parent_id]
                    )
                if chat_id == "by-api":
                    assert mapping == by_api
                for summary in summaries:
                    before, after = _folded(summary), _folded(by_id[mapping[summary.id]])
                    assert after["through"] == mapping[str(before["through"])]
                    previous = before["previous"]
                    assert after["previous"] == (
                        None if previous is None else mapping[str(previous)]
                    )
                (point,) = copy.checkpoints
                (source_point,) = source.checkpoints
                assert point.message_id == mapping[source_point.message_id]
                branch_names = {b.id: b.name for b in copy.branches}
                source_names = {b.id: b.name for b in source.branches}
                assert point.branch_id is not None and source_point.branch_id is not None
                assert branch_names[point.branch_id] == source_names[source_point.branch_id]
                # Both copies resolve: the summary, then the tail, as the source does.
                for branch in ("main", "side"):
                    want = await _resolved(store, "trip", branch)
                    got = await _resolved(store, chat_id, branch)
                    assert [m.text for m in got] == [m.text for m in want]
                    assert got[0].id == mapping[want[0].id]
                    assert got[0].text.startswith("summary of ")
            # export/import keeps the snapshot (copy_chat does not copy snapshots)
            (snapshot,) = copies["by-cli"].snapshots
            (original,) = source.snapshots
            assert original.message_id is not None
            assert snapshot.message_id == f"{original.message_id}@by-cli"
            assert copies["by-api"].snapshots == []

    asyncio.run(check())


def test_the_commands_an_import_suggests_run_on_exactly_its_words(tmp_path: Path) -> None:
    """A taken chat id ``"abc "`` beside a chat ``abc``, exported to a file whose name has a
    space: the suggested ``delete`` command, pasted into a shell, deletes ``"abc "``, not
    ``abc`` (its words were printed unquoted), and the suggested ``import --as`` names the
    file whole."""
    url = sqlite_url(tmp_path / "quoted.db")

    async def seed() -> None:
        async with SqlContextStore(url) as store:
            for chat_id in ("abc", "abc "):
                engine = ContextEngine(store=store, chat_id=chat_id, user_id="u")
                engine.set(user(f"hello {chat_id!r}"))
                await engine.save()

    asyncio.run(seed())
    exported = run_cli("--url", url, "export", "abc ", "-o", "my export.json", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    taken = run_cli("--url", url, "import", "my export.json", cwd=tmp_path)
    assert taken.returncode == 1, taken.stderr
    line = one_error_line(taken)
    suggested_import = line.split("another id with: ", 1)[1].split(", or ", 1)[0]
    assert shlex.split(suggested_import)[-4:] == ["import", "my export.json", "--as", "NEW_ID"]
    suggested_delete = shlex.split(line.split("first with: ", 1)[1])
    assert suggested_delete[0] == "agentcontext" and suggested_delete[-2:] == ["delete", "abc "]
    deleted = run_cli(*suggested_delete[1:], cwd=tmp_path)
    assert deleted.returncode == 0, deleted.stderr

    async def left() -> list[str]:
        async with SqlContextStore(url) as store:
            return [chat.id for chat in await store.list_chats()]

    assert asyncio.run(left()) == ["abc"]


def test_an_import_whose_branch_ids_are_taken_suggests_import_as(tmp_path: Path) -> None:
    """An export edited by hand to another chat id and other message ids keeps its branch
    ids, which are global: the import is refused (exit 1, nothing written) with the command
    that imports a copy under new ids, as for message ids."""
    url = sqlite_url(tmp_path / "branches.db")

    async def seed() -> None:
        async with SqlContextStore(url) as store:
            engine = ContextEngine(store=store, chat_id="abc", user_id="u")
            engine.set(user("hello"))
            await engine.save()

    asyncio.run(seed())
    assert run_cli("--url", url, "export", "abc", "-o", "e.json", cwd=tmp_path).returncode == 0
    edited = json.loads((tmp_path / "e.json").read_text())
    edited["chat"]["id"] = "abc2"
    for message in edited["messages"]:
        message["chat_id"] = "abc2"
        message["id"] += "-2"
        if message.get("parent_id"):
            message["parent_id"] += "-2"
    for branch in edited["branches"]:
        branch["chat_id"] = "abc2"
        branch["head_message_id"] += "-2"
    (tmp_path / "e2.json").write_text(json.dumps(edited))
    result = run_cli("--url", url, "import", "e2.json", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    line = one_error_line(result)
    assert "branch id" in line and line.endswith("import e2.json --as NEW_ID")
    assert run_cli("--url", url, "import", "e2.json", "--as", "abc2", cwd=tmp_path).returncode == 0
