"""Small helpers for the engine tests."""

from __future__ import annotations

from collections.abc import Sequence

from agentcontext import Message


def texts(messages: Sequence[Message]) -> list[str]:
    """The text of each message."""
    return [message.text for message in messages]


def ids(messages: Sequence[Message]) -> list[str]:
    """The id of each message."""
    return [message.id for message in messages]
