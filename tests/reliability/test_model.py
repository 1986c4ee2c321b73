"""A model-checked conversation graph.

A hypothesis state machine drives two engines on one chat (one of them, in some examples,
through a second store on the same database, as another process would) through random
sequences of set / save / save(branch=False) / rewind / btw / switch_branch / checkpoint /
restore / begin_turn / complete_turn / a whole turn begun again / compact / rename_branch /
delete_branch (forks named or not; message ids fresh or reused, folded ones included),
plus reopening an engine cold. After every step it
compares the store's graph (nodes with parents, roles and text; branches with heads, the
active flag and chain lengths; checkpoints), each engine's ``resolve()``, its branch and its
pending queue with a plain in-memory model of the DAG written here from the documented rules
(docs/graph.md), not from the engine's code.

More examples: ``AGENTCONTEXT_MODEL_EXAMPLES=2000`` (and ``AGENTCONTEXT_MODEL_STEPS``).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import shutil
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from agentcontext import (
    BranchExistsError,
    BranchInfo,
    BranchNotFoundError,
    CheckpointNotFoundError,
    ContextEngine,
    ContextFragment,
    EmptyConversationError,
    Graph,
    InvalidInputError,
    Message,
    MessageNotFoundError,
    SqlContextStore,
    XmlRenderer,
    assistant_text,
    hint,
    user,
)
from agentcontext._compaction import compaction_id
from agentcontext.engine import _TURNS
from tests.conftest import run_sync, session_url

T = TypeVar("T")

EXAMPLES = int(os.environ.get("AGENTCONTEXT_MODEL_EXAMPLES", "200"))
STEPS = int(os.environ.get("AGENTCONTEXT_MODEL_STEPS", "30"))

ENGINES = st.sampled_from([0, 1])
CHECKPOINT_NAMES = ["cp1", "cp2", "cp3"]
BRANCH_NAMES = ["main", "side", "topic", "main-v2"]
"""Names given to forks and renames (some collide with the automatic ``X-vN`` names)."""
USER_ID = "model-user"


# --- the model ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Msg:
    """A message as the model sees it: id, role and text (one text part)."""

    id: str
    role: str
    text: str
    bare: bool = False
    """A begin_turn placeholder: no parts at all (``assistant_text("")`` has one empty text
    part, so the two are not stored exactly so, though both are empty placeholders)."""

    @property
    def placeholder(self) -> bool:
        """An assistant message without text: an empty placeholder, never resolved."""
        return self.role == "assistant" and not self.text.strip()


@dataclass
class Node:
    parent: str | None
    msg: Msg


@dataclass
class EngineState:
    branch: str | None = None
    """The engine's branch; None until its first async call loads the active branch."""
    pending: list[Msg] = field(default_factory=list)
    turn: str | None = None
    """The placeholder of a turn begun and not completed."""
    hints: list[str] = field(default_factory=list)
    last_turn: tuple[ContextFragment, Msg] | None = None
    """The user message of the engine's last begun turn (to begin it again, as a caller
    retrying a whole turn whose outcome it never heard does)."""
    stale: set[str] = field(default_factory=set)
    """Names this engine may still report for its branch: it was renamed by another engine,
    and the engine learns the new name on its next call."""


@dataclass
class Fork:
    """A save that forks: ``kept`` keep their ids, ``renamed`` get fresh ones (learnt from
    the store, since they are random)."""

    name: str
    start: str | None
    kept: list[Msg]
    renamed: list[Msg]


def turn_placeholder(user_id: str) -> str:
    """The placeholder id `ContextEngine.begin_turn` derives from the user message's id."""
    return uuid.uuid5(_TURNS, user_id).hex


def dedupe(messages: list[Msg]) -> list[Msg]:
    """Pending messages sharing an id: one message, the later content at the earlier place."""
    by_id: dict[str, Msg] = {}
    for message in messages:
        by_id[message.id] = message
    return list(by_id.values())


