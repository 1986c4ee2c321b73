"""The store contract, split by capability: every store method's signature and docstring,
written once.

Each protocol is what one part of the library needs of a store:

- `ChatReader`: open a chat and keep a branch's chain in step (the engine's reads);
- `TurnWriter`: write turns, in-place updates, forks and chat updates (a save, a streaming
  turn, a compaction, a reminder's latch);
- `BranchKeeper`: branches, checkpoints and the graph (rewind, restore, switch, rename);
- `RecordKeeper`: context snapshots, resolve records and their blobs;
- `ChatAdmin`: the store's life and its chats as a whole (create, list, delete);
- `Searcher`: full-text search;
- `Pages`: reads for viewers of long chats;
- `Retention`: prune, purge, erase;
- `Transfer`: export, import, copy;
- `ConsistencyTokens`: read-your-writes across processes with read replicas.

`ConversationStore` (a reader and a writer) is what the engine's conversation, its save
protocol, compaction and reminders take; `EngineStore` is what a `ContextEngine` takes;
`ContextStore` (in ``base``) is the union of them all. A store built or wrapped for the engine
alone needs only `EngineStore`'s methods; one that subclasses `ContextStore` gets the
defaults written here (marked as such) and must write the rest (the abstract ones).
`SqlContextStore` and `InMemoryContextStore` are checked against these by the type checker.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self, cast, runtime_checkable

from agentcontext import _validate as v
from agentcontext._shape import DEFAULT_FOLD
from agentcontext._validate import dumps
from agentcontext.errors import ChatNotFoundError, InvalidGraphError, InvalidInputError
from agentcontext.store.records import (
    AppendResult,
    Branch,
    BranchInfo,
    BranchState,
    ChainPage,
    ChainRows,
    Chat,
    ChatExport,
    ChatInfo,
    ChatState,
    ChatUpdate,
    Checkpoint,
    ErasureReport,
    Graph,
    GraphOutline,
    MessageRecord,
    PruneReport,
    PurgeReport,
    ResolveRecord,
    SearchResult,
)

if TYPE_CHECKING:
    from agentcontext.snapshots import ContextSnapshot
    from agentcontext.store._memory import ChainMemory

__all__ = [
    "BranchKeeper",
    "ChatAdmin",
    "ChatReader",
    "ConsistencyTokens",
    "ContextStore",
    "ConversationStore",
    "EngineStore",
    "JoinedTransaction",
    "Pages",
    "RecordKeeper",
    "Retention",
    "Searcher",
    "Transfer",
    "TurnWriter",
    "outline_of",
]


def outline_of(
    graph: Graph, *, fold: int, keep: Sequence[str] = (), opened: Sequence[str] = ()
) -> GraphOutline:
    """`Pages.graph_outline` computed from a whole graph (its default, and its reference)."""
    from agentcontext.store._ops.outline import Runs

    marked = {b.head_message_id for b in graph.branches if b.head_message_id is not None}
    marked.update(c.message_id for c in graph.checkpoints)
    marked.update(keep)
    runs = Runs.build((node.id, node.parent_id, node.type) for node in graph.nodes)
    shown, folds = runs.outline(marked, fold=fold, opened=set(opened))
    by_id = {node.id: node for node in graph.nodes}
    return GraphOutline(
        chat_id=graph.chat_id,
        nodes=sorted(
            (by_id[node_id] for node_id in dict.fromkeys(shown)),
            key=lambda node: (node.created_at, node.id),
        ),
        folds=folds,
        branches=graph.branches,
        checkpoints=graph.checkpoints,
        message_count=len(graph.nodes),
    )


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
    """A store whose reads may lag its writes (read replicas), and that says how far.

    A store without replicas keeps these defaults: it has nothing to wait for."""

    def consistency_token(self, chat_id: str) -> str | None:
        """An opaque token naming every write this store committed to ``chat_id``, for
        ``ContextEngine(..., after=token)`` in another process (`SaveResult.consistency_token`
        carries it). None when the store has no read replicas (its reads always see its
        writes), when it never wrote the chat, and until the commit of a caller's transaction
        it wrote in (``using()``, ``begin()``) is confirmed by a later read of that chat."""
        return None

    def read_after(self, chat_id: str, token: str | None) -> None:
        """Make this store's reads of ``chat_id`` see at least the writes ``token`` names (a
        `consistency_token` of any store on the same database, None for nothing). A store
        without read replicas checks the token and has nothing more to do.

        Raises:
            InvalidInputError: ``token`` is not a consistency token.
        """
        from agentcontext.store._db.replicas import parse_token

        v.check_id(chat_id, "chat_id")
        if token is not None:
            parse_token(token)


class ChatReader(Protocol):
    """Opening a chat and keeping a branch's chain in step: what an engine reads."""

    def current_transaction(self) -> JoinedTransaction | None:
        """The caller's transaction the current task's calls run in (``using()``), or None.

        An engine that wrote in one forgets what it saw once it rolled back. Stores without
        such blocks keep this default.
        """
        return None

    @property
    def chain_memory(self) -> ChainMemory | None:
        """The chains its engines decoded, shared by the next engines of the same chat (see
        ``cache_bytes``); None when the store keeps none (this default)."""
        return None

    async def open_chat(self, chat_id: str, *, user_id: str) -> ChatState:
        """The chat (created for ``user_id`` if it does not exist), its active branch, change
        version and counts. Stores may read it in one query; this default uses three calls
        of a `ContextStore` (``upsert_chat``, ``get_active_branch``, ``get_branch_state``)."""
        store = cast("ContextStore", self)
        chat = await store.upsert_chat(chat_id, user_id=user_id)
        branch = await store.get_active_branch(chat_id)
        if branch is None:
            raise InvalidGraphError(f"chat {chat_id!r} has no active branch")
        state = await store.get_branch_state(branch.id)
        if state is None:
            raise ChatNotFoundError(f"chat {chat_id!r} was deleted while it was opened")
        return ChatState(
            chat=chat,
            branch=state.branch,
            version=state.version,
            message_count=state.message_count,
            head_depth=state.head_depth,
            has_compactions=state.has_compactions,
        )

    @abc.abstractmethod
    async def get_chat(self, chat_id: str) -> Chat | None:
        """The chat, or None."""

    @abc.abstractmethod
    async def get_branch_state(self, branch_id: str) -> BranchState | None:
        """The branch with its chat's version and counts, in one query (None if it is gone)."""

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
    ) -> ChainRows:
        """The chain ending at ``head_id`` for the engine: ids, parent ids and JSON texts, root
        first, only the part after ``stop_at`` (at ``stop_depth``). ``head_depth`` and
        ``chat_size`` (from `open_chat` or `get_branch_state`) spare a lookup. With
        ``compacted``, a store may return only the part after the deepest compaction on the
        chain, with that compaction (`ChainRows.summary`). This default reads records and
        serialises their data, and ignores compactions (which is correct, only slower)."""
        records = await self.get_message_chain(head_id, after=stop_at)
        return ChainRows(
            ids=[r.id for r in records],
            parent_ids=[r.parent_id for r in records],
            data=[None if r.data is None else dumps(r.data) for r in records],
        )

    @abc.abstractmethod
    async def get_message_chain(
        self, head_id: str, *, after: str | None = None
    ) -> list[MessageRecord]:
        """The chain ending at ``head_id``, root first, however long; ``[]`` for an unknown id.

        With ``after``, only the part of the chain that comes after that message (which must be
        an ancestor of the head, else `InvalidGraphError`). A cycle or a
        broken chain in stored data raises `InvalidGraphError`.
        """

    @abc.abstractmethod
    async def get_changes(self, chat_id: str, since_version: int) -> list[MessageRecord]:
        """Messages of the chat written (inserted or updated) after ``since_version``.

        In insertion order. Together with `get_branch_state` this lets an engine that holds a
        chain in memory catch up without reading it again.
        """

    @abc.abstractmethod
    async def get_message(self, message_id: str) -> MessageRecord | None:
        """The message, or None."""


