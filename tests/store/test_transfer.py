"""export_chat / import_chat: a chat moves between databases and backends unchanged."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentcontext import (
    ChatExistsError,
    ChatExport,
    ContextEngine,
    ContextSnapshot,
    Message,
    assistant_text,
    errors,
    user,
)
from agentcontext.store import SqlContextStore
from agentcontext.store._ops.copy import copy_message_id
from agentcontext.store.admin import copy_export
from agentcontext.store.records import MessageRecord, compaction_id
from tests.helpers import chain, rec


async def _build(store: SqlContextStore) -> ChatExport:
    await store.create_chat("c", user_id="u", title="T", metadata={"k": [1, "x"]})
    main = await store.get_active_branch("c")
    assert main is not None
    await store.append_messages(main.id, chain("c", 4), expected_head=None)
    await store.fork_branch(
        "c", "main", head_message_id="m1", activate=True, messages=[rec("f1", "c", "m1")]
    )
    await store.create_checkpoint("c", "cp", "m2")
    await store.add_message(rec("r", "c"))
    await store.set_message_parent("m3", "r")  # a child now older than its parent
    return await store.export_chat("c")


async def test_export_import_round_trip_across_backends(
    store: SqlContextStore, tmp_path: Path
) -> None:
    exported = await _build(store)
    text = json.dumps(exported.model_dump(mode="json"))
    # Into a fresh SQLite file and back into the same store under test after deleting.
    async with SqlContextStore(f"sqlite+aiosqlite:///{tmp_path / 'other.db'}") as other:
        await other.import_chat(ChatExport.model_validate_json(text))
        again = await other.export_chat("c")
        assert again == exported
        assert [m.id for m in await other.get_messages("c")] == ["m0", "m1", "f1"]
        assert [r.message.id for r in await other.search_messages("c", "message 2")] == ["m2"]
    assert await store.delete_chat("c")
    await store.import_chat(ChatExport.model_validate_json(text))
    assert await store.export_chat("c") == exported


async def test_import_refuses_a_taken_id_and_inconsistent_exports(store: SqlContextStore) -> None:
    exported = await _build(store)
    with pytest.raises(errors.ChatExistsError):
        await store.import_chat(exported)
    await store.delete_chat("c")
    two_active = exported.model_copy(
        update={"branches": [b.model_copy(update={"is_active": True}) for b in exported.branches]}
    )
    with pytest.raises(errors.InvalidGraphError, match="exactly one active"):
        await store.import_chat(two_active)
    dangling = exported.model_copy(update={"messages": exported.messages[1:]})
    with pytest.raises(errors.InvalidGraphError):
        await store.import_chat(dangling)
    assert await store.get_chat("c") is None
    with pytest.raises(errors.ChatNotFoundError):
        await store.export_chat("c")


def _set(*path: str | int) -> Callable[[dict[str, Any], object], None]:
    """A setter of the value at ``path`` in an export's JSON form."""

    def assign(data: dict[str, Any], value: object) -> None:
        target: Any = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return assign


_CHECKPOINT_BRANCH = _set("checkpoints", 0, "branch_id")
_SUMMARY = _set("snapshots", 0, "summary")
_PATH = _set("snapshots", 0, "items", 0, "path")
_PREVIEW = _set("snapshots", 0, "items", 0, "preview")
_MEDIA_TYPE = _set("snapshots", 0, "items", 0, "media_type")
_SIZE = _set("snapshots", 0, "items", 0, "size")

_UNSTORABLE = [
    (_CHECKPOINT_BRANCH, "x" * 256, "branch_id is 256 characters long"),
    (_CHECKPOINT_BRANCH, "a\x00b", "branch_id contains a NUL"),
    (_CHECKPOINT_BRANCH, "\ud800", "branch_id contains a lone surrogate"),
    (_SUMMARY, "a\x00b", "snapshots[0].summary contains a NUL"),
    (_SUMMARY, "\ud800", "snapshots[0].summary contains a lone surrogate"),
    (_PATH, "a\x00b", "snapshots[0].items[0].path contains a NUL"),
    (_PATH, "\ud800", "snapshots[0].items[0].path contains a lone surrogate"),
    (_PREVIEW, "a\x00b", "snapshots[0].items[0].preview contains a NUL"),
    (_PREVIEW, "\ud800", "snapshots[0].items[0].preview contains a lone surrogate"),
    (_MEDIA_TYPE, "x" * 256, "snapshots[0].items[0].media_type is 256 characters long"),
    (_MEDIA_TYPE, "a\x00b", "snapshots[0].items[0].media_type contains a NUL"),
    (_MEDIA_TYPE, "\ud800", "snapshots[0].items[0].media_type contains a lone surrogate"),
    (_SIZE, 2**63, "snapshots[0].items[0].size must fit in 64 bits"),
]


