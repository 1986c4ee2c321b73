"""get_graph: every node, branch and checkpoint, with text previews."""

from __future__ import annotations

import pytest

from agentcontext import errors
from agentcontext.store import MessageRecord, SqlContextStore
from tests.helpers import chain, msg_data, rec


async def test_graph_has_nodes_branches_checkpoints_and_previews(store: SqlContextStore) -> None:
    await store.create_chat("c", user_id="u")
    main = await store.get_active_branch("c")
    assert main is not None
    long_text = "word " * 40
    data = msg_data(long_text, "assistant")
    data["parts"].insert(0, {"type": "reasoning", "text": "secret thoughts"})
    await store.append_messages(
        main.id,
        [
            *chain("c", 2),
            MessageRecord(id="long", chat_id="c", parent_id="m1", name="assistant", data=data),
        ],
        expected_head=None,
    )
    await store.fork_branch("c", "main", head_message_id="m0", activate=True)
    await store.create_checkpoint("c", "start", "m0")
    graph = await store.get_graph("c")
    assert graph.chat_id == "c"
    assert [(n.id, n.parent_id, n.role) for n in graph.nodes] == [
        ("m0", None, "user"),
        ("m1", "m0", "assistant"),
        ("long", "m1", "assistant"),
    ]
    previews = {n.id: n.preview for n in graph.nodes}
    assert previews["m0"] == "m message 0"
    assert previews["long"] == ("word " * 10).rstrip() + "…"
    assert len(previews["long"]) <= 51
    assert "secret" not in previews["long"] and "{" not in previews["long"]
    assert [(b.name, b.is_active, b.message_count) for b in graph.branches] == [
        ("main", False, 3),
        ("main-v2", True, 1),
    ]
    assert [(c.name, c.message_id) for c in graph.checkpoints] == [("start", "m0")]
    assert graph.model_dump(mode="json")["nodes"][0]["id"] == "m0"


async def test_graph_of_unknown_chat_raises(store: SqlContextStore) -> None:
    with pytest.raises(errors.ChatNotFoundError):
        await store.get_graph("nope")


async def test_a_tool_call_is_previewed_as_a_call_with_its_result(store: SqlContextStore) -> None:
    await store.create_chat("c", user_id="u")
    main = await store.get_active_branch("c")
    assert main is not None

    def call(state: str, **result: object) -> dict[str, object]:
        return {
            "type": "tool",
            "tool_call_id": "call-1",
            "tool_name": "get_weather",
            "input": {"city": "Paris"},
            "state": state,
            **result,
        }

    records = [
        MessageRecord(
            id=name,
            chat_id="c",
            parent_id=parent,
            name="assistant",
            data={"id": name, "role": "assistant", "parts": [part]},
        )
        for name, parent, part in [
            ("thought", None, {"type": "reasoning", "text": "hidden"}),
            ("asked", "thought", call("input-available")),
            ("done", "asked", call("output-available", output="sunny")),
            ("failed", "done", call("output-error", error="timeout")),
        ]
    ]
    await store.append_messages(main.id, records, expected_head=None)
    previews = {n.id: n.preview for n in (await store.get_graph("c")).nodes}
    assert previews == {
        "thought": "(reasoning)",
        "asked": 'tool get_weather({"city": "Paris"})',
        "done": 'tool get_weather({"city": "Paris"}) → sunny',
        "failed": 'tool get_weather({"city": "Paris"}) ✗ timeout',
    }


async def test_a_preview_leaves_out_what_reminders_appended(store: SqlContextStore) -> None:
    await store.create_chat("c", user_id="u")
    text = "Where is Porto?\n\n<system-reminder>Answer in English.</system-reminder>"
    await store.add_messages([rec("q", "c", None, text)])
    [node] = (await store.get_graph("c")).nodes
    assert node.preview == "Where is Porto?"
