"""Chats: create, read, update under a lock, list by activity, delete. Plain functions of a
connection (see ``_database``); arguments are checked by the caller."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import (
    Connection,
    Select,
    bindparam,
    delete,
    func,
    literal,
    or_,
    select,
    union,
    update,
)
from sqlalchemy import exists as exists_where
from sqlalchemy.sql.elements import BindParameter

from agentcontext import _validate as v
from agentcontext.errors import (
    ChatExistsError,
    ChatNotFoundError,
    CorruptDataError,
    EncryptionError,
    InvalidInputError,
    InvalidTypeError,
    MessageNotFoundError,
    StoreError,
)
from agentcontext.store._db.database import Database, unit
from agentcontext.store._db.schema import branches as B
from agentcontext.store._db.schema import chats as C
from agentcontext.store._db.schema import checkpoints as K
from agentcontext.store._db.schema import messages as M
from agentcontext.store._db.schema import record_messages as RM
from agentcontext.store._db.schema import resolve_records as RR
from agentcontext.store._db.schema import snapshot_items as SI
from agentcontext.store._db.schema import snapshots as SN
from agentcontext.store._dialects import Dialect
from agentcontext.store._rows import decode as _rows
from agentcontext.store._rows.checks import new_id
from agentcontext.store._rows.codec import chat_values, open_chat_row
from agentcontext.store._rows.sealing import KeyNotHeld, is_sealed
from agentcontext.store.records import (
    PURGED,
    Chat,
    ChatInfo,
    ChatUpdate,
    parse_chat_cursor,
    utcnow,
)

_log = logging.getLogger("agentcontext.store")
T = TypeVar("T")

CHAT_COLS = (C.c.id, C.c.user_id, C.c.title, C.c.metadata, C.c.created_at, C.c.updated_at)


def checked_new(chat_id: object, user_id: object, title: object, metadata: object) -> Chat:
    """`new_chat` from arguments a caller gave, checked."""
    return new_chat(
        v.check_id(chat_id, "chat_id"),
        v.check_id(user_id, "user_id"),
        v.check_optional_text(title, "title"),
        {} if metadata is None else v.check_json_object(metadata, "metadata"),
    )


def new_chat(chat_id: str, user_id: str, title: str | None, metadata: dict[str, Any]) -> Chat:
    """A chat record created now (not stored yet)."""
    now = utcnow()
    return _rows.build(
        Chat,
        {
            "id": chat_id,
            "user_id": user_id,
            "title": title,
            "metadata": metadata,
            "created_at": now,
            "updated_at": now,
        },
    )


def owner_of(conn: Connection, chat_id: str) -> str | None:
    """The user who owns the chat, or None for an unknown chat."""
    found = conn.execute(select(C.c.user_id).where(C.c.id == chat_id)).scalar()
    return None if found is None else str(found)


def insert_chat_row(conn: Connection, dialect: Dialect, chat: Chat) -> None:
    """Insert the chat's row alone (its branches come with it, as in an import)."""
    written = chat_values(
        dialect, chat.id, chat.user_id, {"title": chat.title, "metadata": chat.metadata}
    )
    conn.execute(
        C.insert().values(
            id=chat.id,
            user_id=chat.user_id,
            **written,
            created_at=chat.created_at,
            updated_at=chat.updated_at,
            version=1,
            incarnation=new_incarnation(),
        )
    )


def new_incarnation() -> int:
    """A chat row's incarnation: random, never 0 (the rows inserted before revision 0009)."""
    return secrets.randbits(62) + 1


def insert_chat(conn: Connection, dialect: Dialect, chat: Chat) -> None:
    """Insert a chat with its active ``main`` branch (so there is always exactly one)."""
    insert_chat_row(conn, dialect, chat)
    conn.execute(
        B.insert().values(
            id=new_id(),
            chat_id=chat.id,
            name="main",
            head_message_id=None,
            is_active=True,
            created_at=chat.created_at,
        )
    )


def exists(conn: Connection, chat_id: str) -> bool:
    """Whether the chat exists."""
    return conn.execute(select(literal(1)).where(C.c.id == chat_id)).first() is not None


def require(conn: Connection, chat_id: str) -> None:
    """Raise `ChatNotFoundError` for an unknown chat."""
    if not exists(conn, chat_id):
        raise ChatNotFoundError(f"chat {chat_id!r} does not exist")


def create(conn: Connection, dialect: Dialect, chat: Chat) -> Chat:
    """Insert a new chat; `ChatExistsError` if the id is taken."""
    if exists(conn, chat.id):
        raise ChatExistsError(f"chat {chat.id!r} already exists; use upsert_chat to reuse it")
    insert_chat(conn, dialect, chat)
    return chat