class Model:
    """The conversation graph of one chat and what each engine holds."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.heads: dict[str, str | None] = {"main": None}
        self.active = "main"
        self.checkpoints: dict[str, str] = {}
        self.checkpoint_branch: dict[str, str | None] = {}
        """The branch each checkpoint was made on (None once deleted): restores are named
        after it."""
        self.engines = [EngineState(), EngineState()]
        self.compactions: dict[str, Msg] = {}
        """Summaries by the message they fold up to (their parent in the graph)."""

    def load(self, e: EngineState) -> None:
        """An engine's first async call loads the chat's active branch."""
        if e.branch is None:
            e.branch = self.active

    def branch_of(self, e: EngineState) -> str:
        assert e.branch is not None
        return e.branch

    def chain(self, head: str | None) -> list[Msg]:
        out: list[Msg] = []
        while head is not None:
            node = self.nodes[head]
            out.append(node.msg)
            head = node.parent
        return out[::-1]

    def fork_name(self, base: str) -> str:
        """``{root}-vN``: the root name (``-vN`` suffixes dropped), smallest free N ≥ 2."""
        root = base
        while (cut := re.sub(r"-v[0-9]+$", "", root)) != root and cut:
            root = cut
        number = 2
        while f"{root}-v{number}" in self.heads:
            number += 1
        return f"{root}-v{number}"

    def new_branch(
        self, base: str, head: str | None, *, activate: bool, name: str | None = None
    ) -> str:
        name = name or self.fork_name(base)
        assert name not in self.heads
        self.heads[name] = head
        if activate:
            self.active = name
        return name

    def rename(self, old: str, new: str) -> None:
        """A branch gets a new name: everything that named it follows."""
        if old == new:
            return
        self.heads[new] = self.heads.pop(old)
        if self.active == old:
            self.active = new
        for checkpoint, made_on in self.checkpoint_branch.items():
            if made_on == old:
                self.checkpoint_branch[checkpoint] = new
        for e in self.engines:
            if e.branch == old:
                e.branch = new
                e.stale.add(old)

    def move_to(self, e: EngineState, name: str) -> None:
        """rewind, restore and switch_branch: the engine moves, its queue and turn go."""
        self.active = name
        e.branch = name
        e.pending = []
        e.turn = None

    def save(self, e: EngineState, *, branch: bool) -> Fork | None:
        """Apply a save; a fork is returned to be finished with :meth:`commit_fork`."""
        messages = dedupe(e.pending)
        applied = self.applied(e, messages)
        if applied == len(messages):
            e.pending = []
            return None
        messages = messages[applied:]
        existing = [i for i, m in enumerate(messages) if m.id in self.nodes]
        name = self.branch_of(e)
        if branch and existing:
            # Saving an id that exists: a new branch from its parent, the original intact.
            first = existing[0]
            return Fork(
                name=self.fork_name(name),
                start=self.nodes[messages[first].id].parent,
                kept=messages[:first],
                renamed=messages[first:],
            )
        head = self.heads[name]
        for message in messages:
            if message.id in self.nodes:
                self.nodes[message.id].msg = message  # in place: same id, same parent
            else:
                self.nodes[message.id] = Node(head, message)
                head = message.id
        self.heads[name] = head
        e.pending = []
        return None

    def applied(self, e: EngineState, messages: list[Msg]) -> int:
        """How many leading messages a save finds on the branch exactly so (a retry after a
        lost outcome): all of them, consecutive, anywhere on the part of the branch after its
        compaction; or some, ending at the head."""
        if not messages:
            return 0
        head = self.heads[self.branch_of(e)]
        visible = self.compacted(self.chain(head))[1]
        ids = [m.id for m in visible]
        if messages[0].id not in ids:
            return 0
        position, count = ids.index(messages[0].id), 0
        while (
            count < len(messages)
            and position + count < len(visible)
            and visible[position + count] == messages[count]
        ):
            count += 1
        if count and count < len(messages) and messages[count - 1].id != head:
            return 0
        return count

    def stored_turn(self, e: EngineState, question: Msg) -> str | None:
        """The placeholder of a turn begun again: the question exactly so on the branch (after
        its compaction), its placeholder right after it."""
        visible = self.compacted(self.chain(self.heads[self.branch_of(e)]))[1]
        placeholder = turn_placeholder(question.id)
        for index, message in enumerate(visible[:-1]):
            if message == question and visible[index + 1].id == placeholder:
                return placeholder
        return None

    def commit_fork(self, e: EngineState, fork: Fork, fresh_ids: list[str]) -> None:
        parent = fork.start
        renamed = [replace(m, id=i) for m, i in zip(fork.renamed, fresh_ids, strict=True)]
        for message in fork.kept + renamed:
            self.nodes[message.id] = Node(parent, message)
            parent = message.id
        self.heads[fork.name] = parent
        self.active = fork.name
        e.branch = fork.name
        e.pending = []

    def resolved(self, e: EngineState) -> list[Msg]:
        """What resolve() shows: the chain, pending messages replacing stored ones of the same
        id in place and the others appended, empty placeholders left out."""
        summary, visible = self.compacted(self.chain(self.heads[self.branch_of(e)]))
        overrides = {m.id: m for m in dedupe(e.pending)}
        out = [overrides.pop(m.id, m) for m in visible]
        out.extend(overrides.values())
        return ([] if summary is None else [summary]) + [m for m in out if not m.placeholder]

    def compacted(self, chain: list[Msg]) -> tuple[Msg | None, list[Msg]]:
        """The deepest compaction on a chain and the messages after it."""
        for index in range(len(chain) - 1, -1, -1):
            if chain[index].id in self.compactions:
                return self.compactions[chain[index].id], chain[index + 1 :]
        return None, chain


async def summarize(messages: list[Message]) -> str:
    """A deterministic summary naming the last message it folds."""
    return f"S:{len(messages)}:{messages[-1].id}"


# --- the machine ----------------------------------------------------------------------------


@dataclass
class Target:
    """Where the examples run: a database URL per example, and what to do after one."""

    new_url: Callable[[], str]
    cleanup: Callable[[str], None]


class GraphMachine(RuleBasedStateMachine):
    target: Target

    def __init__(self) -> None:
        super().__init__()
        self.runner = asyncio.Runner()
        self.tag = uuid.uuid4().hex[:10]  # message ids are global: unique per example
        self.chat_id = f"model-{self.tag}"
        self.url = self.target.new_url()
        self.counter = 0
        self.model = Model()
        self.stores: list[SqlContextStore] = []
        self.engine_store: list[SqlContextStore] = []
        self.engines: list[ContextEngine] = []
        self.eager = True
        self.touched: int | None = None

    def run(self, factory: Callable[[], Awaitable[T]]) -> T:
        async def call() -> T:
            return await factory()

        return self.runner.run(call())

    def fresh(self, kind: str) -> str:
        self.counter += 1
        return f"{kind}{self.counter}"

    def teardown(self) -> None:
        try:
            for store in self.stores:
                self.run(store.close)
        finally:
            self.runner.close()
            self.target.cleanup(self.url)

    # --- setup ------------------------------------------------------------------------------

    @initialize(second_store=st.booleans(), eager=st.booleans())
    def open(self, second_store: bool, eager: bool) -> None:
        # Eager: every step resolves both engines (their caches never lag). Otherwise only
        # the engine that acted is resolved, so the other one's cache falls behind and its
        # next call has to catch up with what was written meanwhile.
        self.eager = eager
        first = SqlContextStore(self.url)
        self.stores.append(first)
        self.engine_store = [first, first]
        if second_store:
            other = SqlContextStore(self.url)
            self.stores.append(other)
            self.engine_store[1] = other
        self.engines = [self.new_engine(0), self.new_engine(1)]
        # Engine 0 creates the chat; engine 1 loads it lazily, on its first async call.
        self.run(self.engines[0].initialize)
        self.model.load(self.model.engines[0])

    def new_engine(self, i: int) -> ContextEngine:
        return ContextEngine(store=self.engine_store[i], chat_id=self.chat_id, user_id=USER_ID)

    # --- helpers ----------------------------------------------------------------------------

    def acting(self, i: int) -> ContextEngine:
        """Engine ``i`` acts in this step: the comparison after it resolves that engine."""
        self.touched = i
        return self.engines[i]

    def draw_id(self, data: st.DataObject, i: int) -> str | None:
        """A message id: fresh, generated by the builder (None), or reused — stored anywhere,
        on this engine's branch, pending in this engine or pending in the other one."""
        kind = data.draw(
            st.sampled_from(["fresh", "fresh", "auto", "stored", "chain", "pending", "other"]),
            label="id kind",
        )
        if kind == "auto":
            return None
        pool: list[str] = []
        e = self.model.engines[i]
        if kind == "stored":
            pool = list(self.model.nodes)
        elif kind == "chain" and e.branch is not None:
            pool = [m.id for m in self.model.chain(self.model.heads[e.branch])]
        elif kind == "pending":
            pool = [m.id for m in e.pending]
        elif kind == "other":
            pool = [m.id for m in self.model.engines[1 - i].pending]
        if not pool:
            return f"{self.tag}-{self.fresh('m')}"
        return data.draw(st.sampled_from(pool), label="reused id")

    def build(self, role: str, text: str, message_id: str | None) -> tuple[ContextFragment, Msg]:
        fragment = (
            user(text, id=message_id) if role == "user" else assistant_text(text, id=message_id)
        )
        assert fragment.id is not None
        return fragment, Msg(fragment.id, role, text)

    def draw_name(self, data: st.DataObject) -> str | None:
        """The name of a fork: automatic (None) mostly, else one of `BRANCH_NAMES`."""
        if data.draw(st.integers(0, 3), label="named") != 0:
            return None
        return data.draw(st.sampled_from(BRANCH_NAMES), label="branch name")

    def expect_error(self, error: type[Exception], factory: Callable[[], Awaitable[Any]]) -> None:
        with pytest.raises(error):
            self.run(factory)

    async def fork_ids(self, fork: Fork) -> list[str]:
        """The fresh ids of a fork: the last messages of the new branch's chain."""
        graph = await self.engine_store[0].get_graph(self.chat_id)
        heads = {b.name: b.head_message_id for b in graph.branches}
        assert fork.name in heads, f"the save should have forked {fork.name!r}: {sorted(heads)}"
        parents = {n.id: n.parent_id for n in graph.nodes}
        ids: list[str] = []
        current = heads[fork.name]
        for _ in fork.renamed:
            assert current is not None, f"branch {fork.name!r} is too short"
            ids.append(current)
            current = parents[current]
        ids.reverse()
        for message_id in ids:
            assert message_id not in self.model.nodes, f"fork reused the id {message_id!r}"
        assert len(set(ids)) == len(ids)
        return ids

    def do_save(self, i: int, *, branch: bool, call: Callable[[], Awaitable[T]]) -> T:
        """Run a call that saves engine ``i``'s pending queue (as the model holds it) and
        apply the same save to the model."""
        e = self.model.engines[i]
        self.model.load(e)
        result = self.run(call)
        fork = self.model.save(e, branch=branch)
        if fork is not None:
            self.model.commit_fork(e, fork, self.run(lambda: self.fork_ids(fork)))
        return result

    def check_branch_info(self, info: BranchInfo, name: str, *, active: bool) -> None:
        head = self.model.heads[name]
        assert (info.name, info.head_message_id, info.is_active) == (name, head, active)
        assert info.message_count == len(self.model.chain(head))

    # --- rules ------------------------------------------------------------------------------

    @rule(i=ENGINES, role=st.sampled_from(["user", "assistant"]), data=st.data())
    def set_message(self, i: int, role: str, data: st.DataObject) -> None:
        text = self.fresh(role[0])
        if role == "assistant" and data.draw(st.integers(0, 5), label="empty") == 0:
            text = ""  # an empty assistant message is a placeholder too
        fragment, message = self.build(role, text, self.draw_id(data, i))
        self.engines[i].set(fragment)
        self.model.engines[i].pending.append(message)

    @rule(i=ENGINES)
    def set_hint(self, i: int) -> None:
        text = self.fresh("hint")
        self.engines[i].set(hint(text))
        self.model.engines[i].hints.append(text)

    @rule(i=ENGINES, branch=st.booleans())
    def save(self, i: int, branch: bool) -> None:
        engine = self.acting(i)
        had_pending = bool(self.model.engines[i].pending)
        result = self.do_save(i, branch=branch, call=lambda: engine.save(branch=branch))
        e = self.model.engines[i]
        if had_pending:
            assert result.head_message_id == self.model.heads[self.model.branch_of(e)]

    @rule(i=ENGINES, data=st.data())
    def begin_turn(self, i: int, data: st.DataObject) -> None:
        fragment, message = self.build("user", self.fresh("q"), self.draw_id(data, i))
        self.begin(i, fragment, message)

    @rule(i=ENGINES)
    def retry_turn(self, i: int) -> None:
        """Begin the engine's last turn again with the very same fragment: a caller retrying
        a whole turn (begin and complete) whose outcome it never heard."""
        last = self.model.engines[i].last_turn
        if last is not None:
            self.begin(i, *last)

    def begin(self, i: int, fragment: ContextFragment, message: Msg) -> None:
        engine = self.acting(i)
        e = self.model.engines[i]
        self.model.load(e)
        if any(m.id == turn_placeholder(message.id) for m in e.pending):
            # The turn's placeholder id is queued already (as another message): refused.
            self.expect_error(InvalidInputError, lambda: engine.begin_turn(fragment))
            return
        stored = None if e.pending else self.model.stored_turn(e, message)
        if stored is not None:
            # The turn is on the branch already (completed or not): nothing is written and
            # its placeholder comes back.
            placeholder = self.run(lambda: engine.begin_turn(fragment))
            assert placeholder == stored, f"a retried turn gave {placeholder!r}"
        else:
            pending = dedupe(
                [*e.pending, message, Msg(turn_placeholder(message.id), "assistant", "", bare=True)]
            )
            retried = self.model.applied(e, pending) == len(pending)
            placeholder = self.do_save(
                i, branch=True, call=lambda: self._begin(engine, fragment, e, message)
            )
            head = self.model.heads[self.model.branch_of(e)]
            if retried:  # stored exactly so already (not necessarily at the head)
                assert placeholder == turn_placeholder(message.id)
            else:
                # The returned id is the stored placeholder: the head of the engine's branch.
                assert head is not None and self.model.nodes[head].msg.placeholder
                assert placeholder == head, f"begin_turn returned {placeholder!r}, stored {head!r}"
                assert engine.head_message_id == placeholder
        e.turn = placeholder
        e.last_turn = (fragment, message)

    async def _begin(
        self, engine: ContextEngine, fragment: ContextFragment, e: EngineState, message: Msg
    ) -> str:
        placeholder = await engine.begin_turn(fragment)
        e.pending += [message, Msg(turn_placeholder(message.id), "assistant", "", bare=True)]
        return placeholder

    @rule(i=ENGINES)
    def complete_turn(self, i: int) -> None:
        engine = self.acting(i)
        e = self.model.engines[i]
        self.model.load(e)
        target = e.turn
        if target is None:
            head = self.model.heads[self.model.branch_of(e)]
            if head is None or not self.model.nodes[head].msg.placeholder:
                self.expect_error(
                    EmptyConversationError, lambda: engine.complete_turn(assistant_text("x"))
                )
                return
            target = head
        text = self.fresh("a")
        e.pending.append(Msg(target, "assistant", text))
        try:
            self.do_save(i, branch=False, call=lambda: engine.complete_turn(assistant_text(text)))
        finally:
            e.turn = None

    @rule(i=ENGINES, data=st.data())
    def rewind(self, i: int, data: st.DataObject) -> None:
        engine = self.acting(i)
        e = self.model.engines[i]
        self.model.load(e)
        known = list(self.model.nodes)
        if not known or data.draw(st.integers(0, 9), label="unknown") == 0:
            ghost = f"{self.tag}-ghost"
            self.expect_error(MessageNotFoundError, lambda: engine.rewind(ghost))
            return
        target = data.draw(st.sampled_from(known), label="rewind to")
        named = self.draw_name(data)
        if named in self.model.heads:
            self.expect_error(BranchExistsError, lambda: engine.rewind(target, name=named))
            return
        info = self.run(lambda: engine.rewind(target, name=named))
        name = self.model.new_branch(self.model.branch_of(e), target, activate=True, name=named)
        self.model.move_to(e, name)
        self.check_branch_info(info, name, active=True)

    @rule(i=ENGINES, name=st.sampled_from(CHECKPOINT_NAMES))
    def checkpoint(self, i: int, name: str) -> None:
        engine = self.acting(i)
        e = self.model.engines[i]
        self.model.load(e)
        head = self.model.heads[self.model.branch_of(e)]
        if head is None:
            self.expect_error(EmptyConversationError, lambda: engine.checkpoint(name))
            return
        checkpoint = self.run(lambda: engine.checkpoint(name))
        self.model.checkpoints[name] = head
        self.model.checkpoint_branch[name] = self.model.branch_of(e)
        assert (checkpoint.name, checkpoint.message_id) == (name, head)

    @rule(i=ENGINES, name=st.sampled_from([*CHECKPOINT_NAMES, "cp-missing"]), data=st.data())
    def restore(self, i: int, name: str, data: st.DataObject) -> None:
        engine = self.acting(i)
        e = self.model.engines[i]
        self.model.load(e)
        if name not in self.model.checkpoints:
            self.expect_error(CheckpointNotFoundError, lambda: engine.restore(name))
            return
        named = self.draw_name(data)
        if named in self.model.heads:
            self.expect_error(BranchExistsError, lambda: engine.restore(name, name=named))
            return
        info = self.run(lambda: engine.restore(name, name=named))
        target = self.model.checkpoints[name]
        made_on = self.model.checkpoint_branch[name] or self.model.branch_of(e)
        new = self.model.new_branch(made_on, target, activate=True, name=named)
        self.model.move_to(e, new)
        self.check_branch_info(info, new, active=True)

    @rule(i=ENGINES, data=st.data())
    def switch_branch(self, i: int, data: st.DataObject) -> None:
        engine = self.acting(i)
        e = self.model.engines[i]
        self.model.load(e)
        name = data.draw(
            st.sampled_from([*sorted(self.model.heads), "no-such-branch"]), label="branch"
        )
        if name not in self.model.heads:
            self.expect_error(BranchNotFoundError, lambda: engine.switch_branch(name))
            return
        info = self.run(lambda: engine.switch_branch(name))
        self.model.move_to(e, name)
        self.check_branch_info(info, name, active=True)

    @rule(i=ENGINES, data=st.data())
    def btw(self, i: int, data: st.DataObject) -> None:
        engine = self.acting(i)
        e = self.model.engines[i]
        self.model.load(e)
        base = self.model.branch_of(e)
        head = self.model.heads[base]
        if head is None:
            self.expect_error(EmptyConversationError, engine.btw)
            return
        named = self.draw_name(data)
        if named in self.model.heads:
            self.expect_error(BranchExistsError, lambda: engine.btw(name=named))
            return
        info = self.run(lambda: engine.btw(name=named))
        name = self.model.new_branch(base, head, activate=False, name=named)
        self.check_branch_info(info, name, active=False)

    @rule(i=ENGINES, keep=st.integers(0, 2))
    def compact(self, i: int, keep: int) -> None:
        """Fold all but the last ``keep`` turns of engine ``i``'s branch into a summary."""
        engine = self.acting(i)
        e = self.model.engines[i]
        self.model.load(e)
        head = self.model.heads[self.model.branch_of(e)]
        previous, stored = self.model.compacted(self.model.chain(head))
        starts = [n for n, m in enumerate(stored) if m.role == "user"]
        cut = len(stored) if keep == 0 else 0 if len(starts) <= keep else starts[-keep]
        if stored and stored[-1].placeholder:  # a turn in progress is never folded
            cut = min(cut, starts[-1] if starts else 0)
        while cut and stored[cut - 1].placeholder:  # nor is a fold point a placeholder
            cut -= 1
        folded = [m for m in stored[:cut] if not m.placeholder]
        if not folded and previous is not None:
            # Compacted as asked already: the stored compaction comes back, nothing is written.
            compaction = self.run(lambda: engine.compact(summarize, keep_last_turns=keep))
            assert compaction.id == previous.id
            return
        if not folded:
            self.expect_error(
                EmptyConversationError, lambda: engine.compact(summarize, keep_last_turns=keep)
            )
            return
        through = stored[cut - 1].id
        compaction = self.run(lambda: engine.compact(summarize, keep_last_turns=keep))
        assert compaction.id == compaction_id(self.chat_id, through)
        given = ([] if previous is None else [previous]) + folded
        text = f"S:{len(given)}:{given[-1].id}"
        self.model.compactions[through] = Msg(compaction.id, "user", text)

    @rule(i=ENGINES, data=st.data())
    def rename_branch(self, i: int, data: st.DataObject) -> None:
        engine = self.acting(i)
        e = self.model.engines[i]
        self.model.load(e)
        heads = self.model.heads
        old = data.draw(st.sampled_from([*sorted(heads), "no-such-branch"]), label="old name")
        new = data.draw(st.sampled_from(sorted({*BRANCH_NAMES, *heads})), label="new name")
        if old not in heads:
            self.expect_error(BranchNotFoundError, lambda: engine.rename_branch(old, new))
            return
        if new != old and new in heads:
            self.expect_error(BranchExistsError, lambda: engine.rename_branch(old, new))
            return
        renamed = self.run(lambda: engine.rename_branch(old, new))
        self.model.rename(old, new)
        e.stale.discard(old)  # the engine that renamed knows the new name at once
        assert (renamed.name, renamed.head_message_id) == (new, heads[new])
        assert renamed.is_active == (new == self.model.active)

    @rule(i=ENGINES, data=st.data())
    def delete_branch(self, i: int, data: st.DataObject) -> None:
        engine = self.acting(i)
        e = self.model.engines[i]
        self.model.load(e)
        heads = self.model.heads
        name = data.draw(st.sampled_from([*sorted(heads), "no-such-branch"]), label="delete")
        if name not in heads:
            assert self.run(lambda: engine.delete_branch(name)) is False
            return
        if name in (e.branch, self.model.active):
            # The engine's own branch, or the chat's active one: refused, nothing changes.
            self.expect_error(InvalidInputError, lambda: engine.delete_branch(name))
            return
        if any(other.branch == name for other in self.model.engines):
            self.run(engine.initialize)  # loaded, as the model says (load() above)
            return  # the other engine's branch: covered by plain tests
        assert self.run(lambda: engine.delete_branch(name)) is True
        del heads[name]  # its messages stay: the node comparison checks it
        for checkpoint, made_on in self.model.checkpoint_branch.items():
            if made_on == name:
                self.model.checkpoint_branch[checkpoint] = None

    @rule(i=ENGINES)
    def look(self, i: int) -> None:
        """Read engine ``i`` (the comparison resolves it), and its get_messages()."""
        engine = self.acting(i)
        e = self.model.engines[i]
        self.model.load(e)
        got = [(m.id, m.role, m.text) for m in self.run(engine.get_messages)]
        assert got == [(m.id, m.role, m.text) for m in self.model.resolved(e)]

    @rule(i=ENGINES)
    def reopen(self, i: int) -> None:
        """A new engine in the slot (another request handler): cold cache, empty queue, and it
        loads the chat's active branch on its first async call."""
        self.engines[i] = self.new_engine(i)
        self.model.engines[i] = EngineState()

    # --- the comparison ---------------------------------------------------------------------

    @invariant()
    def agrees_with_model(self) -> None:
        self.run(self.compare)

    async def compare(self) -> None:
        model = self.model
        graph: Graph = await self.engine_store[0].get_graph(self.chat_id)
        nodes = {n.id: (n.parent_id, n.role, n.preview) for n in graph.nodes}
        expected_nodes = {
            message_id: (node.parent, node.msg.role, node.msg.text)
            for message_id, node in model.nodes.items()
        }
        expected_nodes.update(
            {s.id: (through, s.role, s.text) for through, s in model.compactions.items()}
        )
        assert nodes == expected_nodes
        branches = {
            b.name: (b.head_message_id, b.is_active, b.message_count) for b in graph.branches
        }
        assert branches == {
            name: (head, name == model.active, len(model.chain(head)))
            for name, head in model.heads.items()
        }
        checkpoints = {c.name: c.message_id for c in graph.checkpoints}
        assert checkpoints == model.checkpoints
        active = await self.engine_store[1].get_messages(self.chat_id)
        assert [r.id for r in active] == [m.id for m in model.chain(model.heads[model.active])]

        for i, (engine, e) in enumerate(zip(self.engines, model.engines, strict=True)):
            assert [f.id for f in engine.pending] == [m.id for m in e.pending], f"engine {i}"
            if e.branch is None:
                assert engine.branch is None
                continue  # not loaded yet: leave it to load lazily in a later step
            assert engine.branch in {e.branch, *e.stale}, f"engine {i}"
            if not self.eager and i != self.touched:
                continue  # its cache may lag; it catches up on its next call
            result = await engine.resolve()
            assert engine.branch == e.branch, f"engine {i}"
            e.stale.clear()
            expected = model.resolved(e)
            got = [(m.id, m.role, m.text) for m in result.messages]
            assert got == [(m.id, m.role, m.text) for m in expected], f"engine {i}"
            assert result.system_prompt == XmlRenderer().render([hint(t) for t in e.hints])
            assert engine.head_message_id == model.heads[e.branch], f"engine {i}"


