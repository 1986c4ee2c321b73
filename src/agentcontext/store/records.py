"""The records a `ContextStore` reads and writes.

They are immutable pydantic models. Timestamps are timezone-aware UTC ``datetime`` objects with
microsecond precision on both backends.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from agentcontext.snapshots import ContextSnapshot

__all__ = [
    "AppendResult",
    "Branch",
    "BranchInfo",
    "BranchState",
    "ChainPage",
    "ChainRows",
    "ChatExport",
    "ChatState",
    "ErasureReport",
    "ExportedBlob",
    "Chat",
    "ChatInfo",
    "ChatUpdate",
    "Checkpoint",
    "Fold",
    "Graph",
    "GraphNode",
    "GraphOutline",
    "MessageRecord",
    "PruneReport",
    "PurgeReport",
    "ResolveRecord",
    "SearchResult",
    "compaction_id",
    "utcnow",
]


_COMPACTIONS = uuid.UUID("0b7f9a52-6c1e-4d0b-a8f3-2e5c9d41b7a6")

PURGED = "the chat's history was purged"
"""Words of every error about a message id a purge deleted (the engine passes them on)."""


def compaction_id(chat_id: str, through: str) -> str:
    """The id of the compaction of ``chat_id`` at message ``through`` (a retried compaction of
    the same point, or a copy's compaction of the copied point, gets the same id)."""
    return uuid.uuid5(_COMPACTIONS, f"{chat_id}\x00{through}").hex


def utcnow() -> datetime:
    """The current time as an aware UTC datetime."""
    return datetime.now(UTC)


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Chat(_Record):
    """A conversation owned by one user."""

    id: str
    user_id: str
    title: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: AwareDatetime
    updated_at: AwareDatetime
    """Time of the last activity: creation, a save, or an update of title or metadata."""


class ChatInfo(Chat):
    """A chat with counts, as returned by ``list_chats``."""

    message_count: int
    """Every message of the chat, on all branches."""
    branch_count: int
    damaged: str | None = None
    """None for a healthy chat. For a chat row the store cannot decode (damaged, or written
    outside agentcontext), what is wrong with it: the chat is still listed, with the fields it
    could not read set to neutral values (no title, empty metadata, the epoch for a time)."""

    @property
    def cursor(self) -> str:
        """Where this chat stands in ``list_chats``' order, as an opaque string: pass it as
        ``list_chats(after=...)`` for the chats listed after it (a keyset cursor). Paging with
        it lists no chat twice and skips no chat that gained no activity meanwhile; a chat that
        did gain activity moves ahead of the cursor (the order is by activity), out of the
        later pages, where a new listing from the start finds it."""
        return chat_cursor(self.updated_at, self.id)


class ChatUpdate(BaseModel):
    """What ``update_chat``'s updater wants changed.

    Only the fields given explicitly are applied: ``ChatUpdate(title=None)`` clears the title,
    ``ChatUpdate()`` changes nothing but still counts as activity. ``metadata`` replaces the
    whole dict (merge it in the updater if you want a merge).
    """

    model_config = ConfigDict(extra="forbid")

    title: str | None = None
    metadata: dict[str, Any] | None = None


class MessageRecord(_Record):
    """A node of the conversation graph.

    ``name`` is the role for message nodes (``"user"``, ``"assistant"``, ``"system"``):
    the same value as `GraphNode.role` and ``Message.role``, under the name the original
    package's stores use (a record is the fragment that was saved, named after it);
    ``data`` is the JSON the fragment's codec encoded.
    """

    id: str
    chat_id: str
    parent_id: str | None = None
    name: str
    type: str = "message"
    data: Any = None
    created_at: AwareDatetime = Field(default_factory=utcnow)


class Branch(_Record):
    """A named pointer to a head message. Exactly one branch per chat is active."""

    id: str
    chat_id: str
    name: str
    head_message_id: str | None = None
    is_active: bool = False
    created_at: AwareDatetime


class BranchInfo(Branch):
    """A branch with the length of its chain."""

    message_count: int


class BranchState(_Record):
    """A branch and the change version of its chat, read together.

    ``version`` grows with every write to the chat's graph; an engine that cached the chain
    at one version asks only for what changed since (``get_changes``).
    """

    branch: Branch
    version: int
    head_depth: int = 0
    """The length of the branch's chain (0 when it is empty)."""
    message_count: int = 0
    """Messages of the chat on all branches."""
    has_compactions: bool | None = None
    """Whether the chat holds compaction summaries (None: not known)."""
    incarnation: int = 0
    """Which insertion of the chat's row this is (see `ChatState.incarnation`)."""


class ChatState(_Record):
    """What an engine needs to open a chat, read in one query.

    ``version`` is the chat's change version, ``message_count`` its messages on all branches,
    ``head_depth`` the length of the active branch's chain (0 when it is empty).
    """

    chat: Chat
    branch: Branch
    version: int
    message_count: int
    head_depth: int
    has_compactions: bool | None = None
    """Whether the chat holds compaction summaries (None: not known). An engine loading the
    chain of a chat without any skips looking for one."""
    incarnation: int = 0
    """Drawn at random each time the chat's row is inserted: a chat deleted and created again
    under its id (say, restored by an import, which keeps its creation time, branch ids, and
    starts its version again) has another, so that nothing held of the deleted one serves it."""


@dataclass(frozen=True, slots=True)
class ChainRows:
    """A chain as stored, for the engine to decode: ids, parent ids and each message's JSON
    (root first), as text or as its UTF-8 bytes (what the SQL store reads: pydantic-core
    parses bytes without a ``str`` made first)."""

    ids: list[str]
    parent_ids: list[str | None]
    data: list[str | bytes | None]
    summary_id: str | None = None
    """The compaction that applies to the head, when the rows start after it (see
    `ContextEngine.compact`): its id, ..."""
    summary: str | bytes | None = None
    """... its JSON (a `Message`), ..."""
    base_id: str | None = None
    """... and the last message it folds (the parent of the first row)."""
    times: list[datetime | None] = field(default_factory=list)
    """Each row's ``created_at``, when the store has them at no cost; else empty (the SQL
    store's load leaves them out: reading the column costs more than the engine saves by it,
    which asks the store for the head's time instead, only when a reminder needs it)."""


class Checkpoint(_Record):
    """A named pointer to any message of a chat."""

    id: str
    chat_id: str
    name: str
    message_id: str
    created_at: AwareDatetime
    branch_id: str | None = None
    """The branch it was made on, when known (`ContextEngine.restore` names the new branch
    after it); that branch may have been deleted since."""


class SearchResult(_Record):
    """A full-text hit. ``rank`` is higher for better matches on every backend."""

    message: MessageRecord
    rank: float
    snippet: str
    """The matching text with hits wrapped in ``<mark>``…``</mark>``."""

    @property
    def chat_id(self) -> str:
        """The chat the hit belongs to (useful for user-wide searches)."""
        return self.message.chat_id


class GraphNode(_Record):
    """A message as shown in a graph view."""

    id: str
    parent_id: str | None
    role: str
    preview: str
    """What the message says on one line: its text parts, and each tool call as
    ``tool name(args) → result`` (``✗ error`` when it failed); at most 50 characters plus
    an ellipsis."""
    created_at: AwareDatetime
    type: str = "message"
    """``"message"``, or ``"compaction"`` for a summary stored beside the branch by
    `ContextEngine.compact` (its parent is the last message it folds)."""


class ChainPage(_Record):
    """A page of a chain (`ContextStore.chain_page`): at most ``limit`` messages ending
    at the message asked for, root first."""

    messages: list[MessageRecord]
    depths: list[int]
    """Each message's position in its chain (the root is 1)."""
    older: bool
    """Whether the chain goes on before the first message (ask for the page ending at its
    parent)."""


class Graph(_Record):
    """The whole conversation graph of a chat: every message, branch and checkpoint."""

    chat_id: str
    nodes: list[GraphNode]
    branches: list[BranchInfo]
    checkpoints: list[Checkpoint]


class Fold(_Record):
    """A linear run of messages that a `GraphOutline` shows as one node."""

    first_id: str
    last_id: str
    count: int
    """How many messages the run holds."""
    child_id: str
    """The message after the run (its last message's only child)."""


class GraphOutline(_Record):
    """A chat's graph with its long linear runs folded (`ContextStore.graph_outline`).

    ``nodes`` holds every message that is drawn, and each fold's first and last message;
    ``message_count`` counts every message of the chat.
    """

    chat_id: str
    nodes: list[GraphNode]
    folds: list[Fold]
    branches: list[BranchInfo]
    checkpoints: list[Checkpoint]
    message_count: int


class ResolveRecord(_Record):
    """What one ``resolve(record=True)`` showed the model.

    The rendered system prompt and each message (its JSON) are blobs, so a prompt repeated
    over many turns is stored once; ``replay`` rebuilds the exact result from them, with the
    report of a window (``omitted``, ``estimate``).
    """

    id: str
    chat_id: str
    branch_id: str | None
    branch_name: str | None
    head_message_id: str | None
    renderer: str
    prompt_blob: str
    message_ids: list[str]
    message_blobs: list[str]
    created_at: AwareDatetime
    omitted: list[str] = Field(default_factory=list)
    """The ids ``resolve(window=...)`` left out (``ResolveResult.omitted``)."""
    estimate: int | None = None
    """The tokens it counted for its window (``ResolveResult.estimate``; None without one)."""


class ChatExport(BaseModel):
    """A whole chat as plain data: what ``export_chat`` returns and ``import_chat`` takes.

    ``messages`` come parents first. The JSON form (``model_dump(mode="json")``) moves a chat
    between databases and backends unchanged: ids, timestamps, branches (with the active one)
    and checkpoints.
    """

    model_config = ConfigDict(extra="forbid")

    format: Literal["agentcontext.chat/1"] = "agentcontext.chat/1"
    chat: Chat
    messages: list[MessageRecord]
    branches: list[Branch]
    checkpoints: list[Checkpoint]
    snapshots: list[ContextSnapshot] = Field(default_factory=list)
    blobs: list[ExportedBlob] = Field(default_factory=list)
    """The contents of the snapshots' items (each once)."""


class ExportedBlob(BaseModel):
    """A blob inside a `ChatExport`: its hash, media type and base64 content."""

    model_config = ConfigDict(extra="forbid")

    hash: str
    media_type: str
    content: str
    """The bytes, base64-encoded (standard alphabet, padded)."""

    @classmethod
    def of(cls, hash: str, media_type: str, data: bytes) -> ExportedBlob:
        """An exported blob holding ``data``."""
        return cls(hash=hash, media_type=media_type, content=base64.b64encode(data).decode())

    @property
    def data(self) -> bytes:
        """The decoded bytes."""
        return base64.b64decode(self.content, validate=True)


ChatExport.model_rebuild()


class AppendResult(BaseModel):
    """Outcome of `ContextStore.append_messages`.

    ``ok`` is False when the branch head was not ``expected_head``; nothing was written and
    ``head_message_id`` is the head found instead. ``version`` is the chat's change version
    after the write (or as found, on a conflict).
    """

    model_config = ConfigDict(frozen=True)

    ok: bool
    head_message_id: str | None
    version: int | None
    """None when the store does not report it (the engine confirms it on its next read)."""
    existing: list[str] = []
    """With ``updates``: the ids that exist already but were not allowed to."""


class PruneReport(_Record):
    """What ``prune`` deleted: the chats whose last activity was before ``older_than`` (only
    ``user_id``'s when given), and the rows removed per table (``deleted["blobs"]`` counts the
    contents no remaining chat refers to any more)."""

    older_than: AwareDatetime
    """The cut-off: chats with no activity since this moment were deleted."""
    user_id: str | None
    chat_ids: list[str]
    """The ids of the deleted chats (newest activity first)."""
    chats: list[ChatInfo]
    """The deleted chats as they were just before, in the same order."""
    deleted: dict[str, int]
    """Rows deleted per table (``chats``, ``messages``, ``branches``, ...)."""
    pruned_at: AwareDatetime


class PurgeReport(_Record):
    """What ``purge`` did to one chat: the messages deleted because no branch head,
    checkpoint or compaction tail reaches them any more, and how many are kept."""

    chat_id: str
    deleted_messages: int
    kept_messages: int
    detached: int
    """Snapshots and resolve records that pointed at a deleted message and now point at none
    (they are kept, with their contents)."""
    purged_at: AwareDatetime | None
    """When the chat's history was last purged (None if no purge ever deleted anything)."""


class ErasureReport(_Record):
    """The receipt of ``erase_user``: every chat of the user, with all its rows, and the blobs
    only those chats used, are gone."""

    user_id: str
    chat_ids: list[str]
    """The chats removed (oldest activity first)."""
    deleted: dict[str, int]
    """Rows deleted per table (``chats``, ``messages``, ``branches``, ``checkpoints``,
    ``snapshots``, ``snapshot_items``, ``resolve_records``, ``record_messages``, ``blobs``)."""
    erased_at: AwareDatetime
    keys_destroyed: int = 0
    """Data keys destroyed (1 when the store is encrypted and the user had a key, else 0;
    more when a key made for a chat saved while the erasure ran was destroyed too): copies of
    the user's rows taken before, backups included, can no longer be read."""


def chat_cursor(updated_at: datetime, chat_id: str) -> str:
    """The cursor of a chat last active at ``updated_at`` (see `ChatInfo.cursor`)."""
    moment = updated_at.astimezone(UTC).isoformat(timespec="microseconds")
    return base64.urlsafe_b64encode(f"{moment}\n{chat_id}".encode()).decode().rstrip("=")


def parse_chat_cursor(cursor: str) -> tuple[datetime, str] | None:
    """The activity time and chat id of a `chat_cursor`, or None when it is not one."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        moment, chat_id = raw.split("\n", 1)
        when = datetime.fromisoformat(moment)
        if when.tzinfo is None or not chat_id:
            return None
        return when.astimezone(UTC), chat_id
    except (ValueError, UnicodeDecodeError, OverflowError):  # OverflowError: not a UTC time
        return None
