"""Streaming turns: ``begin_turn`` stores the user message with an empty assistant placeholder
after it, ``complete_turn`` fills that placeholder in place once the answer has streamed.

The placeholder's id is derived from the user message's id, so a ``begin_turn`` retried after
its outcome was lost finds its turn stored (`stored_turn`) instead of storing it twice. The
engine keeps the turn it has in progress in a `TurnTracker`; the saves themselves are the
engine's ``save()``.
"""

from __future__ import annotations

import uuid

from agentcontext._chainview import ChainView
from agentcontext._pending import PendingQueue
from agentcontext._save import SaveResult
from agentcontext.errors import EmptyConversationError, InvalidInputError, InvalidTypeError
from agentcontext.fragments import (
    ContextFragment,
    assistant,
    is_empty_assistant_placeholder,
    is_lazy_fragment,
    is_message_fragment,
    message_of,
    with_message_id,
)
from agentcontext.messages import Message
from agentcontext.store.records import Branch

__all__ = [
    "TURNS",
    "TurnTracker",
    "placeholder_fragment",
    "stored_turn",
    "turn_at_head",
    "turn_message",
]

TURNS = uuid.UUID("6f0c7f5e-2b1a-4c59-9d0e-5a1f3c8b7e42")
"""Namespace of the placeholder ids of `ContextEngine.begin_turn` (derived from the user
message's id, so a retried begin_turn gives the same placeholder)."""


def turn_message(fragment: ContextFragment, role: str) -> Message:
    """The message of a fragment given to ``begin_turn`` (``role`` "user") or
    ``complete_turn`` ("assistant"), or the error saying what to pass."""
    verb, example = (
        ("begin_turn", "user('...')")
        if role == "user"
        else ("complete_turn", "assistant_text('...')")
    )
    if not is_message_fragment(fragment) or is_lazy_fragment(fragment):
        raise InvalidTypeError(f"{verb}() takes a {role} message fragment such as {example}")
    message = message_of(fragment)
    if message.role != role:
        raise InvalidInputError(
            f"{verb}() needs a {role} message such as {example}, got {message.role!r}"
            + ("; queue other messages with set() and save()" if role == "user" else "")
        )
    return message


def placeholder_fragment(placeholder: str) -> ContextFragment:
    """The empty assistant message a turn starts with."""
    return assistant(Message(id=placeholder, role="assistant", parts=[]))


def stored_turn(chain: ChainView, question: Message, placeholder: str) -> str | None:
    """The placeholder of this very turn when the chain holds it already, the question exactly
    so and its placeholder (filled or not) right after it: a turn retried after its outcome
    was lost. Else None."""
    position = chain.index.get(question.id)
    if (
        position is None
        or position + 1 >= len(chain.ids)
        or chain.ids[position + 1] != placeholder
        or chain.messages[position] != question
    ):
        return None
    return placeholder


def turn_at_head(chain: ChainView) -> str:
    """The placeholder at the head of the chain (a turn begun by another engine, or before a
    restart); `EmptyConversationError` when the head is not an empty placeholder."""
    last = chain.messages[-1] if chain.messages else None
    if last is None or not is_empty_assistant_placeholder(last):
        raise EmptyConversationError(
            "no turn in progress: call begin_turn() first (the branch head is not an "
            "empty assistant placeholder)"
        )
    return last.id


class TurnTracker:
    """The streaming turn an engine has in progress: begun, not completed yet."""

    __slots__ = ("attempted", "current")

    def __init__(self) -> None:
        self.current: str | None = None
        """The placeholder of the turn, or None."""
        self.attempted: Message | None = None
        """The user message of the last ``begin_turn``, until its turn is heard to be
        completed (`completed`): a call of it, or of its ``complete_turn``, may have been cut
        short, and the caller retry the turn."""

    def retried(
        self, question: Message, fragment: ContextFragment
    ) -> tuple[Message, ContextFragment]:
        """``begin_turn`` retried after a call whose outcome was lost, with the fragment built
        again (``user("...")`` draws a new id each time): the same words are the same turn, under
        the id of the first attempt, so that it is stored once. Else as given."""
        attempted = self.attempted
        if (
            attempted is None
            or attempted.id == question.id
            or question.model_copy(update={"id": attempted.id}) != attempted
        ):
            return question, fragment
        return attempted, with_message_id(fragment, attempted.id)

    def reset(self) -> None:
        """Forget the turn (the engine moved to another branch)."""
        self.current = self.attempted = None

    def rolled_back(self) -> None:
        """The transaction the engine followed ended: its placeholder may have gone with it.
        The user message of a ``begin_turn`` under way is kept (set as the call starts, it
        makes a retry with the fragment built again that same turn)."""
        self.current = None

    @staticmethod
    def placeholder_for(question: Message, pending: PendingQueue) -> str:
        """The placeholder id of the turn of ``question``; refused when a pending message
        has it already."""
        placeholder = uuid.uuid5(TURNS, question.id).hex
        if any(fragment.id == placeholder for fragment in pending):
            raise InvalidInputError(
                f"begin_turn(): a pending message has the id {placeholder!r}, which is the "
                f"placeholder id this turn derives from its user message's id {question.id!r}; "
                "save or clear the pending messages first, or give the user message another id"
            )
        return placeholder

    def begun(
        self, placeholder: str, before: Branch | None, after: Branch | None, saved: SaveResult
    ) -> str:
        """The turn is stored: its placeholder (the head after the save, on a new branch when
        the user message's id existed with other content) is now the turn in progress."""
        if after is None or before is None or after.id != before.id:
            # The user message's id existed with other content: save() forked a new branch
            # and stored the turn there under fresh ids; the placeholder is its head.
            placeholder = saved.head_message_id
        self.current = placeholder
        return placeholder

    def target(self, answer: Message, chain: ChainView) -> str | None:
        """The placeholder ``answer`` fills: the turn in progress, or the one the answer names
        by its id (several turns in flight); None when neither is known."""
        target = self.current
        if answer.id != target:
            position = chain.index.get(answer.id)
            if position is not None and is_empty_assistant_placeholder(chain.messages[position]):
                target = answer.id  # the answer names a turn of its own
        return target

    def completed(self, target: str) -> None:
        """The placeholder ``target`` was filled."""
        if target == self.current:
            self.current = self.attempted = None