async def test_import_refuses_values_no_backend_stores(store: SqlContextStore) -> None:
    """Checkpoint branches and snapshot fields are checked like those of every other write:
    an `InvalidInputError` naming the field, nothing written, on every backend."""
    engine = ContextEngine(store=store, chat_id="c", user_id="u")
    engine.set(user("q", id="q"))
    await engine.save()
    await engine.checkpoint("cp")
    snapshot = ContextSnapshot(summary="seen")
    snapshot.add_snippet("a note", "some text")
    await engine.snapshot(snapshot)
    exported = (await store.export_chat("c")).model_dump(mode="json")
    await store.delete_chat("c")
    await store.collect_garbage()
    for assign, value, message in _UNSTORABLE:
        data = json.loads(json.dumps(exported))
        assign(data, value)
        with pytest.raises(errors.InvalidInputError, match=re.escape(message)):
            await store.import_chat(ChatExport.model_validate(data))
        assert await store.get_chat("c") is None
        assert await store.collect_garbage() == 0  # no blob was written either
    await store.import_chat(ChatExport.model_validate(exported))  # the export itself is fine
    assert (await store.export_chat("c")).model_dump(mode="json") == exported


# --- one id rule for every copy (copy_chat, import --as) ------------------------------------


async def _summarize(messages: list[Message]) -> str:
    return "summary of " + " / ".join(m.text for m in messages)


async def _compacted(store: SqlContextStore, chat_id: str) -> None:
    """Branches ``main`` and ``side`` (active), a checkpoint, and two nested compactions."""
    engine = ContextEngine(store=store, chat_id=chat_id, user_id="u")
    for i in range(4):
        engine.set(user(f"question {i}", id=f"q{i}"), assistant_text(f"answer {i}", id=f"a{i}"))
        await engine.save()
    await engine.compact(_summarize, keep_last_turns=2)  # folds up to a1
    await engine.checkpoint("cp")
    engine.set(user("question 4", id="q4"), assistant_text("answer 4", id="a4"))
    await engine.save()
    await engine.compact(_summarize, keep_last_turns=1)  # up to a3, nesting the first
    await engine.rewind("a2", name="side")
    engine.set(user("side question", id="sq"), assistant_text("side answer", id="sa"))
    await engine.save()


def _folded(record: MessageRecord) -> dict[str, object]:
    assert isinstance(record.data, dict)
    meta = record.data["metadata"]["compaction"]
    assert isinstance(meta, dict)
    return meta


async def test_copy_chat_maps_ids_by_the_rule_of_copy_export(store: SqlContextStore) -> None:
    await _compacted(store, "c")
    export = await store.export_chat("c")
    expected, rule = copy_export(export, "d")
    mapping = await store.copy_chat("c", "d")
    assert mapping == rule
    summaries = [m for m in export.messages if m.type == "compaction"]
    assert len(summaries) == 2
    for message in export.messages:
        if message.type == "compaction":
            assert message.parent_id is not None
            assert mapping[message.id] == compaction_id("d", mapping[message.parent_id])
        else:
            assert mapping[message.id] == f"{message.id}@d"
    copied = await store.export_chat("d")
    assert [(m.id, m.parent_id, m.type, m.data) for m in copied.messages] == [
        (m.id, m.parent_id, m.type, m.data) for m in expected.messages
    ]
    by_id = {m.id: m for m in copied.messages}
    nested = 0
    for summary in summaries:
        copy = by_id[mapping[summary.id]]
        assert isinstance(copy.data, dict) and copy.data["id"] == copy.id
        source, folded = _folded(summary), _folded(copy)
        assert folded["through"] == mapping[str(source["through"])] == copy.parent_id
        previous = source["previous"]
        assert folded["previous"] == (None if previous is None else mapping[str(previous)])
        nested += previous is not None
    assert nested == 1
    (point,) = copied.checkpoints
    (source_point,) = export.checkpoints
    names = {b.id: b.name for b in export.branches}
    copy_names = {b.id: b.name for b in copied.branches}
    assert point.message_id == mapping[source_point.message_id]
    assert point.branch_id is not None and source_point.branch_id is not None
    assert copy_names[point.branch_id] == names[source_point.branch_id]
    # Compacting the copy at the copied point finds the copied summary, as on the source.
    engine = ContextEngine(store=store, chat_id="d", user_id="u")
    await engine.switch_branch("main")
    again = await engine.compact(_summarize, keep_last_turns=1)
    (last,) = [s for s in summaries if _folded(s)["previous"] is not None]
    assert again.id == mapping[last.id]
    for branch in ("main", "side"):
        source_texts = [m.text for m in await _resolved(store, "c", branch)]
        copy_messages = await _resolved(store, "d", branch)
        assert [m.text for m in copy_messages] == source_texts
    assert copy_messages[0].id == mapping[summaries[0].id]  # side: after the first summary


async def _resolved(store: SqlContextStore, chat_id: str, branch: str) -> list[Message]:
    engine = ContextEngine(store=store, chat_id=chat_id, user_id="u")
    await engine.switch_branch(branch)
    return (await engine.resolve()).messages


