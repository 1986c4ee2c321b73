"""The save protocol: a turn written atomically after the branch head, however the head moves.

1. **Compare-and-swap.** New messages are chained after the head the engine last saw and
   written with the head move in one store call, only if the head is still that one.
2. **Graft.** When another writer moved the head meanwhile, the turn is chained after the new
   head and written again (at once, then with a jittered back-off); `HeadConflictError` only
   after `MAX_SAVE_ATTEMPTS`.
3. **Idempotent retry.** A save whose commit the caller never heard of (it was cancelled, timed
   out, or lost its connection after the commit) and that is saved again with the same pending
   messages finds them stored exactly so (same content, each the parent of the next) and does
   not store them twice, fork, or move to another branch: it catches up and saves only what
   is new.
4. **Resending a stored message** with other content: ``branch=True`` forks a new branch
   from its parent (the original stays intact), ``branch=False`` updates it in place.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import cast

from pydantic import BaseModel, ConfigDict, Field

from agentcontext import _telemetry as telemetry
from agentcontext._conversation import Conversation, decode_record
from agentcontext._gc import gc_paused
from agentcontext._storetypes import takes_tokens
from agentcontext.errors import (
    BranchNotFoundError,
    HeadConflictError,
    InvalidGraphError,
    MessageNotFoundError,
    StoreUnavailableError,
)
from agentcontext.fragments import new_message_id
from agentcontext.messages import Message
from agentcontext.store.protocols import ConsistencyTokens
from agentcontext.store.records import Branch, MessageRecord, utcnow

__all__ = ["MAX_SAVE_ATTEMPTS", "SaveResult", "save_turn", "with_consistency_token"]

MAX_SAVE_ATTEMPTS = 64
"""Compare-and-swap attempts before a save gives up with HeadConflictError."""


class SaveResult(BaseModel):
    """What `ContextEngine.save` returns: the branch head after the save.

    ``head_message_id`` is typed ``str``, so it goes straight to ``rewind()`` under
    ``mypy --strict``: after a save that stored something, and after ``save()`` with nothing
    pending on a branch that has messages, it is the head's id. Only ``save()`` with nothing
    pending on a branch that holds no message yet has no head: then `head` is None and reading
    ``head_message_id`` raises `EmptyConversationError`.

    Construct it with ``SaveResult(head_message_id=...)``.
    """

    model_config = ConfigDict(frozen=True, serialize_by_alias=True)

    head: str | None = Field(alias="head_message_id")
    """The head's id, or None when nothing was saved on a branch without messages."""
    consistency_token: str | None = None
    """With read replicas: an opaque token naming this save's commit. Another process passes
    it as ``ContextEngine(..., after=token)`` and its reads of the chat see the save. None
    when the store has no read replicas (its reads always see the primary) or the save ran
    in a caller's transaction (``store.using()``, ``store.begin()``), which commits later."""

    @property
    def head_message_id(self) -> str:
        """The id of the message at the head of the branch after the save.

        Raises:
            EmptyConversationError: Nothing was pending and the branch holds no message (see
                `head`, which is None then).
        """
        if self.head is None:
            from agentcontext.errors import EmptyConversationError

            raise EmptyConversationError(
                "the save had nothing to store and the branch holds no message, so there is "
                "no head; set() a message before save(), or read SaveResult.head (None here)"
            )
        return self.head


def with_consistency_token(store: object, chat_id: str, result: SaveResult) -> SaveResult:
    """``result`` with the consistency token of its commit, when the store gives one."""
    if not takes_tokens(store):
        return result
    token = cast(ConsistencyTokens, store).consistency_token(chat_id)
    return result if token is None else result.model_copy(update={"consistency_token": token})


