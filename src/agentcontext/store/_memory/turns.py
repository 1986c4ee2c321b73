"""Write turns: writers of one chat in one process take turns.

Engines of one store that write the same chat would otherwise race each other's
compare-and-swap, every loser paying a refused write and a re-read; so each takes the chat's
turn first (writers in other processes are still ordered by the compare-and-swap). A turn
lives while an engine of the chat holds it.
"""

from __future__ import annotations

import asyncio
import weakref

__all__ = ["WriteTurns"]


class WriteTurns:
    """One lock per chat, for the engines of one store (held weakly: a lock no engine holds
    goes)."""

    def __init__(self) -> None:
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def lock(self, chat_id: str) -> asyncio.Lock:
        """The chat's write turn."""
        found = self._locks.get(chat_id)
        if found is None:
            found = self._locks[chat_id] = asyncio.Lock()
        return found
