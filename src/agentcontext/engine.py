"""ContextEngine: the system prompt and the conversation graph of one chat, for one user.

The engine keeps two lists: context fragments (they render into the system prompt) and pending
message fragments (they become nodes of the graph on `ContextEngine.save`). It talks only to
the store interface (`EngineStore`, which every `ContextStore` is).

The public verbs live here, with their docstrings and argument checks; the concerns behind
them have modules of their own, each given the state it needs, never the engine:
``_conversation`` (the chat, its branch and chain, kept in step with the store), ``_pending``
(the pending queue and the conversation it makes with the chain), ``_request`` (what a model
is sent), ``_save`` (compare-and-swap, grafting, idempotent retries), ``_turns`` (streaming
turns), ``_branching``, ``_records``, ``_inspect``, ``_history``, ``_metadata``,
``_compaction`` and ``reminders.engine``. What they read of the chain is a `ChainView`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from agentcontext import _branching as branching
from agentcontext import _history as history
from agentcontext import _records as records
from agentcontext import _request as request
from agentcontext import _telemetry as telemetry
from agentcontext import _validate as v
from agentcontext._compaction import Compaction, Summarizer
from agentcontext._compaction import compact as compact_branch
from agentcontext._conversation import DELETED, Conversation
from agentcontext._inspect import InspectFragments, InspectMeta, InspectResult, build_inspect
from agentcontext._metadata import add_to_usage, retitle
from agentcontext._pending import PendingQueue
from agentcontext._save import SaveResult, save_turn, with_consistency_token
from agentcontext._storetypes import check_store
from agentcontext._turns import TURNS as _TURNS  # noqa: F401 (importable here, as before)
from agentcontext._turns import (
    TurnTracker,
    placeholder_fragment,
    stored_turn,
    turn_at_head,
    turn_message,
)
from agentcontext._window import ContextWindow
from agentcontext.errors import (
    ChatNotFoundError,
    InvalidInputError,
    InvalidTypeError,
    NotFoundError,
)
from agentcontext.estimate import Estimate
from agentcontext.fragments import (
    ContextFragment,
    check_fragment_data,
    is_lazy_fragment,
    is_message_fragment,
    message_of,
    with_message_id,
)
from agentcontext.lazy import LazyResolver, LoadContext
from agentcontext.messages import Message, ResolveResult
from agentcontext.reminders.engine import remind, without_reminders
from agentcontext.renderers import ContextRenderer
from agentcontext.snapshots import ContextSnapshot
from agentcontext.store.protocols import ConsistencyTokens, EngineStore
from agentcontext.store.records import Branch, BranchInfo, Chat, Checkpoint, ResolveRecord
from agentcontext.usage import as_mapping, normalize_usage

__all__ = [
    "Compaction",
    "ContextEngine",
    "ContextWindow",
    "InspectFragments",
    "InspectMeta",
    "InspectResult",
    "SaveResult",
]


class ContextEngine:
    """The context of one chat for one user: system-prompt fragments and the message graph.

    Args:
        store: Where the chat lives.
        chat_id: The chat; created on first use if it does not exist.
        user_id: Its owner. Opening another user's chat raises `ChatOwnershipError`.
        metadata: Merged into the chat's metadata once, on first use.
        lazy_max_depth: Deepest chain of lazy values loaded (default 10).
        lazy_max_items: Most items one lazy generator may yield (default 10 000).
        after: A `SaveResult.consistency_token` from another process: with read replicas,
            this engine's reads of the chat then see that save (a replica serves them only
            once it has replayed it). None (default): no such wait.

    The engine initialises itself on the first async call: it opens the chat (creating it),
    checks its owner, merges ``metadata`` and takes the chat's active branch (whatever its
    name).

    For example:

    ```python
    context = ContextEngine(store=store, chat_id="chat-1", user_id="user-1")
    context.set(role("You are helpful."), user("Hello!"))
    result = await context.resolve()
    context.set(assistant_text("Hi there!"))
    await context.save()
    ```
    """

    def __init__(
        self,
        *,
        store: EngineStore,
        chat_id: str,
        user_id: str,
        metadata: Mapping[str, Any] | None = None,
        lazy_max_depth: int = 10,
        lazy_max_items: int = 10_000,
        after: str | None = None,
    ) -> None:
        check_store(store)
        self._store = store
        checked_metadata = None if metadata is None else v.check_json_object(metadata, "metadata")
        checked_chat = v.check_id(chat_id, "chat_id")
        self._conv = Conversation(
            store,
            checked_chat,
            v.check_id(user_id, "user_id"),
            checked_metadata,
            store.write_turn(checked_chat),
        )
        v.check_int(lazy_max_depth, "lazy_max_depth", minimum=1)
        v.check_int(lazy_max_items, "lazy_max_items", minimum=0)
        self._resolver = LazyResolver(max_depth=lazy_max_depth, max_items=lazy_max_items)
        if after is not None:
            if not isinstance(store, ConsistencyTokens):
                raise InvalidInputError(
                    f"after= needs a store that takes consistency tokens (a ContextStore), got "
                    f"{v.type_name(store)}"
                )
            store.read_after(checked_chat, after)
        self._fragments: list[ContextFragment] = []
        self._pending = PendingQueue()
        self._turns = TurnTracker()
        self._lock = asyncio.Lock()

    # --- properties -------------------------------------------------------------------------

    @property
    def store(self) -> EngineStore:
        """The store the engine writes to."""
        return self._store

    @property
    def chat_id(self) -> str:
        """The chat's id."""
        return self._conv.chat_id

    @property
    def user_id(self) -> str:
        """The owner's id."""
        return self._conv.user_id

    @property
    def branch(self) -> str | None:
        """The name of the engine's branch (the chat's active branch when it was loaded, or the
        one it moved to); None before the first async call, and after a rollback of the
        caller's transaction it worked in (``store.using()``) until its next call."""
        if self._conv.branch is None or self._conv.rolled_back:
            return None
        return self._conv.branch.name

    @property
    def head_message_id(self) -> str | None:
        """The head of the engine's branch as last seen; None for an empty branch (and, like
        `branch`, after a rollback until the next call)."""
        conv = self._conv
        if conv.branch is None or conv.rolled_back:
            return None
        if conv.chain.version is not None:
            return conv.chain.head
        return conv.branch.head_message_id

    @property
    def chat(self) -> Chat | None:
        """The chat record as last read or written; None before the first async call (and after
        a rollback, until the next call)."""
        return None if self._conv.rolled_back else self._conv.chat

    @property
    def fragments(self) -> list[ContextFragment]:
        """The system-prompt fragments (a copy)."""
        return list(self._fragments)

    @property
    def pending(self) -> list[ContextFragment]:
        """The message fragments waiting for `save` (a copy)."""
        return self._pending.snapshot()

    def __repr__(self) -> str:
        return (
            f"ContextEngine(chat_id={self.chat_id!r}, user_id={self.user_id!r}, "
            f"branch={self.branch!r})"
        )

    # --- set --------------------------------------------------------------------------------

    def set(self, *fragments: ContextFragment) -> ContextEngine:
        """Add fragments: messages queue for `save`, the rest form the system prompt.

        Returns the engine, so calls chain.
        """
        for index, fragment in enumerate(fragments):
            if not isinstance(fragment, ContextFragment):
                raise InvalidTypeError(
                    f"set() takes ContextFragment objects; argument {index} is a "
                    f"{v.type_name(fragment)} (build one with role(), hint(), user(), ...)"
                )
            check_fragment_data(fragment, f"set() argument {index} (fragment {fragment.name!r})")
            if is_message_fragment(fragment) and not is_lazy_fragment(fragment):
                # Refused now, before a resolve() could send it.
                v.check_message_size(message_of(fragment), f"set() argument {index} (a message)")
        for fragment in fragments:
            if is_message_fragment(fragment):
                self._pending.add(fragment)
            else:
                self._fragments.append(fragment)
        return self

    def clear_pending(self) -> list[ContextFragment]:
        """Drop the messages waiting for `save` (say, after a failed model call) and return
        them."""
        return self._pending.clear()

    # --- initialisation -----------------------------------------------------------------------

    async def initialize(self) -> None:
        """Load the chat (creating it if needed) and its active branch. Idempotent."""
        async with self._session():
            pass

    @asynccontextmanager
    async def _session(self) -> AsyncIterator[None]:
        """Hold the engine's lock, initialised; name a chat deleted under the engine clearly."""
        async with self._lock:
            if self._conv.follow_transaction():
                self._turns.rolled_back()  # its placeholder may be gone with it
            try:
                await self._conv.open()
                yield
            except ChatNotFoundError as exc:
                if self._conv.branch is None or DELETED in str(exc):
                    raise
                raise self._conv.deleted_error() from exc
            finally:
                self._conv.end_call()
                self._conv.note_transaction()

    # --- resolve ----------------------------------------------------------------------------

    @telemetry.verb("resolve")
    async def resolve(
        self,
        *,
        renderer: ContextRenderer | None = None,
        window: ContextWindow | None = None,
        record: bool = False,
    ) -> ResolveResult:
        """Render the system prompt and assemble the conversation.

        Lazy fragment data is materialised first (once per engine). The messages are the
        branch's stored chain, with pending messages appended; a pending message with the id of
        a stored one replaces it in place, and empty assistant placeholders are left out. After
        a `compact`, the chain starts with the compaction's summary.

        Args:
            renderer: Defaults to `XmlRenderer`.
            window: Fit the request into a model's input limit: whole oldest turns are left
                out (``ResolveResult.omitted``), the system prompt, pinned messages and the
                newest turn always stay, and ``ResolveResult.estimate`` gives the tokens sent.
                See `ContextWindow`.
            record: Store what the model is shown so `replay` can give it back.

        Raises:
            ContextWindowError: the request cannot fit the window even so.
        """
        renderer = request.check_renderer(renderer)
        if window is not None and not isinstance(window, ContextWindow):
            raise InvalidTypeError(f"window must be a ContextWindow, got {v.type_name(window)}")
        v.check_bool(record, "record")
        async with self._session():
            fragments = await self._materialize()
            system_prompt = renderer.render(fragments)
            conv = self._conv
            await conv.sync()
            await remind(conv, conv.chain, self._pending, self._fragments, ("user", "tool-output"))
            result = request.assemble(system_prompt, conv.chain, self._pending, window)
            if record:
                result = await records.record(self._store, conv, repr(renderer), result)
            return result

    async def replay(self, record_id: str) -> ResolveResult:
        """What a ``resolve(record=True)`` returned, rebuilt from the store byte for byte.

        Works however the branch moved on since. Raises `NotFoundError` for an unknown record
        or one of another chat.
        """
        v.check_id(record_id, "record_id")
        async with self._session():
            return await records.replay(self._store, self.chat_id, record_id)

    async def list_records(self) -> list[ResolveRecord]:
        """The chat's resolve records, newest first."""
        async with self._session():
            return await self._store.list_resolve_records(self.chat_id)

    # --- snapshots --------------------------------------------------------------------------

    async def snapshot(self, snapshot: ContextSnapshot) -> ContextSnapshot:
        """Store a context snapshot attached to the chat and the current head message.

        Returns the stored, immutable copy (with its ``id``); the contents it holds are written
        once by hash, however many snapshots or chats use them.
        """
        if not isinstance(snapshot, ContextSnapshot):
            raise InvalidTypeError(
                f"snapshot() takes a ContextSnapshot, got {v.type_name(snapshot)}"
            )
        async with self._session():
            head = await self._conv.synced_head()
            return await self._store.save_snapshot(snapshot, chat_id=self.chat_id, message_id=head)

    async def list_snapshots(self) -> list[ContextSnapshot]:
        """The chat's snapshots, newest first (without their contents)."""
        async with self._session():
            return await self._store.list_snapshots(self.chat_id)

    async def load_snapshot(
        self, snapshot_id: str, *, with_content: bool = False
    ) -> ContextSnapshot:
        """One of the chat's snapshots; ``with_content`` loads its items' contents too."""
        v.check_id(snapshot_id, "snapshot_id")
        v.check_bool(with_content, "with_content")
        async with self._session():
            found = await self._store.get_snapshot(snapshot_id, with_content=with_content)
        if found is None or found.chat_id != self.chat_id:
            raise NotFoundError(f"chat {self.chat_id!r} has no snapshot {snapshot_id!r}")
        return found

    async def get_messages(self) -> list[Message]:
        """The conversation as `resolve` returns it, without rendering the prompt."""
        async with self._session():
            await self._conv.sync()
            return self._pending.compose(self._conv.chain)

    async def _materialize(self) -> list[ContextFragment]:
        fragments = without_reminders(self._fragments)
        return await self._resolver.materialize(fragments, LoadContext(engine=self))

    # --- save -------------------------------------------------------------------------------

    @telemetry.verb("save")
    async def save(self, *, branch: bool = True) -> SaveResult:
        """Store the pending messages as new nodes after the branch head, atomically.

        A pending message whose id already exists in the chat with other content:

        - ``branch=True`` (default): the original stays intact; a new branch ``X-vN`` starts
          at its parent and the message is saved there under a fresh id (in the record and in
          the message alike). The engine moves to that branch.
        - ``branch=False``: it is updated in place (same id, same parent).

        Messages and the head move in one transaction. When another writer moved the head
        meanwhile, the turn is grafted onto the new head and retried (compare-and-swap);
        `HeadConflictError` only after bounded retries. On any failure the pending messages
        stay queued and the database is unchanged.

        Saving again after a save whose outcome was lost (the call was cancelled or timed out,
        or its connection dropped after the commit) stores nothing twice: messages stored
        exactly as pending are recognised, and only what is new is written. Two pending
        messages with one id are saved once: the later one's content at the earlier one's
        place.

        Returns the branch head after the save: ``head_message_id`` is a ``str``. With nothing
        pending it changes nothing and returns the current head; on a branch that holds no
        message yet, ``SaveResult.head`` is None and reading ``head_message_id`` raises
        `EmptyConversationError`.
        """
        v.check_bool(branch, "branch")
        async with self._session():
            if not self._pending:
                return SaveResult(head_message_id=self.head_message_id)
            conv = self._conv
            if conv.chain.version is None:
                await conv.sync()
            await remind(conv, conv.chain, self._pending, self._fragments, ("user",))
            messages = self._pending.messages(conv.chain)
            result = await save_turn(conv, messages, branch=branch)
            self._pending.clear()
            return with_consistency_token(self._store, self.chat_id, result)

    # --- streaming turns ----------------------------------------------------------------------

    @telemetry.verb("begin_turn")
    async def begin_turn(self, user_fragment: ContextFragment) -> str:
        """Save a user message and an empty assistant placeholder; return the placeholder's id.

        Stream the model's answer, then call `complete_turn` to fill the placeholder in place.
        Empty placeholders never appear in `resolve`. Messages already pending are saved first,
        in the same step. The id returned is always the placeholder that is the engine's head
        afterwards (on a new branch if the user message's id existed with other content).

        Idempotent like `save`: calling ``begin_turn`` again with the same fragment after a
        call whose outcome was lost (cancelled, timed out) stores the turn once and returns the
        same placeholder, and so does a fragment built again with the same words (a new
        ``user("...")``: the first attempt's id is kept); so does calling it again after the
        turn was completed (the whole turn retried): the stored turn's placeholder id is
        returned and nothing is written.
        On failure the pending queue is as it was before the call.
        """
        question, user_fragment = self._turns.retried(
            turn_message(user_fragment, "user"), user_fragment
        )
        placeholder = self._turns.placeholder_for(question, self._pending)
        self._turns.attempted = question  # (until its turn is heard to be completed)
        if not self._pending:
            async with self._session():
                await self._conv.sync()
                stored = stored_turn(self._conv.chain, question, placeholder)
            if stored is not None:
                self._turns.current = stored
                return stored
        branch = self._conv.branch
        result = await self._save_with(user_fragment, placeholder_fragment(placeholder))
        return self._turns.begun(placeholder, branch, self._conv.branch, result)

    @telemetry.verb("complete_turn")
    async def complete_turn(self, assistant_fragment: ContextFragment) -> SaveResult:
        """Fill the placeholder of `begin_turn` with the assistant's answer, in place."""
        answer = turn_message(assistant_fragment, "assistant")
        target = self._turns.target(answer, self._conv.chain)
        if target is None:
            async with self._session():
                await self._conv.sync()
                target = turn_at_head(self._conv.chain)
        result = await self._save_with(with_message_id(assistant_fragment, target), branch=False)
        self._turns.completed(target)
        return result

    async def _save_with(self, *fragments: ContextFragment, branch: bool = True) -> SaveResult:
        """Queue ``fragments`` and `save`. All or nothing: on failure the queue is as before,
        so calling the verb again is safe."""
        queued = len(self._pending)
        self.set(*fragments)
        try:
            return await self.save(branch=branch)
        except BaseException:
            self._pending.truncate(queued)
            raise

    # --- branches and checkpoints -----------------------------------------------------------

    def _left_branch(self) -> None:
        """The engine moved to another branch: what was pending for the one it left goes."""
        self._pending.clear()
        self._turns.reset()

    @telemetry.verb("rewind")
    async def rewind(self, message_id: str, *, name: str | None = None) -> BranchInfo:
        """Start a new branch at ``message_id`` and move to it: ``name``, or ``X-vN`` counted
        from the root name ``X`` of the current branch (``main-v3`` after ``main-v2``).

        The original branch is untouched; pending messages are dropped. Returns the new
        branch (its head is ``message_id``).
        """
        v.check_id(message_id, "message_id")
        v.check_optional_id(name, "branch name")
        async with self._session():
            info = await branching.rewind(self._conv, self._store, message_id, name)
            self._left_branch()
            return info

    async def checkpoint(self, name: str) -> Checkpoint:
        """Name the current head (moving an existing checkpoint of that name)."""
        v.check_id(name, "checkpoint name")
        async with self._session():
            return await branching.checkpoint(self._conv, self._store, name)

    async def restore(self, checkpoint: str, *, name: str | None = None) -> BranchInfo:
        """Start a new branch at a checkpoint's message and move to it (like `rewind`): ``name``,
        or ``X-vN`` after the branch ``X`` the checkpoint was made on (the engine's branch if
        that one is gone)."""
        v.check_id(checkpoint, "checkpoint name")
        v.check_optional_id(name, "branch name")
        async with self._session():
            info = await branching.restore(self._conv, self._store, checkpoint, name)
            self._left_branch()
            return info

    async def switch_branch(self, name: str) -> BranchInfo:
        """Make the branch ``name`` active and move to it; pending messages are dropped."""
        v.check_id(name, "branch name")
        async with self._session():
            branch = await branching.switch(self._conv, self._store, name)
            self._left_branch()
            return await branching.branch_info(self._store, self.chat_id, branch)

    async def btw(self, *, name: str | None = None) -> BranchInfo:
        """Fork a new branch at the current head without moving to it ("by the way"):
        ``name``, or ``X-vN`` after the current branch ``X``.

        Pending messages stay queued for the current branch. A given name must be free
        (`BranchExistsError`).
        """
        v.check_optional_id(name, "branch name")
        async with self._session():
            return await branching.fork_aside(self._conv, self._store, name)

    async def rename_branch(self, name: str, new_name: str) -> Branch:
        """Rename a branch of the chat (the engine's own included); `BranchExistsError` if the
        new name is taken."""
        v.check_id(name, "branch name")
        v.check_id(new_name, "new branch name")
        async with self._session():
            return await branching.rename(self._conv, self._store, name, new_name)

    async def delete_branch(self, name: str) -> bool:
        """Delete a branch of the chat, never the active one; its messages stay in the graph
        (other branches and checkpoints still reach them). False if there was none."""
        v.check_id(name, "branch name")
        async with self._session():
            return await branching.delete(self._conv, self._store, name)

    # --- compaction -------------------------------------------------------------------------

    @telemetry.verb("compact")
    async def compact(self, summarize: Summarizer, *, keep_last_turns: int = 2) -> Compaction:
        """Fold the branch's older messages into a summary stored in the graph beside it.

        ``summarize`` is an async callable given the messages to fold (the previous summary
        first, if the branch was compacted before) that returns the summary, as text (stored
        as a user message) or as a `Message`. Everything but the last ``keep_last_turns``
        turns (a turn starts at a user message) is folded. Nothing is deleted: rewinds, search,
        export and the views still see the folded messages. From then on every engine, in any
        process, that resolves this branch (or any head after the compaction point) gets the
        summary followed by the unfolded messages, without reading the folded ones; a head
        rewound to before the point resolves without it. Retrying a compaction of the same
        point stores one node, and a compaction retried after it landed (or asked again with
        nothing new to fold) returns the stored one. Pending messages are not folded (save
        them first).

        Raises:
            EmptyConversationError: there is nothing to fold and the branch holds no
                compaction.
        """
        if not callable(summarize):
            raise InvalidTypeError(
                f"summarize must be an async callable, got {v.type_name(summarize)}"
            )
        v.check_count(keep_last_turns, "keep_last_turns")
        async with self._session():
            await self._conv.sync()
            return await compact_branch(self._conv, summarize, keep_last_turns)

    async def update_chat(
        self, *, title: str | None = None, metadata: Mapping[str, Any] | None = None
    ) -> Chat:
        """Set the title and merge ``metadata`` into the chat's metadata, atomically."""
        v.check_optional_text(title, "title")
        extra = None if metadata is None else v.check_json_object(metadata, "metadata")
        async with self._session():
            updater = retitle(title, extra)
            self._conv.chat = await self._store.update_chat(self.chat_id, updater)
            return self._conv.chat

    async def track_usage(self, usage: Mapping[str, Any] | Any) -> Chat:
        """Add token usage to the chat's ``metadata["usage"]``, in one shape for every SDK.

        Accepts the usage of OpenAI Chat Completions, the Responses API, the Agents SDK,
        Anthropic or pydantic-ai (objects or dicts). The chat keeps normalised totals:
        ``input_tokens``, ``output_tokens``, ``cached_input_tokens``, ``reasoning_tokens``,
        ``total_tokens`` and ``requests`` (see `agentcontext.usage.normalize_usage`). The sum
        is taken under the store's lock, so concurrent calls never lose an update.
        """
        mapped = as_mapping(usage)
        if mapped is None:
            raise InvalidTypeError(
                "usage must be a dict of token counts or an object with model_dump(), "
                f"got {v.type_name(usage)}"
            )
        raw = dict(mapped)
        if isinstance(usage, Mapping):
            v.check_json(raw, "usage")  # a caller's dict: refuse what JSON cannot hold
        increment = normalize_usage(raw)
        v.check_json(increment, "usage")
        async with self._session():
            updater = add_to_usage(increment)
            self._conv.chat = await self._store.update_chat(self.chat_id, updater)
            return self._conv.chat

    # --- estimate and inspect ---------------------------------------------------------------

    async def estimate(self, model_id: str, *, renderer: ContextRenderer | None = None) -> Estimate:
        """Tokens, cost and context fit of what `resolve` would send, offline."""
        v.check_text(model_id, "model_id")
        renderer = request.check_renderer(renderer)
        async with self._session():
            return await self._estimate(model_id, renderer)

    async def _estimate(self, model_id: str, renderer: ContextRenderer) -> Estimate:
        fragments = await self._materialize()
        await self._conv.sync()
        return request.estimate(model_id, renderer, fragments, self._conv.chain, self._pending)

    async def inspect(
        self, *, model_id: str | None = None, renderer: ContextRenderer | None = None
    ) -> InspectResult:
        """A JSON-serialisable picture of the engine: estimate, prompt, fragments, graph."""
        if model_id is not None:
            v.check_text(model_id, "model_id")
        renderer = request.check_renderer(renderer)
        async with self._session():
            conv = self._conv
            assert conv.branch is not None
            estimate = None if model_id is None else await self._estimate(model_id, renderer)
            fragments = await self._materialize()
            rendered = renderer.render(fragments)
            await conv.sync()
            pending = self._pending.messages(conv.chain)
            return await build_inspect(
                self._store, conv, estimate, rendered, fragments=fragments, pending=pending
            )

    # --- conveniences -----------------------------------------------------------------------

    def unset(self, name: str) -> ContextEngine:
        """Drop every system-prompt fragment named ``name`` (``"reminder"`` drops the
        reminders); pending messages are untouched. Returns the engine, so calls chain.
        """
        if not isinstance(name, str):
            raise InvalidTypeError(
                f"unset() takes a fragment name (a str), got {v.type_name(name)}"
            )
        self._fragments = [fragment for fragment in self._fragments if fragment.name != name]
        return self

    def render(self, renderer: ContextRenderer | None = None) -> str:
        """The system prompt as ``renderer`` (default `XmlRenderer`) renders it, reminders
        left out, without touching the store.

        Raises:
            InvalidInputError: a fragment holds lazy data, which only the async calls load;
                use ``(await engine.resolve()).system_prompt`` instead.
        """
        renderer = request.check_renderer(renderer)
        return request.render_loaded(renderer, without_reminders(self._fragments))

    def fork(self) -> ContextEngine:
        """A new engine with the same system-prompt fragments (reminders included) and no
        history: a fresh chat of the same user in its own `InMemoryContextStore`, for a
        one-shot sub-agent. Pending messages are not copied; lazy data is loaded again.

        The fork's store lives as long as the fork; close it with
        ``await fork.store.close()`` when done.
        """
        from agentcontext.store import InMemoryContextStore

        child = ContextEngine(
            store=InMemoryContextStore(),
            chat_id=uuid.uuid4().hex,
            user_id=self.user_id,
            lazy_max_depth=self._resolver.max_depth,
            lazy_max_items=self._resolver.max_items,
        )
        child._fragments = list(self._fragments)
        return child

    async def turn_count(self) -> int:
        """The number of user messages on the branch, pending ones included (the turn number
        reminders see)."""
        async with self._session():
            await self._conv.sync()
            return history.turn_count(self._conv.chain, self._pending)

    async def first_user_message(self) -> Message | None:
        """The branch's first user message (a pending one when none is stored), or None."""
        async with self._session():
            await self._conv.sync()
            return await history.first_user_message(self._store, self._conv.chain, self._pending)

    async def head_message(self) -> Message | None:
        """The newest message of the conversation: the last pending one, else the branch's
        head (an empty assistant placeholder included); None for an empty branch."""
        async with self._session():
            return await history.head_message(self._conv, self._pending)
