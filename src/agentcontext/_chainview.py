"""`ChainView`: a branch's chain as the engine holds it, read-only.

What the parts of the engine read of the cached chain (the pending queue composing the
messages to send, reminders, streaming turns, inspect) is this protocol, not the cache that
keeps it in step with the store (`_conversation.ChainCache`, which is one): nothing that reads
the chain can change it or reach the engine through it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from datetime import datetime
from typing import Protocol

from agentcontext.messages import Message

__all__ = ["ChainView"]


class ChainView(Protocol):
    """The stored chain of a branch, root first (after a compaction: the messages after it)."""

    @property
    def head(self) -> str | None:
        """The head's id; None for an empty branch. After a compaction it may be the last
        message the compaction folds (`base`), with no message held after it."""
        ...

    @property
    def ids(self) -> Sequence[str]:
        """The ids of `messages`, in order."""
        ...

    @property
    def messages(self) -> Sequence[Message]:
        """The messages held, root (or first message after `base`) first."""
        ...

    @property
    def index(self) -> Mapping[str, int]:
        """Each held message's position in `messages`, by id."""
        ...

    @property
    def placeholders(self) -> AbstractSet[str]:
        """Ids of the empty assistant placeholders among `messages`."""
        ...

    @property
    def summary(self) -> Message | None:
        """The compaction standing for the chain up to `base`, or None."""
        ...

    @property
    def base(self) -> str | None:
        """The last message the compaction folds (the parent of the first held), or None."""
        ...

    @property
    def folded_turns(self) -> int:
        """How many user turns the compaction folds (0 without one)."""
        ...

    def created_at(self, message_id: str) -> datetime | None:
        """When a held message was stored; None when the chain does not know it."""
        ...

    def raw_texts(self) -> dict[str, str | bytes | None]:
        """The stored JSON text of the held messages loaded and not changed since, by id (a
        cheap fingerprint of their content)."""
        ...
