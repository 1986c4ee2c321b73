"""The engine side of reminders: find the outgoing message, evaluate, amend, latch.

`ContextEngine` calls `remind` on resolve and save, and renders the prompt `without_reminders`;
there is nothing here for direct use.

`remind` is called by ``ContextEngine.resolve`` (targets ``"user"`` and ``"tool-output"``) and
by ``ContextEngine.save`` (target ``"user"`` only, for a turn saved without a resolve first),
inside the engine's session, after the branch was synced. It is given what it reads as data:
the chat (`RemindedChat`: its record, branch and store), the branch's chain (`ChainView`, which
also gives the head's time) and the pending queue, which it amends in place.

The carriers:

- ``"user"``: the last pending user message;
- ``"tool-output"``: the last pending assistant message when it comes after that user message
  and holds a tool result (its latest result is amended).

A carrier is evaluated once: the pending fragment is replaced by one marked as evaluated (in
the fragment's own metadata, never stored), holding the amended message when reminders fired.
So resolving twice, or saving after a resolve, never applies reminders twice, and ``save()``
stores exactly what was sent.

``once=`` latches live in the chat's metadata under `ONCE_KEY`, claimed with
``store.update_chat`` (an atomic read-modify-write under the store's lock) only for reminders
that fire, so no engine in any process fires one twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, Protocol

from agentcontext._chainview import ChainView
from agentcontext._pending import PendingQueue
from agentcontext.fragments import (
    ContextFragment,
    MessageCodec,
    is_empty_assistant_placeholder,
    is_lazy_fragment,
    message_of,
)
from agentcontext.messages import Message, ToolPart
from agentcontext.reminders._core import (
    ONCE_KEY,
    Reminder,
    ReminderContext,
    ReminderTarget,
    append_to_message,
    append_to_tool_output,
    inserted_texts,
    is_reminder,
    reminder_of,
    tag,
)
from agentcontext.store.protocols import ConversationStore
from agentcontext.store.records import Branch, Chat, ChatUpdate, utcnow

__all__ = ["EVALUATED", "RemindedChat", "remind", "without_reminders"]

EVALUATED = "agentcontext.reminders.evaluated"
"""Key of a pending fragment's metadata: its reminders were evaluated (never stored)."""

_TERMINAL = ("output-available", "output-error")


def _now() -> datetime:
    """The evaluation time (a function, so tests can move the clock)."""
    return utcnow()


class RemindedChat(Protocol):
    """The chat as reminders read and latch it (the engine's `Conversation` is one)."""

    chat: Chat | None
    """The chat record as last read or written; reminders read it again and leave the newest
    here (latches change its metadata)."""

    @property
    def store(self) -> ConversationStore: ...
    @property
    def chat_id(self) -> str: ...
    @property
    def branch(self) -> Branch | None: ...


def without_reminders(fragments: Sequence[ContextFragment]) -> list[ContextFragment]:
    """The fragments that render into the system prompt: all but the reminders."""
    return [fragment for fragment in fragments if not is_reminder(fragment)]


def _latest_result(message: Message) -> int | None:
    for index in range(len(message.parts) - 1, -1, -1):
        part = message.parts[index]
        if isinstance(part, ToolPart) and part.state in _TERMINAL:
            return index
    return None


def _carriers(
    pending: PendingQueue, targets: Sequence[ReminderTarget]
) -> list[tuple[int, ReminderTarget]]:
    """Indexes of the pending fragments to evaluate, with their target."""
    user_index: int | None = None
    for index in range(len(pending) - 1, -1, -1):
        fragment = pending[index]
        if not is_lazy_fragment(fragment) and message_of(fragment).role == "user":
            user_index = index
            break
    found: list[tuple[int, ReminderTarget]] = []
    if "user" in targets and user_index is not None:
        found.append((user_index, "user"))
    if "tool-output" in targets:
        start = -1 if user_index is None else user_index
        for index in range(len(pending) - 1, start, -1):
            fragment = pending[index]
            if is_lazy_fragment(fragment):
                continue
            message = message_of(fragment)
            if message.role == "assistant" and _latest_result(message) is not None:
                found.append((index, "tool-output"))
                break
    return [(i, t) for i, t in found if not pending[i].metadata.get(EVALUATED)]


def _carried(message: Message, target: ReminderTarget, text: str) -> bool:
    """Whether ``message`` already carries this reminder text for ``target`` (it is a copy of
    a message amended before, e.g. resent after a save): it is not appended a second time.

    Reminders already listed in the message's metadata never stop other reminders whose
    predicate holds now from being appended.
    """
    inserted = tag(text)
    return any(inserted in found for found in inserted_texts(message, target))


def _latches(chat: Chat | None) -> dict[str, Any]:
    found = None if chat is None else chat.metadata.get(ONCE_KEY)
    return dict(found) if isinstance(found, Mapping) else {}


def _holder(latch: object) -> object:
    """The message a latch was claimed for (None when unknown)."""
    return latch.get("message_id") if isinstance(latch, Mapping) else None