# --- the tests ------------------------------------------------------------------------------


def machine_settings() -> settings:
    return settings(
        max_examples=EXAMPLES,
        stateful_step_count=STEPS,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


async def migrate(url: str) -> None:
    async with SqlContextStore(url):
        pass


def test_graph_matches_the_model(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "sqlite":
        # A fresh database per example, copied from one migrated once.
        template = tmp_path / "template.db"
        run_sync(lambda: migrate(f"sqlite+aiosqlite:///{template}"))
        files = itertools.count()

        def new_url() -> str:
            path = tmp_path / f"example-{next(files)}.db"
            shutil.copyfile(template, path)
            return f"sqlite+aiosqlite:///{path}"

        def cleanup(url: str) -> None:
            path = url.removeprefix("sqlite+aiosqlite:///")
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(path + suffix).unlink(missing_ok=True)

        target = Target(new_url, cleanup)
    else:
        url = session_url(backend, request, empty=False)
        # One migrated database; every example has a chat (and message ids) of its own.
        target = Target(lambda: url, lambda _: None)

    machine = type(f"GraphMachine_{backend}", (GraphMachine,), {"target": target})
    run_state_machine_as_test(machine, settings=machine_settings())


# --- what the model found, as plain examples ----------------------------------------------


async def test_begin_turn_with_an_existing_user_id_returns_the_stored_placeholder(
    store: SqlContextStore,
) -> None:
    engine = ContextEngine(store=store, chat_id="c1", user_id="u1")
    await engine.begin_turn(user("q", id="q1"))
    await engine.complete_turn(assistant_text("a"))
    placeholder = await engine.begin_turn(user("q again", id="q1"))  # forks: fresh ids
    assert engine.branch == "main-v2"
    assert engine.head_message_id == placeholder
    assert await store.get_message(placeholder) is not None
    await engine.complete_turn(assistant_text("answer"))
    assert [m.text for m in await engine.get_messages()] == ["q again", "answer"]
    assert len((await store.get_graph("c1")).nodes) == 4


async def test_a_fork_never_writes_over_an_earlier_message_of_the_turn(
    store: SqlContextStore,
) -> None:
    first = ContextEngine(store=store, chat_id="c1", user_id="u1")
    second = ContextEngine(store=store, chat_id="c1", user_id="u1")
    first.set(user("q", id="q1"), assistant_text("a", id="a1"))
    await first.save()
    await second.rewind("q1")  # main-v2 at q1
    second.set(assistant_text("other answer", id="x1"))
    await second.save()
    # x1 lives on main-v2, off the first engine's chain; a1 is on it.
    first.set(assistant_text("x1 resent", id="x1"), assistant_text("a1 resent", id="a1"))
    await first.save()
    x1 = await store.get_message("x1")
    assert x1 is not None and x1.parent_id == "q1" and x1.data["parts"][0]["text"] == "other answer"
    messages = await first.get_messages()
    assert [m.text for m in messages] == ["q", "x1 resent", "a1 resent"]  # forked at q1
    assert "x1" not in [m.id for m in messages] and "a1" not in [m.id for m in messages]


async def test_an_in_place_update_off_the_branch_stays_off_the_cached_chain(
    store: SqlContextStore,
) -> None:
    engine = ContextEngine(store=store, chat_id="c1", user_id="u1")
    engine.set(user("q", id="q1"), assistant_text("a", id="a1"))
    await engine.save()
    await engine.rewind("q1")
    assert [m.text for m in await engine.get_messages()] == ["q"]  # the cache is up to date
    engine.set(user("a1 edited", id="a1"), user("new", id="n1"))
    await engine.save(branch=False)  # a1 (on main) in place, n1 appended to main-v2
    expected = ["q", "new"]
    assert [m.text for m in await engine.get_messages()] == expected
    cold = ContextEngine(store=store, chat_id="c1", user_id="u1")
    assert [m.text for m in await cold.get_messages()] == expected


async def test_an_in_place_save_returns_the_stored_head(store: SqlContextStore) -> None:
    first = ContextEngine(store=store, chat_id="c1", user_id="u1")
    second = ContextEngine(store=store, chat_id="c1", user_id="u1")
    first.set(user("q", id="q1"))
    await first.save()
    await second.get_messages()
    second.set(assistant_text("a", id="a1"))
    await second.save()
    first.set(user("q edited", id="q1"))
    result = await first.save(branch=False)  # first has not seen a1
    assert result.head_message_id == "a1"


# --- sequences the model found (or that were reported), run through the model as written -----


class Scripted:
    """Stands for hypothesis's ``data`` in a rule: answers the rule's draws in order. An answer
    that is a callable is given the elements the rule draws from and picks one."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)

    def draw(self, strategy: Any, label: str | None = None) -> Any:
        answer = self.answers.pop(0)
        if callable(answer):
            elements = getattr(strategy, "elements", None)
            if elements is None:
                elements = strategy.wrapped_strategy.elements
            return answer(list(elements))
        return answer


def scripted_machine(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> GraphMachine:
    if backend == "sqlite":
        path = tmp_path / "scripted.db"
        target = Target(lambda: f"sqlite+aiosqlite:///{path}", lambda _: None)
    else:
        url = session_url(backend, request, empty=False)
        target = Target(lambda: url, lambda _: None)
    machine_class = type(f"Scripted_{backend}", (GraphMachine,), {"target": target})
    return machine_class()


def play(machine: GraphMachine, steps: list[tuple[str, dict[str, Any]]]) -> None:
    """Run rules one after another, checking the model after each (as hypothesis does)."""
    try:
        machine.open(second_store=False, eager=True)
        machine.agrees_with_model()
        for name, arguments in steps:
            getattr(machine, name)(**arguments)
            machine.agrees_with_model()
    finally:
        machine.teardown()


def fresh_id() -> Scripted:
    return Scripted("fresh")


def reused(kind: str, index: int) -> Scripted:
    return Scripted(kind, lambda pool: pool[index])


def test_a_turn_begun_with_stored_ids_after_a_compaction_is_the_head(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """begin_turn(q1), begin_turn(q2), set(u3 with q1's id), compact everything, then
    begin_turn with q2's id again: the turn forks to a new branch, and begin_turn returns that
    branch's placeholder (it returned the old one on main)."""
    play(
        scripted_machine(backend, tmp_path, request),
        [
            ("begin_turn", {"i": 0, "data": fresh_id()}),
            ("begin_turn", {"i": 0, "data": fresh_id()}),
            ("set_message", {"i": 0, "role": "user", "data": reused("chain", 0)}),
            ("compact", {"i": 0, "keep": 0}),
            ("begin_turn", {"i": 0, "data": reused("stored", 2)}),
            ("complete_turn", {"i": 0}),
            ("look", {"i": 0}),
        ],
    )


def test_a_whole_turn_begun_again_after_it_was_completed_writes_nothing(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """begin_turn + complete_turn, then both again with the same fragments (the caller never
    heard they landed): no fork, no second question; then a turn by the other engine, and the
    first turn retried once more (it is below the head now)."""
    play(
        scripted_machine(backend, tmp_path, request),
        [
            ("begin_turn", {"i": 0, "data": fresh_id()}),
            ("complete_turn", {"i": 0}),
            ("retry_turn", {"i": 0}),
            ("complete_turn", {"i": 0}),
            ("begin_turn", {"i": 1, "data": fresh_id()}),
            ("retry_turn", {"i": 0}),
            ("retry_turn", {"i": 1}),
            ("complete_turn", {"i": 1}),
        ],
    )


def test_rewinds_of_rewinds_are_named_from_the_root_and_restores_after_the_checkpoint(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    play(
        scripted_machine(backend, tmp_path, request),
        [
            ("set_message", {"i": 0, "role": "user", "data": fresh_id()}),
            ("save", {"i": 0, "branch": True}),
            ("checkpoint", {"i": 0, "name": "cp1"}),
            # rewind to the first message: "unknown" no (1), target index 0, automatic name
            ("rewind", {"i": 0, "data": Scripted(1, lambda nodes: nodes[0], 1)}),
            ("rewind", {"i": 0, "data": Scripted(1, lambda nodes: nodes[0], 1)}),
            ("rename_branch", {"i": 0, "data": Scripted("main", "topic")}),
            ("restore", {"i": 0, "name": "cp1", "data": Scripted(1)}),
        ],
    )
