"""Stores: where the conversation graph lives.

``SqlContextStore`` keeps it in SQLite or PostgreSQL; ``InMemoryContextStore`` in an SQLite
in-memory database. Both implement `ContextStore`, the union of the capability protocols of
``protocols`` (where each method's signature and documentation is written, once); the part of
it the engine uses is `EngineStore`.
"""

from __future__ import annotations

from agentcontext.store._db.options import StoreOptions
from agentcontext.store._in_memory import InMemoryContextStore
from agentcontext.store.base import ContextStore
from agentcontext.store.protocols import (
    BranchKeeper,
    ChatAdmin,
    ChatReader,
    ConsistencyTokens,
    ConversationStore,
    EngineStore,
    Pages,
    RecordKeeper,
    Retention,
    Searcher,
    Transfer,
    TurnWriter,
)
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
    ExportedBlob,
    Fold,
    Graph,
    GraphNode,
    GraphOutline,
    MessageRecord,
    PruneReport,
    PurgeReport,
    ResolveRecord,
    SearchResult,
)
from agentcontext.store.sql import SqlContextStore

__all__ = [
    "AppendResult",
    "BranchKeeper",
    "ChatAdmin",
    "ChatReader",
    "ConsistencyTokens",
    "ConversationStore",
    "Pages",
    "RecordKeeper",
    "Retention",
    "Searcher",
    "Transfer",
    "TurnWriter",
    "Branch",
    "BranchInfo",
    "BranchState",
    "ChainRows",
    "Chat",
    "ChatExport",
    "ChatInfo",
    "ChatState",
    "ChatUpdate",
    "Checkpoint",
    "ContextStore",
    "EngineStore",
    "ErasureReport",
    "ExportedBlob",
    "Graph",
    "ChainPage",
    "Fold",
    "GraphNode",
    "GraphOutline",
    "InMemoryContextStore",
    "MessageRecord",
    "PruneReport",
    "PurgeReport",
    "ResolveRecord",
    "SearchResult",
    "SqlContextStore",
    "StoreOptions",
]