@asynccontextmanager
async def _writing(conv: Conversation) -> AsyncIterator[None]:
    """Take the chat's write turn, unless the save joins a caller's transaction.

    A save inside ``store.using()`` never waits here: a writer outside that transaction may
    hold the lock while it waits for the transaction to end (the store makes it wait), and
    the transaction's own database locks order the writers inside it.
    """
    if conv.store.current_transaction() is not None:
        yield
        return
    async with conv.write_lock:
        yield


def record_of(conv: Conversation, message: Message, parent_id: str | None) -> MessageRecord:
    """The record of a message to write."""
    # Python mode, not JSON mode: JSON mode would silently turn NaN and infinity into null and
    # stringify other values; the store refuses them with a SerializationError instead.
    # Built without validation: the message is a validated model, and the store checks every
    # field of every record it is given (`check_records`).
    return MessageRecord.model_construct(
        id=message.id,
        chat_id=conv.chat_id,
        parent_id=parent_id,
        name=message.role,
        type="message",
        data=message.model_dump(exclude_none=True),
        created_at=utcnow(),
    )


def _applied_on_chain(conv: Conversation, messages: Sequence[Message]) -> int:
    """How many leading messages are on the cached chain exactly so, one after another.

    Counted only when they are all there, or when the last of them is the head (what a retried
    save finds); a stored message resent further back is a resend, not a retry.
    """
    chain = conv.chain
    position = chain.index.get(messages[0].id)
    count = 0
    while (
        position is not None
        and count < len(messages)
        and position < len(chain.ids)
        and chain.ids[position] == messages[count].id
        and chain.messages[position] == messages[count]
    ):
        count += 1
        position += 1
    if count and count < len(messages) and messages[count - 1].id != chain.head:
        return 0
    return count


async def _applied_in_store(
    conv: Conversation, messages: Sequence[Message], head: str | None
) -> int:
    """Like `_applied_on_chain`, reading the stored messages (the cache may not hold them)."""
    count = 0
    for index, message in enumerate(messages):
        stored = await conv.store.get_message(message.id)
        if (
            stored is None
            or stored.chat_id != conv.chat_id
            or (index and stored.parent_id != messages[index - 1].id)
            or decode_record(stored) != message
        ):
            break
        count += 1
    if count and count < len(messages) and messages[count - 1].id != head:
        return 0
    return count


async def save_turn(conv: Conversation, messages: list[Message], *, branch: bool) -> SaveResult:
    """Write a turn after the head of the engine's branch (see the module documentation)."""
    try:
        return await _save_turn(conv, messages, branch=branch)
    except BranchNotFoundError as exc:  # the engine's branch, deleted by another store
        conv.chain.invalidate()
        raise conv.deleted_error() from exc


async def _save_turn(conv: Conversation, messages: list[Message], *, branch: bool) -> SaveResult:
    assert conv.branch is not None
    chain = conv.chain
    applied = _applied_on_chain(conv, messages)
    if applied == len(messages):
        return SaveResult(head_message_id=chain.head)
    messages = messages[applied:]
    expected = chain.head if chain.version is not None else conv.branch.head_message_id
    # Ids that may be updated in place: none when branching, else those known to exist.
    on_chain = [message.id for message in messages if message.id in chain.index]
    if branch and on_chain:
        # Resending a message of the branch: fork from its parent (no store round trip, and
        # no record that would name itself as its parent).
        return await fork_for_update(conv, messages, on_chain[0])
    known: set[str] = set() if branch else set(on_chain)
    async with _writing(conv):
        if expected == chain.head and conv.take_newer_saved([m.id for m in messages]):
            # Another engine of this store saved on the branch while this one waited for its
            # turn: go after what it left (the chain now held), as after losing the race.
            expected = conv.chain.head
        return await _attempt(conv, messages, expected, known, branch=branch)


