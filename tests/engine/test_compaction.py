"""compact(): a summary beside the branch, resolved without the folded prefix.

On SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from sqlalchemy import event, text

from agentcontext import (
    Compaction,
    ContextWindow,
    EmptyConversationError,
    InvalidInputError,
    InvalidTypeError,
    Message,
    TextPart,
    assistant,
    every_n_turns,
    graph_to_mermaid,
    reminder,
    user,
    visualize_graph,
)
from agentcontext.store import SqlContextStore
from tests.engine._util import texts
from tests.engine.conftest import EngineFactory

FILLER = "the quick brown fox jumps over the lazy dog while the ledger balances " * 4


async def _turns(engine, start: int, count: int) -> None:  # type: ignore[no-untyped-def]
    for i in range(start, start + count):
        engine.set(user(f"question {i} {FILLER}"), assistant(f"answer {i} {FILLER}"))
        await engine.save()


class Summaries:
    """A summarizer that records what it was given."""

    def __init__(self) -> None:
        self.calls: list[list[Message]] = []

    async def __call__(self, messages: list[Message]) -> str:
        self.calls.append(messages)
        return f"summary {len(self.calls)}: " + " | ".join(m.text[:12] for m in messages)


async def test_compact_folds_all_but_the_last_turns(make_engine: EngineFactory) -> None:
    engine = make_engine()
    await _turns(engine, 0, 6)
    summaries = Summaries()
    compaction = await engine.compact(summaries, keep_last_turns=2)
    assert isinstance(compaction, Compaction)
    assert compaction.folded == 8 and compaction.previous_id is None
    assert [m.text.split()[1] for m in summaries.calls[0]] == [
        "0",
        "0",
        "1",
        "1",
        "2",
        "2",
        "3",
        "3",
    ]
    result = await engine.resolve()
    assert result.messages[0].id == compaction.id
    assert result.messages[0].text.startswith("summary 1")
    assert result.messages[0].metadata == {
        "compaction": {
            "folded": 8,
            "through": compaction.through_message_id,
            "previous": None,
            "turns": 4,
        }
    }
    assert [m.text.split()[1] for m in result.messages[1:]] == ["4", "4", "5", "5"]
    assert (await engine.get_messages())[0].id == compaction.id


async def test_the_folded_messages_stay_in_the_graph(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    await _turns(engine, 0, 5)
    compaction = await engine.compact(Summaries())
    assert engine.head_message_id is not None
    chain = await store.get_message_chain(engine.head_message_id)
    assert len(chain) == 10 and all(r.type == "message" for r in chain)
    graph = await store.get_graph("c1")
    kinds = {node.id: node.type for node in graph.nodes}
    assert kinds[compaction.id] == "compaction"
    node = next(n for n in graph.nodes if n.id == compaction.id)
    assert node.parent_id == compaction.through_message_id
    hits = await store.search_messages("c1", "question")
    assert len([h for h in hits if h.message.type == "message"]) >= 5


async def test_a_fresh_engine_never_reads_the_folded_prefix(
    store: SqlContextStore, other_store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    await _turns(engine, 0, 8)
    compaction = await engine.compact(Summaries(), keep_last_turns=2)
    expected = texts((await engine.resolve()).messages)
    # Damage every folded message: a reader of them would fail to decode.
    assert engine.head_message_id is not None
    folded = [r.id for r in await store.get_message_chain(compaction.through_message_id)]
    async with other_store.begin() as conn:
        for message_id in folded:
            await conn.execute(
                text("UPDATE messages SET data = :bad WHERE id = :id"),
                {"bad": '{"not": "a message"}', "id": message_id},
            )
    fresh = make_engine(on=other_store)
    assert texts((await fresh.resolve()).messages) == expected
    rows = await other_store.load_chain_rows("c1", engine.head_message_id, compacted=True)
    assert rows.summary_id == compaction.id and rows.base_id == compaction.through_message_id
    assert len(rows.ids) == 4


async def test_a_head_before_the_compaction_point_resolves_without_it(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    await _turns(engine, 0, 6)
    compaction = await engine.compact(Summaries())
    assert engine.head_message_id is not None
    chain = await store.get_message_chain(engine.head_message_id)
    await engine.rewind(chain[3].id)
    result = await engine.resolve()
    assert [m.id for m in result.messages] == [r.id for r in chain[:4]]
    # Back on a head after the point (a new turn from the folded-through message's descendant):
    await engine.switch_branch("main")
    result = await engine.resolve()
    assert result.messages[0].id == compaction.id
    fresh = make_engine()
    await fresh.rewind(compaction.through_message_id)
    assert [m.id for m in (await fresh.resolve()).messages] == [compaction.id]


async def test_compactions_nest(make_engine: EngineFactory, other_store: SqlContextStore) -> None:
    engine = make_engine()
    await _turns(engine, 0, 5)
    summaries = Summaries()
    first = await engine.compact(summaries)
    await _turns(engine, 5, 3)
    second = await engine.compact(summaries, keep_last_turns=1)
    assert second.previous_id == first.id
    given = summaries.calls[1]
    assert given[0].id == first.id  # the previous summary first
    assert [m.text.split()[1] for m in given[1:]] == ["3", "3", "4", "4", "5", "5", "6", "6"]
    for reader in (engine, make_engine(on=other_store)):
        result = await reader.resolve()
        assert result.messages[0].id == second.id
        assert [m.text.split()[1] for m in result.messages[1:]] == ["7", "7"]


async def test_a_warm_engine_picks_up_another_engines_compaction(
    make_engine: EngineFactory, other_store: SqlContextStore
) -> None:
    warm = make_engine()
    await _turns(warm, 0, 5)
    await warm.resolve()
    compaction = await make_engine(on=other_store).compact(Summaries())
    assert (await warm.resolve()).messages[0].id == compaction.id
    await _turns(warm, 5, 1)
    result = await warm.resolve()
    assert result.messages[0].id == compaction.id
    assert result.messages[-1].text.startswith("answer 5")


async def test_concurrent_saves_and_a_compaction_lose_nothing(
    store: SqlContextStore, make_engine: EngineFactory, other_store: SqlContextStore
) -> None:
    writer = make_engine()
    await _turns(writer, 0, 6)
    compactor = make_engine(on=other_store)

    async def slow_summary(messages: list[Message]) -> str:
        await asyncio.sleep(0.01)
        return "slow summary"

    await asyncio.gather(compactor.compact(slow_summary), _turns(writer, 6, 4))
    assert writer.head_message_id is not None
    chain = await store.get_message_chain(writer.head_message_id)
    assert len(chain) == 20
    result = await make_engine().resolve()
    assert result.messages[0].text == "slow summary"
    assert result.messages[-1].text.startswith("answer 9")
    ids = [m.id for m in result.messages[1:]]
    assert ids == [r.id for r in chain][-len(ids) :]


async def test_a_retried_compaction_stores_one_node(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    rng = random.Random(7)
    await _turns(make_engine(), 0, 6)
    compaction: Compaction | None = None
    for _ in range(60):
        engine = make_engine()
        try:
            compaction = await asyncio.wait_for(engine.compact(Summaries()), rng.uniform(0.0, 0.02))
            break
        except TimeoutError:
            continue  # cancelled (maybe after it committed: the retry gives it back)
    # Retried once more, uninterrupted: the stored compaction comes back, nothing new.
    again = await make_engine().compact(Summaries())
    graph = await store.get_graph("c1")
    nodes = [n for n in graph.nodes if n.type == "compaction"]
    assert len(nodes) == 1
    assert again.id == nodes[0].id
    if compaction is not None:
        assert compaction.id == again.id
        assert (compaction.through_message_id, compaction.folded) == (
            again.through_message_id,
            again.folded,
        )
    assert (await make_engine().resolve()).messages[0].id == nodes[0].id


async def test_export_and_import_carry_the_compaction(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    await _turns(engine, 0, 5)
    compaction = await engine.compact(Summaries())
    exported = await store.export_chat("c1")
    await store.delete_chat("c1")
    await store.import_chat(exported)
    result = await make_engine().resolve()
    assert result.messages[0].id == compaction.id and len(result.messages) == 5


async def test_a_summary_message_and_the_window(make_engine: EngineFactory) -> None:
    engine = make_engine()
    await _turns(engine, 0, 6)

    async def as_message(messages: list[Message]) -> Message:
        return Message(id="ignored", role="assistant", parts=[TextPart(text="so far: " + FILLER)])

    compaction = await engine.compact(as_message)
    assert compaction.summary.role == "assistant" and compaction.summary.id == compaction.id
    result = await engine.resolve(window=ContextWindow(200))  # only the newest turn fits
    assert result.messages[0].id == compaction.id  # the summary is always sent
    assert result.messages[-1].text.startswith("answer 5")
    assert result.omitted


async def test_compact_refuses_bad_input(make_engine: EngineFactory) -> None:
    engine = make_engine()
    await _turns(engine, 0, 2)
    with pytest.raises(EmptyConversationError, match="nothing to compact"):
        await engine.compact(Summaries())
    with pytest.raises(InvalidInputError):
        await engine.compact(Summaries(), keep_last_turns=-1)
    with pytest.raises(InvalidTypeError):
        await engine.compact("summarize")  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="async"):
        await engine.compact(lambda messages: "sync", keep_last_turns=1)  # type: ignore[arg-type,return-value]

    async def returns_number(messages: list[Message]) -> int:
        return 3

    with pytest.raises(InvalidTypeError, match="str or a Message"):
        await engine.compact(returns_number, keep_last_turns=1)  # type: ignore[arg-type]
    compaction = await engine.compact(Summaries(), keep_last_turns=1)
    with pytest.raises(InvalidInputError, match="compaction summary"):
        await make_engine().rewind(compaction.id)


@pytest.mark.parametrize(
    "empty",
    [
        "",
        " \n\t ",
        Message(id="x", role="assistant", parts=[]),
        Message(id="x", role="assistant", parts=[TextPart(text="  ")]),
        Message(id="x", role="user", parts=[]),
    ],
    ids=["empty-str", "blank-str", "no-parts", "blank-text", "user-no-parts"],
)
async def test_an_empty_summary_is_refused_and_nothing_is_compacted(
    make_engine: EngineFactory, store: SqlContextStore, empty: str | Message
) -> None:
    engine = make_engine()
    await _turns(engine, 0, 3)
    before = await store.export_chat("c1")
    sent = [m.text for m in (await make_engine().resolve()).messages]

    async def summarize(messages: list[Message]) -> str | Message:
        return empty

    with pytest.raises(InvalidInputError, match=r"empty summary.*nothing was compacted"):
        await engine.compact(summarize, keep_last_turns=1)
    assert await store.export_chat("c1") == before
    assert [m.text for m in (await make_engine().resolve()).messages] == sent
    assert [m.text for m in (await engine.resolve()).messages] == sent
    # A summary with content other than text is not empty.
    data_only = Message.model_validate(
        {"id": "x", "role": "assistant", "parts": [{"type": "data", "name": "facts", "data": 1}]}
    )

    async def data_summary(messages: list[Message]) -> Message:
        return data_only

    compaction = await engine.compact(data_summary, keep_last_turns=1)
    assert compaction.summary.parts == data_only.parts


async def test_turns_and_the_first_message_count_what_was_folded(
    make_engine: EngineFactory, other_store: SqlContextStore
) -> None:
    engine = make_engine()
    await _turns(engine, 0, 6)
    first = await engine.first_user_message()
    await engine.compact(Summaries())
    await _turns(engine, 6, 1)
    await engine.compact(Summaries(), keep_last_turns=1)
    for reader in (engine, make_engine(on=other_store)):
        assert await reader.turn_count() == 7
        assert await reader.first_user_message() == first
        head = await reader.head_message()
        assert head is not None and head.text.startswith("answer 6")
    fresh = make_engine()
    fresh.set(user("the eighth question"))
    fresh.set(reminder("every fourth turn", when=every_n_turns(4)))
    result = await fresh.resolve()
    assert "every fourth turn" in result.messages[-1].text  # turn 8, folded turns included


async def test_the_views_mark_the_compaction(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    await _turns(engine, 0, 4)
    compaction = await engine.compact(Summaries())
    graph = await store.get_graph("c1")
    tree = visualize_graph(graph)
    assert f"{compaction.id[:8]} (compaction):" in tree
    mermaid = graph_to_mermaid(graph)
    assert '{{"compaction#58; summary 1' in mermaid


async def test_a_cold_load_looks_for_compactions_only_in_chats_that_have_one(
    store: SqlContextStore, make_engine: EngineFactory
) -> None:
    engine = make_engine()
    await _turns(engine, 0, 4)
    opened = await store.open_chat("c1", user_id="u1")
    assert opened.has_compactions is False
    statements: list[str] = []

    def seen(_c, _cur, statement, *_rest) -> None:  # type: ignore[no-untyped-def]
        statements.append(statement)

    event.listen(store.db.engine.sync_engine, "before_cursor_execute", seen)
    try:
        store.chain_memory.clear()  # a cold load: the store holds no decoded chain
        await make_engine().resolve()
        # The chat's state (which says it has no compaction), then the chain: nothing else.
        assert len([s for s in statements if s.lstrip().upper().startswith("SELECT")]) == 2
        await engine.compact(Summaries(), keep_last_turns=1)
        assert (await store.open_chat("c1", user_id="u1")).has_compactions is True
        assert engine.branch is not None
        branch = await store.get_branch("c1", engine.branch)
        assert branch is not None
        state = await store.get_branch_state(branch.id)
        assert state is not None and state.has_compactions is True
        statements.clear()
        store.chain_memory.clear()
        result = await make_engine().resolve()
        assert (
            result.messages[0].metadata is not None and "compaction" in result.messages[0].metadata
        )
        assert len(result.messages) == 3  # the summary and the kept turn
    finally:
        event.remove(store.db.engine.sync_engine, "before_cursor_execute", seen)
