"""ContextEngine: the system prompt and the conversation graph of one chat, for one user.

The engine keeps two lists: context fragments (they render into the system prompt) and pending
message fragments (they become nodes of the graph on `ContextEngine.save`). It talks only to
the store interface (`EngineStore`, which every `ContextStore` is).

The public verbs live here; the concerns behind them have modules of their own:
``_conversation`` (the chat, the branch and its chain held in memory, kept in step with the
store) and ``_save`` (compare-and-swap, grafting, idempotent retries).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, cast

from pydantic import BaseModel

from agentcontext import _telemetry as telemetry
from agentcontext import _validate as v
from agentcontext._compaction import Compaction, Summarizer
from agentcontext._compaction import compact as compact_branch
from agentcontext._conversation import DELETED, Conversation, decode_record
from agentcontext._save import SaveResult, chat_write_lock, save_turn
from agentcontext._window import ContextWindow, fit
from agentcontext.errors import (
    BranchNotFoundError,
    ChatNotFoundError,
    CheckpointNotFoundError,
    EmptyConversationError,
    InvalidInputError,
    InvalidTypeError,
    MessageNotFoundError,
    NotFoundError,
)
from agentcontext.estimate import Estimate, estimate_context
from agentcontext.fragments import (
    ContextFragment,
    assistant,
    check_fragment_data,
    is_empty_assistant_placeholder,
    is_lazy_fragment,
    is_message_fragment,
    message_of,
    resolve_lazy_message,
    with_message_id,
)
from agentcontext.lazy import LazyResolver, LoadContext, has_lazy_value
from agentcontext.messages import Message, ResolveResult
from agentcontext.reminders.engine import remind, without_reminders
from agentcontext.renderers import ContextRenderer, XmlRenderer
from agentcontext.snapshots import ContextSnapshot
from agentcontext.store.protocols import ConsistencyTokens, EngineStore
from agentcontext.store.records import (
    PURGED,
    Branch,
    BranchInfo,
    Chat,
    ChatUpdate,
    Checkpoint,
    Graph,
    MessageRecord,
    ResolveRecord,
    utcnow,
)
from agentcontext.usage import add_usage, as_mapping, normalize_usage

__all__ = [
    "Compaction",
    "ContextEngine",
    "ContextWindow",
    "InspectFragments",
    "InspectMeta",
    "InspectResult",
    "SaveResult",
]

_TURNS = uuid.UUID("6f0c7f5e-2b1a-4c59-9d0e-5a1f3c8b7e42")
"""Namespace of the placeholder ids of `ContextEngine.begin_turn` (derived from the user
message's id, so a retried begin_turn gives the same placeholder)."""


class InspectFragments(BaseModel):
    """The fragments of an `InspectResult`, as JSON-able data."""

    context: list[dict[str, Any]]
    """System-prompt fragments (lazy data materialised)."""
    pending: list[dict[str, Any]]
    """Message fragments waiting for ``save()``."""
    persisted: list[MessageRecord]
    """The stored messages of the branch, root first."""


class InspectMeta(BaseModel):
    """Where and when an `InspectResult` was taken."""

    chat_id: str
    branch: str
    timestamp: datetime


class InspectResult(BaseModel):
    """Everything about an engine's context, JSON-serialisable (``model_dump(mode="json")``)."""

    estimate: Estimate | None
    rendered: str
    fragments: InspectFragments
    graph: Graph
    meta: InspectMeta


def _fragment_json(fragment: ContextFragment) -> dict[str, Any]:
    """A JSON-able view of a context fragment (for inspect)."""

    def plain(value: Any, depth: int = 0) -> Any:
        if depth > 64:
            return "…"
        if isinstance(value, ContextFragment):
            return {"name": value.name, "data": plain(value.data, depth + 1)}
        if isinstance(value, Mapping):
            return {str(k): plain(item, depth + 1) for k, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(item, depth + 1) for item in value]
        if value is None or isinstance(value, (str, int, float, bool)):
            return value
        return repr(value)

    data = fragment.codec.decode() if fragment.codec is not None else fragment.data
    out: dict[str, Any] = {"name": fragment.name, "type": fragment.type, "data": plain(data)}
    if fragment.id is not None:
        out["id"] = fragment.id
    return out


def _message_json(message: Message) -> bytes:
    """A message exactly as pydantic serialises it, so a replay gives back the same bytes."""
    return message.model_dump_json().encode("utf-8")


_STORE_TYPES: set[type] = set()
"""Types checked to be `EngineStore`s already (a fresh engine per request checks once)."""


def _check_store(store: object) -> None:
    kind = type(store)
    if kind in _STORE_TYPES:
        return
    if not isinstance(store, EngineStore):
        raise InvalidTypeError(
            f"store must be a ContextStore (such as SqlContextStore), got {v.type_name(store)}"
        )
    _STORE_TYPES.add(kind)


_TOKEN_TYPES: dict[type, bool] = {}
"""Whether stores of a type take consistency tokens (a protocol check is slow, and a save
asks it every time)."""


def _takes_tokens(store: object) -> bool:
    kind = type(store)
    found = _TOKEN_TYPES.get(kind)
    if found is None:
        found = _TOKEN_TYPES[kind] = isinstance(store, ConsistencyTokens)
    return found


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
        _check_store(store)
        self._store = store
        checked_metadata = None if metadata is None else v.check_json_object(metadata, "metadata")
        checked_chat = v.check_id(chat_id, "chat_id")
        self._conv = Conversation(
            store,
            checked_chat,
            v.check_id(user_id, "user_id"),
            checked_metadata,
            chat_write_lock(store, checked_chat),
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
        self._pending: list[ContextFragment] = []
        self._turn: str | None = None
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
        return list(self._pending)

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
                self._pending.append(fragment)
            else:
                self._fragments.append(fragment)
        return self

    def clear_pending(self) -> list[ContextFragment]:
        """Drop the messages waiting for `save` (say, after a failed model call) and return
        them."""
        dropped = list(self._pending)
        self._pending.clear()
        return dropped

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
                self._turn = None  # its placeholder was rolled back with it
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
        renderer = self._check_renderer(renderer)
        if window is not None and not isinstance(window, ContextWindow):
            raise InvalidTypeError(f"window must be a ContextWindow, got {v.type_name(window)}")
        v.check_bool(record, "record")
        async with self._session():
            fragments = await self._materialize()
            system_prompt = renderer.render(fragments)
            await self._conv.sync()
            await remind(
                self._conv, self._fragments, self._pending, self._resolve_pending,
                ("user", "tool-output"),
            )  # fmt: skip
            messages = self._compose()
            omitted: list[str] = []
            estimate: int | None = None
            if window is not None:
                summary = self._conv.chain.summary
                fitted = fit(
                    window,
                    system_prompt,
                    messages,
                    keep=() if summary is None else (summary.id,),
                    raw=self._conv.chain.raw_texts(),
                )
                messages, omitted, estimate = fitted.messages, fitted.omitted, fitted.tokens
            result = ResolveResult.model_construct(
                system_prompt=system_prompt,
                messages=messages,
                record_id=None,
                omitted=omitted,
                estimate=estimate,
            )
            if record:
                result = await self._record(result, renderer)
            return result

    async def _record(self, result: ResolveResult, renderer: ContextRenderer) -> ResolveResult:
        """Store the prompt and the messages as blobs; return the result with its record id."""
        conv = self._conv
        assert conv.branch is not None
        stored = await self._store.create_resolve_record(
            conv.chat_id,
            branch_id=conv.branch.id,
            branch_name=conv.branch.name,
            head_message_id=conv.chain.head,
            renderer=repr(renderer),
            system_prompt=result.system_prompt,
            messages=[(message.id, _message_json(message)) for message in result.messages],
        )
        return result.model_copy(update={"record_id": stored.id})

    async def replay(self, record_id: str) -> ResolveResult:
        """What a ``resolve(record=True)`` returned, rebuilt from the store byte for byte.

        Works however the branch moved on since. Raises `NotFoundError` for an unknown record
        or one of another chat.
        """
        v.check_id(record_id, "record_id")
        async with self._session():
            record = await self._store.get_resolve_record(record_id)
            if record is None or record.chat_id != self.chat_id:
                raise NotFoundError(f"chat {self.chat_id!r} has no resolve record {record_id!r}")
            blobs = {}
            for digest in {record.prompt_blob, *record.message_blobs}:
                content = await self._store.read_blob(digest)
                if content is None:
                    raise NotFoundError(
                        f"blob {digest} of resolve record {record_id!r} is missing from the store"
                    )
                blobs[digest] = content
        return ResolveResult(
            system_prompt=blobs[record.prompt_blob].decode("utf-8"),
            messages=[Message.model_validate_json(blobs[h]) for h in record.message_blobs],
            record_id=record.id,
        )

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
            head = await self._fresh_head()
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
            return self._compose()

    @staticmethod
    def _check_renderer(renderer: object) -> ContextRenderer:
        if renderer is None:
            return XmlRenderer()
        if not isinstance(renderer, ContextRenderer):
            raise InvalidTypeError(
                f"renderer must be a ContextRenderer (XmlRenderer(), MarkdownRenderer(), ...), "
                f"got {v.type_name(renderer)}"
            )
        return renderer

    async def _materialize(self) -> list[ContextFragment]:
        fragments = without_reminders(self._fragments)
        return await self._resolver.materialize(fragments, LoadContext(engine=self))

    def _last_assistant_id(self, pending: Sequence[ContextFragment]) -> str | None:
        for fragment in reversed(pending):
            if fragment.name == "assistant" and not is_lazy_fragment(fragment):
                return message_of(fragment).id
        for message in reversed(self._conv.chain.messages):
            if message.role == "assistant":
                return message.id
        return None

    def _resolve_pending(self) -> list[ContextFragment]:
        """Give lazy message fragments their ids (in place, so save uses the same ids)."""
        for index, fragment in enumerate(self._pending):
            if is_lazy_fragment(fragment):
                self._pending[index] = resolve_lazy_message(
                    fragment, last_assistant_id=self._last_assistant_id(self._pending[:index])
                )
        return list(self._pending)

    def _pending_messages(self) -> list[Message]:
        """The pending messages, lazy ones resolved. A message with the id of an earlier
        pending one replaces it at its place (a retry, e.g. ``last_assistant_message``)."""
        by_id: dict[str, Message] = {}
        for fragment in self._resolve_pending():
            message = message_of(fragment)
            by_id[message.id] = message  # an existing key keeps its position
        return list(by_id.values())

    def _compose(self) -> list[Message]:
        chain = self._conv.chain
        composed = self._compose_chain()
        if chain.summary is not None:
            composed.insert(0, chain.summary)
        return composed

    def _compose_chain(self) -> list[Message]:
        chain = self._conv.chain
        pending = self._pending_messages()
        if not pending and not chain.placeholders:
            return list(chain.messages)  # the common case: nothing to merge or leave out
        overrides = {message.id: message for message in pending}
        if any(message_id in chain.index for message_id in overrides):
            out = [overrides.pop(message.id, message) for message in chain.messages]
        else:
            out = list(chain.messages)
        out.extend(overrides.values())
        maybe_empty = chain.placeholders.union(message.id for message in pending)
        return [
            message
            for message in out
            if message.id not in maybe_empty or not is_empty_assistant_placeholder(message)
        ]

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
            if self._conv.chain.version is None:
                await self._conv.sync()
            await remind(
                self._conv, self._fragments, self._pending, self._resolve_pending, ("user",)
            )
            messages = self._pending_messages()
            result = await save_turn(self._conv, messages, branch=branch)
            self._pending.clear()
            if _takes_tokens(self._store):
                token = cast(ConsistencyTokens, self._store).consistency_token(self.chat_id)
                if token is not None:
                    result = result.model_copy(update={"consistency_token": token})
            return result

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
        same placeholder; so does calling it again after the turn was completed (the whole
        turn retried): the stored turn's placeholder id is returned and nothing is written.
        On failure the pending queue is as it was before the call.
        """
        if not is_message_fragment(user_fragment):
            raise InvalidTypeError("begin_turn() takes a message fragment such as user('...')")
        if is_lazy_fragment(user_fragment):
            raise InvalidTypeError("begin_turn() takes a user message fragment such as user('...')")
        question = message_of(user_fragment)
        placeholder = uuid.uuid5(_TURNS, question.id).hex
        if any(fragment.id == placeholder for fragment in self._pending):
            raise InvalidInputError(
                f"begin_turn(): a pending message has the id {placeholder!r}, which is the "
                f"placeholder id this turn derives from its user message's id {question.id!r}; "
                "save or clear the pending messages first, or give the user message another id"
            )
        if not self._pending:
            stored = await self._stored_turn(question, placeholder)
            if stored is not None:
                self._turn = stored
                return stored
        queued = len(self._pending)
        self.set(user_fragment, assistant(Message(id=placeholder, role="assistant", parts=[])))
        branch = self._conv.branch
        try:
            result = await self.save()
        except BaseException:
            # All or nothing: the queue is as before, so calling begin_turn() again is safe.
            del self._pending[queued:]
            raise
        conv = self._conv
        if conv.branch is None or branch is None or conv.branch.id != branch.id:
            # The user message's id existed with other content: save() forked a new branch
            # and stored the turn there under fresh ids; the placeholder is its head.
            placeholder = result.head_message_id
        self._turn = placeholder
        return placeholder

    async def _stored_turn(self, question: Message, placeholder: str) -> str | None:
        """The placeholder of this very turn when the branch holds it already, the question
        exactly so and its placeholder (filled or not) right after it: a turn retried after
        its outcome was lost. Else None."""
        async with self._session():
            await self._conv.sync()
            chain = self._conv.chain
            position = chain.index.get(question.id)
            if (
                position is None
                or position + 1 >= len(chain.ids)
                or chain.ids[position + 1] != placeholder
                or chain.messages[position] != question
            ):
                return None
            return placeholder

    @telemetry.verb("complete_turn")
    async def complete_turn(self, assistant_fragment: ContextFragment) -> SaveResult:
        """Fill the placeholder of `begin_turn` with the assistant's answer, in place."""
        if not is_message_fragment(assistant_fragment) or is_lazy_fragment(assistant_fragment):
            raise InvalidTypeError(
                "complete_turn() takes an assistant message fragment such as assistant_text('...')"
            )
        answer = message_of(assistant_fragment)
        if answer.role != "assistant":
            raise InvalidInputError(
                f"complete_turn() needs an assistant message, got {answer.role!r}"
            )
        target = self._turn
        if answer.id != target and self._is_cached_placeholder(answer.id):
            target = answer.id  # the answer names a turn of its own (several in flight)
        if target is None:
            async with self._session():
                await self._conv.sync()
                chain = self._conv.chain
                last = chain.messages[-1] if chain.messages else None
            if last is None or not is_empty_assistant_placeholder(last):
                raise EmptyConversationError(
                    "no turn in progress: call begin_turn() first (the branch head is not an "
                    "empty assistant placeholder)"
                )
            target = last.id
        self.set(with_message_id(assistant_fragment, target))
        try:
            result = await self.save(branch=False)
        except BaseException:
            del self._pending[-1]
            raise
        if target == self._turn:
            self._turn = None
        return result

    def _is_cached_placeholder(self, message_id: str) -> bool:
        chain = self._conv.chain
        position = chain.index.get(message_id)
        return position is not None and is_empty_assistant_placeholder(chain.messages[position])

    # --- branches and checkpoints -----------------------------------------------------------

    async def _fresh_head(self) -> str | None:
        await self._conv.sync()
        return self._conv.chain.head

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
            return await self._rewind(message_id, name)

    async def _rewind(
        self, message_id: str, name: str | None, *, base: str | None = None
    ) -> BranchInfo:
        conv = self._conv
        assert conv.branch is not None
        try:
            # The store checks the message (it exists, in this chat, not a compaction).
            info = await self._store.fork_branch(
                self.chat_id,
                base if base is not None else await conv.branch_name(),
                head_message_id=message_id,
                activate=True,
                name=name,
            )
        except MessageNotFoundError as exc:
            await conv.require_chat()
            if PURGED in str(exc):
                raise  # the store names the purge that deleted it
            raise MessageNotFoundError(
                f"message {message_id!r} does not exist in chat {self.chat_id!r}"
            ) from None
        conv.moved_to(info)
        self._pending.clear()
        self._turn = None
        return info

    async def checkpoint(self, name: str) -> Checkpoint:
        """Name the current head (moving an existing checkpoint of that name)."""
        v.check_id(name, "checkpoint name")
        async with self._session():
            head = await self._fresh_head()
            if head is None:
                raise EmptyConversationError(
                    "cannot create a checkpoint: the branch has no messages yet; save first"
                )
            assert self._conv.branch is not None
            return await self._store.create_checkpoint(
                self.chat_id, name, head, branch_id=self._conv.branch.id
            )

    async def restore(self, checkpoint: str, *, name: str | None = None) -> BranchInfo:
        """Start a new branch at a checkpoint's message and move to it (like `rewind`): ``name``,
        or ``X-vN`` after the branch ``X`` the checkpoint was made on (the engine's branch if
        that one is gone)."""
        v.check_id(checkpoint, "checkpoint name")
        v.check_optional_id(name, "branch name")
        async with self._session():
            found = await self._store.get_checkpoint(self.chat_id, checkpoint)
            if found is None:
                await self._conv.require_chat()
                raise CheckpointNotFoundError(
                    f"chat {self.chat_id!r} has no checkpoint named {checkpoint!r}"
                )
            base = None
            if found.branch_id is not None and name is None:
                made_on = await self._store.get_branch_by_id(found.branch_id)
                if made_on is not None and made_on.chat_id == self.chat_id:
                    base = made_on.name
            return await self._rewind(found.message_id, name, base=base)

    async def switch_branch(self, name: str) -> BranchInfo:
        """Make the branch ``name`` active and move to it; pending messages are dropped."""
        v.check_id(name, "branch name")
        async with self._session():
            target = await self._store.get_branch(self.chat_id, name)
            if target is None:
                await self._conv.require_chat()
                raise BranchNotFoundError(f"chat {self.chat_id!r} has no branch named {name!r}")
            branch = await self._store.set_active_branch(self.chat_id, target.id)
            self._conv.moved_to(branch)
            self._pending.clear()
            self._turn = None
            return await self._branch_info(branch)

    async def _branch_info(self, branch: Branch) -> BranchInfo:
        for info in await self._store.list_branches(self.chat_id):
            if info.id == branch.id:
                return info
        raise BranchNotFoundError(f"branch {branch.name!r} disappeared")  # pragma: no cover

    async def btw(self, *, name: str | None = None) -> BranchInfo:
        """Fork a new branch at the current head without moving to it ("by the way"):
        ``name``, or ``X-vN`` after the current branch ``X``.

        Pending messages stay queued for the current branch. A given name must be free
        (`BranchExistsError`).
        """
        v.check_optional_id(name, "branch name")
        async with self._session():
            conv = self._conv
            assert conv.branch is not None
            head = await self._fresh_head()
            if head is None:
                raise EmptyConversationError(
                    "cannot fork with btw(): the branch has no messages yet; save first"
                )
            return await self._store.fork_branch(
                self.chat_id, conv.branch.name, head_message_id=head, activate=False, name=name
            )

    async def rename_branch(self, name: str, new_name: str) -> Branch:
        """Rename a branch of the chat (the engine's own included); `BranchExistsError` if the
        new name is taken."""
        v.check_id(name, "branch name")
        v.check_id(new_name, "new branch name")
        async with self._session():
            renamed = await self._store.rename_branch(self.chat_id, name, new_name)
            conv = self._conv
            if conv.branch is not None and conv.branch.id == renamed.id:
                conv.branch = conv.branch.model_copy(update={"name": new_name})
            return renamed

    async def delete_branch(self, name: str) -> bool:
        """Delete a branch of the chat, never the active one; its messages stay in the graph
        (other branches and checkpoints still reach them). False if there was none."""
        v.check_id(name, "branch name")
        async with self._session():
            conv = self._conv
            target = await self._store.get_branch(self.chat_id, name)
            if target is not None and conv.branch is not None and conv.branch.id == target.id:
                raise InvalidInputError(
                    f"branch {name!r} is this engine's branch and cannot be deleted; switch to "
                    "another branch first"
                )
            return await self._store.delete_branch(self.chat_id, name)

    # --- chat metadata ----------------------------------------------------------------------

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

        def updater(chat: Chat) -> ChatUpdate:
            fields: dict[str, Any] = {}
            if title is not None:
                fields["title"] = title
            if extra is not None:
                fields["metadata"] = {**chat.metadata, **extra}
            return ChatUpdate(**fields)

        async with self._session():
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

        def updater(chat: Chat) -> ChatUpdate:
            current = chat.metadata.get("usage")
            total = add_usage(current if isinstance(current, Mapping) else {}, increment)
            return ChatUpdate(metadata={**chat.metadata, "usage": total})

        async with self._session():
            self._conv.chat = await self._store.update_chat(self.chat_id, updater)
            return self._conv.chat

    # --- estimate and inspect ---------------------------------------------------------------

    async def estimate(self, model_id: str, *, renderer: ContextRenderer | None = None) -> Estimate:
        """Tokens, cost and context fit of what `resolve` would send, offline."""
        v.check_text(model_id, "model_id")
        renderer = self._check_renderer(renderer)
        async with self._session():
            return await self._estimate(model_id, renderer)

    async def _estimate(self, model_id: str, renderer: ContextRenderer) -> Estimate:
        fragments = await self._materialize()
        await self._conv.sync()
        return estimate_context(
            model_id,
            system_prompt=renderer.render(fragments),
            fragments=[(fragment.name, renderer.render([fragment])) for fragment in fragments],
            messages=self._compose(),
        )

    async def inspect(
        self, *, model_id: str | None = None, renderer: ContextRenderer | None = None
    ) -> InspectResult:
        """A JSON-serialisable picture of the engine: estimate, prompt, fragments, graph."""
        if model_id is not None:
            v.check_text(model_id, "model_id")
        renderer = self._check_renderer(renderer)
        async with self._session():
            conv = self._conv
            assert conv.branch is not None
            estimate = None if model_id is None else await self._estimate(model_id, renderer)
            fragments = await self._materialize()
            rendered = renderer.render(fragments)
            await conv.sync()
            pending = [
                {"id": message.id, "name": message.role, "message": message.model_dump(mode="json")}
                for message in self._pending_messages()
            ]
            persisted: list[MessageRecord] = (
                []
                if conv.chain.head is None
                else await self._store.get_message_chain(conv.chain.head)
            )
            graph = await self._store.get_graph(self.chat_id)
            return InspectResult(
                estimate=estimate,
                rendered=rendered,
                fragments=InspectFragments(
                    context=[_fragment_json(fragment) for fragment in fragments],
                    pending=pending,
                    persisted=persisted,
                ),
                graph=graph,
                meta=InspectMeta(chat_id=self.chat_id, branch=conv.branch.name, timestamp=utcnow()),
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
        renderer = self._check_renderer(renderer)
        fragments = without_reminders(self._fragments)
        for fragment in fragments:
            if has_lazy_value(fragment):
                raise InvalidInputError(
                    f"fragment {fragment.name!r} holds lazy data, which render() cannot load; "
                    "use (await engine.resolve()).system_prompt instead"
                )
        return renderer.render(fragments)

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
            chain = self._conv.chain
            users = sum(1 for message in self._compose_chain() if message.role == "user")
            return chain.folded_turns + users

    async def first_user_message(self) -> Message | None:
        """The branch's first user message (a pending one when none is stored), or None."""
        async with self._session():
            await self._conv.sync()
            chain = self._conv.chain
            if chain.base is not None:  # compacted: the first user message is folded
                for record in await self._store.get_message_chain(chain.base):
                    if record.name == "user" and record.type == "message":
                        return decode_record(record)
            return next((m for m in self._compose_chain() if m.role == "user"), None)

    async def head_message(self) -> Message | None:
        """The newest message of the conversation: the last pending one, else the branch's
        head (an empty assistant placeholder included); None for an empty branch."""
        async with self._session():
            pending = self._pending_messages()
            if pending:
                return pending[-1]
            await self._conv.sync()
            chain = self._conv.chain
            if chain.messages:
                return chain.messages[-1]
            if chain.base is not None:  # the head is the last message a compaction folds
                record = await self._store.get_message(chain.base)
                return None if record is None else decode_record(record)
            return None
