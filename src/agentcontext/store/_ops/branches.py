"""Branches: named heads, one active per chat, compare-and-swap moves, forks, appends.
Plain functions of a connection; arguments are checked by the caller."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence

from sqlalchemy import (
    Connection,
    and_,
    bindparam,
    delete,
    exists,
    func,
    literal,
    literal_column,
    select,
    update,
)

from agentcontext import _validate as v
from agentcontext.errors import (
    BranchExistsError,
    BranchNotFoundError,
    ChatNotFoundError,
    InvalidGraphError,
    InvalidInputError,
    StoreError,
)
from agentcontext.store._db.database import Database, unit
from agentcontext.store._db.schema import branches as B
from agentcontext.store._db.schema import chats as C
from agentcontext.store._db.schema import messages as M
from agentcontext.store._dialects import Dialect, MessageRow
from agentcontext.store._ops import chats as _chats
from agentcontext.store._ops import messages as _messages
from agentcontext.store._ops.messages import ExistingMessages
from agentcontext.store._rows import decode as _rows
from agentcontext.store._rows.checks import new_id
from agentcontext.store._rows.codec import open_chat_row
from agentcontext.store.records import (
    AppendResult,
    Branch,
    BranchInfo,
    BranchState,
    Chat,
    ChatState,
    MessageRecord,
    utcnow,
)

__all__ = [
    "BRANCH_COLS",
    "AppendConflict",
    "HeadMoved",
    "active",
    "append",
    "append_rows",
    "check_head",
    "chat_state",
    "create",
    "fork",
    "fork_retrying",
    "get",
    "get_by_id",
    "list_infos",
    "move_head",
    "check_fork_records",
    "open_or_create",
    "next_name",
    "refused",
    "remove",
    "rename",
    "root_name",
    "set_active",
    "state",
    "sync_head_depths",
]

BRANCH_COLS = (B.c.id, B.c.chat_id, B.c.name, B.c.head_message_id, B.c.is_active, B.c.created_at)


def sync_head_depths(conn: Connection, chat_id: str) -> None:
    """Set every branch's ``head_depth`` of a chat from its head message (after writes that
    change depths or place heads in bulk: an import, a re-parenting)."""
    head_depth = select(M.c.depth).where(M.c.id == B.c.head_message_id).scalar_subquery()
    conn.execute(
        update(B).where(B.c.chat_id == chat_id).values(head_depth=func.coalesce(head_depth, 0))
    )


def check_head(conn: Connection, chat_id: str, message_id: str | None) -> int:
    """The depth of ``message_id`` (0 for None) after checking it is a message of the chat."""
    if message_id is None:
        return 0
    row = conn.execute(select(M.c.chat_id, M.c.depth, M.c.type).where(M.c.id == message_id)).first()
    if row is None:
        raise _chats.missing_message_error(conn, chat_id, message_id)
    if row[0] != chat_id:
        raise InvalidGraphError(f"message {message_id!r} belongs to another chat, not {chat_id!r}")
    if row[2] == _messages.COMPACTION:
        raise _messages.summary_refused(message_id, "its head")
    return int(row[1])


def _insert(
    conn: Connection, chat_id: str, name: str, head: str | None, depth: int, activate: bool
) -> Branch:
    if activate:
        conn.execute(update(B).where(B.c.chat_id == chat_id, B.c.is_active).values(is_active=False))
    branch = _rows.build(
        Branch,
        {
            "id": new_id(),
            "chat_id": chat_id,
            "name": name,
            "head_message_id": head,
            "is_active": activate,
            "created_at": utcnow(),
        },
    )
    conn.execute(
        B.insert().values(
            id=branch.id,
            chat_id=chat_id,
            name=name,
            head_message_id=head,
            head_depth=depth,
            is_active=activate,
            created_at=branch.created_at,
        )
    )
    return branch


def _name_taken(conn: Connection, chat_id: str, name: str) -> bool:
    found = conn.scalar(select(literal(1)).where(B.c.chat_id == chat_id, B.c.name == name))
    return found is not None


def create(
    conn: Connection, dialect: Dialect, chat_id: str, name: str, head: str | None, activate: bool
) -> Branch:
    """A new branch (write transaction)."""
    _chats.touch(conn, dialect, chat_id)
    depth = check_head(conn, chat_id, head)
    if _name_taken(conn, chat_id, name):
        raise BranchExistsError(f"chat {chat_id!r} already has a branch named {name!r}")
    return _insert(conn, chat_id, name, head, depth, activate)


def fork(
    conn: Connection,
    dialect: Dialect,
    chat_id: str,
    base_name: str,
    head: str | None,
    activate: bool,
    records: list[MessageRecord],
    name: str | None = None,
) -> BranchInfo:
    """The next free branch ``{base_name}-vN`` (or ``name``) at ``head``, with ``records``
    written on it (write transaction). The chat row lock serialises forks, so names never
    collide."""
    version = _chats.touch(conn, dialect, chat_id)
    depth = check_head(conn, chat_id, head)
    if name is None:
        name = next_name(base_name, conn.scalars(select(B.c.name).where(B.c.chat_id == chat_id)))
    elif _name_taken(conn, chat_id, name):
        raise BranchExistsError(f"chat {chat_id!r} already has a branch named {name!r}")
    if records:
        _messages.write(conn, dialect, records, {chat_id: version})
        head = records[-1].id
        depth = check_head(conn, chat_id, head)
    branch = _insert(conn, chat_id, name, head, depth, activate)
    return _rows.build(BranchInfo, {**branch.__dict__, "message_count": depth})


_VERSION_SUFFIX = re.compile(r"(?:-v\d+)+$")


def root_name(name: str) -> str:
    """A branch name without its automatic ``-vN`` suffixes (``main-v2-v3`` → ``main``)."""
    return _VERSION_SUFFIX.sub("", name) or name


def next_name(base_name: str, taken: Iterable[str]) -> str:
    """The automatic name of a branch forked from ``base_name``: ``{root}-vN`` with the
    smallest free N ≥ 2, counted from the root name, so names stay flat and short however
    many forks follow (``main`` and ``main-v7`` both give ``main-vN``). The root is cut so
    the name never exceeds the length limit."""
    root = root_name(base_name)
    used = set(taken)
    number = 2
    while True:
        suffix = f"-v{number}"
        name = root[: v.MAX_ID_LENGTH - len(suffix)] + suffix
        if name not in used:
            return name
        number += 1


def get(conn: Connection, chat_id: str, name: str) -> Branch | None:
    """The branch of that name, or None."""
    row = conn.execute(select(*BRANCH_COLS).where(B.c.chat_id == chat_id, B.c.name == name)).first()
    return None if row is None else _rows.branch(row)


def get_by_id(conn: Connection, branch_id: str) -> Branch | None:
    """The branch with that id, or None."""
    row = conn.execute(select(*BRANCH_COLS).where(B.c.id == branch_id)).first()
    return None if row is None else _rows.branch(row)


# The last column of both states: whether the chat holds a compaction (a probe of the partial
# index of compactions, whose condition it repeats literally), so that a chain load of a chat
# without any does not look for one.
_COMPACTED = exists(
    select(literal(1)).where(M.c.chat_id == C.c.id, M.c.type == literal_column("'compaction'"))
)
_STATE = (
    select(
        *BRANCH_COLS,
        C.c.version,
        C.c.message_count,
        B.c.head_depth,
        _COMPACTED,
        C.c.incarnation,
    )
    .join_from(B, C, C.c.id == B.c.chat_id)
    .where(B.c.id == bindparam("branch_id"))
)


def state(conn: Connection, dialect: Dialect, branch_id: str) -> BranchState | None:
    """The branch with its chat's version and counts, in one query; None if it is gone."""
    row = conn.execute(_STATE, {"branch_id": branch_id}).first()
    if row is None:
        return None
    branch = _rows.branch(row[:6])
    return _rows.build(
        BranchState,
        {
            "branch": branch,
            "version": int(row[6]),
            "message_count": int(row[7]),
            "head_depth": int(row[8]),
            "has_compactions": bool(row[9]),
            "incarnation": int(row[10]),
        },
    )


