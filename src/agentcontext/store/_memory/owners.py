"""Who owns each chat, as last read: a chat's owner never changes while it exists, so a save
computes its search terms for the owner without asking (the write checks it still is; a chat
deleted and created again for another user is refused, read again and written)."""

from __future__ import annotations

import threading
from collections import OrderedDict

__all__ = ["Owners"]

MAX_CHATS = 100_000


class Owners:
    """Chat id → user id, least recently used first out past `MAX_CHATS`."""

    def __init__(self) -> None:
        self._owners: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, chat_id: str) -> str | None:
        """The owner of a chat, if known."""
        return self._owners.get(chat_id)

    def note(self, chat_id: str, user_id: str) -> None:
        """``user_id`` owns ``chat_id`` (read from the store)."""
        with self._lock:
            self._owners[chat_id] = user_id
            self._owners.move_to_end(chat_id)
            if len(self._owners) > MAX_CHATS:
                self._owners.popitem(last=False)

    def forget(self, *chat_ids: str) -> None:
        """Drop what is known of these chats."""
        with self._lock:
            for chat_id in chat_ids:
                self._owners.pop(chat_id, None)