class TurnWriter(Protocol):
    """Writing turns (compare-and-swap appends, in-place updates, forks) and chat updates: what
    a save, a streaming turn, a compaction and a reminder's latch write."""

    def write_turn(self, chat_id: str) -> asyncio.Lock:
        """The chat's write turn among the engines of this process that share this store:
        writers of one chat take turns instead of racing each other's compare-and-swap (which
        costs every loser a refused write); writers in other processes are still ordered by
        the compare-and-swap. This default keeps one lock per store and chat in a table of the
        process; `SqlContextStore` keeps its turns with the rest of its process state."""
        from agentcontext.store._memory import turns_of

        return turns_of(self).lock(v.check_id(chat_id, "chat_id"))

    @abc.abstractmethod
    async def update_chat(self, chat_id: str, updater: Callable[[Chat], ChatUpdate | None]) -> Chat:
        """Atomic read-modify-write of a chat under a lock.

        ``updater`` gets the current chat and returns the fields to change (a
        `ChatUpdate`) or None to change nothing. Concurrent updates are
        serialised, so none is lost. Returns the chat as stored afterwards.
        """

    async def append_turn(
        self, branch_id: str, messages: Sequence[MessageRecord], *, expected_head: str | None
    ) -> AppendResult:
        """`append_messages` for a save: new messages, each the parent of the next, after the
        head (compare-and-swap). The result's version may be None (not read back, to spare a
        round trip): a save bumps it by one, and the engine confirms that on its next read."""
        return await self.append_messages(
            branch_id, messages, expected_head=expected_head, updates=()
        )

    @abc.abstractmethod
    async def append_messages(
        self,
        branch_id: str,
        messages: Sequence[MessageRecord],
        *,
        expected_head: str | None,
        new_head: str | None = None,
        updates: Collection[str] | None = None,
    ) -> AppendResult:
        """Write messages and move the branch head, atomically.

        Only if the head is still ``expected_head`` (compare-and-swap); otherwise nothing is
        written. The head moves to ``new_head`` (default: the last message). Messages that
        exist already are updated in place (their parent stays). With ``updates``, only the
        ids in it may exist already: if another one does, nothing is written and
        `AppendResult.existing` lists them. Counts as chat activity.
        """

    @abc.abstractmethod
    async def add_message(self, message: MessageRecord) -> MessageRecord:
        """Insert a message, or update the name, type and data of an existing one.

        An update never changes ``parent_id``, ``chat_id`` or ``created_at``. Returns the
        stored record.
        """

    @abc.abstractmethod
    async def add_messages(self, messages: Sequence[MessageRecord]) -> list[MessageRecord]:
        """`add_message` for many messages in one transaction (a parent may come earlier
        in the same batch)."""

    @abc.abstractmethod
    async def fork_branch(
        self,
        chat_id: str,
        base_name: str,
        *,
        head_message_id: str | None,
        activate: bool,
        messages: Sequence[MessageRecord] = (),
        name: str | None = None,
    ) -> BranchInfo:
        """Create the next free branch ``{base_name}-vN`` (N = 2, 3, …) atomically, or the
        branch ``name`` (`BranchExistsError` if it is taken).

        The new branch starts at ``head_message_id``; ``messages`` (chained, the first one's
        parent being ``head_message_id``) are written in the same transaction and the head
        moves to the last of them. Names never collide, even between processes.
        """