_CHAT_STATE = (
    select(
        C.c.id, C.c.user_id, C.c.title, C.c.metadata, C.c.created_at,
        C.c.updated_at, C.c.version, C.c.message_count, B.c.id, B.c.name, B.c.head_message_id,
        B.c.created_at, B.c.head_depth, _COMPACTED, C.c.incarnation,
    )
    .select_from(C)
    .outerjoin(B, and_(B.c.chat_id == C.c.id, B.c.is_active))
    .where(C.c.id == bindparam("chat_id"))
)  # fmt: skip


def chat_state(conn: Connection, dialect: Dialect, chat_id: str) -> ChatState | None:
    """The chat, its active branch, version and counts in one query; None for an unknown chat
    (or one without an active branch)."""
    row = conn.execute(_CHAT_STATE, {"chat_id": chat_id}).first()
    if row is None or row[8] is None:
        return None
    chat = _rows.chat(open_chat_row(dialect, (row[0], row[1], row[2], row[3], row[4], row[5])))
    branch = _rows.branch((row[8], row[0], row[9], row[10], True, row[11]))
    return _rows.build(
        ChatState,
        {
            "chat": chat,
            "branch": branch,
            "version": int(row[6]),
            "message_count": int(row[7]),
            "head_depth": int(row[12]),
            "has_compactions": bool(row[13]),
            "incarnation": int(row[14]),
        },
    )


