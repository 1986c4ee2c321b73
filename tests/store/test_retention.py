"""Retention and erasure: prune, purge, erase_user and copy_chat, on every backend.

Counts in the reports are checked against the database's own counts; cancelled runs are
retried and must reach the same final state.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import LargeBinary, cast, func, select, update

from agentcontext import (
    ChatExistsError,
    ChatNotFoundError,
    ContextEngine,
    ContextSnapshot,
    ErasureReport,
    InvalidInputError,
    InvalidTypeError,
    Message,
    MessageNotFoundError,
    PruneReport,
    PurgeReport,
    assistant,
    user,
)
from agentcontext.store import SqlContextStore
from agentcontext.store._db.schema import chats as C
from agentcontext.store._db.schema import messages as M
from agentcontext.store._ops.retention import TABLES, collect_if_due
from agentcontext.store.records import MessageRecord, compaction_id
from tests.helpers import chain, rec, table_counts

FILLER = "the ledger balances while the quick brown fox jumps"


async def _age(store: SqlContextStore, chat_id: str, days: int) -> None:
    async with store.engine.begin() as conn:
        await conn.execute(
            update(C)
            .where(C.c.id == chat_id)
            .values(updated_at=datetime.now(UTC) - timedelta(days=days))
        )


def _snapshot(*texts: str) -> ContextSnapshot:
    snapshot = ContextSnapshot()
    for i, text in enumerate(texts):
        snapshot.add_file(f"f{i}.txt", text)
    return snapshot


async def _chat_with_everything(store: SqlContextStore, chat_id: str, user_id: str) -> None:
    """A chat with two branches, a checkpoint, a snapshot and a resolve record."""
    engine = ContextEngine(store=store, chat_id=chat_id, user_id=user_id)
    for i in range(3):
        engine.set(user(f"{chat_id} question {i} {FILLER}"), assistant(f"{chat_id} answer {i}"))
        await engine.save()
    await engine.checkpoint("cp")
    await engine.snapshot(_snapshot(f"private {chat_id}", "shared by everyone"))
    await engine.resolve(record=True)
    head = engine.head_message_id
    assert head is not None
    await engine.rewind((await store.get_messages(chat_id))[1].id, name="alt")
    engine.set(user(f"{chat_id} side question {FILLER}"))
    await engine.save()


# --- prune ------------------------------------------------------------------------------------


async def test_prune_deletes_old_chats_with_their_rows_and_private_blobs(
    store: SqlContextStore,
) -> None:
    for chat_id, user_id in (("old-a", "u1"), ("old-b", "u2"), ("new-c", "u1")):
        await _chat_with_everything(store, chat_id, user_id)
    await _age(store, "old-a", 100)
    await _age(store, "old-b", 50)
    before = await table_counts(store)

    only_u1 = await store.prune(older_than=timedelta(days=30), user_id="u1")
    assert isinstance(only_u1, PruneReport)
    assert only_u1.chat_ids == ["old-a"] and only_u1.user_id == "u1"
    assert only_u1.chats[0].message_count == 7 and only_u1.chats[0].branch_count == 2
    middle = await table_counts(store)
    assert only_u1.deleted == {name: before[name] - middle[name] for name in TABLES}
    assert only_u1.deleted["chats"] == 1 and only_u1.deleted["messages"] == 7
    # Its private file and its record's blobs went; the shared file stays for the others.
    assert only_u1.deleted["blobs"] >= 1

    assert PruneReport.model_validate_json(only_u1.model_dump_json()) == only_u1
    everyone = await store.prune(older_than=datetime.now(UTC) - timedelta(days=30))
    assert everyone.chat_ids == ["old-b"]
    after = await table_counts(store)
    assert everyone.deleted == {name: middle[name] - after[name] for name in TABLES}
    assert [c.id for c in await store.list_chats()] == ["new-c"]
    snapshot = (await store.list_snapshots("new-c"))[0]
    full = await store.get_snapshot(snapshot.id or "", with_content=True)
    assert full is not None
    assert sorted(data for data, _ in full.contents.values()) == [
        b"private new-c",
        b"shared by everyone",
    ]
    assert await store.search_user_messages("u2", "question") == []
    hits = await store.search_user_messages("u1", "question")
    assert len(hits) == 4 and {hit.message.chat_id for hit in hits} == {"new-c"}

    nothing = await store.prune(older_than=timedelta(days=30))
    assert nothing.chats == [] and set(nothing.deleted.values()) == {0}


async def test_prune_keeps_a_chat_active_again(store: SqlContextStore) -> None:
    await store.create_chat("c", user_id="u")
    await _age(store, "c", 10)
    engine = ContextEngine(store=store, chat_id="c", user_id="u")
    engine.set(user("fresh"))
    await engine.save()  # a save is activity
    assert (await store.prune(older_than=timedelta(days=1))).chats == []


@pytest.mark.parametrize(
    ("older_than", "error"),
    [
        (timedelta(0), InvalidInputError),
        (timedelta(days=-1), InvalidInputError),
        (timedelta(days=999_999_999), InvalidInputError),
        (datetime(2020, 1, 1), InvalidInputError),  # naive
        ("90d", InvalidTypeError),
        (90, InvalidTypeError),
    ],
)
async def test_prune_refuses_bad_bounds(
    store: SqlContextStore, older_than: Any, error: type[Exception]
) -> None:
    await store.create_chat("c", user_id="u")
    await _age(store, "c", 10)
    with pytest.raises(error):
        await store.prune(older_than=older_than)
    with pytest.raises(InvalidInputError):
        await store.prune(older_than=timedelta(days=1), user_id="")
    assert await store.get_chat("c") is not None


# --- erase_user -------------------------------------------------------------------------------


async def test_erase_user_receipt_matches_the_database(store: SqlContextStore) -> None:
    for chat_id, user_id in (("a1", "alice"), ("a2", "alice"), ("b1", "bob")):
        await _chat_with_everything(store, chat_id, user_id)
    await _age(store, "a2", 3)
    before = await table_counts(store)
    bob_export = await store.export_chat("b1")

    receipt = await store.erase_user("alice")
    assert isinstance(receipt, ErasureReport)
    assert receipt.user_id == "alice" and receipt.chat_ids == ["a2", "a1"]
    after = await table_counts(store)
    assert receipt.deleted == {name: before[name] - after[name] for name in TABLES}
    assert receipt.deleted["chats"] == 2 and receipt.deleted["messages"] == 14
    assert receipt.deleted["snapshots"] == 2 and receipt.deleted["resolve_records"] == 2
    assert receipt.erased_at.tzinfo is not None
    assert ErasureReport.model_validate_json(receipt.model_dump_json()) == receipt
    assert await store.list_chats(user_id="alice") == []
    assert await store.search_user_messages("alice", "question") == []
    assert await store.export_chat("b1") == bob_export  # bob's chat, blobs included, intact
    async with store.engine.connect() as conn:
        left = await conn.scalar(select(func.count()).where(M.c.chat_id.in_(["a1", "a2"])))
    assert left == 0

    again = await store.erase_user("alice")
    assert again.chat_ids == [] and set(again.deleted.values()) == {0}
    with pytest.raises(InvalidInputError):
        await store.erase_user("")


# --- purge ------------------------------------------------------------------------------------


async def _graph(store: SqlContextStore, chat_id: str = "c", p: str = "") -> None:
    """m0..m9 on main, compacted through m5; branch alt (m3 -> a0, a1) deleted (ids after
    the prefix ``p``)."""
    await store.create_chat(chat_id, user_id="u")
    main = await store.get_active_branch(chat_id)
    assert main is not None
    await store.append_messages(main.id, chain(chat_id, 10, prefix=f"{p}m"), expected_head=None)
    await store.fork_branch(
        chat_id, "main", head_message_id=f"{p}m3", activate=False, name="alt",
        messages=chain(chat_id, 2, prefix=f"{p}a", parent=f"{p}m3"),
    )  # fmt: skip
    await store.delete_branch(chat_id, "alt")
    summary = compaction_id(chat_id, f"{p}m5")
    await store.add_message(
        MessageRecord(
            id=summary, chat_id=chat_id, parent_id=f"{p}m5", name="user", type="compaction",
            data={"id": summary, "role": "user", "parts": [{"type": "text", "text": "summary"}],
                  "metadata": {"compaction": {"through": f"{p}m5", "folded": 6}}},
        )
    )  # fmt: skip


async def _state(store: SqlContextStore, chat_id: str = "c") -> dict[str, Any]:
    async with store.engine.connect() as conn:
        rows = (
            await conn.execute(
                select(M.c.id, M.c.parent_id, M.c.depth).where(M.c.chat_id == chat_id)
            )
        ).all()
        kept = await conn.scalar(select(C.c.message_count).where(C.c.id == chat_id))
    assert kept == len(rows)  # the chat's count follows the rows
    return {row[0]: (row[1], row[2]) for row in rows}


async def test_purge_deletes_what_nothing_reaches(store: SqlContextStore) -> None:
    await _graph(store)
    summary = compaction_id("c", "m5")
    branches_before = await store.list_branches("c")
    report = await store.purge("c")
    assert isinstance(report, PurgeReport)
    assert report.deleted_messages == 7 and report.kept_messages == 6
    assert report.purged_at is not None
    state = await _state(store)
    assert state == {
        "m5": (None, 1),
        summary: ("m5", 2),
        **{f"m{i}": (f"m{i - 1}", i - 4) for i in range(6, 10)},
    }
    # Branch lengths follow the new depths; the chain loads whole from its new root.
    (main,) = await store.list_branches("c")
    assert main.message_count == 5 and main.id == branches_before[0].id
    assert [m.id for m in await store.get_messages("c")] == [f"m{i}" for i in range(5, 10)]
    assert [r.message.id for r in await store.search_messages("c", "message")] == [
        f"m{i}" for i in range(9, 4, -1)
    ]
    with pytest.raises(MessageNotFoundError, match="history was purged"):
        await store.create_branch("c", "back", head_message_id="m2")
    with pytest.raises(MessageNotFoundError, match="history was purged"):
        await store.create_checkpoint("c", "cp", "a1")
    assert (await store.create_branch("c", "ok", head_message_id="m7")).head_message_id == "m7"

    again = await store.purge("c")
    assert again.deleted_messages == 0 and again.kept_messages == 6
    assert again.purged_at == report.purged_at
    assert await _state(store) == state


async def test_purge_keeps_what_a_checkpoint_or_an_uncompacted_branch_reaches(
    store: SqlContextStore,
) -> None:
    await _graph(store)
    await store.create_checkpoint("c", "early", "m2")
    await store.create_branch("c", "side", head_message_id="m4")
    report = await store.purge("c")
    assert report.deleted_messages == 2  # only the deleted branch's a0, a1
    state = await _state(store)
    assert {f"m{i}" for i in range(10)} <= set(state) and "a0" not in state
    assert state["m5"] == ("m4", 6)  # nothing moved: the prefix is still reached
    never = await store.purge("c")
    assert never.deleted_messages == 0


async def test_purge_of_a_chat_without_history_to_drop(store: SqlContextStore) -> None:
    await store.create_chat("c", user_id="u")
    report = await store.purge("c")
    assert report == PurgeReport(
        chat_id="c", deleted_messages=0, kept_messages=0, detached=0, purged_at=None
    )
    with pytest.raises(ChatNotFoundError):
        await store.purge("nope")
    with pytest.raises(InvalidInputError):
        await store.purge("")


async def test_purge_after_compaction_through_the_engine(store: SqlContextStore) -> None:
    engine = ContextEngine(store=store, chat_id="c", user_id="u")
    for i in range(8):
        engine.set(user(f"question {i} {FILLER}"), assistant(f"answer {i}"))
        await engine.save()
    early = (await store.get_messages("c"))[2].id
    await engine.snapshot(_snapshot("at the head"))
    await engine.resolve(record=True)

    async def summarize(messages: list[Message]) -> str:
        return f"summary of {len(messages)}"

    await engine.compact(summarize, keep_last_turns=2)
    before = [m.text for m in (await engine.resolve()).messages]
    report = await store.purge("c")
    # 16 messages and a summary: the last two turns, the point and the summary stay.
    assert report.deleted_messages == 11 and report.kept_messages == 6
    assert report.detached == 0  # the snapshot and record were taken at the head, still here
    fresh = ContextEngine(store=store, chat_id="c", user_id="u")
    assert [m.text for m in (await fresh.resolve()).messages] == before
    assert [m.text for m in (await engine.resolve()).messages] == before
    with pytest.raises(MessageNotFoundError, match="history was purged"):
        await fresh.rewind(early)
    tail = (await store.get_messages("c"))[-2].id
    await fresh.rewind(tail, name="again")
    fresh.set(user("a new question"))
    await fresh.save()
    assert [m.text for m in (await fresh.resolve()).messages][-1] == "a new question"
    assert await store.search_messages("c", "question 1") == []  # purged with its entry
    assert len(await store.search_messages("c", "question 7")) == 1


async def test_purge_detaches_snapshots_of_deleted_messages(store: SqlContextStore) -> None:
    await _graph(store)
    await store.save_snapshot(_snapshot("on a deleted branch"), chat_id="c", message_id="a1")
    report = await store.purge("c")
    assert report.detached == 1
    (snapshot,) = await store.list_snapshots("c")
    assert snapshot.message_id is None


# --- copy_chat --------------------------------------------------------------------------------


def _texts(messages: list[Message]) -> list[str]:
    return [m.text for m in messages]


async def test_copy_chat_works_as_the_source(store: SqlContextStore) -> None:
    engine = ContextEngine(store=store, chat_id="src", user_id="u")
    for i in range(5):
        engine.set(user(f"question {i} {FILLER}"), assistant(f"answer {i}"))
        await engine.save()

    async def summarize(messages: list[Message]) -> str:
        return f"summary of {len(messages)}"

    await engine.compact(summarize, keep_last_turns=1)
    await engine.checkpoint("cp")
    await engine.rewind((await store.get_messages("src"))[3].id, name="side")
    engine.set(user(f"side question {FILLER}"))
    await engine.save()
    source_ids = {m.id for m in (await store.get_graph("src")).nodes}

    mapping = await store.copy_chat("src", "dst", user_id="v")
    assert set(mapping) == source_ids and not set(mapping.values()) & source_ids
    copy = await store.get_chat("dst")
    assert copy is not None and copy.user_id == "v"
    for name in ("main", "side"):
        a = ContextEngine(store=store, chat_id="src", user_id="u")
        b = ContextEngine(store=store, chat_id="dst", user_id="v")
        await a.switch_branch(name)
        await b.switch_branch(name)
        assert _texts((await a.resolve()).messages) == _texts((await b.resolve()).messages)
        assert [mapping[i] for i in [m.id for m in (await a.resolve()).messages]] == [
            m.id for m in (await b.resolve()).messages
        ]
    assert [b.name for b in await store.list_branches("dst")] == [
        b.name for b in await store.list_branches("src")
    ]
    assert (await store.get_active_branch("dst")).name == "side"  # type: ignore[union-attr]
    (cp,) = await store.list_checkpoints("dst")
    assert cp.message_id == mapping[(await store.list_checkpoints("src"))[0].message_id]
    hits = await store.search_messages("dst", "side question")
    assert [h.message.chat_id for h in hits] == ["dst"]
    assert (
        hits[0].message.id
        == mapping[(await store.search_messages("src", "side question"))[0].message.id]
    )
    # Rewind and restore on the copy.
    b = ContextEngine(store=store, chat_id="dst", user_id="v")
    await b.restore("cp")
    second = mapping[(await store.get_messages("src"))[1].id]
    await b.rewind(second, name="early")
    assert _texts((await b.resolve()).messages) == [f"question 0 {FILLER}", "answer 0"]


async def test_copy_chat_up_to_one_message(store: SqlContextStore) -> None:
    await store.create_chat("src", user_id="u", title="T")
    main = await store.get_active_branch("src")
    assert main is not None
    await store.append_messages(main.id, chain("src", 6), expected_head=None)
    await store.create_branch("src", "other", head_message_id="m4")
    mapping = await store.copy_chat("src", "dst", up_to="m3")
    assert sorted(mapping) == ["m0", "m1", "m2", "m3"]
    (branch,) = await store.list_branches("dst")
    assert branch.name == "main" and branch.is_active and branch.message_count == 4
    copied = await store.get_messages("dst")
    assert [m.data["parts"] for m in copied] == [
        m.data["parts"] for m in (await store.get_message_chain("m3"))
    ]
    counts = {c.id: (c.message_count, c.branch_count) for c in await store.list_chats()}
    assert counts == {"dst": (4, 1), "src": (6, 2)}
    assert (await store.get_chat("dst")).title == "T"  # type: ignore[union-attr]


async def test_copy_chat_refusals_write_nothing(store: SqlContextStore) -> None:
    await store.create_chat("src", user_id="u")
    main = await store.get_active_branch("src")
    assert main is not None
    await store.append_messages(main.id, chain("src", 3), expected_head=None)
    await store.create_chat("taken", user_id="u")
    before = await table_counts(store)
    with pytest.raises(ChatExistsError):
        await store.copy_chat("src", "taken")
    with pytest.raises(ChatNotFoundError):
        await store.copy_chat("missing", "new")
    with pytest.raises(MessageNotFoundError):
        await store.copy_chat("src", "new", up_to="nope")
    await store.create_chat("elsewhere", user_id="u")
    await store.add_message(rec("x0", "elsewhere"))
    with pytest.raises(InvalidInputError):
        await store.copy_chat("src", "")
    from agentcontext import InvalidGraphError

    with pytest.raises(InvalidGraphError):
        await store.copy_chat("src", "new", up_to="x0")
    after = await table_counts(store)
    assert after["chats"] == before["chats"] + 1 and after["messages"] == before["messages"] + 1
    assert await store.get_chat("new") is None


# --- cancellation -----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
async def test_cancelled_purge_and_erase_leave_a_working_store(
    store: SqlContextStore, seed: int
) -> None:
    rng = random.Random(seed)
    await _graph(store, "c")
    await _graph(store, "reference", "r")
    await store.purge("reference")
    expected = await _state(store, "reference")
    await _chat_with_everything(store, "gone", "eve")
    await _chat_with_everything(store, "stays", "zed")
    kept = await store.export_chat("stays")
    for attempt in range(6):
        operation = store.purge("c") if attempt % 2 == 0 else store.erase_user("eve")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(operation, timeout=rng.uniform(0, 0.03))
        assert (await store.list_chats(user_id="zed"))[0].id == "stays"  # still works
    await store.purge("c")
    await store.erase_user("eve")
    # The same final state as an uncancelled run of the same graph.
    summary, reference = compaction_id("c", "m5"), compaction_id("reference", "rm5")

    def plain(state: dict[str, Any], prefix: str, summary: str) -> dict[str, Any]:
        def name(i: str | None) -> str | None:
            return "S" if i == summary else None if i is None else i.removeprefix(prefix)

        return {name(k): (name(parent), depth) for k, (parent, depth) in state.items()}

    assert plain(await _state(store, "c"), "", summary) == plain(expected, "r", reference)
    assert await store.list_chats(user_id="eve") == []
    assert await store.export_chat("stays") == kept
    assert (await store.purge("c")).deleted_messages == 0


_CHATS = itertools.count()


async def _random_chat(store: SqlContextStore, chat_id: str, seed: int, size: int) -> int:
    """A random tree of ``size`` messages with compactions, branches (some deleted) and
    checkpoints; how many compactions it has."""
    rng = random.Random(seed)
    await store.create_chat(chat_id, user_id="u")
    ids: list[str] = []
    records = []
    for i in range(size):
        parent = rng.choice(ids) if ids and rng.random() < 0.9 else None
        ids.append(f"{chat_id}-{i}")
        records.append(rec(ids[-1], chat_id, parent, f"text {i} of {chat_id}"))
    await store.add_messages(records)
    points = rng.sample(ids, k=min(len(ids), rng.randint(0, 3)))
    for point in points:
        summary = compaction_id(chat_id, point)
        await store.add_message(
            MessageRecord(
                id=summary, chat_id=chat_id, parent_id=point, name="user", type="compaction",
                data={"id": summary, "role": "user", "parts": [{"type": "text", "text": "s"}]},
            )
        )  # fmt: skip
    for n in range(rng.randint(0, 4)):
        await store.create_branch(chat_id, f"b{n}", head_message_id=rng.choice(ids))
    for n in range(rng.randint(0, 2)):
        await store.create_checkpoint(chat_id, f"k{n}", rng.choice(ids))
    for branch in await store.list_branches(chat_id):
        if not branch.is_active and rng.random() < 0.5:
            await store.delete_branch(chat_id, branch.name)
    return len(points)


async def _heads(store: SqlContextStore, chat_id: str) -> list[str]:
    targets = [b.head_message_id for b in await store.list_branches(chat_id)]
    targets += [k.message_id for k in await store.list_checkpoints(chat_id)]
    return sorted({t for t in targets if t is not None})


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(seed=st.integers(0, 100_000), size=st.integers(1, 40))
async def test_purge_never_changes_what_a_head_or_checkpoint_resolves(
    store: SqlContextStore, seed: int, size: int
) -> None:
    """Random trees with branches (some deleted), checkpoints and compactions: every branch
    head and checkpoint loads the same compacted chain after a purge, and every stored chain
    is still whole."""
    chat_id = f"p{next(_CHATS)}"
    compactions = await _random_chat(store, chat_id, seed, size)
    heads = await _heads(store, chat_id)
    before = {h: await store.load_chain_rows(chat_id, h, compacted=True) for h in heads}

    report = await store.purge(chat_id)

    after = {h: await store.load_chain_rows(chat_id, h, compacted=True) for h in heads}
    assert after == before
    left = {node.id for node in (await store.get_graph(chat_id)).nodes}
    assert report.kept_messages == len(left)
    assert report.deleted_messages == size + compactions - len(left)
    for head in heads:
        chain_ = await store.get_message_chain(head)  # whole: no InvalidGraphError
        assert chain_[-1].id == head and chain_[0].parent_id is None
    for node in left:
        await store.get_message_chain(node)
    (info,) = [c for c in await store.list_chats(user_id="u") if c.id == chat_id]
    assert info.message_count == len(left)


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(seed=st.integers(0, 100_000), size=st.integers(1, 30), purge_first=st.booleans())
async def test_a_copy_resolves_as_its_source(
    store: SqlContextStore, seed: int, size: int, purge_first: bool
) -> None:
    """Every branch head and checkpoint of a copy loads the source's compacted chain, with
    the new ids (and a purged source copies as it now is)."""
    source, target = f"s{next(_CHATS)}", f"t{next(_CHATS)}"
    await _random_chat(store, source, seed, size)
    if purge_first:
        await store.purge(source)
    mapping = await store.copy_chat(source, target)
    assert await _heads(store, target) == sorted(mapping[h] for h in await _heads(store, source))
    for head in await _heads(store, source):
        a = await store.load_chain_rows(source, head, compacted=True)
        b = await store.load_chain_rows(target, mapping[head], compacted=True)
        assert [mapping[i] for i in a.ids] == b.ids
        assert [None if p is None else mapping[p] for p in a.parent_ids] == b.parent_ids
        assert (a.summary_id and mapping[a.summary_id]) == b.summary_id
        assert (a.base_id and mapping[a.base_id]) == b.base_id
        assert [json.loads(x)["parts"] for x in a.data] == [json.loads(x)["parts"] for x in b.data]


# --- short transactions -------------------------------------------------------------------------


async def _old_chats(
    store: SqlContextStore, count: int, size: int, user_id: str = "u"
) -> list[str]:
    ids = [f"old{i}" for i in range(count)]
    for chat_id in ids:
        await store.create_chat(chat_id, user_id=user_id)
        await store.add_messages(chain(chat_id, size, prefix=f"{chat_id}-"))
        await _age(store, chat_id, 100)
    return ids


def _commits(store: SqlContextStore) -> list[int]:
    """Counts the transactions the store commits (a real observation of its batches)."""
    from sqlalchemy import event

    seen = [0]

    @event.listens_for(store.engine.sync_engine, "commit")
    def count(_conn: Any) -> None:
        seen[0] += 1

    return seen


async def test_prune_deletes_whole_chats_a_batch_at_a_time(store: SqlContextStore) -> None:
    """A prune of many chats is many short transactions, each of whole chats, with progress
    after each; the report counts exactly what the database lost."""
    ids = await _old_chats(store, 12, 120)
    await store.create_chat("young", user_id="u")
    before = await table_counts(store)
    commits = _commits(store)
    seen: list[tuple[int, int]] = []
    report = await store.prune(
        older_than=timedelta(days=30), progress=lambda d, t: seen.append((d, t))
    )
    assert sorted(report.chat_ids) == sorted(ids)
    assert commits[0] >= 3, "a prune of 1 440 messages ran in fewer than three transactions"
    assert seen[-1] == (12, 12) and len(seen) >= 3
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    after = await table_counts(store)
    assert {t: before[t] - after[t] for t in TABLES} == report.deleted
    assert [c.id for c in await store.list_chats()] == ["young"]


async def test_sqlite_retention_checkpoints_the_log_between_batches(tmp_path: Any) -> None:
    """On SQLite each pause between batches starts with a passive checkpoint of the WAL, so
    that a writer of another chat does not find it long and copy it into the database itself;
    the checkpoint runs outside the batches' transactions."""
    from sqlalchemy import event

    async with SqlContextStore(f"sqlite+aiosqlite:///{tmp_path / 'wal.db'}") as store:
        await _old_chats(store, 8, 120)
        checkpoints: list[bool] = []

        @event.listens_for(store.engine.sync_engine, "before_cursor_execute")
        def seen(conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
            if "wal_checkpoint" in statement:
                checkpoints.append(bool(conn.connection.driver_connection.in_transaction))

        batches: list[int] = []
        await store.prune(older_than=timedelta(days=30), progress=lambda d, _t: batches.append(d))
        assert len(batches) >= 3
        assert len(checkpoints) == len(batches) - 1  # after each batch but the last
        assert not any(checkpoints)  # none inside a transaction
        assert await store.list_chats() == []


async def _fts_matches(store: SqlContextStore, kind: str, scope: str) -> int:
    """How many rows of the SQLite search index match "message" in a scope."""
    from sqlalchemy import text

    from agentcontext.store._dialects.sqlite import SqliteDialect
    from agentcontext.store._rows.terms import query_terms

    query = SqliteDialect().search_params(*query_terms(["message"], kind, scope))
    match = text("SELECT count(*) FROM messages_fts WHERE messages_fts MATCH :q")
    async with store.engine.connect() as conn:
        return int(await conn.scalar(match, {"q": query["search_query"]}) or 0)


async def test_sqlite_prune_takes_its_chats_out_of_the_search_index(tmp_path: Any) -> None:
    """The terms to take out are computed ahead of each batch's write transaction; a row that
    changed since (its data or its owner) has its terms computed again inside it, so the
    index never keeps an entry of a deleted message, whatever was read ahead."""
    from agentcontext.store._dialects.sqlite import SqliteDialect

    async with SqlContextStore(f"sqlite+aiosqlite:///{tmp_path / 'fts.db'}") as store:
        ids = await _old_chats(store, 5, 40)
        await store.create_chat("keep", user_id="u")
        await store.add_messages(chain("keep", 7, prefix="keep-"))
        assert await _fts_matches(store, "user", "u") == 5 * 40 + 7
        report = await store.prune(older_than=timedelta(days=30))
        assert sorted(report.chat_ids) == ids
        for chat_id in ids:
            assert await _fts_matches(store, "chat", chat_id) == 0
        assert await _fts_matches(store, "chat", "keep") == 7
        assert await _fts_matches(store, "user", "u") == 7

        # What was read ahead is used only where the row is as it was read.
        async with store.engine.begin() as conn:
            rows = (
                await conn.execute(
                    select(M.c.seq, cast(M.c.data, LargeBinary)).where(M.c.chat_id == "keep")
                )
            ).all()
            stale = {  # data that changed; the same data under another owner
                rows[0][0]: (b'{"stale": true}', "u", "0000000000000000000000"),
                rows[1][0]: (rows[1][1], "someone-else", "0000000000000000000000"),
            }
            await conn.run_sync(lambda c: SqliteDialect().unindex_chats(c, ["keep"], stale))
        assert await _fts_matches(store, "chat", "keep") == 0
        assert await _fts_matches(store, "user", "u") == 0


async def test_a_prune_cut_short_leaves_whole_chats_and_finishes_when_run_again(
    store: SqlContextStore,
) -> None:
    ids = await _old_chats(store, 10, 150)
    task: asyncio.Task[PruneReport] | None = None

    def stop_after_first_batch(_done: int, _total: int) -> None:
        assert task is not None
        task.cancel()  # cancelled at its next step, after the batch it just committed

    task = asyncio.create_task(
        store.prune(older_than=timedelta(days=30), progress=stop_after_first_batch)
    )
    with contextlib.suppress(asyncio.CancelledError):
        await task
    listed = await store.list_chats()
    left = [chat.id for chat in listed]
    assert 0 < len(left) < len(ids)
    assert all(chat.message_count == 150 for chat in listed)  # what is left is whole
    assert (await table_counts(store))["messages"] == 150 * len(left)
    again = await store.prune(older_than=timedelta(days=30))
    assert sorted(again.chat_ids) == sorted(left)
    assert again.deleted["messages"] == 150 * len(left)
    assert await store.list_chats() == []


async def test_a_save_never_waits_for_the_whole_prune(store: SqlContextStore) -> None:
    """A writer of another chat gets its turn between two batches of a long prune: it is done
    while the prune still runs."""
    ids = await _old_chats(store, 12, 200)
    progress: list[int] = []
    first = asyncio.Event()

    def note(done: int, _total: int) -> None:
        progress.append(done)
        first.set()

    prune = asyncio.create_task(store.prune(older_than=timedelta(days=30), progress=note))
    await first.wait()  # the first batch is done
    writer = ContextEngine(store=store, chat_id="busy", user_id="u")
    writer.set(user("written meanwhile"))
    await writer.save()
    assert not prune.done() and progress[-1] < len(ids)
    report = await prune
    assert len(report.chat_ids) == len(ids)
    assert [c.id for c in await store.list_chats()] == ["busy"]


async def test_erase_user_in_batches_keeps_exact_receipts(store: SqlContextStore) -> None:
    ids = await _old_chats(store, 9, 150, user_id="leaving")
    await _chat_with_everything(store, "stays", "zed")
    before = await table_counts(store)
    commits = _commits(store)
    receipt = await store.erase_user("leaving")
    assert sorted(receipt.chat_ids) == sorted(ids)
    assert commits[0] >= 3
    after = await table_counts(store)
    assert {t: before[t] - after[t] for t in TABLES} == receipt.deleted
    assert [c.id for c in await store.list_chats()] == ["stays"]


async def test_purge_deletes_in_batches_and_a_rewind_meanwhile_is_kept(
    store: SqlContextStore,
) -> None:
    """A purge's first transaction makes the unreachable messages so for good; batches then
    delete them. A message reached again meanwhile (a rewind to it between two batches) makes
    the purge plan again: it stays, with what it needs."""
    await store.create_chat("c", user_id="u")
    await store.add_messages(chain("c", 1500, prefix="c-"))
    await store.create_branch("c", "side", head_message_id="c-1499")
    main = await store.get_active_branch("c")
    assert main is not None
    await store.update_branch_head(main.id, "c-9", main.head_message_id)
    assert await store.delete_branch("c", "side")
    progress: list[tuple[int, int]] = []
    rewound = asyncio.Event()

    def on_progress(done: int, total: int) -> None:
        progress.append((done, total))
        if len(progress) == 1:
            asyncio.get_running_loop().create_task(reach())

    async def reach() -> None:
        await store.create_checkpoint("c", "late", "c-800")
        rewound.set()

    report = await store.purge("c", progress=on_progress)
    assert rewound.is_set()
    kept = {m.id for m in await store.get_message_chain("c-800")}
    assert len(kept) == 801
    assert report.kept_messages >= 801
    assert (await store.get_message("c-1499")) is None
    assert (await table_counts(store))["messages"] == 801
    assert len(progress) >= 2


def test_a_full_collection_that_is_due_runs_between_batches_not_inside_one() -> None:
    """The interpreter runs a full collection at the first allocation after its oldest
    generation's count passes the threshold; between two batches the retention runs it first,
    so that it does not fall inside the next batch while that holds the locks."""
    threshold = gc.get_threshold()[2]
    gc.collect()
    assert gc.get_count()[2] == 0
    for _ in range(threshold - 1):
        gc.collect(1)  # each younger collection counts toward the oldest generation's
    assert gc.get_count()[2] == threshold - 1
    assert not collect_if_due()  # not due yet: nothing run, the count kept
    assert gc.get_count()[2] == threshold - 1
    gc.collect(1)
    assert collect_if_due()  # due: the full collection ran, the count starts again
    assert gc.get_count()[2] == 0
    gc.disable()
    try:
        for _ in range(threshold):
            gc.collect(1)
        assert not collect_if_due()  # the application turned collection off: left alone
    finally:
        gc.enable()


async def test_a_chain_read_whose_chat_is_deleted_meanwhile_says_the_chat_is_gone(
    store: SqlContextStore,
) -> None:
    """A read of a chain runs several statements; a chat deleted between them (another
    caller's erase_user, prune or delete_chat) is a chat that is gone, not a chain "changed
    outside agentcontext" (InvalidGraphError)."""
    import threading

    from sqlalchemy import event

    engine = ContextEngine(store=store, chat_id="doomed", user_id="u1")
    engine.set(*(user(f"message {n}", id=f"d{n}") for n in range(6)))
    await engine.save()
    url = store.engine.url
    armed, fired = [True], []

    def delete_elsewhere() -> None:
        async def run() -> None:
            async with SqlContextStore(url) as other:
                fired.append(await other.delete_chat("doomed"))

        asyncio.run(run())

    def between(conn: Any, cursor: Any, statement: str, *_rest: Any) -> None:
        # The chain's rows are read after its head: delete the chat right before them.
        if armed[0] and "messages" in statement and "parent_id" in statement:
            armed[0] = False
            worker = threading.Thread(target=delete_elsewhere)
            worker.start()
            worker.join()

    async with SqlContextStore(url) as reader:  # (a store that holds no copy of the chain)
        await reader.initialize()
        event.listen(reader.engine.sync_engine, "before_cursor_execute", between)
        with pytest.raises(ChatNotFoundError):
            await ContextEngine(store=reader, chat_id="doomed", user_id="u1").resolve()
    assert fired == [True]