async def _attempt(
    conv: Conversation,
    messages: list[Message],
    expected: str | None,
    known: set[str],
    *,
    branch: bool,
) -> SaveResult:
    assert conv.branch is not None
    store = conv.store
    pending_ids = {message.id for message in messages}
    ambiguous = False
    for attempt in range(MAX_SAVE_ATTEMPTS):
        if expected is not None and expected in pending_ids and expected not in known:
            # The head is one of these messages: stored by this very save in a call whose
            # outcome was lost, or by another writer.
            applied = await _applied_in_store(conv, messages, expected)
            if applied:
                await conv.sync()
                if applied == len(messages):
                    return SaveResult(head_message_id=conv.chain.head)
                messages = messages[applied:]
                pending_ids = {message.id for message in messages}
                expected = conv.chain.head
                continue
            if branch:
                return await fork_for_update(conv, messages, expected)
            known.add(expected)
        with gc_paused():  # a burst of new objects, none of them garbage
            records = _chained(conv, messages, expected, known)
        new_ids = [r.id for r in records if r.id not in known]
        telemetry.add(telemetry.SAVE_ATTEMPTS)
        try:
            if not new_ids:
                # branch=False and only in-place updates: the head does not move, but another
                # writer may have moved it since this engine last looked.
                await store.add_messages(records)
                _apply_updates(conv, records, messages)
                state = await store.get_branch_state(conv.branch.id)
                if state is None:
                    raise conv.deleted_error()
                return SaveResult(head_message_id=state.branch.head_message_id)
            if known:
                result = await store.append_messages(
                    conv.branch.id,
                    records,
                    expected_head=expected,
                    new_head=new_ids[-1],
                    updates=known,
                )
            elif conv.wants_saved_version():  # as append_turn, with the version read back
                result = await store.append_messages(
                    conv.branch.id, records, expected_head=expected, updates=()
                )
            else:  # new messages only: what almost every save writes
                result = await store.append_turn(conv.branch.id, records, expected_head=expected)
        except StoreUnavailableError as error:
            if error.contended and not ambiguous:
                # Lost races (lock waits that timed out, deadlocks) the store already ran
                # again as often as it does: nothing was written, and another run would only
                # wait as long again. (After an attempt whose outcome was lost, the next one
                # finds out whether it was written, as below.)
                raise
            # The connection dropped: the write may or may not have committed.
            ambiguous = True
            if attempt >= 2:
                raise
            await asyncio.sleep(0.05 * (attempt + 1))
            continue
        if result.ok:
            first, conv.saved = not conv.saved, True
            await _after_append(conv, records, messages, result.version, expected, known, first)
            return SaveResult(head_message_id=result.head_message_id)
        fresh = [r for r in records if r.id not in known]
        if ambiguous or result.existing or result.head_message_id in pending_ids:
            applied = await _applied_in_store(
                conv, [m for m in messages if m.id not in known], result.head_message_id
            )
            if applied == len(fresh):
                # Stored exactly so. A save whose outcome was lost put it on this branch (the
                # head, or below what others wrote since): fast-forward. Stored exactly so
                # elsewhere (another branch reaches it), it is a resend like any other.
                await conv.sync()
                if fresh[-1].id in conv.chain.index:
                    return SaveResult(head_message_id=conv.chain.head)
        if result.existing:
            if branch:
                return await fork_for_update(conv, messages, result.existing[0])
            known.update(result.existing)  # in-place updates of messages off the chain
            continue
        # Another writer moved the head: graft the turn onto the new head and retry at once
        # (the head just read is as fresh as it gets). After repeated losses to writers of
        # other processes, back off with jitter, then read the head again.
        expected = result.head_message_id
        telemetry.add(telemetry.SAVE_GRAFTS)
        if attempt >= 2:
            await asyncio.sleep(random.uniform(0, min(0.05, 0.001 * 2 ** (attempt - 2))))
            state = await store.get_branch_state(conv.branch.id)
            if state is None:
                raise conv.deleted_error()
            expected = state.branch.head_message_id
    raise HeadConflictError(
        f"the head of branch {conv.branch.name!r} kept moving: {MAX_SAVE_ATTEMPTS} attempts "
        "lost the race to other writers. Nothing was written; the messages are still pending, "
        "save again"
    )