def active(conn: Connection, chat_id: str) -> Branch | None:
    """The chat's active branch, or None."""
    row = conn.execute(select(*BRANCH_COLS).where(B.c.chat_id == chat_id, B.c.is_active)).first()
    return None if row is None else _rows.branch(row)


def set_active(conn: Connection, dialect: Dialect, chat_id: str, branch_id: str) -> Branch:
    """Make this branch the chat's only active one (write transaction)."""
    _chats.touch(conn, dialect, chat_id)
    row = conn.execute(
        select(*BRANCH_COLS).where(B.c.id == branch_id, B.c.chat_id == chat_id)
    ).first()
    if row is None:
        raise BranchNotFoundError(f"chat {chat_id!r} has no branch with id {branch_id!r}")
    if not row[4]:
        conn.execute(update(B).where(B.c.chat_id == chat_id, B.c.is_active).values(is_active=False))
        conn.execute(update(B).where(B.c.id == branch_id).values(is_active=True))
    return _rows.build(Branch, {**_rows.branch(row).__dict__, "is_active": True})


class HeadMoved(Exception):
    """Internal: a compare-and-swap lost (raised to roll the transaction back)."""

    def __init__(self, head: str | None, version: int | None, existing: list[str] | None = None):
        super().__init__(head)
        self.head = head
        self.version = version
        self.existing = existing or []


def move_head(
    conn: Connection, dialect: Dialect, branch_id: str, message_id: str | None, expected: str | None
) -> bool:
    """Compare-and-swap a branch head (write transaction)."""
    chat_id = conn.scalar(select(B.c.chat_id).where(B.c.id == branch_id))
    if chat_id is None:
        raise BranchNotFoundError(f"no branch with id {branch_id!r}")
    _chats.touch(conn, dialect, chat_id)
    depth = check_head(conn, chat_id, message_id)
    moved = conn.execute(
        update(B)
        .where(B.c.id == branch_id, B.c.head_message_id.is_not_distinct_from(expected))
        .values(head_message_id=message_id, head_depth=depth)
    )
    if not moved.rowcount:
        raise HeadMoved(None, None)  # rolls back the version bump
    return True


def append(
    conn: Connection,
    dialect: Dialect,
    branch_id: str,
    records: list[MessageRecord],
    expected: str | None,
    head: str,
    allowed: Collection[str] | None,
) -> AppendResult:
    """The general append: any mix of new messages and allowed in-place updates, in one
    write transaction."""
    chat_id = records[0].chat_id
    try:
        # Lock order everywhere: the chat row first, then branches.
        version = _chats.touch(conn, dialect, chat_id)
        row = conn.execute(
            select(B.c.chat_id, B.c.head_message_id).where(B.c.id == branch_id)
        ).first()
        if row is None or row[0] != chat_id:
            raise BranchNotFoundError(f"chat {chat_id!r} has no branch with id {branch_id!r}")
        if row[1] != expected:
            raise HeadMoved(row[1], version - 1)  # rolls back the version bump
        try:
            _messages.write(conn, dialect, records, {chat_id: version}, updates=allowed)
        except ExistingMessages as refused:
            raise HeadMoved(row[1], version - 1, refused.ids) from None
        depth = check_head(conn, chat_id, head)
        conn.execute(
            update(B).where(B.c.id == branch_id).values(head_message_id=head, head_depth=depth)
        )
    except HeadMoved as conflict:
        raise AppendConflict(conflict.head, conflict.version, conflict.existing) from None
    return AppendResult(ok=True, head_message_id=head, version=version)


class AppendConflict(Exception):
    """Internal: carries a refused append out of its rolled-back transaction."""

    def __init__(self, head: str | None, version: int | None, existing: list[str]) -> None:
        super().__init__(head)
        self.result = AppendResult(
            ok=False, head_message_id=head, version=version, existing=existing
        )


def append_rows(
    conn: Connection,
    dialect: Dialect,
    branch_id: str,
    rows: Sequence[MessageRow],
    head: str,
    owner: str,
    report_version: bool = True,
) -> AppendResult:
    """The fast append: new messages chained after the head, in one statement per
    ``dialect.append_chunk`` rows (one statement for any usual save); their search terms
    were made for the chat's ``owner``."""
    version: int | None = None
    touched = utcnow()
    for start in range(0, len(rows), dialect.append_chunk):
        chunk = rows[start : start + dialect.append_chunk]
        version = dialect.append(
            conn,
            branch_id,
            chunk,
            first=start == 0,
            new_head=chunk[-1].id,
            touched_at=touched,
            owner=owner,
            report_version=report_version,
        )
    assert rows[-1].id == head
    return AppendResult(ok=True, head_message_id=head, version=version)