def get(conn: Connection, dialect: Dialect, chat_id: str) -> Chat | None:
    """The chat, or None."""
    row = conn.execute(select(*CHAT_COLS).where(C.c.id == chat_id)).first()
    return None if row is None else _rows.chat(open_chat_row(dialect, row))


def get_or_insert(conn: Connection, dialect: Dialect, chat: Chat) -> Chat:
    """The stored chat of that id, inserting ``chat`` if there is none (write transaction)."""
    found = get(conn, dialect, chat.id)
    if found is not None:
        return found
    insert_chat(conn, dialect, chat)
    return chat


def touch(conn: Connection, dialect: Dialect, chat_id: str, *, count: int = 0) -> int:
    """Record a change to a chat: newer activity time, next change version, ``count`` more
    messages. Locks the chat row until the transaction ends; every write takes this lock
    first, so writers of one chat never deadlock. Returns the new version."""
    version = dialect.update_returning(
        conn,
        C,
        [C.c.id == chat_id],
        {
            "updated_at": utcnow(),
            "version": C.c.version + 1,
            "message_count": C.c.message_count + count,
        },
        C.c.version,
    )
    if version is None:
        raise ChatNotFoundError(f"chat {chat_id!r} does not exist")
    return int(version)


def lock(conn: Connection, dialect: Dialect, chat_id: str) -> Chat:
    """The chat, its row locked for this transaction."""
    dialect.lock_chat(conn, chat_id)
    chat = get(conn, dialect, chat_id)
    if chat is None:
        raise ChatNotFoundError(f"chat {chat_id!r} does not exist")
    return chat


def update_chat(
    conn: Connection,
    dialect: Dialect,
    chat_id: str,
    updater: Callable[[Chat], ChatUpdate | None],
) -> Chat:
    """Atomic read-modify-write of a chat (write transaction)."""
    chat = lock(conn, dialect, chat_id)
    change = updater(chat)
    if change is None:
        return chat
    if not isinstance(change, ChatUpdate):
        raise InvalidTypeError(
            f"updater must return a ChatUpdate or None, got {v.type_name(change)}"
        )
    values: dict[str, Any] = {"updated_at": utcnow(), "version": C.c.version + 1}
    fields = change.model_fields_set
    if "title" in fields:
        values["title"] = v.check_optional_text(change.title, "title")
    if "metadata" in fields:
        values["metadata"] = v.check_json_object(change.metadata or {}, "metadata")
    values = chat_values(dialect, chat_id, chat.user_id, values)
    conn.execute(update(C).where(C.c.id == chat_id).values(**values))
    row = conn.execute(select(*CHAT_COLS).where(C.c.id == chat_id)).one()
    return _rows.chat(open_chat_row(dialect, row))


def list_query(
    dialect: Dialect,
    *,
    user_id: str | None,
    metadata: Mapping[str, str | int | bool] | None,
    limit: int | None,
    offset: int,
    older_than: datetime | None = None,
    after: tuple[datetime, str] | None = None,
    ids: Sequence[str] | None = None,
) -> Select[Any]:
    """The SQL of ``list_chats``: the page first (an index walk on (user_id, updated_at, id)),
    then the branch counts of its rows only. Message counts are kept on the chat row.
    ``after``: only the chats that come after that ``(updated_at, id)`` in the order (a
    keyset cursor); ``ids``: only these chats (looked up by their key, not found among all
    the others)."""
    page = select(*CHAT_COLS, C.c.message_count).order_by(C.c.updated_at.desc(), C.c.id.desc())
    if ids is not None:
        page = page.where(C.c.id.in_(ids))
    if after is not None:
        moment, chat_id = after
        # The bound on updated_at alone is what an index range can start from (the planner
        # does not derive it from the OR); the OR then drops the rows of that moment already
        # listed.
        page = page.where(
            C.c.updated_at <= moment,
            or_(C.c.updated_at < moment, C.c.id < chat_id),
        )
    if user_id is not None:
        page = page.where(C.c.user_id == user_id)
        if after is not None:
            page = dialect.chats_after_cursor(page)
    if metadata:
        if dialect.sealer.encrypted:
            raise InvalidInputError(
                "list_chats(metadata=...) cannot filter an encrypted store: chat metadata is "
                "encrypted at rest, the database cannot compare it. List by user_id and filter "
                "the chats' metadata in your code"
            )
        page = page.where(dialect.metadata_filter(C.c.metadata, metadata))
    if older_than is not None:
        page = page.where(C.c.updated_at < older_than)
    if limit is not None:
        page = page.limit(limit)
    if offset:
        page = page.offset(offset)
    rows = page.subquery("page")
    branch_count = (
        select(func.count()).select_from(B).where(B.c.chat_id == rows.c.id).scalar_subquery()
    )
    return select(*rows.c, branch_count).order_by(rows.c.updated_at.desc(), rows.c.id.desc())


