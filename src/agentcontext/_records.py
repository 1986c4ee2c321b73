"""Resolve records: what ``resolve(record=True)`` showed the model, stored as content-addressed
blobs, and given back byte for byte by ``replay``."""

from __future__ import annotations

from agentcontext._conversation import Conversation
from agentcontext.errors import NotFoundError
from agentcontext.messages import Message, ResolveResult
from agentcontext.store.protocols import RecordKeeper

__all__ = ["record", "replay"]


def _message_json(message: Message) -> bytes:
    """A message exactly as pydantic serialises it, so a replay gives back the same bytes."""
    return message.model_dump_json().encode("utf-8")


async def record(
    store: RecordKeeper, conv: Conversation, renderer: str, result: ResolveResult
) -> ResolveResult:
    """Store the prompt and the messages of ``result`` (resolved on the head of ``conv``'s
    branch) as blobs, with the report of its window; ``result`` with its record id."""
    assert conv.branch is not None
    stored = await store.create_resolve_record(
        conv.chat_id,
        branch_id=conv.branch.id,
        branch_name=conv.branch.name,
        head_message_id=conv.chain.head,
        renderer=renderer,
        system_prompt=result.system_prompt,
        messages=[(message.id, _message_json(message)) for message in result.messages],
        omitted=result.omitted,
        estimate=result.estimate,
    )
    return result.model_copy(update={"record_id": stored.id})


async def replay(store: RecordKeeper, chat_id: str, record_id: str) -> ResolveResult:
    """The result a record of the chat stored; `NotFoundError` for an unknown record, one of
    another chat, or a missing blob."""
    found = await store.get_resolve_record(record_id)
    if found is None or found.chat_id != chat_id:
        raise NotFoundError(f"chat {chat_id!r} has no resolve record {record_id!r}")
    blobs = {}
    for digest in {found.prompt_blob, *found.message_blobs}:
        content = await store.read_blob(digest, chat_id=chat_id)
        if content is None:
            raise NotFoundError(
                f"blob {digest} of resolve record {record_id!r} is missing from the store"
            )
        blobs[digest] = content
    return ResolveResult(
        system_prompt=blobs[found.prompt_blob].decode("utf-8"),
        messages=[Message.model_validate_json(blobs[h]) for h in found.message_blobs],
        record_id=found.id,
        omitted=found.omitted,
        estimate=found.estimate,
    )
