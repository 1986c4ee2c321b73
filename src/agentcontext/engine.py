"""ContextEngine: the system prompt and the conversation graph of one chat, for one user.

The engine keeps two lists: context fragments (they render into the system prompt) and
pending message fragments (they become nodes of the graph on :meth:`ContextEngine.save`).
It talks only to the :class:`~agentcontext.ContextStore` interface.

It also keeps the chain of its branch in memory. Stored messages change only by an explicit
in-place update, and every write bumps the chat's change version, so a warm engine catches up
with one small query (the branch and the version) plus, when something changed, the rows
written since; it never reads the whole chain again unless it has to.
"""

from __future__ import annotations

import asyncio
import builtins
import gc
import random
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from agentcontext import _validate as v
from agentcontext.errors import (
    BranchNotFoundError,
    ChatNotFoundError,
    ChatOwnershipError,
    CheckpointNotFoundError,
    EmptyConversationError,
    HeadConflictError,
    InvalidGraphError,
    InvalidInputError,
    InvalidTypeError,
    MessageNotFoundError,
    NotFoundError,
    SerializationError,
    StoreUnavailableError,
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
    new_message_id,
    resolve_lazy_message,
    with_message_id,
)
from agentcontext.lazy import LazyResolver, LoadContext
from agentcontext.messages import Message, ResolveResult
from agentcontext.renderers import ContextRenderer, XmlRenderer
from agentcontext.snapshots import ContextSnapshot
from agentcontext.store.base import ContextStore
from agentcontext.store.records import (
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

__all__ = ["ContextEngine", "InspectFragments", "InspectMeta", "InspectResult", "SaveResult"]

_DELETED = "was deleted while this engine had it open"

MAX_SAVE_ATTEMPTS = 64
"""Compare-and-swap attempts before a save gives up with HeadConflictError."""


class SaveResult(BaseModel):
    """What :meth:`ContextEngine.save` returns: the branch head after the save."""

    model_config = ConfigDict(frozen=True)

    head_message_id: str | None


class InspectFragments(BaseModel):
    """The fragments of an :class:`InspectResult`, as JSON-able data."""

    context: list[dict[str, Any]]
    """System-prompt fragments (lazy data materialised)."""
    pending: list[dict[str, Any]]
    """Message fragments waiting for ``save()``."""
    persisted: list[MessageRecord]
    """The stored messages of the branch, root first."""


class InspectMeta(BaseModel):
    """Where and when an :class:`InspectResult` was taken."""

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


_WRITE_LOCKS: weakref.WeakKeyDictionary[
    ContextStore, weakref.WeakValueDictionary[str, asyncio.Lock]
]
_WRITE_LOCKS = weakref.WeakKeyDictionary()


def _chat_write_lock(store: ContextStore, chat_id: str) -> asyncio.Lock:
    """One lock per store and chat, shared by the engines of this process.

    Writers of one chat in one process take turns instead of racing each other's
    compare-and-swap (which costs every loser a wasted transaction); writers in other
    processes are still handled by the compare-and-swap.
    """
    locks = _WRITE_LOCKS.get(store)
    if locks is None:
        locks = _WRITE_LOCKS[store] = weakref.WeakValueDictionary()
    lock = locks.get(chat_id)
    if lock is None:
        lock = locks[chat_id] = asyncio.Lock()
    return lock


class _Chain:
    """The branch's chain as the engine last saw it: records and decoded messages.

    ``version`` is the chat's change version the cached content corresponds to (None: the
    cache must be loaded).

    When the chain is cut (a rewind, a switch to an ancestor), the part cut off is kept as
    the *detached tail*: moving back to a message in it (switching back to the branch that
    was left) re-attaches it instead of reading the chain again, and the cut costs no
    deallocation of thousands of messages on the caller's path.
    """

    __slots__ = (
        "detached",
        "detached_version",
        "head",
        "index",
        "messages",
        "placeholders",
        "records",
        "version",
    )

    def __init__(self) -> None:
        self.head: str | None = None
        self.version: int | None = None
        self.records: list[MessageRecord] = []
        self.messages: list[Message] = []
        self.index: dict[str, int] = {}
        self.placeholders: builtins.set[str] = builtins.set()
        """Ids of the empty assistant placeholders on the chain (resolve leaves them out)."""
        self.detached: tuple[list[MessageRecord], list[Message]] | None = None
        self.detached_version = 0

    def reset(self, head: str | None, version: int, records: list[MessageRecord]) -> None:
        self.head, self.version = head, version
        self.records = records
        self.messages = _decode_all(records)
        self.index = {record.id: i for i, record in enumerate(records)}
        self.placeholders = {m.id for m in self.messages if is_empty_assistant_placeholder(m)}
        self.detached = None

    def invalidate(self) -> None:
        self.version = None
        self.detached = None

    def truncate(self, message_id: str | None, *, reattach: bool = True) -> bool:
        """Make ``message_id`` the head (None: empty): cut the chain after it, or re-attach
        the detached tail up to it. False if it is not cached."""
        if self.version is None:
            return False
        if message_id is None:
            keep = 0
        elif message_id in self.index:
            keep = self.index[message_id] + 1
        else:
            return reattach and self._reattach(message_id)
        self._cut(keep)
        self.head = message_id
        return True

    def _cut(self, keep: int) -> None:
        if keep >= len(self.records):
            return
        records, messages = self.records[keep:], self.messages[keep:]
        index = self.index
        for record in records:
            del index[record.id]
        if self.placeholders:
            self.placeholders.difference_update(record.id for record in records)
        del self.records[keep:]
        del self.messages[keep:]
        assert self.version is not None
        if self.detached is not None and self.detached[0][0].parent_id == records[-1].id:
            # The tail cut before continues this one: keep them as one.
            records += self.detached[0]
            messages += self.detached[1]
            self.detached_version = min(self.detached_version, self.version)
        else:
            self.detached_version = self.version
        self.detached = (records, messages)

    def _reattach(self, message_id: str) -> bool:
        if self.detached is None:
            return False
        records, messages = self.detached
        end = next((i for i, record in enumerate(records) if record.id == message_id), None)
        if end is None:
            return False
        anchor = records[0].parent_id
        if anchor is not None and anchor not in self.index:
            return False
        assert self.version is not None
        since = self.detached_version
        self.detached = None
        self._cut(0 if anchor is None else self.index[anchor] + 1)
        for record, message in zip(records[: end + 1], messages[: end + 1], strict=True):
            self.append(record, message)
        # Changes made to the tail while it was detached were not applied: fetch them again.
        self.version = min(self.version, since)
        return True

    def append(self, record: MessageRecord, message: Message) -> None:
        self.index[record.id] = len(self.records)
        self.records.append(record)
        self.messages.append(message)
        self.head = record.id
        if is_empty_assistant_placeholder(message):
            self.placeholders.add(record.id)

    def replace(self, record: MessageRecord, message: Message) -> None:
        position = self.index[record.id]
        self.records[position] = record
        self.messages[position] = message
        if is_empty_assistant_placeholder(message):
            self.placeholders.add(record.id)
        else:
            self.placeholders.discard(record.id)


def _decode(record: MessageRecord) -> Message:
    try:
        message = Message.model_validate(record.data)
    except ValidationError as exc:
        raise SerializationError(
            f"stored message {record.id!r} is not a valid Message ({exc.error_count()} "
            "errors); it was written outside the engine with another shape"
        ) from exc
    if message.id != record.id:
        # Written outside the engine with another id in its JSON: the node's id is the
        # identity (rewind, in-place updates and placeholders go by it).
        message = message.model_copy(update={"id": record.id})
    return message


def _decode_all(records: list[MessageRecord]) -> list[Message]:
    """Decode a loaded chain. A long one with the cyclic garbage collector paused: it
    creates tens of thousands of long-lived objects and no garbage, and the collector's
    passes over them would take about as long as the decoding itself."""
    if len(records) < 1000 or not gc.isenabled():
        return [_decode(record) for record in records]
    gc.disable()
    try:
        return [_decode(record) for record in records]
    finally:
        gc.enable()


def _message_json(message: Message) -> bytes:
    """A message exactly as pydantic serialises it, so a replay gives back the same bytes."""
    return message.model_dump_json().encode("utf-8")


def _usage_dict(usage: object) -> dict[str, Any]:
    if isinstance(usage, Mapping):
        return dict(usage)
    dump = getattr(usage, "model_dump", None)
    if callable(dump):
        dumped = dump()
        if isinstance(dumped, Mapping):
            return dict(dumped)
    if hasattr(usage, "__dict__"):
        return {k: val for k, val in vars(usage).items() if not k.startswith("_")}
    raise InvalidTypeError(
        "usage must be a dict of token counts or an object with model_dump(), "
        f"got {v.type_name(usage)}"
    )


def _add_usage(total: Mapping[str, Any], usage: Mapping[str, Any]) -> dict[str, Any]:
    """Sum numbers key by key (nested dicts too); keep the latest value of anything else."""
    out = dict(total)
    for key, value in usage.items():
        if not isinstance(key, str):
            raise InvalidInputError(f"usage keys must be strings, got {key!r}")
        if value is None:
            continue
        if isinstance(value, Mapping):
            current = out.get(key)
            out[key] = _add_usage(current if isinstance(current, Mapping) else {}, value)
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            out[key] = value
        else:
            current = out.get(key)
            if isinstance(current, bool) or not isinstance(current, (int, float)):
                current = 0
            out[key] = current + value
    return out


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


class ContextEngine:
    """The context of one chat for one user: system-prompt fragments and the message graph.

    Args:
        store: Where the chat lives.
        chat_id: The chat; created on first use if it does not exist.
        user_id: Its owner. Opening another user's chat raises
            :class:`~agentcontext.ChatOwnershipError`.
        metadata: Merged into the chat's metadata once, on first use.
        lazy_max_depth: Deepest chain of lazy values loaded (default 10).
        lazy_max_items: Most items one lazy generator may yield (default 10 000).

    The engine initialises itself on the first async call: it upserts the chat, checks its
    owner, merges ``metadata`` and loads the chat's active branch (whatever its name).

    Example::

        context = ContextEngine(store=store, chat_id="chat-1", user_id="user-1")
        context.set(role("You are helpful."), user("Hello!"))
        result = await context.resolve()
        context.set(assistant_text("Hi there!"))
        await context.save()
    """

    def __init__(
        self,
        *,
        store: ContextStore,
        chat_id: str,
        user_id: str,
        metadata: Mapping[str, Any] | None = None,
        lazy_max_depth: int = 10,
        lazy_max_items: int = 10_000,
    ) -> None:
        if not isinstance(store, ContextStore):
            raise InvalidTypeError(f"store must be a ContextStore, got {v.type_name(store)}")
        self._store = store
        self._chat_id = v.check_id(chat_id, "chat_id")
        self._user_id = v.check_id(user_id, "user_id")
        self._initial_metadata = (
            None if metadata is None else v.check_json_object(metadata, "metadata")
        )
        v.check_int(lazy_max_depth, "lazy_max_depth", minimum=1)
        v.check_int(lazy_max_items, "lazy_max_items", minimum=0)
        self._resolver = LazyResolver(max_depth=lazy_max_depth, max_items=lazy_max_items)
        self._fragments: list[ContextFragment] = []
        self._pending: list[ContextFragment] = []
        self._chat: Chat | None = None
        self._branch: Branch | None = None
        self._chain = _Chain()
        self._turn: str | None = None
        self._lock = asyncio.Lock()
        self._write_lock = _chat_write_lock(store, self._chat_id)

    # --- properties -------------------------------------------------------------------------

    @property
    def store(self) -> ContextStore:
        """The store the engine writes to."""
        return self._store

    @property
    def chat_id(self) -> str:
        """The chat's id."""
        return self._chat_id

    @property
    def user_id(self) -> str:
        """The owner's id."""
        return self._user_id

    @property
    def branch(self) -> str | None:
        """The name of the engine's branch (the chat's active branch when it was loaded, or the
        one it moved to); None before the first async call."""
        return None if self._branch is None else self._branch.name

    @property
    def head_message_id(self) -> str | None:
        """The head of the engine's branch as last seen; None for an empty branch."""
        if self._branch is None:
            return None
        if self._chain.version is not None:
            return self._chain.head
        return self._branch.head_message_id

    @property
    def chat(self) -> Chat | None:
        """The chat record as last read or written; None before the first async call."""
        return self._chat

    @property
    def fragments(self) -> list[ContextFragment]:
        """The system-prompt fragments (a copy)."""
        return list(self._fragments)

    @property
    def pending(self) -> list[ContextFragment]:
        """The message fragments waiting for :meth:`save` (a copy)."""
        return list(self._pending)

    def __repr__(self) -> str:
        return (
            f"ContextEngine(chat_id={self._chat_id!r}, user_id={self._user_id!r}, "
            f"branch={self.branch!r})"
        )

    # --- set --------------------------------------------------------------------------------

    def set(self, *fragments: ContextFragment) -> ContextEngine:
        """Add fragments: messages queue for :meth:`save`, the rest form the system prompt.

        Returns the engine, so calls chain.
        """
        for index, fragment in enumerate(fragments):
            if not isinstance(fragment, ContextFragment):
                raise InvalidTypeError(
                    f"set() takes ContextFragment objects; argument {index} is a "
                    f"{v.type_name(fragment)} (build one with role(), hint(), user(), ...)"
                )
            check_fragment_data(fragment, f"set() argument {index} (fragment {fragment.name!r})")
        for fragment in fragments:
            if is_message_fragment(fragment):
                self._pending.append(fragment)
            else:
                self._fragments.append(fragment)
        return self

    def clear_pending(self) -> list[ContextFragment]:
        """Drop the messages waiting for :meth:`save` (say, after a failed model call) and
        return them."""
        dropped = list(self._pending)
        self._pending.clear()
        return dropped

    # --- initialisation and syncing -----------------------------------------------------------

    async def initialize(self) -> None:
        """Load the chat (creating it if needed) and its active branch. Idempotent."""
        async with self._session():
            pass

    @asynccontextmanager
    async def _session(self) -> AsyncIterator[None]:
        """Hold the engine's lock, initialised; name a chat deleted under the engine clearly."""
        async with self._lock:
            try:
                await self._ensure_initialized()
                yield
            except ChatNotFoundError as exc:
                if self._branch is None or _DELETED in str(exc):
                    raise
                raise self._deleted_error() from exc

    def _deleted_error(self) -> ChatNotFoundError:
        branch = "" if self._branch is None else f" (or its branch {self._branch.name!r})"
        return ChatNotFoundError(
            f"chat {self._chat_id!r}{branch} {_DELETED}; create a new engine to start it again"
        )

    async def _require_chat(self) -> None:
        """Before reporting something missing: a deleted chat is the better explanation."""
        if await self._store.get_chat(self._chat_id) is None:
            raise self._deleted_error()

    async def _ensure_initialized(self) -> None:
        if self._branch is not None:
            return
        chat = await self._store.upsert_chat(self._chat_id, user_id=self._user_id)
        if chat.user_id != self._user_id:
            raise ChatOwnershipError(
                f"chat {self._chat_id!r} belongs to another user; open it with its owner's "
                "user_id or use another chat_id"
            )
        wanted = self._initial_metadata
        if wanted and any(chat.metadata.get(k, object()) != val for k, val in wanted.items()):
            chat = await self._store.update_chat(
                self._chat_id, lambda current: ChatUpdate(metadata={**current.metadata, **wanted})
            )
        self._initial_metadata = None
        branch = await self._store.get_active_branch(self._chat_id)
        if branch is None:
            if await self._store.get_chat(self._chat_id) is None:
                raise ChatNotFoundError(
                    f"chat {self._chat_id!r} was deleted while the engine opened it; retry"
                )
            raise InvalidGraphError(
                f"chat {self._chat_id!r} has no active branch: the database was changed "
                "outside agentcontext. Make one active with store.set_active_branch(chat_id, "
                "branch_id), or create one with store.create_branch(..., activate=True)"
            )
        self._chat = chat
        self._branch = branch

    async def _sync(self) -> None:
        """Bring the cached chain up to date with the store."""
        assert self._branch is not None
        state = await self._store.get_branch_state(self._branch.id)
        if state is None:
            self._chain.invalidate()
            raise self._deleted_error()
        self._branch = state.branch
        head, version = state.branch.head_message_id, state.version
        chain = self._chain
        if chain.version is not None and chain.version == version and chain.head == head:
            return
        if chain.version is not None and await self._catch_up(head, version):
            return
        records = [] if head is None else await self._store.get_message_chain(head)
        chain.reset(head, version, records)

    async def _catch_up(self, head: str | None, version: int) -> bool:
        """Apply the changes since the cached version; False when a full load is needed."""
        chain = self._chain
        assert chain.version is not None
        changes = await self._store.get_changes(self._chat_id, chain.version)
        by_id = {record.id: record for record in changes}
        for record in changes:
            if record.id in chain.index:
                cached = chain.records[chain.index[record.id]]
                if cached.parent_id != record.parent_id:
                    return False  # re-parented: the chain itself changed
                chain.replace(record, _decode(record))
        if head != chain.head:
            # Walk back from the new head through what changed, to a message we hold.
            tail: list[MessageRecord] = []
            current = head
            while (
                current is not None
                and current != chain.head
                and current not in chain.index
                and current in by_id
            ):
                tail.append(by_id[current])
                current = by_id[current].parent_id
                if len(tail) > len(by_id):
                    return False  # a cycle in stored data: the full load reports it
            if current != chain.head and not chain.truncate(current, reattach=False):
                return False  # the new head is not reachable from what changed
            for record in reversed(tail):
                chain.append(record, _decode(record))
            chain.head = head
        chain.version = version
        return True

    # --- resolve ----------------------------------------------------------------------------

    async def resolve(
        self, *, renderer: ContextRenderer | None = None, record: bool = False
    ) -> ResolveResult:
        """Render the system prompt and assemble the conversation.

        Lazy fragment data is materialised first (once per engine). The messages are the
        branch's stored chain, with pending messages appended; a pending message with the id
        of a stored one replaces it in place, and empty assistant placeholders are left out.

        Args:
            renderer: Defaults to :class:`~agentcontext.XmlRenderer`.
            record: Store what the model is shown so :meth:`replay` can give it back.
        """
        renderer = self._check_renderer(renderer)
        v.check_bool(record, "record")
        async with self._session():
            fragments = await self._materialize()
            system_prompt = renderer.render(fragments)
            await self._sync()
            messages = self._compose()
            result = ResolveResult(system_prompt=system_prompt, messages=messages)
            if record:
                result = await self._record(result, renderer)
            return result

    async def _record(self, result: ResolveResult, renderer: ContextRenderer) -> ResolveResult:
        """Store the prompt and the messages as blobs; return the result with its record id."""
        assert self._branch is not None
        record = await self._store.create_resolve_record(
            self._chat_id,
            branch_id=self._branch.id,
            branch_name=self._branch.name,
            head_message_id=self._chain.head,
            renderer=repr(renderer),
            system_prompt=result.system_prompt,
            messages=[(message.id, _message_json(message)) for message in result.messages],
        )
        return result.model_copy(update={"record_id": record.id})

    async def replay(self, record_id: str) -> ResolveResult:
        """What a ``resolve(record=True)`` returned, rebuilt from the store byte for byte.

        Works however the branch moved on since. Raises
        :class:`~agentcontext.NotFoundError` for an unknown record or one of another chat.
        """
        v.check_id(record_id, "record_id")
        async with self._session():
            record = await self._store.get_resolve_record(record_id)
            if record is None or record.chat_id != self._chat_id:
                raise NotFoundError(f"chat {self._chat_id!r} has no resolve record {record_id!r}")
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
            return await self._store.list_resolve_records(self._chat_id)

    # --- snapshots --------------------------------------------------------------------------

    async def snapshot(self, snapshot: ContextSnapshot) -> ContextSnapshot:
        """Store a context snapshot attached to the chat and the current head message.

        Returns the stored, immutable copy (with its ``id``); the contents it holds are
        written once by hash, however many snapshots or chats use them.
        """
        if not isinstance(snapshot, ContextSnapshot):
            raise InvalidTypeError(
                f"snapshot() takes a ContextSnapshot, got {v.type_name(snapshot)}"
            )
        async with self._session():
            head = await self._fresh_head()
            return await self._store.save_snapshot(snapshot, chat_id=self._chat_id, message_id=head)

    async def list_snapshots(self) -> list[ContextSnapshot]:
        """The chat's snapshots, newest first (without their contents)."""
        async with self._session():
            return await self._store.list_snapshots(self._chat_id)

    async def load_snapshot(
        self, snapshot_id: str, *, with_content: bool = False
    ) -> ContextSnapshot:
        """One of the chat's snapshots; ``with_content`` loads its items' contents too."""
        v.check_id(snapshot_id, "snapshot_id")
        v.check_bool(with_content, "with_content")
        async with self._session():
            found = await self._store.get_snapshot(snapshot_id, with_content=with_content)
        if found is None or found.chat_id != self._chat_id:
            raise NotFoundError(f"chat {self._chat_id!r} has no snapshot {snapshot_id!r}")
        return found

    async def get_messages(self) -> list[Message]:
        """The conversation as :meth:`resolve` returns it, without rendering the prompt."""
        async with self._session():
            await self._sync()
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
        return await self._resolver.materialize(self._fragments, LoadContext(engine=self))

    def _last_assistant_id(self, pending: Sequence[ContextFragment]) -> str | None:
        for fragment in reversed(pending):
            if fragment.name == "assistant" and not is_lazy_fragment(fragment):
                return message_of(fragment).id
        for message in reversed(self._chain.messages):
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
        chain = self._chain
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

    async def save(self, *, branch: bool = True) -> SaveResult:
        """Store the pending messages as new nodes after the branch head, atomically.

        A pending message whose id already exists in the chat:

        - ``branch=True`` (default): the original stays intact; a new branch ``X-vN`` starts
          at its parent and the message is saved there under a fresh id (in the record and
          in the message alike). The engine moves to that branch.
        - ``branch=False``: it is updated in place (same id, same parent).

        Messages and the head move in one transaction. When another writer moved the head
        meanwhile, the turn is grafted onto the new head and retried (compare-and-swap);
        :class:`~agentcontext.HeadConflictError` only after bounded retries. On any failure the
        pending messages stay queued and the database is unchanged. Two pending messages with
        one id are saved once: the later one's content at the earlier one's place.
        """
        v.check_bool(branch, "branch")
        async with self._session():
            assert self._branch is not None
            if not self._pending:
                return SaveResult(head_message_id=self.head_message_id)
            if self._chain.version is None:
                await self._sync()
            messages = self._pending_messages()
            result = await self._write_turn(messages, branch=branch)
            self._pending.clear()
            return result

    def _record_of(self, message: Message, parent_id: str | None) -> MessageRecord:
        # Python mode, not JSON mode: JSON mode would silently turn NaN and infinity into null
        # and stringify other values; the store refuses them with a SerializationError instead.
        data = message.model_dump(exclude_none=True)
        return MessageRecord(
            id=message.id,
            chat_id=self._chat_id,
            parent_id=parent_id,
            name=message.role,
            type="message",
            data=data,
            created_at=utcnow(),
        )

    async def _write_turn(self, messages: list[Message], *, branch: bool) -> SaveResult:
        assert self._branch is not None
        chain = self._chain
        expected = chain.head if chain.version is not None else self._branch.head_message_id
        # Ids that may be updated in place: none when branching, else those known to exist.
        on_chain = [message.id for message in messages if message.id in chain.index]
        if branch and on_chain:
            # Resending a message of the branch: fork from its parent (no store round trip,
            # and no record that would name itself as its parent).
            return await self._fork_for_update(messages, on_chain[0])
        known: builtins.set[str] = builtins.set() if branch else builtins.set(on_chain)
        async with self._write_lock:
            return await self._attempt_writes(messages, expected, known, branch=branch)

    async def _attempt_writes(
        self,
        messages: list[Message],
        expected: str | None,
        known: builtins.set[str],
        *,
        branch: bool,
    ) -> SaveResult:
        assert self._branch is not None
        pending_ids = {message.id for message in messages}
        ambiguous = False
        for attempt in range(MAX_SAVE_ATTEMPTS):
            if expected is not None and expected in pending_ids and expected not in known:
                # Another writer stored one of these ids and made it the head meanwhile.
                if branch:
                    return await self._fork_for_update(messages, expected)
                known.add(expected)
            records = self._chained(messages, expected, known)
            new_ids = [r.id for r in records if r.id not in known]
            try:
                if not new_ids:
                    # branch=False and only in-place updates: the head does not move, but
                    # another writer may have moved it since this engine last looked.
                    await self._store.add_messages(records)
                    self._apply_updates(records, messages)
                    state = await self._store.get_branch_state(self._branch.id)
                    if state is None:
                        raise self._deleted_error()
                    return SaveResult(head_message_id=state.branch.head_message_id)
                result = await self._store.append_messages(
                    self._branch.id,
                    records,
                    expected_head=expected,
                    new_head=new_ids[-1],
                    updates=known,
                )
            except StoreUnavailableError:
                # The connection dropped: the write may or may not have committed.
                ambiguous = True
                if attempt >= 2:
                    raise
                await asyncio.sleep(0.05 * (attempt + 1))
                continue
            if result.ok:
                await self._after_append(records, messages, result.version, expected, known)
                return SaveResult(head_message_id=result.head_message_id)
            if (ambiguous or result.existing) and await self._already_applied(
                [r for r in records if r.id not in known], result.head_message_id
            ):
                await self._sync()  # fast-forward: this turn is on the branch already
                return SaveResult(head_message_id=self.head_message_id)
            if result.existing:
                if branch:
                    return await self._fork_for_update(messages, result.existing[0])
                known.update(result.existing)  # in-place updates of messages off the chain
                continue
            # Another writer moved the head: graft the turn onto the new head and retry at
            # once (the head just read is as fresh as it gets). After repeated losses to
            # writers of other processes, back off with jitter, then read the head again.
            expected = result.head_message_id
            if attempt >= 2:
                await asyncio.sleep(random.uniform(0, min(0.05, 0.001 * 2 ** (attempt - 2))))
                state = await self._store.get_branch_state(self._branch.id)
                if state is None:
                    raise self._deleted_error()
                expected = state.branch.head_message_id
        raise HeadConflictError(
            f"the head of branch {self._branch.name!r} kept moving: {MAX_SAVE_ATTEMPTS} "
            "attempts lost the race to other writers. Nothing was written; the messages are "
            "still pending, save again"
        )

    def _chained(
        self, messages: list[Message], parent_id: str | None, known: builtins.set[str]
    ) -> list[MessageRecord]:
        """Records for ``messages``: updates keep their parent, new ones chain after
        ``parent_id`` in order."""
        chain = self._chain
        records = []
        for message in messages:
            if message.id in known:
                stored = (
                    chain.records[chain.index[message.id]] if message.id in chain.index else None
                )
                records.append(self._record_of(message, stored.parent_id if stored else None))
            else:
                records.append(self._record_of(message, parent_id))
                parent_id = message.id
        return records

    async def _already_applied(self, new: list[MessageRecord], head: str | None) -> bool:
        """Whether exactly this turn is stored already (same parent) and on the branch.

        True after a save whose commit was not acknowledged (a dropped connection), or when
        another engine saved the very same turn. A resent message with an existing id is not
        "already applied": its stored parent differs.
        """
        if not new or head is None:
            return False
        stored = await self._store.get_message(new[0].id)
        if stored is None or stored.parent_id != new[0].parent_id:
            return False
        return await self._store.is_ancestor(new[-1].id, head)

    def _apply_updates(self, records: list[MessageRecord], messages: list[Message]) -> None:
        chain = self._chain
        for record, message in zip(records, messages, strict=True):
            if record.id in chain.index:
                chain.replace(record, message)

    async def _after_append(
        self,
        records: list[MessageRecord],
        messages: list[Message],
        version: int,
        expected: str | None,
        updates: builtins.set[str],
    ) -> None:
        chain = self._chain
        if chain.version is None or chain.head != expected:
            # Grafted onto a head this engine has not seen: catch up from the store.
            await self._sync()
            return
        caught_up = chain.version == version - 1
        for record, message in zip(records, messages, strict=True):
            if record.id in chain.index:
                chain.replace(record, message)
            elif record.id not in updates:
                chain.append(record, message)
            # else: an in-place update of a message off this branch; the chain is unchanged.
        if caught_up:
            chain.version = version
        # Otherwise keep the older version: the next sync fetches what others wrote since.

    async def _fork_for_update(self, messages: list[Message], existing_id: str) -> SaveResult:
        """branch=True and a pending id exists: a new branch from its parent, fresh ids.

        The fork starts at the parent of the turn's *first* message that exists, which may
        come before ``existing_id`` (stored off the cached chain, say by another engine);
        that message and every one after it get fresh ids, so no stored message is written
        over.
        """
        assert self._branch is not None
        existing: MessageRecord | None = None
        for message in messages:
            existing = await self._store.get_message(message.id)
            if existing is not None or message.id == existing_id:
                break
        if existing is None:  # deleted meanwhile; not possible through the engine
            raise MessageNotFoundError(f"message {existing_id!r} does not exist")
        if existing.chat_id != self._chat_id:
            raise InvalidGraphError(
                f"message id {existing.id!r} is used in another chat; message ids are global, "
                "give the message a new id"
            )
        start = existing.parent_id
        renamed: list[Message] = []
        seen_existing = False
        for message in messages:
            if message.id == existing.id or seen_existing or message.id in self._chain.index:
                seen_existing = True
                message = message.model_copy(update={"id": new_message_id()})
            renamed.append(message)
        records: list[MessageRecord] = []
        parent = start
        for message in renamed:
            records.append(self._record_of(message, parent))
            parent = message.id
        info = await self._store.fork_branch(
            self._chat_id,
            self._branch.name,
            head_message_id=start,
            activate=True,
            messages=records,
        )
        self._branch = Branch.model_validate(info.model_dump(exclude={"message_count"}))
        if self._chain.truncate(start):
            # The version stays: the next sync fetches the fork's own rows (and anything
            # else written since) and finds them in place.
            for record, message in zip(records, renamed, strict=True):
                self._chain.append(record, message)
        else:
            self._chain.invalidate()
        return SaveResult(head_message_id=info.head_message_id)

    # --- streaming turns ----------------------------------------------------------------------

    async def begin_turn(self, user_fragment: ContextFragment) -> str:
        """Save a user message and an empty assistant placeholder; return the placeholder's id.

        Stream the model's answer, then call :meth:`complete_turn` to fill the placeholder in
        place. Empty placeholders never appear in :meth:`resolve`. Messages already pending are
        saved first, in the same step. On failure nothing is saved and the pending queue is as
        it was before the call.
        """
        if not is_message_fragment(user_fragment):
            raise InvalidTypeError("begin_turn() takes a message fragment such as user('...')")
        placeholder = new_message_id()
        queued = len(self._pending)
        self.set(user_fragment, assistant(Message(id=placeholder, role="assistant", parts=[])))
        try:
            result = await self.save()
        except BaseException:
            # All or nothing: the queue is as before, so calling begin_turn() again is safe.
            del self._pending[queued:]
            raise
        if placeholder not in self._chain.index and result.head_message_id is not None:
            # The user message's id existed: save() forked a new branch and stored the turn
            # there under fresh ids; the placeholder, its last message, is the new head.
            placeholder = result.head_message_id
        self._turn = placeholder
        return placeholder

    async def complete_turn(self, assistant_fragment: ContextFragment) -> SaveResult:
        """Fill the placeholder of :meth:`begin_turn` with the assistant's answer, in place."""
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
                await self._sync()
                last = self._chain.messages[-1] if self._chain.messages else None
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
        position = self._chain.index.get(message_id)
        return position is not None and is_empty_assistant_placeholder(
            self._chain.messages[position]
        )

    # --- branches and checkpoints -----------------------------------------------------------

    async def _fresh_head(self) -> str | None:
        await self._sync()
        return self._chain.head

    async def rewind(self, message_id: str) -> BranchInfo:
        """Start a new branch ``X-vN`` at ``message_id`` and move to it.

        The original branch is untouched; pending messages are dropped.
        """
        v.check_id(message_id, "message_id")
        async with self._session():
            return await self._rewind(message_id)

    async def _rewind(self, message_id: str) -> BranchInfo:
        assert self._branch is not None
        if message_id not in self._chain.index:
            message = await self._store.get_message(message_id)
            if message is None:
                await self._require_chat()
                raise MessageNotFoundError(
                    f"message {message_id!r} does not exist in chat {self._chat_id!r}"
                )
            if message.chat_id != self._chat_id:
                raise InvalidGraphError(
                    f"message {message_id!r} belongs to another chat, not {self._chat_id!r}"
                )
        info = await self._store.fork_branch(
            self._chat_id, self._branch.name, head_message_id=message_id, activate=True
        )
        self._moved_to(info)
        self._pending.clear()
        self._turn = None
        return info

    def _moved_to(self, info: BranchInfo | Branch) -> None:
        self._branch = Branch.model_validate(info.model_dump(exclude={"message_count"}))
        if not self._chain.truncate(info.head_message_id):
            self._chain.invalidate()

    async def checkpoint(self, name: str) -> Checkpoint:
        """Name the current head (moving an existing checkpoint of that name)."""
        v.check_id(name, "checkpoint name")
        async with self._session():
            head = await self._fresh_head()
            if head is None:
                raise EmptyConversationError(
                    "cannot create a checkpoint: the branch has no messages yet; save first"
                )
            return await self._store.create_checkpoint(self._chat_id, name, head)

    async def restore(self, name: str) -> BranchInfo:
        """Start a new branch at a checkpoint's message and move to it (like :meth:`rewind`)."""
        v.check_id(name, "checkpoint name")
        async with self._session():
            checkpoint = await self._store.get_checkpoint(self._chat_id, name)
            if checkpoint is None:
                await self._require_chat()
                raise CheckpointNotFoundError(
                    f"chat {self._chat_id!r} has no checkpoint named {name!r}"
                )
            return await self._rewind(checkpoint.message_id)

    async def switch_branch(self, name: str) -> BranchInfo:
        """Make the branch ``name`` active and move to it; pending messages are dropped."""
        v.check_id(name, "branch name")
        async with self._session():
            target = await self._store.get_branch(self._chat_id, name)
            if target is None:
                await self._require_chat()
                raise BranchNotFoundError(f"chat {self._chat_id!r} has no branch named {name!r}")
            branch = await self._store.set_active_branch(self._chat_id, target.id)
            self._moved_to(branch)
            self._pending.clear()
            self._turn = None
            return await self._branch_info(branch)

    async def _branch_info(self, branch: Branch) -> BranchInfo:
        for info in await self._store.list_branches(self._chat_id):
            if info.id == branch.id:
                return info
        raise BranchNotFoundError(f"branch {branch.name!r} disappeared")  # pragma: no cover

    async def btw(self) -> BranchInfo:
        """Fork a new branch at the current head without moving to it ("by the way").

        Pending messages stay queued for the current branch.
        """
        async with self._session():
            assert self._branch is not None
            head = await self._fresh_head()
            if head is None:
                raise EmptyConversationError(
                    "cannot fork with btw(): the branch has no messages yet; save first"
                )
            return await self._store.fork_branch(
                self._chat_id, self._branch.name, head_message_id=head, activate=False
            )

    # --- chat metadata ----------------------------------------------------------------------

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
            self._chat = await self._store.update_chat(self._chat_id, updater)
            return self._chat

    async def track_usage(self, usage: Mapping[str, Any] | Any) -> Chat:
        """Add token usage to the chat's ``metadata["usage"]`` (numbers summed key by key).

        Accepts a dict or an SDK usage object (anything with ``model_dump()``). The sum is
        taken under the store's lock, so concurrent calls never lose an update.
        """
        increment = _usage_dict(usage)
        v.check_json(increment, "usage")

        def updater(chat: Chat) -> ChatUpdate:
            current = chat.metadata.get("usage")
            total = _add_usage(current if isinstance(current, Mapping) else {}, increment)
            return ChatUpdate(metadata={**chat.metadata, "usage": total})

        async with self._session():
            self._chat = await self._store.update_chat(self._chat_id, updater)
            return self._chat

    # --- estimate and inspect ---------------------------------------------------------------

    async def estimate(self, model_id: str, *, renderer: ContextRenderer | None = None) -> Estimate:
        """Tokens, cost and context fit of what :meth:`resolve` would send, offline."""
        v.check_text(model_id, "model_id")
        renderer = self._check_renderer(renderer)
        async with self._session():
            return await self._estimate(model_id, renderer)

    async def _estimate(self, model_id: str, renderer: ContextRenderer) -> Estimate:
        fragments = await self._materialize()
        await self._sync()
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
            assert self._branch is not None
            estimate = None if model_id is None else await self._estimate(model_id, renderer)
            fragments = await self._materialize()
            rendered = renderer.render(fragments)
            await self._sync()
            pending = [
                {"id": message.id, "name": message.role, "message": message.model_dump(mode="json")}
                for message in self._pending_messages()
            ]
            graph = await self._store.get_graph(self._chat_id)
            return InspectResult(
                estimate=estimate,
                rendered=rendered,
                fragments=InspectFragments(
                    context=[_fragment_json(fragment) for fragment in fragments],
                    pending=pending,
                    persisted=list(self._chain.records),
                ),
                graph=graph,
                meta=InspectMeta(
                    chat_id=self._chat_id, branch=self._branch.name, timestamp=utcnow()
                ),
            )
