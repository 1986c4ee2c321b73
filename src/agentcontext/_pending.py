"""The pending queue: message fragments waiting for ``save()``, and the conversation they make
with the branch's stored chain.

Lazy message fragments (``last_assistant_message`` and the like) get their ids from what comes
before them, in the queue or on the chain, the first time the queue is read; the resolved
fragment replaces the lazy one, so a resolve and the save after it use the same ids. A pending
message with the id of an earlier pending one replaces it at its place (a retry), and one with
the id of a stored message replaces that message in place. Empty assistant placeholders (of a
streaming turn in progress) are left out of what is sent.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from agentcontext._chainview import ChainView
from agentcontext.fragments import (
    ContextFragment,
    is_empty_assistant_placeholder,
    is_lazy_fragment,
    message_of,
    resolve_lazy_message,
)
from agentcontext.messages import Message

__all__ = ["PendingQueue"]


def _last_assistant_id(before: Sequence[ContextFragment], chain: ChainView) -> str | None:
    """The id of the assistant message a lazy fragment after ``before`` refers to."""
    for fragment in reversed(before):
        if fragment.name == "assistant" and not is_lazy_fragment(fragment):
            return message_of(fragment).id
    for message in reversed(chain.messages):
        if message.role == "assistant":
            return message.id
    return None


class PendingQueue:
    """The message fragments waiting for ``save()``, in order."""

    __slots__ = ("_fragments",)

    def __init__(self) -> None:
        self._fragments: list[ContextFragment] = []

    def __len__(self) -> int:
        return len(self._fragments)

    def __iter__(self) -> Iterator[ContextFragment]:
        return iter(self._fragments)

    def __getitem__(self, index: int) -> ContextFragment:
        return self._fragments[index]

    def snapshot(self) -> list[ContextFragment]:
        """The fragments (a copy)."""
        return list(self._fragments)

    def add(self, fragment: ContextFragment) -> None:
        self._fragments.append(fragment)

    def replace(self, index: int, fragment: ContextFragment) -> None:
        """Put ``fragment`` at ``index`` instead of the one there (reminders mark and amend
        the fragments they evaluated so)."""
        self._fragments[index] = fragment

    def clear(self) -> list[ContextFragment]:
        """Drop every fragment; returns them."""
        dropped = list(self._fragments)
        self._fragments.clear()
        return dropped

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` fragments (undo what a failed call queued)."""
        del self._fragments[length:]

    def resolve(self, chain: ChainView) -> None:
        """Give lazy message fragments their ids (in place, so save uses the same ids)."""
        fragments = self._fragments
        for index, fragment in enumerate(fragments):
            if is_lazy_fragment(fragment):
                fragments[index] = resolve_lazy_message(
                    fragment, last_assistant_id=_last_assistant_id(fragments[:index], chain)
                )

    def messages(self, chain: ChainView) -> list[Message]:
        """The pending messages, lazy ones resolved. A message with the id of an earlier
        pending one replaces it at its place (a retry, e.g. ``last_assistant_message``)."""
        self.resolve(chain)
        by_id: dict[str, Message] = {}
        for fragment in self._fragments:
            message = message_of(fragment)
            by_id[message.id] = message  # an existing key keeps its position
        return list(by_id.values())

    def compose(self, chain: ChainView) -> list[Message]:
        """The conversation as sent: the compaction's summary (if any), then `compose_chain`."""
        composed = self.compose_chain(chain)
        if chain.summary is not None:
            composed.insert(0, chain.summary)
        return composed

    def compose_chain(self, chain: ChainView) -> list[Message]:
        """The chain's messages with the pending ones merged in (a pending message with a
        stored id replaces it in place, the others follow), empty placeholders left out."""
        pending = self.messages(chain)
        if not pending and not chain.placeholders:
            return list(chain.messages)  # the common case: nothing to merge or leave out
        overrides = {message.id: message for message in pending}
        index = chain.index
        if any(message_id in index for message_id in overrides):
            out = [overrides.pop(message.id, message) for message in chain.messages]
        else:
            out = list(chain.messages)
        out.extend(overrides.values())
        maybe_empty = {message.id for message in pending}
        maybe_empty.update(chain.placeholders)
        return [
            message
            for message in out
            if message.id not in maybe_empty or not is_empty_assistant_placeholder(message)
        ]
