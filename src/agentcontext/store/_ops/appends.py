"""The write path of a save: new messages chained after a branch head, with the head moved by
compare-and-swap, in one statement when it can be, in one transaction otherwise.

`append` is the store's policy: a plain save (new messages, each the parent of the next, the
first one's parent the expected head) takes the dialect's single-statement append; anything
else (in-place updates, a head that is not the last message) runs the general append of
``_branches`` in a write transaction. A refused append is read back into an `AppendResult`
(the head found instead, or the ids that exist already) rather than raised.
"""

from __future__ import annotations

from collections.abc import Collection

from agentcontext._gc import gc_paused
from agentcontext.errors import InvalidGraphError, InvalidInputError
from agentcontext.store._db.database import Database, unit
from agentcontext.store._dialects import AppendRefused, Dialect
from agentcontext.store._memory import Owners
from agentcontext.store._ops import branches as _branches
from agentcontext.store._ops import chats as _chats
from agentcontext.store._ops import messages as _messages
from agentcontext.store._rows.codec import message_rows
from agentcontext.store.records import AppendResult, MessageRecord

__all__ = ["append", "check", "is_plain"]


def check(records: list[MessageRecord], what: str) -> list[MessageRecord]:
    """An append writes at least one message, all of one chat."""
    if not records:
        raise InvalidInputError(f"{what} needs at least one message")
    chat_id = records[0].chat_id
    for record in records:
        if record.chat_id != chat_id:
            raise InvalidGraphError(
                f"message {record.id!r} is for chat {record.chat_id!r}, not {chat_id!r}"
            )
    return records


def is_plain(
    records: list[MessageRecord], expected: str | None, head: str, allowed: Collection[str] | None
) -> bool:
    """New messages chained one after another from the expected head, the last one the new
    head: what a save writes, in one statement. A compaction summary is never plain: it is
    neither a head nor a parent (the general append refuses it)."""
    if head != records[-1].id or (allowed and any(r.id in allowed for r in records)):
        return False
    parent = expected
    for record in records:
        if record.parent_id != parent or record.type == _messages.COMPACTION:
            return False
        parent = record.id
    return True


async def append(
    db: Database,
    dialect: Dialect,
    owners: Owners,
    branch_id: str,
    records: list[MessageRecord],
    *,
    expected: str | None,
    head: str,
    allowed: set[str] | None,
    report_version: bool = True,
) -> AppendResult:
    """Append checked records of one chat after ``expected`` and move the head to ``head``.
    ``owners`` knows (or learns) who owns the chat: a save's search terms are made for its
    owner."""
    chat_id = records[0].chat_id
    if is_plain(records, expected, head, allowed):
        owner = owners.get(chat_id)
        if owner is None:
            owner = await db.run("read", unit(_chats.owner_of, chat_id), chat=chat_id)
            if owner is not None:
                owners.note(chat_id, owner)
        if owner is not None:
            result = await _fast(
                db, dialect, owners, branch_id, chat_id, owner, records, allowed, report_version
            )
            if result is not None:
                return result
    try:
        return await db.run(
            "write",
            unit(_branches.append, dialect, branch_id, records, expected, head, allowed),
            chat=chat_id,
        )
    except _branches.AppendConflict as conflict:
        return conflict.result


async def _fast(
    db: Database,
    dialect: Dialect,
    owners: Owners,
    branch_id: str,
    chat_id: str,
    owner: str,
    records: list[MessageRecord],
    allowed: set[str] | None,
    report_version: bool,
) -> AppendResult | None:
    """The single-statement append; None when the general path must decide."""
    await dialect.sealer.ensure((owner,))  # an encrypted store: the owner's key, made if new
    with gc_paused():  # a burst of new objects, none of them garbage
        rows = message_rows(dialect, records, {chat_id: owner})
    try:
        atomic = dialect.atomic_append and len(rows) <= dialect.append_chunk
        return await db.run(
            "atomic" if atomic else "write",
            unit(
                _branches.append_rows,
                dialect,
                branch_id,
                rows,
                rows[-1].id,
                owner,
                report_version,
            ),
            idempotent=True,
            chat=chat_id,
        )
    except AppendRefused as refused:
        if refused.reason == "owner":
            # Deleted and created again for another user since it was read (or deleted):
            # the general path reads the owner in its transaction.
            owners.forget(chat_id)
            return None
        if refused.reason == "exists" and allowed is None:
            return None  # existing messages are updated in place by the general path
        ids = [r.id for r in records]
        return await db.run(
            "read", unit(_branches.refused, branch_id, chat_id, refused.reason, ids), primary=True
        )
