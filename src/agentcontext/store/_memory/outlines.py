"""The outlines of the chats a store last drew: their `Runs`, found once per chat version."""

from __future__ import annotations

import threading
from collections import OrderedDict

from agentcontext.store._ops.outline import Runs

__all__ = ["KEPT_CHATS", "OutlineMemory"]

KEPT_CHATS = 8
"""The most chats an `OutlineMemory` holds, whatever their size."""


class OutlineMemory:
    """The `Runs` of the chats last shown, by chat identity and version, bounded in
    (estimated) bytes and in chats; safe to share between tasks and threads."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._held: OrderedDict[str, tuple[object, Runs]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        """Outlines served from memory (statistics for tests and benchmarks)."""

    def recall(self, chat_id: str, key: object) -> Runs | None:
        """The runs of the chat at ``key`` (its identity and version), or None."""
        with self._lock:
            held = self._held.get(chat_id)
            if held is None or held[0] != key:
                return None
            self._held.move_to_end(chat_id)
            self.hits += 1
            return held[1]

    def remember(self, chat_id: str, key: object, runs: Runs) -> None:
        """Keep the runs of the chat at ``key`` (replacing older ones of the chat)."""
        if runs.size > self.max_bytes:
            return
        with self._lock:
            old = self._held.pop(chat_id, None)
            if old is not None:
                self._bytes -= old[1].size
            self._held[chat_id] = (key, runs)
            self._bytes += runs.size
            while self._bytes > self.max_bytes or len(self._held) > KEPT_CHATS:
                _, (_, dropped) = self._held.popitem(last=False)
                self._bytes -= dropped.size

    def forget(self, *chat_ids: str) -> None:
        """Drop what is held for these chats."""
        with self._lock:
            for chat_id in chat_ids:
                old = self._held.pop(chat_id, None)
                if old is not None:
                    self._bytes -= old[1].size
