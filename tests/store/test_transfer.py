"""export_chat / import_chat: a chat moves between databases and backends unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentcontext import ChatExport, errors
from agentcontext.store import SqlContextStore
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