class BranchKeeper(Protocol):
    """Branches, checkpoints and the graph: what rewinds, restores and switches use."""

    @abc.abstractmethod
    async def create_branch(
        self,
        chat_id: str,
        name: str,
        *,
        head_message_id: str | None = None,
        activate: bool = False,
    ) -> Branch:
        """Create a branch. Raises `BranchExistsError` for a taken name."""

    @abc.abstractmethod
    async def get_branch(self, chat_id: str, name: str) -> Branch | None:
        """The branch of that name, or None."""

    @abc.abstractmethod
    async def get_branch_by_id(self, branch_id: str) -> Branch | None:
        """The branch with that id, or None."""

    @abc.abstractmethod
    async def get_active_branch(self, chat_id: str) -> Branch | None:
        """The chat's active branch, or None for an unknown chat."""

    @abc.abstractmethod
    async def set_active_branch(self, chat_id: str, branch_id: str) -> Branch:
        """Make this branch the chat's only active branch."""

    @abc.abstractmethod
    async def update_branch_head(
        self, branch_id: str, message_id: str | None, expected_head: str | None
    ) -> bool:
        """Compare-and-swap the head: move it to ``message_id`` only if it is
        ``expected_head``. Returns whether it moved."""

    @abc.abstractmethod
    async def list_branches(self, chat_id: str) -> list[BranchInfo]:
        """The chat's branches, oldest first, with their chain lengths."""

    @abc.abstractmethod
    async def rename_branch(self, chat_id: str, name: str, new_name: str) -> Branch:
        """Rename a branch; `BranchExistsError` if the new name is taken."""

    @abc.abstractmethod
    async def delete_branch(self, chat_id: str, name: str) -> bool:
        """Delete a branch (its name and head pointer), never the active one; its messages stay
        in the graph. False if there was no branch of that name."""

    @abc.abstractmethod
    async def create_checkpoint(
        self, chat_id: str, name: str, message_id: str, *, branch_id: str | None = None
    ) -> Checkpoint:
        """Create a checkpoint, or move an existing one of that name to ``message_id``.

        ``branch_id``: the branch it is made on (a restore is named after it), if any."""

    @abc.abstractmethod
    async def get_checkpoint(self, chat_id: str, name: str) -> Checkpoint | None:
        """The checkpoint of that name, or None."""

    @abc.abstractmethod
    async def list_checkpoints(self, chat_id: str) -> list[Checkpoint]:
        """The chat's checkpoints, newest first."""

    @abc.abstractmethod
    async def delete_checkpoint(self, chat_id: str, name: str) -> bool:
        """Delete a checkpoint; False if there was none of that name."""

    @abc.abstractmethod
    async def get_messages(self, chat_id: str) -> list[MessageRecord]:
        """The chain of the chat's active branch, root first."""

    @abc.abstractmethod
    async def has_children(self, message_id: str) -> bool:
        """Whether any message has this one as its parent."""

    @abc.abstractmethod
    async def set_message_parent(self, message_id: str, parent_id: str | None) -> None:
        """Re-parent a message (and so its whole subtree).

        Refused with `InvalidGraphError` for a self-parent, a parent in
        another chat, or a parent inside the message's own subtree (a cycle).
        """

    @abc.abstractmethod
    async def is_ancestor(self, ancestor_id: str, message_id: str) -> bool:
        """Whether ``ancestor_id`` is on the chain ending at ``message_id`` (itself included)."""

    @abc.abstractmethod
    async def get_graph(self, chat_id: str) -> Graph:
        """Every message, branch and checkpoint of the chat."""


