"""Changes of the chat's record made by the engine: its title, its metadata, and the token usage
it totals. Each is an updater for ``store.update_chat``, which applies it under the store's
lock (a read-modify-write that loses no concurrent update)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from agentcontext.store.records import Chat, ChatUpdate
from agentcontext.usage import add_usage

__all__ = ["add_to_usage", "retitle"]


def retitle(title: str | None, extra: Mapping[str, Any] | None) -> Callable[[Chat], ChatUpdate]:
    """Set the title (unless None) and merge ``extra`` into the metadata (unless None)."""

    def updater(chat: Chat) -> ChatUpdate:
        fields: dict[str, Any] = {}
        if title is not None:
            fields["title"] = title
        if extra is not None:
            fields["metadata"] = {**chat.metadata, **extra}
        return ChatUpdate(**fields)

    return updater


def add_to_usage(increment: Mapping[str, Any]) -> Callable[[Chat], ChatUpdate]:
    """Add normalised token counts to ``metadata["usage"]``."""

    def updater(chat: Chat) -> ChatUpdate:
        current = chat.metadata.get("usage")
        total = add_usage(current if isinstance(current, Mapping) else {}, increment)
        return ChatUpdate(metadata={**chat.metadata, "usage": total})

    return updater
