"""The database schema: SQLAlchemy 2.0 typed models, the single source the migrations match.

Two SQLite objects SQLAlchemy cannot model are created by the migrations only: the
contentless FTS5 table ``messages_fts`` (the search tokens of each message, by ``seq``) and
the view ``message_appends`` whose ``INSTEAD OF INSERT`` trigger appends messages and moves a
branch head in one statement (see ``migrations/versions/0003_one_path.py``). So is one
PostgreSQL index, the GIN index `SEARCH_HASHES_INDEX` on ``messages.search_hashes``
(``migrations/versions/0007_search_hashes.py``): a model's index would exist on SQLite too.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator, TypeEngine

from agentcontext._validate import dumps, loads
from agentcontext.store._rows.decode import damaged_json, damaged_time

__all__ = [
    "SEALING",
    "SEALING_COMPLETE",
    "SEARCH_HASHES_INDEX",
    "VERSION_TABLE",
    "Base",
    "BlobRow",
    "BranchRow",
    "ChatRow",
    "CheckpointRow",
    "MessageRow",
    "RecordMessageRow",
    "ResolveRecordRow",
    "SnapshotItemRow",
    "SnapshotRow",
    "StoreSettingRow",
    "UTCDateTime",
]

VERSION_TABLE = "agentcontext_version"
"""Alembic's version table, named so it never clashes with an application's own Alembic."""

SEARCH_HASHES_INDEX = "ix_messages_search_hashes"
"""PostgreSQL's GIN index on ``messages.search_hashes`` (made by the migrations only)."""

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class _IsoText(TypeDecorator[datetime]):
    """SQLite's timestamps: fixed-width ISO-8601 text with microseconds and the UTC offset
    (``2026-01-02T03:04:05.678901+00:00``), which sorts in time order."""

    impl = String(32)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        return _aware(value).isoformat(timespec="microseconds")

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        if value is None:
            return None
        try:
            moment = datetime.fromisoformat(value)
        except (TypeError, ValueError):
            return damaged_time(value)  # named with its row when a record is built
        return moment if moment.tzinfo is not None else damaged_time(value)


class _Timestamptz(TypeDecorator[datetime]):
    """PostgreSQL's timestamps: ``timestamptz``, read back in UTC."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        return None if value is None else _aware(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        return value.astimezone(UTC) if isinstance(value, datetime) else value


def _aware(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("naive datetime given; agentcontext stores aware UTC datetimes")
    return value.astimezone(UTC)


class _UTCDatetime6(TypeDecorator[datetime]):
    """MariaDB's and MySQL's timestamps: ``DATETIME(6)`` holding UTC (no time zone of its own,
    so none of the server's or the session's is ever applied), read back aware."""

    impl = mysql.DATETIME(fsp=6)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        return None if value is None else _aware(value).replace(tzinfo=None)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        if isinstance(value, datetime):
            return value.replace(tzinfo=UTC)
        return value if value is None else damaged_time(value)


MYSQL = ("mysql", "mariadb")
"""SQLAlchemy's names of the MariaDB/MySQL dialect (the variants below are for both)."""


def UTCDateTime() -> TypeEngine[datetime]:
    """An aware UTC datetime with microsecond precision on every backend: ``timestamptz`` on
    PostgreSQL, sortable ISO-8601 text on SQLite, ``DATETIME(6)`` in UTC on MariaDB/MySQL (a
    per-dialect variant of the column, as the schema declares it for Alembic)."""
    return _Timestamptz().with_variant(_IsoText(), "sqlite").with_variant(_UTCDatetime6(), *MYSQL)