def check_cursor(after: object) -> tuple[datetime, str] | None:
    """A ``list_chats(after=...)`` cursor, checked: `ChatInfo.cursor` of a listed chat."""
    if after is None:
        return None
    if not isinstance(after, str):
        raise InvalidTypeError(
            f"after must be a str (ChatInfo.cursor of a listed chat), got {v.type_name(after)}"
        )
    found = parse_chat_cursor(after) if len(after) <= 1024 else None
    if found is not None:
        try:  # the chat id a listed chat can have (no NUL, valid Unicode, 255 at most)
            v.check_id(found[1], "the cursor's chat id")
        except InvalidInputError:
            found = None
    if found is None:
        shown = after if len(after) <= 40 else after[:40] + "…"
        raise InvalidInputError(
            f"after={shown!r} is not a cursor of list_chats; pass the cursor of a chat it "
            "listed (ChatInfo.cursor)"
        )
    return found


def list_chats(
    conn: Connection, dialect: Dialect, query: Select[Any], *, sealed_ok: bool = False
) -> list[ChatInfo]:
    """Run a `list_query`. A chat row that cannot be decoded is listed with
    ``ChatInfo.damaged`` saying what is wrong (and logged), so one damaged row never hides the
    others; so is a chat whose title and metadata are sealed under a key the provider does
    not hold (its owner was erased). With ``sealed_ok`` (what a deletion reports), so is one
    whose key cannot be had at all, instead of raising `EncryptionError`."""
    infos = []
    rows = conn.execute(query).all()
    if dialect.sealer.encrypted:
        dialect.sealer.require({row[1] for row in rows})
    for row in rows:
        counts = {"message_count": int(row[6]), "branch_count": int(row[7])}
        try:
            fields = {**_rows.chat(open_chat_row(dialect, row)).__dict__, **counts, "damaged": None}
            infos.append(_rows.build(ChatInfo, fields))
        except CorruptDataError as exc:
            _log.warning("%s", exc)
            infos.append(_damaged_info(row, counts, str(exc), dialect.sealer.whole))
        except KeyNotHeld as exc:  # (a restored backup's chat of an erased user, say)
            _log.warning("%s", exc)
            infos.append(_damaged_info(row, counts, str(exc), dialect.sealer.whole))
        except EncryptionError as exc:
            if not sealed_ok:
                raise
            infos.append(_damaged_info(row, counts, str(exc), dialect.sealer.whole))
    return infos


_EPOCH = datetime.fromtimestamp(0, UTC)


def _damaged_info(row: Any, counts: dict[str, int], reason: str, sealed: bool) -> ChatInfo:
    """A damaged row as listed: what of it reads, but no title or metadata in the clear from a
    database whose values are all ``sealed`` (they were not written by the store)."""

    def readable(value: Any, kind: type) -> Any:
        return (
            None if sealed and kind is not datetime else value if isinstance(value, kind) else None
        )

    return _rows.build(
        ChatInfo,
        {
            "id": row[0],
            "user_id": row[1],
            "title": None if is_sealed(row[2]) else readable(row[2], str),
            "metadata": readable(row[3], dict) or {},
            "created_at": readable(row[4], datetime) or _EPOCH,
            "updated_at": readable(row[5], datetime) or _EPOCH,
            **counts,
            "damaged": reason,
        },
    )


def missing_message_error(conn: Connection, chat_id: str, message_id: str) -> MessageNotFoundError:
    """The error for a message id missing from a chat: it names the purge when the chat was
    purged (the id may have been one of its messages)."""
    purged = conn.scalar(select(C.c.purged_at).where(C.c.id == chat_id))
    if purged is None:
        return MessageNotFoundError(f"message {message_id!r} does not exist")
    return MessageNotFoundError(
        f"message {message_id!r} does not exist in chat {chat_id!r}: {PURGED} at {purged} "
        "(messages no branch, checkpoint or compaction tail "
        "reached were deleted); rewind to a message the chat still holds"
    )


def delete_chat(conn: Connection, dialect: Dialect, chat_id: str, user_id: str | None) -> bool:
    """Delete a chat with everything it holds (write transaction); False if it is unknown or
    another user's. Nothing of the chat is opened: a chat whose owner's data key was destroyed
    (a backup restored after an erasure) is deleted as any other."""
    dialect.lock_chat(conn, chat_id)
    owner = owner_of(conn, chat_id)
    if owner is None or (user_id is not None and owner != user_id):
        return False
    delete_rows(conn, dialect, [chat_id])
    return True


