"""Branches and checkpoints of the engine's chat: rewind, restore, switch, fork aside (``btw``),
rename, delete, checkpoint.

Each takes the engine's `Conversation` and a store that keeps branches; moving to another branch
leaves the conversation on it (`Conversation.moved_to`), and the engine drops what was pending
for the branch it left.
"""

from __future__ import annotations

from typing import Protocol

from agentcontext._conversation import Conversation
from agentcontext.errors import (
    BranchNotFoundError,
    CheckpointNotFoundError,
    EmptyConversationError,
    InvalidInputError,
    MessageNotFoundError,
)
from agentcontext.store.protocols import BranchKeeper, TurnWriter
from agentcontext.store.records import PURGED, Branch, BranchInfo, Checkpoint

__all__ = [
    "BranchStore",
    "branch_info",
    "checkpoint",
    "delete",
    "fork_aside",
    "rename",
    "restore",
    "rewind",
    "switch",
]


class BranchStore(BranchKeeper, TurnWriter, Protocol):
    """What branching uses of a store (every `EngineStore` does it)."""


async def rewind(
    conv: Conversation,
    store: BranchStore,
    message_id: str,
    name: str | None,
    *,
    base: str | None = None,
) -> BranchInfo:
    """A new branch at ``message_id``, named ``name`` or after ``base`` (default: the engine's
    branch), made active; the conversation moves to it."""
    assert conv.branch is not None
    try:
        # The store checks the message (it exists, in this chat, not a compaction).
        info = await store.fork_branch(
            conv.chat_id,
            base if base is not None else await conv.branch_name(),
            head_message_id=message_id,
            activate=True,
            name=name,
        )
    except MessageNotFoundError as exc:
        await conv.require_chat()
        if PURGED in str(exc):
            raise  # the store names the purge that deleted it
        raise MessageNotFoundError(
            f"message {message_id!r} does not exist in chat {conv.chat_id!r}"
        ) from None
    conv.moved_to(info)
    return info


async def checkpoint(conv: Conversation, store: BranchStore, name: str) -> Checkpoint:
    """Name the current head."""
    head = await conv.synced_head()
    if head is None:
        raise EmptyConversationError(
            "cannot create a checkpoint: the branch has no messages yet; save first"
        )
    assert conv.branch is not None
    return await store.create_checkpoint(conv.chat_id, name, head, branch_id=conv.branch.id)


async def restore(
    conv: Conversation, store: BranchStore, checkpoint: str, name: str | None
) -> BranchInfo:
    """`rewind` to a checkpoint's message, the new branch named after the branch the
    checkpoint was made on when that one still exists."""
    found = await store.get_checkpoint(conv.chat_id, checkpoint)
    if found is None:
        await conv.require_chat()
        raise CheckpointNotFoundError(
            f"chat {conv.chat_id!r} has no checkpoint named {checkpoint!r}"
        )
    base = None
    if found.branch_id is not None and name is None:
        made_on = await store.get_branch_by_id(found.branch_id)
        if made_on is not None and made_on.chat_id == conv.chat_id:
            base = made_on.name
    return await rewind(conv, store, found.message_id, name, base=base)


async def switch(conv: Conversation, store: BranchStore, name: str) -> Branch:
    """Make the branch ``name`` active; the conversation moves to it."""
    target = await store.get_branch(conv.chat_id, name)
    if target is None:
        await conv.require_chat()
        raise BranchNotFoundError(f"chat {conv.chat_id!r} has no branch named {name!r}")
    branch = await store.set_active_branch(conv.chat_id, target.id)
    conv.moved_to(branch)
    return branch


async def branch_info(store: BranchStore, chat_id: str, branch: Branch) -> BranchInfo:
    """The listing of ``branch`` (with its message count)."""
    for info in await store.list_branches(chat_id):
        if info.id == branch.id:
            return info
    raise BranchNotFoundError(f"branch {branch.name!r} disappeared")  # pragma: no cover


async def fork_aside(conv: Conversation, store: BranchStore, name: str | None) -> BranchInfo:
    """A new branch at the current head; the conversation stays where it is."""
    assert conv.branch is not None
    head = await conv.synced_head()
    if head is None:
        raise EmptyConversationError(
            "cannot fork with btw(): the branch has no messages yet; save first"
        )
    return await store.fork_branch(
        conv.chat_id, conv.branch.name, head_message_id=head, activate=False, name=name
    )


async def rename(conv: Conversation, store: BranchStore, name: str, new_name: str) -> Branch:
    """Rename a branch of the chat (the conversation's own keeps up)."""
    renamed = await store.rename_branch(conv.chat_id, name, new_name)
    if conv.branch is not None and conv.branch.id == renamed.id:
        conv.branch = conv.branch.model_copy(update={"name": new_name})
    return renamed


async def delete(conv: Conversation, store: BranchStore, name: str) -> bool:
    """Delete a branch of the chat, never the conversation's own."""
    target = await store.get_branch(conv.chat_id, name)
    if target is not None and conv.branch is not None and conv.branch.id == target.id:
        raise InvalidInputError(
            f"branch {name!r} is this engine's branch and cannot be deleted; switch to "
            "another branch first"
        )
    return await store.delete_branch(conv.chat_id, name)
