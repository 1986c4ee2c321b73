"""The store's memory of decoded chains: what engines decoded, for the next engine to reuse.

Stored messages never change in place (an in-place update writes a new chat version, and
`ContextStore.get_changes` reports it), so a chain decoded at chat version ``v`` is still
right at any later version once the changes after ``v`` are applied to it. An engine that
loaded or caught up a chain leaves a copy here; a fresh engine on the same store (what every
stateless request handler makes) starts from that copy and reads only what changed since,
instead of reading and decoding the whole history again.

The memory is bounded by an estimate of the decoded size in bytes (``cache_bytes``, least
recently used chats go first) and holds a few chains per chat (the branches last used). It
holds only what was committed: engines leave nothing here from inside a caller's
transaction. What it holds is opaque to it (the engine's `ChainCopy`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Protocol

__all__ = ["DEFAULT_CACHE_BYTES", "ChainMemory", "Remembered"]

DEFAULT_CACHE_BYTES = 64 * 2**20
"""The default bound of a store's memory of decoded messages (64 MiB)."""

PER_CHAT = 4
"""Chains kept per chat (its most recently used branches)."""


class Remembered(Protocol):
    """What the memory holds for a chain: its identity, where it stands, its estimated size."""

    @property
    def chat_key(self) -> tuple[str, object]: ...
    @property
    def head(self) -> str | None: ...
    @property
    def version(self) -> int: ...
    @property
    def size(self) -> int: ...
    def covers(self, head: str | None) -> bool:
        """Whether ``head`` is a message of this chain (so this chain can serve it)."""
        ...


class ChainMemory:
    """Decoded chains by chat, bounded in (estimated) bytes; safe to share between tasks and
    threads (each call takes a lock for a few dictionary operations, never across an await)."""

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._chats: OrderedDict[str, list[Any]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        """Chains handed to an engine (statistics for tests and benchmarks)."""

    @property
    def size(self) -> int:
        """The estimated bytes held."""
        return self._bytes

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._chats.values())

    def recall(self, chat_key: tuple[str, object], version: int) -> list[Any]:
        """The chains held for a chat at ``version`` or before, best first: the newest
        version first, and for one version the most recently left."""
        with self._lock:
            entries = self._chats.get(chat_key[0])
            if not entries:
                return []
            self._chats.move_to_end(chat_key[0])
            found = [e for e in entries if e.chat_key == chat_key and e.version <= version]
        found.sort(key=lambda e: -e.version)
        return found

    def holds(self, chat_key: tuple[str, object]) -> bool:
        """Whether a chain of the chat is held."""
        with self._lock:
            return any(e.chat_key == chat_key for e in self._chats.get(chat_key[0], ()))

    def note_hit(self) -> None:
        self.hits += 1

    def remember(self, entry: Remembered) -> None:
        """Keep ``entry``, replacing the one held for the same head and older ones whose head
        it holds (a branch that grew: the new chain serves both, and the copies share their
        messages, so keeping both would count them twice); evict the least recently used
        chats past the bound. An entry larger than the bound is not kept."""
        if self.max_bytes <= 0 or entry.size > self.max_bytes:
            return
        chat_id = entry.chat_key[0]
        with self._lock:
            entries = self._chats.get(chat_id)
            if entries is None:
                entries = self._chats[chat_id] = []
            else:
                self._chats.move_to_end(chat_id)
            kept = []
            for old in entries:
                if (
                    old.chat_key != entry.chat_key  # left by a chat deleted since
                    or old.head == entry.head  # replaced
                    or (old.version <= entry.version and entry.covers(old.head))  # outgrown
                ):
                    self._bytes -= old.size
                else:
                    kept.append(old)
            kept.insert(0, entry)
            self._bytes += entry.size
            while len(kept) > PER_CHAT:
                self._bytes -= kept.pop().size
            self._chats[chat_id] = kept
            while self._bytes > self.max_bytes and self._chats:
                _, evicted = self._chats.popitem(last=False)
                self._bytes -= sum(e.size for e in evicted)

    def forget(self, *chat_ids: str) -> None:
        """Drop what is held for these chats (deleted, purged or rewritten)."""
        with self._lock:
            for chat_id in chat_ids:
                entries = self._chats.pop(chat_id, None)
                if entries:
                    self._bytes -= sum(e.size for e in entries)

    def clear(self) -> None:
        """Drop everything."""
        with self._lock:
            self._chats.clear()
            self._bytes = 0
