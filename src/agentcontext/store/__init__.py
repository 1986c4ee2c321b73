"""Stores: where the conversation graph lives.

``SqlContextStore`` keeps it in SQLite or PostgreSQL; ``InMemoryContextStore`` in an SQLite
in-memory database. Both implement the abstract :class:`ContextStore`.
"""

from __future__ import annotations

from agentcontext.store.base import AppendResult, ContextStore
from agentcontext.store.records import (
    Branch,
    BranchInfo,
    BranchState,
    Chat,
    ChatExport,
    ChatInfo,
    ChatUpdate,
    Checkpoint,
    ExportedBlob,
    Graph,
    GraphNode,
    MessageRecord,
    ResolveRecord,
    SearchResult,
)
from agentcontext.store.sql import InMemoryContextStore, SqlContextStore

__all__ = [
    "AppendResult",
    "Branch",
    "BranchInfo",
    "BranchState",
    "Chat",
    "ChatExport",
    "ChatInfo",
    "ChatUpdate",
    "Checkpoint",
    "ContextStore",
    "ExportedBlob",
    "Graph",
    "GraphNode",
    "InMemoryContextStore",
    "MessageRecord",
    "ResolveRecord",
    "SearchResult",
    "SqlContextStore",
]
