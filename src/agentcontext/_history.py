"""Questions about the conversation as the engine holds it, the branch's chain with the pending
messages merged in: how many turns, its first user message, its newest message. On a compacted
branch, what the compaction folds is read from the store."""

from __future__ import annotations

from agentcontext._chainview import ChainView
from agentcontext._conversation import Conversation, decode_record
from agentcontext._pending import PendingQueue
from agentcontext.messages import Message
from agentcontext.store.protocols import ChatReader

__all__ = ["first_user_message", "head_message", "turn_count"]


def turn_count(chain: ChainView, pending: PendingQueue) -> int:
    """The user messages of the conversation, those a compaction folds included."""
    composed = pending.compose_chain(chain)
    return chain.folded_turns + sum(1 for message in composed if message.role == "user")


async def first_user_message(
    store: ChatReader, chain: ChainView, pending: PendingQueue
) -> Message | None:
    """The first stored user message (a pending one when none is stored), or None."""
    if chain.base is not None:  # compacted: the first user message is folded
        for record in await store.get_message_chain(chain.base):
            if record.name == "user" and record.type == "message":
                return decode_record(record)
    composed = pending.compose_chain(chain)
    return next((m for m in composed if m.role == "user"), None)


async def head_message(conv: Conversation, pending: PendingQueue) -> Message | None:
    """The last pending message, else the branch's head (an empty assistant placeholder
    included), else None."""
    messages = pending.messages(conv.chain)
    if messages:
        return messages[-1]
    await conv.sync()
    chain = conv.chain
    if chain.messages:
        return chain.messages[-1]
    if chain.base is not None:  # the head is the last message a compaction folds
        record = await conv.store.get_message(chain.base)
        return None if record is None else decode_record(record)
    return None