def refused(
    conn: Connection, branch_id: str, chat_id: str, reason: str, ids: list[str]
) -> AppendResult:
    """After a refused fast append: the result to report, or the error to raise."""
    row = conn.execute(
        select(B.c.chat_id, B.c.head_message_id, C.c.version)
        .join_from(B, C, C.c.id == B.c.chat_id)
        .where(B.c.id == branch_id)
    ).first()
    if row is None or row[0] != chat_id:
        if not _chats.exists(conn, chat_id):
            raise ChatNotFoundError(f"chat {chat_id!r} does not exist")
        raise BranchNotFoundError(f"chat {chat_id!r} has no branch with id {branch_id!r}")
    existing = []
    if reason == "exists":
        existing = sorted(_messages.fetch_nodes(conn, ids))
    return AppendResult(ok=False, head_message_id=row[1], version=int(row[2]), existing=existing)


def list_infos(conn: Connection, chat_id: str) -> list[BranchInfo]:
    """The chat's branches, oldest first, with their chain lengths."""
    rows = conn.execute(
        select(*BRANCH_COLS, B.c.head_depth)
        .where(B.c.chat_id == chat_id)
        .order_by(B.c.created_at, B.c.name)
    ).all()
    if not rows:
        _chats.require(conn, chat_id)
    return [
        _rows.build(BranchInfo, {**_rows.branch(row).__dict__, "message_count": int(row[6])})
        for row in rows
    ]


def rename(conn: Connection, dialect: Dialect, chat_id: str, old: str, new: str) -> Branch:
    """Rename a branch (write transaction)."""
    _chats.touch(conn, dialect, chat_id)
    branch = get(conn, chat_id, old)
    if branch is None:
        raise BranchNotFoundError(f"chat {chat_id!r} has no branch named {old!r}")
    if old == new:
        return branch
    if _name_taken(conn, chat_id, new):
        raise BranchExistsError(f"chat {chat_id!r} already has a branch named {new!r}")
    conn.execute(update(B).where(B.c.id == branch.id).values(name=new))
    return _rows.build(Branch, {**branch.__dict__, "name": new})


def remove(conn: Connection, dialect: Dialect, chat_id: str, name: str) -> bool:
    """Delete a branch pointer (write transaction); never the active branch."""
    _chats.touch(conn, dialect, chat_id)
    branch = get(conn, chat_id, name)
    if branch is None:
        return False
    if branch.is_active:
        raise InvalidInputError(
            f"branch {name!r} is the active branch of chat {chat_id!r} and cannot be deleted; "
            "switch to another branch first"
        )
    conn.execute(delete(B).where(B.c.id == branch.id))
    return True


async def fork_retrying(
    db: Database,
    dialect: Dialect,
    chat_id: str,
    base_name: str,
    head: str | None,
    activate: bool,
    records: list[MessageRecord],
    name: str | None,
) -> BranchInfo:
    """`fork`, looked at again when another process took the automatic name between the read
    and the insert (the unique index refuses it); a name given is `BranchExistsError`."""
    for _ in range(3):
        try:
            return await db.run(
                "write",
                unit(fork, dialect, chat_id, base_name, head, activate, records, name),
                chat=chat_id,
            )
        except StoreError as exc:
            if not dialect.is_unique_violation(exc.__cause__ or exc):
                raise
            if name is not None:
                raise BranchExistsError(
                    f"chat {chat_id!r} already has a branch named {name!r}"
                ) from None
    raise StoreError(f"could not find a free branch name for {base_name!r}; retry")


def check_fork_records(chat_id: str, records: list[MessageRecord]) -> list[MessageRecord]:
    """The messages of a fork must all be of its chat."""
    for record in records:
        if record.chat_id != chat_id:
            raise InvalidGraphError(
                f"message {record.id!r} is for chat {record.chat_id!r}, not {chat_id!r}"
            )
    return records


def open_or_create(conn: Connection, dialect: Dialect, chat: Chat) -> ChatState:
    """`chat_state` of a chat, inserting it (with its ``main`` branch) if it does not exist
    (write transaction)."""
    _chats.get_or_insert(conn, dialect, chat)
    state = chat_state(conn, dialect, chat.id)
    if state is None:
        raise InvalidGraphError(
            f"chat {chat.id!r} has no active branch: the database was changed outside "
            "agentcontext. Make one active with store.set_active_branch(chat_id, branch_id), "
            "or create one with store.create_branch(..., activate=True)"
        )
    return state
