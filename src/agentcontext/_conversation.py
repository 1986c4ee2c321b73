"""The engine's view of its chat: the chat, the branch it is on, and that branch's chain held in
memory, kept in step with the store.

Stored messages change only by an explicit in-place update, and every write bumps the chat's
change version, so a warm engine catches up with one small query (the branch and the version)
plus, when something changed, the rows written since; it never reads the whole chain again
unless it has to. A fresh engine reads the chat, its branch and version in one query and the
chain in one more, and decodes the chain's JSON into messages in one validation pass.
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any, cast

from pydantic import ValidationError

from agentcontext._gc import gc_paused
from agentcontext.errors import (
    ChatNotFoundError,
    ChatOwnershipError,
    CorruptDataError,
)
from agentcontext.fragments import is_empty_assistant_placeholder
from agentcontext.messages import Message, TextPart
from agentcontext.store.protocols import ConversationStore, JoinedTransaction
from agentcontext.store.records import (
    Branch,
    BranchInfo,
    BranchState,
    ChainRows,
    Chat,
    ChatState,
    ChatUpdate,
    MessageRecord,
)

__all__ = [
    "COMPACTION",
    "ChainCache",
    "Conversation",
    "decode_record",
    "decode_record_json",
    "decode_rows",
]

DELETED = "was deleted while this engine had it open"
COMPACTION = "compaction"
"""The stored type of a compaction summary (a message beside the branch)."""

_validate_json = Message.__pydantic_validator__.validate_json


def _corrupt(chat_id: str | None, message_id: str, reason: str) -> CorruptDataError:
    chat = "" if chat_id is None else f" of chat {chat_id!r}"
    return CorruptDataError(
        f"the stored message {message_id!r}{chat} (table messages) cannot be decoded: {reason}. "
        "It was damaged or written outside agentcontext with another shape; delete or repair "
        "that row",
        table="messages",
        chat_id=chat_id,
        row_id=message_id,
    )


def _invalid(exc: ValidationError) -> str:
    first = exc.errors()[0] if exc.error_count() else None
    if first is not None and first.get("type") == "json_invalid":
        return f"its data is not JSON ({first.get('msg', 'invalid JSON')})"
    where = ".".join(str(part) for part in first["loc"]) if first and first.get("loc") else ""
    detail = f" ({where}: {first['msg']})" if first and where else ""
    return f"its data is not a valid Message ({exc.error_count()} errors{detail})"


def decode_record(record: MessageRecord) -> Message:
    """A stored record's message (its id is the record's)."""
    try:
        message = Message.model_validate(record.data)
    except ValidationError as exc:
        raise _corrupt(record.chat_id, record.id, _invalid(exc)) from exc
    if message.id != record.id:
        # Written outside the engine with another id in its JSON: the node's id is the
        # identity (rewind, in-place updates and placeholders go by it).
        message = message.model_copy(update={"id": record.id})
    return message


def decode_record_json(
    message_id: str, data: str | bytes | None, chat_id: str | None = None
) -> Message:
    """A stored message from its JSON text (its id is the record's)."""
    rows = ChainRows(ids=[message_id], parent_ids=[None], data=[data])
    return decode_rows(rows, chat_id)[0]


def decode_rows(rows: ChainRows, chat_id: str | None = None) -> list[Message]:
    """The messages of a stored chain, validated from their JSON one row at a time.

    One pydantic-core call per row, with no Python in between: joining rows into one JSON
    array costs more than it saves (a single emoji makes the whole array four bytes a
    character). A row that cannot be decoded raises `CorruptDataError` naming it.
    """
    if not rows.ids:
        return []
    data = rows.data
    try:
        with gc_paused():
            messages = [_validate_json(text) for text in cast(list[str | bytes], data)]
    except (ValidationError, TypeError, ValueError):
        for message_id, text in zip(rows.ids, data, strict=True):
            if not isinstance(text, (str, bytes)):
                raise _corrupt(chat_id, message_id, "it has no data") from None
            try:
                _validate_json(text)
            except ValidationError as exc:
                raise _corrupt(chat_id, message_id, _invalid(exc)) from exc
        raise  # pragma: no cover - the list failed, so one of its rows does
    if [message.id for message in messages] != rows.ids:
        for i, (message, message_id) in enumerate(zip(messages, rows.ids, strict=True)):
            if message.id != message_id:
                messages[i] = message.model_copy(update={"id": message_id})
    return messages


def _blank(text: str) -> bool:
    """Whether ``text`` is empty or only whitespace (without copying it)."""
    return not text or text.isspace()


def _placeholders(messages: list[Message]) -> builtins.set[str]:
    """Ids of the empty assistant placeholders among ``messages``."""
    found: builtins.set[str] = builtins.set()
    for m in messages:
        if m.role == "assistant":
            parts = m.parts
            # Most replies start with a part that settles it (text with words, a tool call).
            first = parts[0] if parts else None
            if first is not None and (not isinstance(first, TextPart) or not _blank(first.text)):
                continue
            if is_empty_assistant_placeholder(m):
                found.add(m.id)
    return found


_NEWEST = 2**63
"""A version above any chat's: `ChainMemory.recall` of every chain held."""

_OBJECT_BYTES = 1536
"""Estimated bytes of a decoded message besides its text (its objects and their dicts)."""

CHEAP_COPY = 2000
"""Chains up to this length are left in the store's memory after every save of an engine;
longer ones after its first save only, or when the memory holds none of the chat yet (a
fresh engine catches up from an older copy with one small query). A copy shares the cache's
lists, and the cache copies them before it next changes them (`ChainCache.copy`): an engine
that saves again and again would copy a long chain at each save."""


def _message_bytes(message: Message) -> int:
    """Estimated bytes of a decoded message: its objects, plus its text parts at their length
    (a message appended since the load has no stored JSON to measure)."""
    size = _OBJECT_BYTES
    for part in message.parts:
        text = getattr(part, "text", None)
        if isinstance(text, str):
            size += len(text)
    return size


_Tail = tuple[list[str], list[str | None], list[Message], list[datetime | None]]
"""A detached tail: ids, parents, messages and times."""


@dataclasses.dataclass(frozen=True, slots=True)
class ChainCopy:
    """A chain as an engine held it at a committed chat version, left in the store's memory
    (`ChainMemory`) for the next engine of the chat. Its lists never change: a cache that
    shares them copies them before it changes them (`ChainCache.copy`, `ChainCache.restore`)."""

    chat_key: tuple[str, object]
    """The chat's id and incarnation (a chat deleted and created again is another)."""
    head: str | None
    version: int
    size: int
    ids: list[str]
    parents: list[str | None]
    messages: list[Message]
    index: dict[str, int]
    placeholders: frozenset[str]
    summary: Message | None
    base: str | None
    loaded: ChainRows | None
    dirty: frozenset[str]
    extra_bytes: int
    times: list[datetime | None] = dataclasses.field(default_factory=list)
    loaded_bytes: int = 0
    """Estimated bytes of the messages of the last full load (part of ``size``)."""
    branch_id: str | None = None
    """The branch of the engine that left it (it serves any branch whose head it holds)."""

    def covers(self, head: str | None) -> bool:
        """Whether ``head`` is a message of this chain."""
        return head is not None and head in self.index


class ChainCache:
    """The branch's chain as the engine last saw it: ids, parents and decoded messages.

    ``version`` is the chat's change version the cached content corresponds to (None: the
    cache must be loaded). It is the engine's `ChainView`: what it exposes beside ``ids``,
    ``messages``, ``index``, ``placeholders``, ``summary``, ``base`` and ``head`` is read
    through `folded_turns` and `created_at`.

    Each message's creation time is kept beside it: its record's for a message a save or a
    catch-up appended, the loaded row's when the store gives it (see `ChainRows.times`), else
    None.

    When the chain is cut (a rewind, a switch to an ancestor), the part cut off is kept as the
    *detached tail*: moving back to a message in it (switching back to the branch that was
    left) re-attaches it instead of reading the chain again, and the cut costs no deallocation
    of thousands of messages on the caller's path.
    """

    __slots__ = (
        "base",
        "detached",
        "detached_version",
        "dirty",
        "expected",
        "extra_bytes",
        "head",
        "ids",
        "index",
        "loaded",
        "loaded_bytes",
        "messages",
        "parents",
        "placeholders",
        "shared",
        "summary",
        "times",
        "version",
    )

    def __init__(self) -> None:
        self.head: str | None = None
        self.version: int | None = None
        self.ids: list[str] = []
        self.parents: list[str | None] = []
        self.messages: list[Message] = []
        self.index: dict[str, int] = {}
        self.times: list[datetime | None] = []
        """Each message's ``created_at``, or None when not known."""
        self.placeholders: builtins.set[str] = builtins.set()
        """Ids of the empty assistant placeholders on the chain (resolve leaves them out)."""
        self.detached: _Tail | None = None
        self.detached_version = 0
        self.expected: tuple[int, str | None] | None = None
        """``(version, head)`` the store should report if nobody else wrote since this
        engine's last save (whose version was not read back)."""
        self.loaded: ChainRows | None = None
        """The rows of the last full load (their JSON texts fingerprint the messages)."""
        self.dirty: builtins.set[str] = builtins.set()
        """Ids of loaded messages changed since."""
        self.summary: Message | None = None
        """The compaction standing for the chain up to ``base`` (the messages held start
        after it), or None: the messages held start at the root."""
        self.base: str | None = None
        self.extra_bytes = 0
        """Estimated bytes of the messages decoded since the load (see `copy`)."""
        self.loaded_bytes = 0
        """Estimated bytes of the messages of the last full load (see `copy`)."""
        self.shared = False
        """Whether a copy in the store's memory shares the lists (``ids``, ``parents``,
        ``messages``, ``times``, ``index``): they are copied before they change (`_own`)."""

    def expect(self, version: int, head: str | None) -> None:
        """The version and head the store reaches if nobody else writes (see `confirm`)."""
        self.expected = (version, head)

    def confirm(self, version: int, head: str | None) -> bool:
        """Whether the store's ``(version, head)`` is the expected one: the cache is then up
        to date at that version."""
        expected, self.expected = self.expected, None
        if self.version is not None and expected == (version, head):
            self.version = version
            return True
        return False

    def reset(
        self,
        head: str | None,
        version: int,
        ids: list[str],
        parents: list[str | None],
        messages: list[Message],
        *,
        summary: Message | None = None,
        base: str | None = None,
        loaded: ChainRows | None = None,
    ) -> None:
        self.summary, self.base = summary, base
        times = [] if loaded is None else loaded.times
        if len(times) != len(ids):  # the store gives none
            times = [None] * len(ids)
        # The cache's own lists grow and shrink with the chain: keep the loaded ids apart (the
        # times are the cache's alone).
        self.loaded = (
            None if loaded is None else dataclasses.replace(loaded, ids=list(loaded.ids), times=[])
        )
        self.dirty = builtins.set()
        self.head, self.version = head, version
        self.ids, self.parents, self.messages = ids, parents, messages
        self.times = times
        self.index = dict(zip(ids, range(len(ids)), strict=True))
        self.placeholders = _placeholders(messages)
        self.detached = None
        self.expected = None
        self.extra_bytes = 0
        self.loaded_bytes = (
            0 if loaded is None else sum(map(len, filter(None, loaded.data))) * 3 // 2
        )
        self.shared = False

    def copy(self, chat_key: tuple[str, object], branch_id: str | None = None) -> ChainCopy:
        """A copy of the chain as held now (its version must be one read from the store). It
        shares this cache's lists, which the cache copies before it next changes them: a
        chain left in the memory after a save costs nothing more when the engine is done."""
        assert self.version is not None
        self.shared = True
        return ChainCopy(
            chat_key=chat_key,
            head=self.head,
            version=self.version,
            size=_OBJECT_BYTES * len(self.ids) + self.extra_bytes + self.loaded_bytes,
            ids=self.ids,
            parents=self.parents,
            messages=self.messages,
            index=self.index,
            times=self.times,
            placeholders=frozenset(self.placeholders),
            summary=self.summary,
            base=self.base,
            loaded=self.loaded,
            loaded_bytes=self.loaded_bytes,
            dirty=frozenset(self.dirty),
            extra_bytes=self.extra_bytes,
            branch_id=branch_id,
        )

    def restore(self, held: ChainCopy) -> None:
        """Hold the chain of ``held`` (its lists shared until this cache changes them)."""
        self.head, self.version = held.head, held.version
        self.ids, self.parents = held.ids, held.parents
        self.messages, self.index = held.messages, held.index
        self.times = held.times
        self.shared = True
        self.placeholders = builtins.set(held.placeholders)
        self.summary, self.base = held.summary, held.base
        self.loaded, self.dirty = held.loaded, builtins.set(held.dirty)
        self.loaded_bytes = held.loaded_bytes
        self.extra_bytes = held.extra_bytes
        self.detached = None
        self.expected = None

    def _own(self) -> None:
        """Before the lists change: copy them if a copy in the store's memory shares them."""
        if self.shared:
            self.ids, self.parents = self.ids.copy(), self.parents.copy()
            self.messages, self.times = self.messages.copy(), self.times.copy()
            self.index = self.index.copy()
            self.shared = False

    def invalidate(self) -> None:
        self.version = None
        self.detached = None
        self.expected = None

    def parent_of(self, message_id: str) -> str | None:
        """The stored parent of a cached message."""
        return self.parents[self.index[message_id]]

    def truncate(self, message_id: str | None, *, reattach: bool = True) -> bool:
        """Make ``message_id`` the head (None: empty): cut the chain after it, or re-attach
        the detached tail up to it. False if it is not cached."""
        if self.version is None:
            return False
        if message_id is None:
            if self.summary is not None:
                return False
            keep = 0
        elif message_id == self.base:
            keep = 0
        elif message_id in self.index:
            keep = self.index[message_id] + 1
        else:
            return reattach and self._reattach(message_id)
        self._cut(keep)
        self.head = message_id
        return True

    def _cut(self, keep: int) -> None:
        if keep >= len(self.ids):
            return
        self._own()
        ids, parents, messages = self.ids[keep:], self.parents[keep:], self.messages[keep:]
        times = self.times[keep:]
        index = self.index
        for message_id in ids:
            del index[message_id]
        if self.placeholders:
            self.placeholders.difference_update(ids)
        del self.ids[keep:]
        del self.parents[keep:]
        del self.messages[keep:]
        del self.times[keep:]
        assert self.version is not None
        if self.detached is not None and self.detached[1][0] == ids[-1]:
            # The tail cut before continues this one: keep them as one.
            ids += self.detached[0]
            parents += self.detached[1]
            messages += self.detached[2]
            times += self.detached[3]
            self.detached_version = min(self.detached_version, self.version)
        else:
            self.detached_version = self.version
        self.detached = (ids, parents, messages, times)

    def _reattach(self, message_id: str) -> bool:
        if self.detached is None:
            return False
        ids, parents, messages, times = self.detached
        try:
            end = ids.index(message_id)
        except ValueError:
            return False
        anchor = parents[0]
        if anchor is not None and anchor not in self.index and anchor != self.base:
            return False
        assert self.version is not None
        since = self.detached_version
        self.detached = None
        self._cut(0 if anchor is None or anchor == self.base else self.index[anchor] + 1)
        for i in range(end + 1):
            self.append(ids[i], parents[i], messages[i], times[i])
        # Changes made to the tail while it was detached were not applied: fetch them again.
        self.version = min(self.version, since)
        return True

    def append(
        self,
        message_id: str,
        parent_id: str | None,
        message: Message,
        created_at: datetime | None,
    ) -> None:
        """A message after the head, stored at ``created_at`` (None: not known)."""
        self._own()
        self.index[message_id] = len(self.ids)
        self.ids.append(message_id)
        self.parents.append(parent_id)
        self.messages.append(message)
        self.times.append(created_at)
        self.head = message_id
        self.extra_bytes += _message_bytes(message)
        if is_empty_assistant_placeholder(message):
            self.placeholders.add(message_id)

    @property
    def folded_turns(self) -> int:
        """How many user turns the compaction standing for the start of the chain folds."""
        if self.summary is None or not self.summary.metadata:
            return 0
        meta = self.summary.metadata.get("compaction")
        turns = meta.get("turns") if isinstance(meta, dict) else None
        return turns if isinstance(turns, int) and not isinstance(turns, bool) else 0

    def created_at(self, message_id: str) -> datetime | None:
        """When a message of the chain was stored; None when the chain does not know (the
        message is not on it, or it was loaded without its time)."""
        position = self.index.get(message_id)
        return None if position is None else self.times[position]

    def raw_texts(self) -> dict[str, str | bytes | None]:
        """The stored JSON text of the loaded messages not changed since (by id)."""
        rows = self.loaded
        if rows is None:
            return {}
        texts = dict(zip(rows.ids, rows.data, strict=True))
        if rows.summary_id is not None:
            texts[rows.summary_id] = rows.summary
        for message_id in self.dirty:
            texts.pop(message_id, None)
        return texts

    def replace(self, message: Message) -> None:
        """A cached message updated in place (its parent stays)."""
        self._own()
        self.dirty.add(message.id)
        self.extra_bytes += _message_bytes(message)
        self.messages[self.index[message.id]] = message
        if is_empty_assistant_placeholder(message):
            self.placeholders.add(message.id)
        else:
            self.placeholders.discard(message.id)


class Conversation:
    """One chat as an engine sees it: its record, the branch the engine is on, the cached
    chain, and how to bring them up to date with the store."""

    def __init__(
        self,
        store: ConversationStore,
        chat_id: str,
        user_id: str,
        metadata: Mapping[str, Any] | None,
        write_lock: asyncio.Lock,
    ) -> None:
        self.store = store
        self.chat_id = chat_id
        self.user_id = user_id
        self.write_lock = write_lock
        """The chat's write turn among the engines of this process (see ``_save``)."""
        self.chat: Chat | None = None
        self.branch: Branch | None = None
        self.chain = ChainCache()
        self._metadata = None if metadata is None else dict(metadata)
        self._initial_metadata = self._metadata
        self._opened: ChatState | None = None
        self._fresh = False
        """Whether ``branch`` was read from the store during the current public call."""
        self.joined: JoinedTransaction | None = None
        """The caller's transaction (``store.using()``) the engine last worked in."""
        self.saved = False
        """Whether this engine has appended to the chat yet."""
        self.incarnation: int | None = None
        """Which insertion of the chat's row the engine opened (`ChatState.incarnation`): a
        chat deleted and created again under its id since is another chat to this engine."""

    # --- a caller's transaction -------------------------------------------------------------

    def follow_transaction(self) -> bool:
        """Before a call: forget everything seen inside a caller's transaction that rolled
        back since (the chat, its branch and chain are read again). True if it did."""
        joined = self.joined
        if joined is None or joined.is_open:
            return False
        self.joined = None
        if not joined.rolled_back:
            return False
        self.chat, self.branch, self._opened = None, None, None
        self.incarnation = None
        self.chain = ChainCache()
        self._initial_metadata = self._metadata  # merged again if the merge was undone
        return True

    @property
    def rolled_back(self) -> bool:
        """Whether what the engine holds came from a caller's transaction that rolled back
        since (it is forgotten on the engine's next call)."""
        return self.joined is not None and self.joined.rolled_back

    def note_transaction(self) -> None:
        """After a call: remember the caller's transaction it ran in, if any."""
        joined = self.store.current_transaction()
        if joined is not None:
            self.joined = joined

    # --- opening ----------------------------------------------------------------------------

    async def open(self) -> None:
        """Load the chat (creating it), check its owner, merge the initial metadata, and take
        its active branch."""
        if self.branch is not None:
            return
        state = await self.store.open_chat(self.chat_id, user_id=self.user_id)
        chat = state.chat
        if chat.user_id != self.user_id:
            raise ChatOwnershipError(
                f"chat {self.chat_id!r} belongs to another user; open it with its owner's "
                "user_id or use another chat_id"
            )
        opened: ChatState | None = state
        wanted = self._initial_metadata
        if wanted and any(chat.metadata.get(k, object()) != val for k, val in wanted.items()):
            chat = await self.store.update_chat(
                self.chat_id, lambda current: ChatUpdate(metadata={**current.metadata, **wanted})
            )
            opened = None  # the version moved: the first sync reads the branch state
        self._initial_metadata = None
        self.chat, self.branch, self._opened = chat, state.branch, opened
        self.incarnation = state.incarnation
        self._fresh = True

    def end_call(self) -> None:
        """The public call is over: what it read is no longer fresh."""
        self._opened = None
        self._fresh = False

    def deleted_error(self) -> ChatNotFoundError:
        branch = "" if self.branch is None else f" (or its branch {self.branch.name!r})"
        return ChatNotFoundError(
            f"chat {self.chat_id!r}{branch} {DELETED}; create a new engine to start it again"
        )

    async def require_chat(self) -> None:
        """Before reporting something missing: a deleted chat is the better explanation."""
        if await self.store.get_chat(self.chat_id) is None:
            raise self.deleted_error()

    # --- keeping up -------------------------------------------------------------------------

    async def sync(self) -> None:
        """Bring the cached chain up to date with the store."""
        assert self.branch is not None
        chain = self.chain
        opened, self._opened = self._opened, None
        if opened is not None and opened.branch.id == self.branch.id:
            # The state read when the chat was opened, for the branch it describes.
            head, version = opened.branch.head_message_id, opened.version
            depth, size = opened.head_depth, opened.message_count
            compactions = opened.has_compactions
        else:
            state = self._current(await self.store.get_branch_state(self.branch.id))
            self.branch = state.branch
            self._fresh = True
            head, version = state.branch.head_message_id, state.version
            depth, size = state.head_depth, state.message_count
            compactions = state.has_compactions
        if chain.version is not None and chain.version == version and chain.head == head:
            return
        if chain.confirm(version, head):
            self.remember(saved=True)
            return
        if chain.version is not None and await self._catch_up(head, version):
            self.remember()
            return
        if head is None:
            chain.reset(None, version, [], [], [])
            return
        if await self._recall(head, version):
            return
        rows = await self.store.load_chain_rows(
            self.chat_id,
            head,
            head_depth=depth,
            chat_size=size,
            compacted=compactions is not False,  # unless the chat is known to have none
        )
        summary = None
        if rows.summary_id is not None:
            summary = decode_record_json(rows.summary_id, rows.summary, self.chat_id)
        chain.reset(
            head,
            version,
            rows.ids,
            rows.parent_ids,
            decode_rows(rows, self.chat_id),
            summary=summary,
            base=rows.base_id,
            loaded=rows,
        )
        self.remember()

    async def synced_head(self) -> str | None:
        """The head of the branch as stored now (the chain brought up to date)."""
        await self.sync()
        return self.chain.head

    def _current(self, state: BranchState | None) -> BranchState:
        """``state`` if it is of the chat this engine opened; `deleted_error` when the branch
        is gone or the chat was deleted and created again since (nothing held of the chat
        this engine opened may serve the new one)."""
        if state is None or state.incarnation != self.incarnation:
            self.chain.invalidate()
            raise self.deleted_error()
        return state

    # --- the store's memory of decoded chains -----------------------------------------------

    @property
    def _chat_key(self) -> tuple[str, object] | None:
        return None if self.incarnation is None else (self.chat_id, self.incarnation)

    async def _recall(self, head: str, version: int) -> bool:
        """Start from a chain another engine of this store decoded (at ``version`` or before,
        brought up to date with the changes since); False when none serves."""
        memory, key = self.store.chain_memory, self._chat_key
        if memory is None or key is None:
            return False
        for held in memory.recall(key, version):
            if held.head != head and head not in held.index and held.version == version:
                continue  # another branch, and nothing changed since: it cannot serve
            self.chain.restore(held)
            try:
                served = (held.version == version and held.head == head) or await self._catch_up(
                    head, version
                )
            except BaseException:
                self.chain.invalidate()
                raise
            if served:
                memory.note_hit()
                if held.version != version or held.head != head:
                    self.remember()
                return True
            self.chain.invalidate()
            return False  # the newest copy cannot be brought up to date: load the chain
        return False

    def wants_saved_version(self) -> bool:
        """Whether a save should read back the chat's version, for the chain after it to be
        left in the store's memory at once: on the engine's first save only. An engine made
        per request saves once, and the next request's engine then starts from exactly that
        chain (no query for the changes since); a long-lived engine does not pay for reading
        the version back on every save, and confirms it on its next read instead."""
        memory = self.store.chain_memory
        return (
            not self.saved
            and memory is not None
            and memory.max_bytes > 0
            and self.chain.version is not None
            and self.store.current_transaction() is None
        )

    def remember(self, *, saved: bool = False, first: bool = False) -> None:
        """Leave a copy of the chain in the store's memory (only what is committed: nothing
        read or written inside a caller's transaction). After a save (``saved``) that is not
        the engine's ``first``, only a short chain, or the first of the chat (see
        `CHEAP_COPY`): an engine made per request saves once, and the next one starts from
        the chain it left."""
        memory, key = self.store.chain_memory, self._chat_key
        if memory is None or key is None or self.chain.version is None:
            return
        if self.store.current_transaction() is not None:
            return
        if saved and not first and len(self.chain.ids) > CHEAP_COPY and memory.holds(key):
            return
        memory.remember(self.chain.copy(key, None if self.branch is None else self.branch.id))

    def take_newer_saved(self, pending: Collection[str]) -> bool:
        """Before a save, in the chat's write turn: start from the chain another engine of this
        store saved on the branch since this one looked, when it continues this engine's chain
        and holds none of the ``pending`` ids. The save then goes after the head that other
        engine left, as it would after losing the race to it, without the refused write and
        the read that would tell it so. False when the memory holds no such chain (the
        store's compare-and-swap still decides)."""
        memory, key, chain = self.store.chain_memory, self._chat_key, self.chain
        if (
            memory is None
            or key is None
            or self.branch is None
            or chain.version is None
            or chain.head is None
            or self.store.current_transaction() is not None
        ):
            return False
        summary = None if chain.summary is None else chain.summary.id
        for held in memory.recall(key, _NEWEST):
            if held.version <= chain.version:
                return False  # newest first: nothing newer is held
            if (
                held.branch_id == self.branch.id
                and held.index.get(chain.head) == len(chain.ids) - 1
                and held.base == chain.base
                and (None if held.summary is None else held.summary.id) == summary
                and not any(message_id in held.index for message_id in pending)
            ):
                chain.restore(held)
                memory.note_hit()
                return True
        return False

    async def _catch_up(self, head: str | None, version: int) -> bool:
        """Apply the changes since the cached version; False when a full load is needed."""
        chain = self.chain
        assert chain.version is not None
        changes = await self.store.get_changes(self.chat_id, chain.version)
        summary = None if chain.summary is None else chain.summary.id
        if any(record.type == COMPACTION or record.id == summary for record in changes):
            # A compaction was stored (or the one in use rewritten): the full load finds
            # where it applies.
            return False
        by_id = {record.id: record for record in changes}
        for record in changes:
            if record.id in chain.index:
                if chain.parent_of(record.id) != record.parent_id:
                    return False  # re-parented: the chain itself changed
                chain.replace(decode_record(record))
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
                chain.append(record.id, record.parent_id, decode_record(record), record.created_at)
            chain.head = head
        chain.version = version
        return True

    async def branch_name(self) -> str:
        """The name of the engine's branch as stored now (another engine may have renamed
        it); forks are named after it."""
        assert self.branch is not None
        if self._fresh:
            return self.branch.name  # read from the store during this call
        state = self._current(await self.store.get_branch_state(self.branch.id))
        self._fresh = True
        if state.branch.name != self.branch.name:
            self.branch = self.branch.model_copy(update={"name": state.branch.name})
        return state.branch.name

    def moved_to(self, info: BranchInfo | Branch) -> None:
        """The engine is now on this branch (its head known to be stored)."""
        self.branch = Branch.model_validate(info.model_dump(exclude={"message_count"}))
        self._opened = None
        if not self.chain.truncate(info.head_message_id):
            self.chain.invalidate()