class RecordKeeper(Protocol):
    """Context snapshots, resolve records and the content blobs they hold."""

    @abc.abstractmethod
    async def put_blob(
        self,
        content: bytes,
        *,
        media_type: str = "application/octet-stream",
        expected_hash: str | None = None,
        chat_id: str | None = None,
    ) -> str:
        """Store content once under its SHA-256 and return the hash.

        With ``expected_hash``, content whose hash differs is refused (`InvalidInputError`).
        Storing the same content again is free. An encrypted store keeps blobs apart per user,
        sealed under the user's key: there ``chat_id`` (a chat of that user) is required, and
        the blob is found by snapshots and records of that user's chats.
        """

    @abc.abstractmethod
    async def read_blob(self, blob: str, *, chat_id: str | None = None) -> bytes | None:
        """The exact bytes stored under a hash, or None. An encrypted store needs ``chat_id``,
        the chat whose snapshot or resolve record holds the blob (`InvalidInputError`
        without it)."""

    @abc.abstractmethod
    async def save_snapshot(
        self, snapshot: ContextSnapshot, *, chat_id: str, message_id: str | None
    ) -> ContextSnapshot:
        """Store a snapshot attached to a chat (and a message); returns the stored copy.

        Item contents held by the snapshot are written as blobs in the same transaction; every
        item must have its blob (held, or stored before). Raises `SnapshotError` for an already
        stored snapshot or a missing blob.
        """

    @abc.abstractmethod
    async def get_snapshot(
        self, snapshot_id: str, *, with_content: bool = False
    ) -> ContextSnapshot | None:
        """A stored snapshot, or None; ``with_content`` loads its items' contents too."""

    @abc.abstractmethod
    async def list_snapshots(self, chat_id: str) -> list[ContextSnapshot]:
        """The chat's snapshots, newest first (without contents)."""

    @abc.abstractmethod
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
        omitted: Sequence[str] = (),
        estimate: int | None = None,
    ) -> ResolveRecord:
        """Store what a model was shown: the prompt and each message's JSON, as blobs, and
        the report of its window (the ids left out, the tokens counted), if it had one."""

    @abc.abstractmethod
    async def get_resolve_record(self, record_id: str) -> ResolveRecord | None:
        """A stored resolve record, or None."""

    @abc.abstractmethod
    async def list_resolve_records(self, chat_id: str) -> list[ResolveRecord]:
        """The chat's resolve records, newest first."""

    @abc.abstractmethod
    async def collect_garbage(self) -> int:
        """Delete the blobs nothing refers to any more; return how many were deleted.

        A blob another chat's snapshot or record still uses stays. Safe to run while others
        write: blobs being written concurrently are locked and skipped.
        """