def test_the_copy_id_of_a_message_depends_only_on_its_id_and_the_new_chat() -> None:
    assert copy_message_id("m1", "copy") == "m1@copy"
    long = "x" * 251  # "x…x@copy" would pass the 255-character limit of ids
    assert len(copy_message_id("x" * 250, "copy")) == 255
    assert copy_message_id(long, "copy") == copy_message_id(long, "copy")
    assert len(copy_message_id(long, "copy")) == 32
    assert copy_message_id(long, "copy") != copy_message_id(long, "other")


def _summary_of(data: dict[str, Any], nested: bool) -> dict[str, Any]:
    """The first (or the nesting) compaction summary of an export's JSON form."""
    summaries = [m for m in data["messages"] if m["type"] == "compaction"]
    return next(
        s for s in summaries if (s["data"]["metadata"]["compaction"]["previous"] is None) != nested
    )


def _message_of(data: dict[str, Any], message_id: str) -> dict[str, Any]:
    return next(m for m in data["messages"] if m["id"] == message_id)


def _head_at_summary(data: dict[str, Any]) -> None:
    data["branches"][0]["head_message_id"] = _summary_of(data, False)["id"]


def _checkpoint_at_summary(data: dict[str, Any]) -> None:
    data["checkpoints"][0]["message_id"] = _summary_of(data, False)["id"]


def _summary_off_its_point(data: dict[str, Any]) -> None:
    _summary_of(data, False)["parent_id"] = "q0"  # it folds through a1


def _summary_through_elsewhere(data: dict[str, Any]) -> None:
    _summary_of(data, False)["data"]["metadata"]["compaction"]["through"] = "q0"


def _child_of_summary(data: dict[str, Any]) -> None:
    _message_of(data, "q2")["parent_id"] = _summary_of(data, False)["id"]


def _summary_of_summary(data: dict[str, Any]) -> None:
    nesting = _summary_of(data, True)
    nesting["parent_id"] = _summary_of(data, False)["id"]
    nesting["data"]["metadata"]["compaction"]["through"] = nesting["parent_id"]


@pytest.mark.parametrize(
    ("damage", "error", "says"),
    [
        (_head_at_summary, errors.InvalidGraphError, "cannot be its head"),
        (_checkpoint_at_summary, errors.InvalidGraphError, "compaction summary"),
        (
            _summary_off_its_point,
            errors.InvalidGraphError,
            "has parent 'q0' but folds through 'a1'",
        ),
        (
            _summary_through_elsewhere,
            errors.InvalidGraphError,
            "has parent 'a1' but folds through 'q0'",
        ),
        (_child_of_summary, errors.InvalidGraphError, "cannot be its parent"),
        (_summary_of_summary, errors.InvalidGraphError, "cannot be its parent"),
    ],
)
async def test_import_refuses_a_graph_no_save_writes(
    store: SqlContextStore,
    damage: Callable[[dict[str, Any]], None],
    error: type[Exception],
    says: str,
) -> None:
    """Compaction summaries stay beside their branch, at the message they fold through; else
    the import writes nothing, on every backend."""
    await _compacted(store, "c")
    exported = (await store.export_chat("c")).model_dump(mode="json")
    await store.delete_chat("c")
    data = json.loads(json.dumps(exported))
    damage(data)
    with pytest.raises(error, match=re.escape(says)):
        await store.import_chat(ChatExport.model_validate(data))
    assert await store.get_chat("c") is None
    assert await store.list_chats() == []
    await store.import_chat(ChatExport.model_validate(exported))  # the export itself is fine
    assert (await store.export_chat("c")).model_dump(mode="json") == exported


async def test_concurrent_creations_of_one_chat_id_leave_one_and_a_chat_exists_error(
    store: SqlContextStore, store_url: str
) -> None:
    """Two stores import one export at once, then copy one chat to one new id at once: one
    wins, the other gets `ChatExistsError` (on the servers both passed the check that the chat
    was new, and the loser's insert met the winner's row: a driver's duplicate-key error came
    out as a `StoreError`)."""
    engine = ContextEngine(store=store, chat_id="src", user_id="u")
    for i in range(20):
        engine.set(user(f"question {i}"), assistant_text(f"answer {i}"))
    await engine.save()
    export = await store.export_chat("src")
    async with SqlContextStore(store_url) as other:
        for round_ in range(4):
            await store.delete_chat("src")
            outcomes = await asyncio.gather(
                store.import_chat(export), other.import_chat(export), return_exceptions=True
            )
            failed = [o for o in outcomes if isinstance(o, BaseException)]
            assert len(failed) == 1 and isinstance(failed[0], ChatExistsError), outcomes
            copied = await asyncio.gather(
                store.copy_chat("src", f"dst-{round_}"),
                other.copy_chat("src", f"dst-{round_}"),
                return_exceptions=True,
            )
            failed = [o for o in copied if isinstance(o, BaseException)]
            assert len(failed) == 1 and isinstance(failed[0], ChatExistsError), copied
    assert len(await store.get_messages("src")) == 40
    for round_ in range(4):
        assert len(await store.get_messages(f"dst-{round_}")) == 40
