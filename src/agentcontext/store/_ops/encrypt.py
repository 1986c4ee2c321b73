"""Encrypting an existing plain database in place (``agentcontext migrate encrypt``).

Chat by chat, each in a short transaction of its own: the chat row is locked, its title and
metadata sealed, every message still plain written again through the one write path
(`_messages.write`: sealed content, search terms taken out under their plain hashes and put
back under the owner's keyed ones), and its context snapshots and resolve records written again
through theirs (sealed, their blobs moved to the owner's namespace); the plain blobs left
behind are deleted at the end (`collect_garbage`). A chat already sealed is passed over, so a
run cut short (killed, cancelled, a lost connection) is finished by running it again, and a
second run changes nothing. Activity times stay as they were; the chat's change version
moves, so engines of other
processes read the chat again.

Until a run finishes, the chats it has not reached are plain: they read as before, but an
encrypted store's search does not find their messages (their terms are unkeyed). When it
finishes, the database records that every value is sealed (``sealing_complete``): from then on
a value found in the clear is a `CorruptDataError` (altered, or written by a store without a
key provider; running `migrate encrypt` again seals what such a store wrote).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection, delete, func, select, update

from agentcontext.store._db.database import Database, unit
from agentcontext.store._db.schema import chats as C
from agentcontext.store._db.schema import messages as M
from agentcontext.store._db.schema import record_messages as RM
from agentcontext.store._db.schema import resolve_records as RR
from agentcontext.store._db.schema import snapshot_items as SI
from agentcontext.store._db.schema import snapshots as SN
from agentcontext.store._dialects import Dialect
from agentcontext.store._ops import messages as _messages
from agentcontext.store._ops import snapshots as _snapshots
from agentcontext.store._rows.codec import chat_values, message_columns, row_record
from agentcontext.store._rows.sealing import is_sealed, is_sealed_json

__all__ = ["EncryptReport", "encrypt_in_place"]

_LISTED = 500
"""Chat ids read per listing query (keyset pages, so a run over millions stays flat)."""


@dataclass(frozen=True, slots=True)
class EncryptReport:
    """What a run sealed: chats whose rows it wrote, messages, context snapshots and resolve
    records, and the plain blobs it deleted after sealing copies of them."""

    chats: int
    messages: int
    snapshots: int = 0
    records: int = 0
    blobs_deleted: int = 0


async def encrypt_in_place(
    db: Database, dialect: Dialect, progress: Callable[[int, int], object] | None = None
) -> EncryptReport:
    """Seal every plain chat and message of the database (see the module's documentation).
    ``progress(done, total)`` is called after each chat."""
    if not dialect.sealer.encrypted:
        raise AssertionError("encrypt_in_place needs a store with a key provider")
    await db.initialize()  # (the store learns whether its database is sealed whole first)
    whole, dialect.sealer.whole = dialect.sealer.whole, False
    try:
        return await _encrypt(db, dialect, progress)
    except BaseException:
        dialect.sealer.whole = whole  # (a run cut short leaves the store as strict as it was)
        raise


async def _encrypt(
    db: Database, dialect: Dialect, progress: Callable[[int, int], object] | None
) -> EncryptReport:
    """`encrypt_in_place`, run while the store reads values in the clear as they are (they
    are what it seals)."""
    total = int(await db.run("read", unit(_count)))
    done = chats = messages = snapshots = records = 0
    after = ""
    while True:
        page = await db.run("read", unit(_chat_page, after))
        if not page:
            break
        for chat_id in page:
            # (A key is asked for, or made, only when the chat has something to seal: a chat
            # sealed already, such as one of a user erased since, makes no key.)
            sealed = await db.run("write", unit(_seal_chat, dialect, chat_id), chat=chat_id)
            if sealed is not None:
                chats += 1
                messages += sealed[0]
                snapshots += sealed[1]
                records += sealed[2]
            done += 1
            if progress is not None:
                progress(done, max(total, done))
            await asyncio.sleep(0)  # let writers of this process take their turn
        after = page[-1]
    deleted = await _snapshots.collect_garbage_retrying(db)
    # Every chat is sealed: from now on a value in the clear is corrupt, never shown as text.
    await db.run("write", unit(_sealed_whole, dialect))
    return EncryptReport(
        chats=chats, messages=messages, snapshots=snapshots, records=records, blobs_deleted=deleted
    )


def _sealed_whole(conn: Connection, dialect: Dialect) -> None:
    dialect.mark_sealed(conn, complete=True)


def _count(conn: Connection) -> int:
    return int(conn.scalar(select(func.count()).select_from(C)) or 0)


def _chat_page(conn: Connection, after: str) -> list[str]:
    rows = conn.execute(select(C.c.id).where(C.c.id > after).order_by(C.c.id).limit(_LISTED))
    return [str(row[0]) for row in rows]


def _seal_chat(conn: Connection, dialect: Dialect, chat_id: str) -> tuple[int, int, int] | None:
    """Seal what is plain of one chat (write transaction); the messages, snapshots and records
    written, or None when the chat was sealed already (or is gone)."""
    dialect.lock_chat(conn, chat_id)
    row = conn.execute(
        select(C.c.user_id, C.c.title, C.c.metadata).where(C.c.id == chat_id)
    ).first()
    if row is None:
        return None
    owner, title, metadata = str(row[0]), row[1], row[2]
    plain_chat = (title is not None and not is_sealed(title)) or not is_sealed(metadata)
    rows = conn.execute(
        select(*message_columns(dialect, M)).where(M.c.chat_id == chat_id).order_by(M.c.depth)
    ).all()
    plain = [r for r in rows if r[5] is not None and not is_sealed_json(r[5])]
    if not plain_chat and not plain:
        return None
    moved = (0, 0)
    if not is_sealed(metadata):  # the chat's snapshots and records are plain too
        moved = _seal_snapshots_and_records(conn, dialect, chat_id, owner)
    values = {"metadata": metadata or {}, **({} if title is None else {"title": title})}
    if plain_chat:
        opened = {
            key: value for key, value in values.items() if not is_sealed(value)
        }  # a half-sealed row keeps what is sealed
        conn.execute(
            update(C)
            .where(C.c.id == chat_id)
            .values(**chat_values(dialect, chat_id, owner, opened))
        )
    if plain:
        version = dialect.update_returning(
            conn, C, [C.c.id == chat_id], {"version": C.c.version + 1}, C.c.version
        )
        records = [row_record(dialect, r) for r in plain]
        _messages.write(
            conn, dialect, records, {chat_id: int(version)}, updates={r.id for r in records}
        )
    return len(plain), *moved


def _seal_snapshots_and_records(
    conn: Connection, dialect: Dialect, chat_id: str, owner: str
) -> tuple[int, int]:
    """Write a plain chat's snapshots and records again, sealed (read while the chat row is
    still plain, written as the sealed chat's); how many of each."""
    snapshots = _snapshots.snapshots(conn, dialect, SN.c.chat_id == chat_id, True)
    records = _snapshots.records(conn, dialect, RR.c.chat_id == chat_id)
    contents = {record.id: _snapshots.record_contents(conn, dialect, record) for record in records}
    if snapshots:
        ids = [snapshot.id for snapshot in snapshots]
        conn.execute(delete(SI).where(SI.c.snapshot_id.in_(ids)))
        conn.execute(delete(SN).where(SN.c.id.in_(ids)))
    if records:
        ids = [record.id for record in records]
        conn.execute(delete(RM).where(RM.c.record_id.in_(ids)))
        conn.execute(delete(RR).where(RR.c.id.in_(ids)))
    for snapshot in reversed(snapshots):
        assert snapshot.id is not None
        assert snapshot.created_at is not None
        _snapshots.put_blobs(conn, dialect, owner, snapshot.contents)
        _snapshots.insert_snapshot(
            conn, dialect, owner, snapshot, snapshot.id, chat_id, snapshot.message_id,
            snapshot.created_at,
        )  # fmt: skip
    for record in reversed(records):
        _snapshots.insert_record_rows(conn, dialect, owner, record, contents[record.id])
    return len(snapshots), len(records)