_IDS: BindParameter[list[str]] = bindparam("ids", expanding=True)
_RECORDS_OF = select(RR.c.id).where(RR.c.chat_id.in_(_IDS))
_SNAPSHOTS_OF = select(SN.c.id).where(SN.c.chat_id.in_(_IDS))
_HELD = select(
    exists_where().where(RR.c.chat_id.in_(_IDS)),
    exists_where().where(SN.c.chat_id.in_(_IDS)),
    exists_where().where(K.c.chat_id.in_(_IDS)),
)
"""Whether some chats hold resolve records, snapshots, checkpoints: the deletes of what they
do not hold are skipped (most chats hold none)."""
_BLOBS_OF = union(
    select(SI.c.blob_hash).where(SI.c.snapshot_id.in_(_SNAPSHOTS_OF)),
    select(RR.c.prompt_hash).where(RR.c.chat_id.in_(_IDS)),
    select(RM.c.blob_hash).where(RM.c.record_id.in_(_RECORDS_OF)),
)
"""The blobs some chats' snapshots and resolve records refer to."""
_DELETE_RECORDS = (
    ("record_messages", delete(RM).where(RM.c.record_id.in_(_RECORDS_OF))),
    ("resolve_records", delete(RR).where(RR.c.chat_id.in_(_IDS))),
)
_DELETE_SNAPSHOTS = (
    ("snapshot_items", delete(SI).where(SI.c.snapshot_id.in_(_SNAPSHOTS_OF))),
    ("snapshots", delete(SN).where(SN.c.chat_id.in_(_IDS))),
)
_DELETE_CHECKPOINTS = (("checkpoints", delete(K).where(K.c.chat_id.in_(_IDS))),)
_DELETE_BRANCHES = delete(B).where(B.c.chat_id.in_(_IDS))
_DELETE_CHATS = delete(C).where(C.c.id.in_(_IDS))


def delete_rows(
    conn: Connection,
    dialect: Dialect,
    chat_ids: Sequence[str],
    ahead: Mapping[int, Any] | None = None,
    blobs: set[str] | None = None,
) -> dict[str, int]:
    """Delete everything of some chats (at most ``IN_CHUNK`` of them: a statement names each),
    search entries included, a statement per table for all of them; the rows deleted per
    table (``ahead``: see `Dialect.unindex_ahead`). Blobs stay (see ``_retention.drop_blobs``);
    the hashes of those the deleted rows referred to are added to ``blobs``, when given."""
    ids = {"ids": list(chat_ids)}
    counts = dict.fromkeys(
        (
            "record_messages", "resolve_records", "snapshot_items", "snapshots", "checkpoints",
            "branches", "messages", "chats",
        ),
        0,
    )  # fmt: skip
    if not ids["ids"]:
        return counts
    records, snapshots, checkpoints = conn.execute(_HELD, ids).one()
    if blobs is not None and (records or snapshots):
        blobs.update(conn.scalars(_BLOBS_OF, ids))
    dialect.unindex_chats(conn, ids["ids"], ahead)
    for held, statements in (
        (records, _DELETE_RECORDS),
        (snapshots, _DELETE_SNAPSHOTS),
        (checkpoints, _DELETE_CHECKPOINTS),
    ):
        if held:
            for table, statement in statements:
                counts[table] = int(conn.execute(statement, ids).rowcount or 0)
    counts["branches"] = int(conn.execute(_DELETE_BRANCHES, ids).rowcount or 0)
    counts["messages"] = dialect.delete_messages(conn, M.c.chat_id.in_(ids["ids"]))
    counts["chats"] = int(conn.execute(_DELETE_CHATS, ids).rowcount or 0)
    return counts


__all__ = [
    "CHAT_COLS",
    "check_cursor",
    "checked_new",
    "create",
    "delete_chat",
    "delete_rows",
    "exists",
    "get",
    "get_or_insert",
    "insert_chat",
    "insert_chat_row",
    "insert_or_read",
    "list_chats",
    "list_query",
    "lock",
    "missing_message_error",
    "new_chat",
    "require",
    "touch",
    "update_chat",
]


async def insert_or_read(
    db: Database, dialect: Dialect, chat: Chat, write: Callable[[Connection, Dialect, Chat], T]
) -> T:
    """Run ``write(conn, dialect, chat)`` (which inserts the chat unless it exists); if another
    process inserted it meanwhile (the unique index refuses ours), run it once more: it then
    reads."""
    for attempt in range(3):
        try:
            return await db.run("write", unit(write, dialect, chat), chat=chat.id)
        except StoreError as exc:
            if attempt == 2 or not dialect.is_unique_violation(exc.__cause__ or exc):
                raise
    raise AssertionError("unreachable")  # pragma: no cover
