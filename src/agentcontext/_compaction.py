"""Compaction: a summary of the older part of a branch, stored in the graph beside it.

`ContextEngine.compact` gives the messages to fold (a previous summary first) to the caller's
``summarize`` and stores what it returns as a message of type ``compaction`` whose parent is
the last message folded (the *compaction point*). Nothing is deleted: the folded messages stay
on the branch for rewinds, search, export and the views.

A chain load (`ContextStore.load_chain_rows(..., compacted=True)`) finds the deepest compaction
whose point is on the head's chain and reads only the messages after it, so a compacted chat of
any length resolves at the cost of its tail. A head rewound to before the point does not reach
it, and resolves without it. The id of a compaction is derived from its point, so a retried or
concurrent compaction of the same point stores one node (the last summary written wins).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict

from agentcontext import _validate as v
from agentcontext._conversation import COMPACTION, Conversation
from agentcontext.errors import EmptyConversationError, InvalidInputError, InvalidTypeError
from agentcontext.fragments import is_empty_assistant_placeholder
from agentcontext.messages import Message, TextPart
from agentcontext.store.records import MessageRecord, compaction_id, utcnow

__all__ = ["Compaction", "Summarizer", "compact", "compaction_id"]

Summarizer = Callable[[list[Message]], Awaitable[str | Message]]
"""An async callable given the messages to fold that returns the summary (text or message)."""


class Compaction(BaseModel):
    """A stored compaction: the summary and the part of the branch it stands for."""

    model_config = ConfigDict(frozen=True)

    id: str
    """The id of the summary node (derived from the compaction point)."""
    chat_id: str
    through_message_id: str
    """The last message folded: resolving a head at or after it sends the summary instead of
    the chain up to it."""
    summary: Message
    folded: int
    """How many messages were given to ``summarize`` (a previous summary included)."""
    previous_id: str | None = None
    """The compaction this one nests (its summary was folded into this one)."""
    created_at: AwareDatetime


def _fold_point(messages: Sequence[Message], keep_last_turns: int) -> int:
    """How many leading messages to fold so the last ``keep_last_turns`` turns stay. A turn in
    progress (the head is an empty placeholder of `ContextEngine.begin_turn`) is never folded:
    it is about to be filled in place; nor is the fold point ever an empty placeholder."""
    starts = [i for i, message in enumerate(messages) if message.role == "user"]
    if keep_last_turns == 0:
        cut = len(messages)
    else:
        cut = 0 if len(starts) <= keep_last_turns else starts[-keep_last_turns]
    if messages and is_empty_assistant_placeholder(messages[-1]):
        cut = min(cut, starts[-1] if starts else 0)
    while cut and is_empty_assistant_placeholder(messages[cut - 1]):
        cut -= 1  # never fold up to a placeholder: it may still be filled in place
    return cut


async def compact(conv: Conversation, summarize: Summarizer, keep_last_turns: int) -> Compaction:
    """Fold the branch's older messages into a summary stored beside it (the engine's lock is
    held and the chain is in sync)."""
    chain = conv.chain
    messages = chain.messages
    cut = _fold_point(messages, keep_last_turns)
    folded = [m for m in messages[:cut] if not is_empty_assistant_placeholder(m)]
    if not folded:
        if chain.summary is not None and chain.base is not None:
            # Compacted as asked already: a compaction retried after it landed (its caller
            # never heard), or asked again with nothing new. What is stored comes back.
            return await _stored(conv, chain.summary, chain.base)
        turns = sum(message.role == "user" for message in messages)
        raise EmptyConversationError(
            f"nothing to compact: the branch has {turns} turn(s) after its last compaction "
            f"and keep_last_turns={keep_last_turns} keeps them all"
        )
    through = messages[cut - 1].id
    given = ([chain.summary] if chain.summary is not None else []) + folded
    result: Any = summarize(list(given))
    if not inspect.isawaitable(result):
        raise InvalidTypeError(
            "summarize must be an async callable (async def summarize(messages): ...)"
        )
    summary_out = await result
    identity = compaction_id(conv.chat_id, through)
    previous = chain.summary.id if chain.summary is not None else None
    turns = chain.folded_turns + sum(1 for message in folded if message.role == "user")
    meta = {"folded": len(given), "through": through, "previous": previous, "turns": turns}
    if isinstance(summary_out, str):
        v.check_text(summary_out, "the summary")
        summary = Message(
            id=identity,
            role="user",
            parts=[TextPart(text=summary_out)],
            metadata={"compaction": meta},
        )
    elif isinstance(summary_out, Message):
        summary = summary_out.model_copy(
            update={
                "id": identity,
                "metadata": {**(summary_out.metadata or {}), "compaction": meta},
            }
        )
    else:
        raise InvalidTypeError(
            f"summarize must return the summary as a str or a Message, got "
            f"{v.type_name(summary_out)}"
        )
    if _is_empty(summary):
        raise InvalidInputError(
            f"the summarizer returned an empty summary (no text, no parts) for the "
            f"{len(given)} message(s) to fold, and nothing was compacted; make summarize "
            "return the summary (text that is not blank, or a Message with content)"
        )
    record = MessageRecord(
        id=identity,
        chat_id=conv.chat_id,
        parent_id=through,
        name=summary.role,
        type=COMPACTION,
        data=summary.model_dump(exclude_none=True),
        created_at=utcnow(),
    )
    stored = await conv.store.add_message(record)
    conv.chain.invalidate()  # the next resolve loads the tail after the compaction
    return Compaction(
        id=identity,
        chat_id=conv.chat_id,
        through_message_id=through,
        summary=summary,
        folded=len(given),
        previous_id=previous,
        created_at=stored.created_at,
    )


def _is_empty(summary: Message) -> bool:
    """Whether a summary says nothing: no parts, or only text parts of blank text (what
    `is_empty_assistant_placeholder` calls empty, whatever the role). Stored, it would stand
    for the folded messages and send nothing in their place."""
    return all(isinstance(part, TextPart) and not part.text.strip() for part in summary.parts)


async def _stored(conv: Conversation, summary: Message, through: str) -> Compaction:
    """The compaction standing for the start of the engine's chain, as `compact` returned it."""
    meta = (summary.metadata or {}).get("compaction")
    meta = meta if isinstance(meta, dict) else {}
    record = await conv.store.get_message(summary.id)
    folded = meta.get("folded")
    previous = meta.get("previous")
    return Compaction(
        id=summary.id,
        chat_id=conv.chat_id,
        through_message_id=through,
        summary=summary,
        folded=folded if isinstance(folded, int) and not isinstance(folded, bool) else 0,
        previous_id=previous if isinstance(previous, str) else None,
        created_at=record.created_at if record is not None else utcnow(),
    )
