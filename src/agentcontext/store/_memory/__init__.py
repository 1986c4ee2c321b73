"""What a store keeps in this process, in one place: the decoded chains its engines share
(``chains``), the outlines of the chats it last drew (``outlines``) and the write turns of
its engines (``turns``).

A `StoreMemory` holds them for one store (with who owns each chat it wrote, ``owners``):
``cache_bytes`` bounds the chains, and the outlines apart. `StoreMemory.forget` is the one
invalidation: a removal (a delete, a purge, a prune, an erasure) calls `forget_everywhere`,
which drops the chats from the memories of every store of the process, whichever store made the
call and whatever engine or URL the others were opened with. Nothing here is ever served for a
chat whose identity changed (a chat deleted and created again is another incarnation, which the
chains and outlines are keyed by).
"""

from __future__ import annotations

import threading
import weakref

from agentcontext.store._memory.chains import DEFAULT_CACHE_BYTES, ChainMemory
from agentcontext.store._memory.outlines import OutlineMemory
from agentcontext.store._memory.owners import Owners
from agentcontext.store._memory.turns import WriteTurns

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "ChainMemory",
    "OutlineMemory",
    "Owners",
    "StoreMemory",
    "WriteTurns",
    "forget_everywhere",
    "turns_of",
]


class StoreMemory:
    """The process state of one store: its chains, outlines and write turns."""

    def __init__(self, cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.chains = ChainMemory(cache_bytes)
        """The chains its engines decoded (bounded by ``cache_bytes``)."""
        self.outlines = OutlineMemory(cache_bytes)
        """The runs of the chats it last drew (within ``cache_bytes`` too, apart)."""
        self.turns = WriteTurns()
        """The write turns of its engines, by chat."""
        self.owners = Owners()
        """Who owns each chat (a save's search terms are made for its owner)."""
        with _LOCK:
            _ALL.add(self)

    def forget(self, *chat_ids: str) -> None:
        """Drop what is held of these chats (decoded chains and outlines)."""
        self.chains.forget(*chat_ids)
        self.outlines.forget(*chat_ids)
        self.owners.forget(*chat_ids)


_ALL: weakref.WeakSet[StoreMemory] = weakref.WeakSet()
_LOCK = threading.Lock()


def forget_everywhere(*chat_ids: str) -> None:
    """Drop what every store of this process holds of these chats (see the module's
    docstring); a store of another database that held a chat of the same id only reads it
    again."""
    if not chat_ids:
        return
    with _LOCK:
        memories = list(_ALL)
    for memory in memories:
        memory.forget(*chat_ids)


_TURNS: weakref.WeakKeyDictionary[object, WriteTurns] = weakref.WeakKeyDictionary()


def turns_of(store: object) -> WriteTurns:
    """The write turns of a store that keeps no `StoreMemory` (a store built on
    `ContextStore`'s defaults), held as long as the store lives."""
    with _LOCK:
        found = _TURNS.get(store)
        if found is None:
            found = _TURNS[store] = WriteTurns()
        return found
