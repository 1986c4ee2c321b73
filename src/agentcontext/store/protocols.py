"""What the engine needs of a store, split by capability.

`ContextEngine` is written against these small protocols, not the whole `ContextStore`:

- `ChatReader`: open a chat and keep a branch's chain in step (the engine's reads);
- `TurnWriter`: write turns, in-place updates, forks and chat updates (the save protocol,
  compaction and reminder latches);
- `BranchKeeper`: branches, checkpoints and the graph (rewind, restore, switch, rename);
- `RecordKeeper`: context snapshots and resolve records (``snapshot``, ``record``, ``replay``).

`ConversationStore` (a reader and a writer) is what the engine's conversation, its save
protocol, compaction and reminders take; `EngineStore` is all four. Every `ContextStore` —
`SqlContextStore`, `InMemoryContextStore` — is an `EngineStore`; a store built or wrapped for
the engine alone needs only these methods.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from agentcontext.store.records import (
    AppendResult,
    Branch,
    BranchInfo,
    BranchState,
    ChainRows,
    Chat,
    ChatState,
    ChatUpdate,
    Checkpoint,
    Graph,
    MessageRecord,
    ResolveRecord,
)

if TYPE_CHECKING:
    from agentcontext.snapshots import ContextSnapshot
    from agentcontext.store._memory import ChainMemory

__all__ = [
    "BranchKeeper",
    "ChatReader",
    "ConsistencyTokens",
    "ConversationStore",
    "EngineStore",
    "JoinedTransaction",
    "RecordKeeper",
    "TurnWriter",
]


class JoinedTransaction(Protocol):
    """A caller's transaction that a store's calls joined (``store.using()``)."""

    @property
    def is_open(self) -> bool:
        """Whether it has neither committed nor rolled back yet."""
        ...

    @property
    def rolled_back(self) -> bool:
        """Whether it rolled back (everything the store wrote in it is gone)."""
        ...


@runtime_checkable
class ConsistencyTokens(Protocol):
    """A store whose reads may lag its writes (read replicas) and that says how far."""

    def consistency_token(self, chat_id: str) -> str | None: ...
    def read_after(self, chat_id: str, token: str | None) -> None: ...


class ChatReader(Protocol):
    """Opening a chat and keeping a branch's chain in step."""

    def current_transaction(self) -> JoinedTransaction | None: ...
    @property
    def chain_memory(self) -> ChainMemory | None:
        """Decoded chains engines of this store share (None: the store keeps none)."""
        ...

    async def open_chat(self, chat_id: str, *, user_id: str) -> ChatState: ...
    async def get_chat(self, chat_id: str) -> Chat | None: ...
    async def get_branch_state(self, branch_id: str) -> BranchState | None: ...
    async def load_chain_rows(
        self,
        chat_id: str,
        head_id: str,
        *,
        head_depth: int | None = None,
        chat_size: int | None = None,
        stop_depth: int = 0,
        stop_at: str | None = None,
        compacted: bool = False,
    ) -> ChainRows: ...
    async def get_message_chain(
        self, head_id: str, *, after: str | None = None
    ) -> list[MessageRecord]: ...
    async def get_changes(self, chat_id: str, since_version: int) -> list[MessageRecord]: ...
    async def get_message(self, message_id: str) -> MessageRecord | None: ...


class TurnWriter(Protocol):
    """Writing turns (compare-and-swap appends, in-place updates, forks) and chat updates."""

    async def update_chat(
        self, chat_id: str, updater: Callable[[Chat], ChatUpdate | None]
    ) -> Chat: ...
    async def append_turn(
        self, branch_id: str, messages: Sequence[MessageRecord], *, expected_head: str | None
    ) -> AppendResult: ...
    async def append_messages(
        self,
        branch_id: str,
        messages: Sequence[MessageRecord],
        *,
        expected_head: str | None,
        new_head: str | None = None,
        updates: Collection[str] | None = None,
    ) -> AppendResult: ...
    async def add_message(self, message: MessageRecord) -> MessageRecord: ...
    async def add_messages(self, messages: Sequence[MessageRecord]) -> list[MessageRecord]: ...
    async def fork_branch(
        self,
        chat_id: str,
        base_name: str,
        *,
        head_message_id: str | None,
        activate: bool,
        messages: Sequence[MessageRecord] = (),
        name: str | None = None,
    ) -> BranchInfo: ...


class BranchKeeper(Protocol):
    """Branches, checkpoints and the graph."""

    async def get_branch(self, chat_id: str, name: str) -> Branch | None: ...
    async def get_branch_by_id(self, branch_id: str) -> Branch | None: ...
    async def set_active_branch(self, chat_id: str, branch_id: str) -> Branch: ...
    async def list_branches(self, chat_id: str) -> list[BranchInfo]: ...
    async def rename_branch(self, chat_id: str, name: str, new_name: str) -> Branch: ...
    async def delete_branch(self, chat_id: str, name: str) -> bool: ...
    async def create_checkpoint(
        self, chat_id: str, name: str, message_id: str, *, branch_id: str | None = None
    ) -> Checkpoint: ...
    async def get_checkpoint(self, chat_id: str, name: str) -> Checkpoint | None: ...
    async def get_graph(self, chat_id: str) -> Graph: ...


class RecordKeeper(Protocol):
    """Context snapshots and resolve records."""

    async def save_snapshot(
        self, snapshot: ContextSnapshot, *, chat_id: str, message_id: str | None
    ) -> ContextSnapshot: ...
    async def get_snapshot(
        self, snapshot_id: str, *, with_content: bool = False
    ) -> ContextSnapshot | None: ...
    async def list_snapshots(self, chat_id: str) -> list[ContextSnapshot]: ...
    async def create_resolve_record(
        self,
        chat_id: str,
        *,
        branch_id: str | None,
        branch_name: str | None,
        head_message_id: str | None,
        renderer: str,
        system_prompt: str,
        messages: Sequence[tuple[str, bytes]],
    ) -> ResolveRecord: ...
    async def get_resolve_record(self, record_id: str) -> ResolveRecord | None: ...
    async def list_resolve_records(self, chat_id: str) -> list[ResolveRecord]: ...
    async def read_blob(self, blob: str) -> bytes | None: ...


class ConversationStore(ChatReader, TurnWriter, Protocol):
    """What a conversation, its save protocol, compaction and reminders use."""


@runtime_checkable
class EngineStore(ConversationStore, BranchKeeper, RecordKeeper, Protocol):
    """Everything a `ContextEngine` uses; every `ContextStore` is one."""