def _chained(
    conv: Conversation, messages: list[Message], parent_id: str | None, known: set[str]
) -> list[MessageRecord]:
    """Records for ``messages``: updates keep their parent, new ones chain after
    ``parent_id`` in order."""
    chain = conv.chain
    records = []
    for message in messages:
        if message.id in known:
            parent = chain.parent_of(message.id) if message.id in chain.index else None
            records.append(record_of(conv, message, parent))
        else:
            records.append(record_of(conv, message, parent_id))
            parent_id = message.id
    return records


def _apply_updates(
    conv: Conversation, records: list[MessageRecord], messages: list[Message]
) -> None:
    for record, message in zip(records, messages, strict=True):
        if record.id in conv.chain.index:
            conv.chain.replace(message)


async def _after_append(
    conv: Conversation,
    records: list[MessageRecord],
    messages: list[Message],
    version: int | None,
    expected: str | None,
    updates: set[str],
    first: bool = False,
) -> None:
    chain = conv.chain
    if chain.version is None or chain.head != expected:
        # Grafted onto a head this engine has not seen: catch up from the store.
        await conv.sync()
        return
    cached = chain.version
    for record, message in zip(records, messages, strict=True):
        if record.id in chain.index:
            chain.replace(message)
        elif record.id not in updates:
            chain.append(record.id, record.parent_id, message, record.created_at)
        # else: an in-place update of a message off this branch; the chain is unchanged.
    if version is None:
        # Not read back: a save bumps the version by one, so if the next read finds exactly
        # that (and this head), nobody else wrote in between.
        chain.expect(cached + 1, chain.head)
    elif version == cached + 1:
        chain.version = version
        # The version was read back: the chain is what is stored.
        conv.remember(saved=True, first=first)
    # Otherwise keep the older version: the next sync fetches what others wrote since.


async def fork_for_update(
    conv: Conversation, messages: list[Message], existing_id: str, *, name: str | None = None
) -> SaveResult:
    """``branch=True`` and a pending id exists: a new branch from its parent, fresh ids.

    The fork starts at the parent of the turn's *first* message that exists, which may come
    before ``existing_id`` (stored off the cached chain, say by another engine); that message
    and every one after it get fresh ids, so no stored message is written over.
    """
    assert conv.branch is not None
    existing: MessageRecord | None = None
    for message in messages:
        existing = await conv.store.get_message(message.id)
        if existing is not None or message.id == existing_id:
            break
    if existing is None:  # deleted meanwhile; not possible through the engine
        raise MessageNotFoundError(f"message {existing_id!r} does not exist")
    if existing.chat_id != conv.chat_id:
        raise InvalidGraphError(
            f"message id {existing.id!r} is used in another chat; message ids are global, "
            "give the message a new id"
        )
    start = existing.parent_id
    renamed: list[Message] = []
    seen_existing = False
    for message in messages:
        if message.id == existing.id or seen_existing or message.id in conv.chain.index:
            seen_existing = True
            message = message.model_copy(update={"id": new_message_id()})
        renamed.append(message)
    records: list[MessageRecord] = []
    parent = start
    for message in renamed:
        records.append(record_of(conv, message, parent))
        parent = message.id
    info = await conv.store.fork_branch(
        conv.chat_id,
        await conv.branch_name(),
        head_message_id=start,
        activate=True,
        messages=records,
        name=name,
    )
    conv.branch = Branch.model_validate(info.model_dump(exclude={"message_count"}))
    telemetry.note(telemetry.BRANCH_FORKED, True)
    if conv.chain.truncate(start):
        # The version stays: the next sync fetches the fork's own rows (and anything else
        # written since) and finds them in place.
        for record, message in zip(records, renamed, strict=True):
            conv.chain.append(record.id, record.parent_id, message, record.created_at)
    else:
        conv.chain.invalidate()
    return SaveResult(head_message_id=info.head_message_id)