class JSONText(TypeDecorator[Any]):
    """JSON kept as TEXT on SQLite.

    A column declared ``JSON`` has NUMERIC affinity in SQLite, which silently turns the
    document ``12345678901234567890123`` into a float; TEXT affinity keeps the exact text.
    """

    impl: type[TypeEngine[Any]] = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else dumps(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        if value is None:
            return None
        try:
            return loads(value)
        except (ValueError, TypeError, RecursionError) as exc:
            return damaged_json(value, exc)  # named with its row when a record is built


class _JSONLongText(JSONText):
    """JSON kept as ``LONGTEXT`` on MariaDB/MySQL: the same text on MariaDB (whose ``JSON`` is
    ``LONGTEXT`` under another name) and MySQL, read inside with ``JSON_EXTRACT``."""

    impl = mysql.LONGTEXT
    cache_ok = True


JSONDocument = JSON().with_variant(JSONText(), "sqlite").with_variant(_JSONLongText(), *MYSQL)
"""JSON text on SQLite and MariaDB/MySQL, ``json`` on PostgreSQL (chats' metadata): kept as
written (``jsonb`` turned ``1e308`` into a 309-digit integer); filters that look inside cast it
(`Dialect.metadata_filter`)."""

JSONMessage = JSON().with_variant(JSONText(), "sqlite").with_variant(mysql.LONGTEXT(), *MYSQL)
"""JSON text on SQLite, ``json`` on PostgreSQL, ``LONGTEXT`` on MariaDB/MySQL: a message is
written once and read whole, so it keeps the text the library wrote (``jsonb`` would be turned
back into text on every read)."""

LongText = Text().with_variant(mysql.LONGTEXT(), *MYSQL)
"""Text of any length (MariaDB's and MySQL's ``TEXT`` holds 64 KiB)."""

LongBinary = LargeBinary().with_variant(mysql.LONGBLOB(), *MYSQL)
"""Bytes of any length (MariaDB's and MySQL's ``BLOB`` holds 64 KiB)."""


class Base(DeclarativeBase):
    """Declarative base carrying the constraint naming convention."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class ChatRow(Base):
    """A conversation. ``updated_at`` is its last activity (a save counts)."""

    __tablename__ = "chats"

    id: Mapped[str] = mapped_column(String(255), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(255))
    title: Mapped[str | None] = mapped_column(LongText)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSONDocument)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    version: Mapped[int] = mapped_column(BigInteger, server_default="0")
    """Change counter: every write to the chat's graph increments it (see messages.version)."""
    message_count: Mapped[int] = mapped_column(BigInteger, server_default="0")
    """Messages of the chat on all branches, kept in step by every write that inserts some."""
    purged_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    """When ``purge`` last deleted messages of the chat (None if it never did): an id missing
    from a purged chat is named as purged, not only as unknown."""
    incarnation: Mapped[int] = mapped_column(BigInteger, server_default="0")
    """Drawn at random each time the row is inserted: a chat deleted and created again under
    its id (an import keeps its creation time and branch ids, and its version starts again) is
    another chat to what a process remembers of it (0: inserted before revision 0009)."""

    __table_args__ = (
        Index("ix_chats_user_id_updated_at_id", "user_id", "updated_at", "id"),
        Index("ix_chats_updated_at_id", "updated_at", "id"),
    )


class MessageRow(Base):
    """A node of the graph.

    ``seq`` is an internal surrogate key (the SQLite rowid the FTS index points at, and a
    stable insertion order). ``depth`` is the length of the chain ending at this message
    (a root has depth 1): it bounds chain walks and makes branch lengths free to read.
    ``search_hashes`` is, on PostgreSQL, the ascending distinct 32-bit hashes of the message's
    search tokens (``_tokenizer.token_hashes``; NULL for none) under the GIN index
    `SEARCH_HASHES_INDEX`; on MariaDB/MySQL, the message's keys in the side table
    ``message_terms``, packed (`agentcontext.store._dialects.mysql_search.pack_terms`), by which its
    entries are deleted with it; SQLite keeps the tokens in its FTS5 table instead and leaves it
    NULL. ``version`` lets an engine that holds a chain in memory fetch only what changed
    since it last looked.
    """

    __tablename__ = "messages"

    seq: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True
    )
    id: Mapped[str] = mapped_column(String(255), unique=True)
    chat_id: Mapped[str] = mapped_column(String(255), ForeignKey("chats.id", ondelete="CASCADE"))
    parent_id: Mapped[str | None] = mapped_column(String(255), ForeignKey("messages.id"))
    depth: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(255))
    type: Mapped[str] = mapped_column(String(64))
    data: Mapped[Any] = mapped_column(JSONMessage, nullable=True)
    search_hashes: Mapped[Any] = mapped_column(
        LargeBinary()
        .with_variant(ARRAY(Integer()), "postgresql")
        .with_variant(mysql.LONGBLOB(), *MYSQL),
        nullable=True,
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    version: Mapped[int] = mapped_column(BigInteger)
    """The chat's version when this row was last written (inserted or updated in place)."""

    __table_args__ = (
        # Chain loads: a chat's messages, or the part of a chain below a depth.
        Index("ix_messages_chat_id_depth", "chat_id", "depth"),
        # The change feed of engines holding a chain in memory.
        Index("ix_messages_chat_id_version", "chat_id", "version"),
        # Children of a message (foreign-key checks on delete look them up by parent alone).
        Index("ix_messages_parent_id", "parent_id"),
        # Compaction summaries (``type = 'compaction'``), found by depth below a chain's head.
        Index(
            "ix_messages_compactions",
            "chat_id",
            "depth",
            sqlite_where=text("type = 'compaction'"),
            postgresql_where=text("type = 'compaction'"),
        ),
    )


class BranchRow(Base):
    """A named pointer to a head message; a partial unique index keeps one active per chat.

    ``head_depth`` is the depth of the head message (0 for an empty branch), moved with the
    head: an append reads it from the branch row it locks anyway, so a save needs no lookup of
    its parent, and a branch's length is known without reading its messages.
    """

    __tablename__ = "branches"

    id: Mapped[str] = mapped_column(String(255), primary_key=True)
    chat_id: Mapped[str] = mapped_column(String(255), ForeignKey("chats.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(255))
    head_message_id: Mapped[str | None] = mapped_column(String(255), ForeignKey("messages.id"))
    head_depth: Mapped[int] = mapped_column(Integer, server_default="0")
    is_active: Mapped[bool] = mapped_column(
        Boolean(create_constraint=False), server_default=false()
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        UniqueConstraint("chat_id", "name"),
        Index("ix_branches_head_message_id", "head_message_id"),
        Index(
            "uq_branches_chat_id_active",
            "chat_id",
            unique=True,
            sqlite_where=text("is_active"),
            postgresql_where=text("is_active"),
        ),
    )


class CheckpointRow(Base):
    """A named pointer to any message of a chat; names are unique per chat."""

    __tablename__ = "checkpoints"

    id: Mapped[str] = mapped_column(String(255), primary_key=True)
    chat_id: Mapped[str] = mapped_column(String(255), ForeignKey("chats.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(255))
    message_id: Mapped[str] = mapped_column(String(255), ForeignKey("messages.id"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    branch_id: Mapped[str | None] = mapped_column(String(255), nullable=True)
    """The branch it was made on (a restore is named after it); may have been deleted since."""

    __table_args__ = (
        UniqueConstraint("chat_id", "name"),
        Index("ix_checkpoints_message_id", "message_id"),
    )


class BlobRow(Base):
    """Content addressed by its SHA-256, stored once however many things refer to it."""

    __tablename__ = "blobs"

    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    media_type: Mapped[str] = mapped_column(String(255))
    content: Mapped[bytes] = mapped_column(LongBinary)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class SnapshotRow(Base):
    """A context snapshot, attached to a chat and the head message it was taken at."""

    __tablename__ = "snapshots"

    id: Mapped[str] = mapped_column(String(255), primary_key=True)
    chat_id: Mapped[str] = mapped_column(String(255), ForeignKey("chats.id", ondelete="CASCADE"))
    message_id: Mapped[str | None] = mapped_column(String(255), ForeignKey("messages.id"))
    selection: Mapped[str] = mapped_column(String(16))
    summary: Mapped[str | None] = mapped_column(LongText)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        Index("ix_snapshots_chat_id_created_at", "chat_id", "created_at"),
        Index("ix_snapshots_message_id", "message_id"),
    )


class SnapshotItemRow(Base):
    """One item of a snapshot; its content is a blob."""

    __tablename__ = "snapshot_items"

    snapshot_id: Mapped[str] = mapped_column(
        String(255), ForeignKey("snapshots.id", ondelete="CASCADE"), primary_key=True
    )
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    path: Mapped[str] = mapped_column(LongText)
    blob_hash: Mapped[str] = mapped_column(String(64), ForeignKey("blobs.hash"))
    preview: Mapped[str | None] = mapped_column(LongText)
    media_type: Mapped[str] = mapped_column(String(255))
    size: Mapped[int] = mapped_column(BigInteger)
    selection: Mapped[str | None] = mapped_column(String(16))

    __table_args__ = (Index("ix_snapshot_items_blob_hash", "blob_hash"),)


class ResolveRecordRow(Base):
    """What a model was shown by one ``resolve(record=True)``: prompt and messages as blobs,
    and the report of its window (revision 0017)."""

    __tablename__ = "resolve_records"

    id: Mapped[str] = mapped_column(String(255), primary_key=True)
    chat_id: Mapped[str] = mapped_column(String(255), ForeignKey("chats.id", ondelete="CASCADE"))
    branch_id: Mapped[str | None] = mapped_column(String(255))
    branch_name: Mapped[str | None] = mapped_column(String(255))
    head_message_id: Mapped[str | None] = mapped_column(String(255), ForeignKey("messages.id"))
    renderer: Mapped[str] = mapped_column(String(255))
    prompt_hash: Mapped[str] = mapped_column(String(64), ForeignKey("blobs.hash"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    window_omitted: Mapped[str | None] = mapped_column(LongText, nullable=True)
    """The ids a ``resolve(window=...)`` left out, as a JSON array (None without a window)."""
    window_estimate: Mapped[int | None] = mapped_column(Integer, nullable=True)
    """The tokens that resolve counted for its window (None without a window)."""

    __table_args__ = (
        Index("ix_resolve_records_chat_id_created_at", "chat_id", "created_at"),
        Index("ix_resolve_records_prompt_hash", "prompt_hash"),
        Index("ix_resolve_records_head_message_id", "head_message_id"),
    )


class RecordMessageRow(Base):
    """The messages of a resolve record, in order, each as a blob of its JSON."""

    __tablename__ = "record_messages"

    record_id: Mapped[str] = mapped_column(
        String(255), ForeignKey("resolve_records.id", ondelete="CASCADE"), primary_key=True
    )
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    message_id: Mapped[str] = mapped_column(String(255))
    blob_hash: Mapped[str] = mapped_column(String(64), ForeignKey("blobs.hash"))

    __table_args__ = (Index("ix_record_messages_blob_hash", "blob_hash"),)


class StoreSettingRow(Base):
    """What the database itself must remember about the stores that use it, by name: today
    ``sealing`` (`SEALING`), written when an encrypted store first opens the database, so that
    a store without a key provider refuses it even while it holds no sealed row."""

    __tablename__ = "agentcontext_settings"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(255))


SEALING = "sealing"
"""The setting an encrypted store writes (its value: the format of its sealed values)."""
SEALING_COMPLETE = "sealing_complete"
"""The setting that says every value of the database is sealed (its value: when that was
recorded): an encrypted store's first opening of an empty database, or the end of a
`migrate encrypt` run. From then on a value in the clear is a `CorruptDataError`."""

chats = cast(Table, ChatRow.__table__)
messages = cast(Table, MessageRow.__table__)
branches = cast(Table, BranchRow.__table__)
checkpoints = cast(Table, CheckpointRow.__table__)
blobs = cast(Table, BlobRow.__table__)
snapshots = cast(Table, SnapshotRow.__table__)
snapshot_items = cast(Table, SnapshotItemRow.__table__)
resolve_records = cast(Table, ResolveRecordRow.__table__)
record_messages = cast(Table, RecordMessageRow.__table__)
store_settings = cast(Table, StoreSettingRow.__table__)