async def _claim(conv: RemindedChat, claims: Mapping[str, str]) -> set[str]:
    """Latch the ids of ``claims`` (once id -> message id) in the chat's metadata atomically;
    the ids this call holds afterwards.

    A latch already held for the same message counts as held, so a save retried after a
    lost outcome amends the message the same way.
    """
    won: set[str] = set()

    def updater(chat: Chat) -> ChatUpdate | None:
        won.clear()
        latches = _latches(chat)
        changed = False
        for once, message_id in claims.items():
            if once not in latches:
                latches[once] = {"message_id": message_id, "at": utcnow().isoformat()}
                changed = True
                won.add(once)
            elif _holder(latches[once]) == message_id:
                won.add(once)
        if not changed:
            return None
        return ChatUpdate(metadata={**chat.metadata, ONCE_KEY: latches})

    conv.chat = await conv.store.update_chat(conv.chat_id, updater)
    return won


async def remind(
    conv: RemindedChat,
    chain: ChainView,
    pending: PendingQueue,
    fragments: Sequence[ContextFragment],
    targets: Sequence[ReminderTarget],
) -> None:
    """Evaluate the reminders among ``fragments`` for the outgoing pending message(s) and
    amend them in ``pending`` (in place; lazy pending messages get their ids first). The
    history and the head's time come from ``chain``, the chat and its latches from ``conv``.

    Raises:
        ReminderError: a predicate or text function raised; the pending messages are left
            as they were (no latch is claimed).
    """
    if not pending:
        return
    configs = [reminder_of(f) for f in fragments if is_reminder(f)]
    if not configs:
        return  # an engine without reminders works as if they did not exist
    pending.resolve(chain)
    carriers = _carriers(pending, targets)
    if not carriers:
        return
    wanted = {target for _, target in carriers}
    if not any(config.target in wanted for config in configs):
        for index, _ in carriers:
            pending.replace(index, _mark(pending[index], None))
        return
    chat = await conv.store.get_chat(conv.chat_id) or conv.chat
    conv.chat = chat
    assert chat is not None
    assert conv.branch is not None
    now = _now()
    last_at: datetime | None = None
    head = chain.head
    if head is not None:
        last_at = chain.created_at(head)
        if last_at is None:
            # Not held with the chain (a head the compaction folds, a chain loaded without
            # its times): the store has it.
            record = await conv.store.get_message(head)
            last_at = None if record is None else record.created_at
    pending_messages = [message_of(fragment) for fragment in pending]
    pending_ids = {message.id for message in pending_messages}
    stored = [
        message
        for message in chain.messages
        if message.id not in pending_ids and not is_empty_assistant_placeholder(message)
    ]
    latches = _latches(chat)
    usage = chat.metadata.get("usage")
    amended: dict[int, Message] = {}
    fired_once: dict[int, list[tuple[Reminder, str]]] = {}
    for index, target in carriers:
        message = pending_messages[index]
        history = stored + pending_messages[: index + 1]
        outcome = next(
            (
                part
                for item in reversed(history)
                for part in reversed(item.parts)
                if isinstance(part, ToolPart) and part.state in _TERMINAL
            ),
            None,
        )
        context = ReminderContext(
            turn=chain.folded_turns + sum(1 for item in history if item.role == "user"),
            target=target,
            message=message,
            content=message.text,
            messages=tuple(history),
            last_message=history[-2] if len(history) > 1 else None,
            chat=chat,
            usage=dict(usage) if isinstance(usage, Mapping) else {},
            branch=conv.branch.name,
            now=now,
            last_message_at=last_at,
            elapsed=None if last_at is None else (now - last_at).total_seconds(),
            tool_outcome=outcome,
        )
        fired: list[tuple[Reminder, str]] = []
        for config in configs:
            if config.target != target:
                continue
            if config.once in latches and _holder(latches[config.once]) != message.id:
                continue
            if not await config.holds(context):
                continue
            text = await config.render(context)
            if text.strip() and not _carried(message, target, text):
                fired.append((config, text))
        fired_once[index] = fired
    claims: dict[str, str] = {}
    for index, fired in fired_once.items():
        for config, _ in fired:
            if config.once is not None:
                claims.setdefault(config.once, pending_messages[index].id)
    won = await _claim(conv, claims) if claims else set()
    for index, target in carriers:
        texts: list[str] = []
        for config, text in fired_once.get(index, []):
            if config.once is not None:
                if config.once not in won:
                    continue
                won.discard(config.once)  # one reminder per latch, even within a batch
            texts.append(text)
        if texts:
            message = pending_messages[index]
            if target == "user":
                amended[index] = append_to_message(message, texts)
            else:
                result = _latest_result(message)
                assert result is not None
                amended[index] = append_to_tool_output(message, result, texts)
    for index, _ in carriers:
        pending.replace(index, _mark(pending[index], amended.get(index)))


def _mark(fragment: ContextFragment, message: Message | None) -> ContextFragment:
    metadata = {**fragment.metadata, EVALUATED: True}
    if message is None:
        return replace(fragment, metadata=metadata)
    return replace(fragment, codec=MessageCodec(message), metadata=metadata)