class ChatAdmin(Protocol):
    """The store's life and its chats as a whole: opening and closing, creating, listing and
    deleting chats."""

    async def initialize(self) -> None:
        """Prepare the store (`SqlContextStore`: migrate with ``migrate="auto"``, else check the
        schema). Idempotent; a store also runs it on first use."""

    async def close(self) -> None:
        """Wait for the calls still running, then release what the store owns (an engine it made
        from a URL is disposed; one you passed is not). Safe to call twice."""

    async def __aenter__(self) -> Self:
        try:
            await self.initialize()
        except BaseException:
            # ``__aexit__`` does not run when entering fails: the connections the failed
            # opening took are closed here (a service making a new store for each attempt
            # would run out of them); the store can still be entered again.
            await self.opening_failed()
            raise
        return self

    async def opening_failed(self) -> None:  # (optional: nothing held by default)
        """Called when entering ``async with store`` failed: close what the attempt opened."""

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @abc.abstractmethod
    async def create_chat(
        self,
        chat_id: str,
        *,
        user_id: str,
        title: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Chat:
        """Create a chat and its active ``main`` branch.

        Raises `ChatExistsError` if the id is taken.
        """

    @abc.abstractmethod
    async def upsert_chat(
        self,
        chat_id: str,
        *,
        user_id: str,
        title: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Chat:
        """Create the chat (with its ``main`` branch) unless it exists; return the stored chat.

        An existing chat is returned unchanged, whoever owns it: compare ``user_id`` to decide.
        """

    @abc.abstractmethod
    async def list_chats(
        self,
        *,
        user_id: str | None = None,
        metadata: Mapping[str, str | int | bool] | None = None,
        limit: int | None = None,
        offset: int = 0,
        after: str | None = None,
    ) -> list[ChatInfo]:
        """Chats, newest activity first (ties broken by id, descending).

        ``metadata`` keeps chats whose top-level metadata has every given key with exactly that
        str, int or bool value. ``after`` is a keyset cursor, the `ChatInfo.cursor` of a listed
        chat: only the chats after it in this order come (``limit`` of them). A chat already
        listed is not listed again and one that gained no activity since is not skipped; one
        that gained activity moved ahead of the cursor, where a new listing from the start
        finds it. Paging with it costs the same at any depth, where ``offset`` reads the
        chats it skips. A string that is not such a cursor is an `InvalidInputError`.
        """

    @abc.abstractmethod
    async def delete_chat(self, chat_id: str, *, user_id: str | None = None) -> bool:
        """Delete a chat with its messages, branches, checkpoints and index entries.

        With ``user_id`` the chat is deleted only if that user owns it (case-sensitive).
        Returns False for an unknown chat or another user's chat.
        """


class Searcher(Protocol):
    """Full-text search, with one meaning on every backend."""

    @abc.abstractmethod
    async def search_messages(
        self,
        chat_id: str,
        query: str,
        *,
        roles: Sequence[str] | None = None,
        limit: int = 20,
    ) -> list[SearchResult]:
        """Full-text search over every branch of a chat; best match first.

        ``query`` is plain text: every word must occur; quotes, operators and punctuation are
        just text, so it never raises a syntax error.
        """

    @abc.abstractmethod
    async def search_user_messages(
        self,
        user_id: str,
        query: str,
        *,
        roles: Sequence[str] | None = None,
        limit: int = 20,
    ) -> list[SearchResult]:
        """`search_messages` over all chats of one user; each hit names its chat."""


class Pages(Protocol):
    """Reads for viewers of long chats (the web viewer and the command line use them): each reads
    what it draws."""

    async def graph_outline(
        self,
        chat_id: str,
        *,
        fold: int = DEFAULT_FOLD,
        keep: Sequence[str] = (),
        opened: Sequence[str] = (),
    ) -> GraphOutline:
        """The chat's graph with every linear run of ``fold`` or more messages folded into a
        `Fold` (for viewers of long chats).

        A message is part of a run when it has exactly one child, which is not a
        compaction, and it is not a root, a compaction, a branch head, a checkpoint or in
        ``keep``. Runs whose first message is in ``opened`` come whole. This default reads
        the whole graph; `SqlContextStore` summarises it in SQL and reads only what is
        drawn.
        """
        if isinstance(fold, bool) or not isinstance(fold, int) or fold < 2:
            raise InvalidInputError(f"fold must be a whole number of 2 or more, got {fold!r}")
        graph = await cast("ContextStore", self).get_graph(chat_id)
        return outline_of(graph, fold=fold, keep=keep, opened=opened)

    async def chain_page(self, chat_id: str, end_id: str, *, limit: int) -> ChainPage:
        """At most ``limit`` messages of the chain ending at ``end_id``, root first, with their
        positions; an id that is not a message of the chat gives an empty page.

        For viewers that page through a long branch: the next, older page ends at the parent
        of this page's first message. This default reads the whole chain; `SqlContextStore`
        reads only the page.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidInputError(f"limit must be a whole number of 1 or more, got {limit!r}")
        store = cast("ContextStore", self)
        record = await store.get_message(end_id)
        if record is None or record.chat_id != chat_id:
            return ChainPage(messages=[], depths=[], older=False)
        chain = await store.get_message_chain(end_id)
        start = max(0, len(chain) - limit)
        return ChainPage(
            messages=chain[start:],
            depths=list(range(start + 1, len(chain) + 1)),
            older=start > 0,
        )


class Retention(Protocol):
    """Retention and erasure, with receipts."""

    @abc.abstractmethod
    async def prune(
        self,
        *,
        older_than: datetime | timedelta,
        user_id: str | None = None,
        progress: Callable[[int, int], object] | None = None,
    ) -> PruneReport:
        """Delete the chats whose last activity is before ``older_than`` (a moment, or an age
        such as ``timedelta(days=90)``), only ``user_id``'s when given.

        Each goes with everything it holds (messages, search entries, branches, checkpoints,
        compactions, snapshots, resolve records) and the blobs no other chat refers to. Whole
        chats are deleted a batch at a time, each batch its own short transaction, so writers
        never wait for the whole run; ``progress(done, total)`` is called after each batch
        (chats). A chat written meanwhile is read again once its writer commits, and kept if
        it is active again. A run cut short has deleted whole chats only; running it again
        finishes. Returns a `PruneReport` naming the chats and counting the rows per table.
        """

    @abc.abstractmethod
    async def purge(
        self, chat_id: str, *, progress: Callable[[int, int], object] | None = None
    ) -> PurgeReport:
        """Delete the messages of a chat that no branch head, checkpoint or compaction tail
        reaches any more: one transaction makes them unreachable for good, then short ones
        delete them a batch at a time (``progress(done, total)``, in messages, after each).

        Those are the messages only deleted branches reached, and the prefix a compaction
        folded once every branch and checkpoint through it is compacted past it (the
        compaction point and its summary stay). Their search entries go too; snapshots and
        resolve records that pointed at one are kept, pointing at none. Afterwards a rewind
        (or a branch or checkpoint) to a purged id raises `MessageNotFoundError` saying the
        chat's history was purged. Running it again deletes nothing more.
        Raises `ChatNotFoundError` for an unknown chat.
        """

    @abc.abstractmethod
    async def erase_user(
        self, user_id: str, *, progress: Callable[[int, int], object] | None = None
    ) -> ErasureReport:
        """Delete every chat of ``user_id`` with all its rows, and every blob only those chats
        used (blobs shared with other users' chats stay), whole chats a batch at a time, each
        batch its own short transaction (``progress(done, total)``, in chats, after each).
        Returns the receipt: the chat ids removed and the rows deleted per table. A user with
        no chats gets an empty receipt; a run cut short is finished by running it again. In an
        encrypted store the user's data key is destroyed last (``keys_destroyed``), so copies
        of their rows taken before, backups included, can no longer be read.
        """


class Transfer(Protocol):
    """Chats as plain data, and copies."""

    @abc.abstractmethod
    async def export_chat(self, chat_id: str) -> ChatExport:
        """Everything of a chat as plain data (see `ChatExport`), read as one snapshot."""

    @abc.abstractmethod
    async def import_chat(self, export: ChatExport) -> None:
        """Write an exported chat into this store as it was (ids, timestamps, branches).

        Raises `ChatExistsError` if the chat id is taken, and `InvalidGraphError` if the export
        is inconsistent (a branch or checkpoint pointing at a missing message, not exactly one
        active branch, ids that exist in this database already). Nothing is written unless
        everything is.
        """

    @abc.abstractmethod
    async def copy_chat(
        self,
        source_id: str,
        new_chat_id: str,
        *,
        up_to: str | None = None,
        user_id: str | None = None,
    ) -> dict[str, str]:
        """Copy a chat to ``new_chat_id`` with fresh message ids, in one transaction; returns
        each old message id with its new one.

        The copy has the source's branches (the same one active), checkpoints and
        compactions, or with ``up_to`` only the chain ending at that message (with the
        compactions on it) as one active branch ``main``. It belongs to ``user_id`` (default:
        the source's owner) and is searched, resolved and rewound like the source. Snapshots
        and resolve records are not copied. Raises `ChatNotFoundError` for an unknown source
        and `ChatExistsError` (writing nothing) when ``new_chat_id`` is taken.
        """


class ConversationStore(ChatReader, TurnWriter, Protocol):
    """What a conversation, its save protocol, compaction and reminders use."""


@runtime_checkable
class EngineStore(ConversationStore, BranchKeeper, RecordKeeper, Protocol):
    """Everything a `ContextEngine` uses; every `ContextStore` is one."""


@runtime_checkable
class ContextStore(
    EngineStore, ChatAdmin, Searcher, Pages, Retention, Transfer, ConsistencyTokens, Protocol
):
    """Where chats, the message graph, branches and checkpoints live: every capability of
    ``agentcontext.store.protocols`` at once.

    Every method is a coroutine and runs in its own transaction: it applies wholly or not at
    all. ``get_*`` methods return ``None`` for something that does not exist; methods that act
    on a chat raise `ChatNotFoundError` when it does not exist.

    `SqlContextStore` implements it on SQLite and PostgreSQL. To write another store,
    subclass it: the methods marked abstract are yours to write, the others have defaults
    built on them (correct, if slower than a store that reads each in one query).
    """
