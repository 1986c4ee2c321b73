"""MariaDB (10.11+) and MySQL (8.0+) through asyncmy (or aiomysql).

What these servers make different, all of it here:

- **Ids compare byte for byte.** Every table's text is ``utf8mb4`` in a binary collation that
  does not pad (``utf8mb4_nopad_bin`` on MariaDB, ``utf8mb4_0900_bin`` on MySQL): ``"Abc"``,
  ``"abc"`` and ``"abc "`` are three ids. (The tables are made by the migrations, which ask
  the server which collation it has: `nopad_collation`.)
- **Timestamps** are ``DATETIME(6)`` in UTC; every connection's session time zone is UTC.
- **No data-modifying CTE, no RETURNING.** The append of a save is one short transaction:
  a locking read of the chat row, then the branch row (every writer's lock order), the
  message rows, their search terms, the chat's activity, the branch's head; the
  compare-and-swap is the locking read (the head must be the first row's parent). On MariaDB
  it is one compound statement that commits itself: one round trip. Upserts read back what
  they wrote.
- **Deadlocks and lock wait timeouts** (1213, 1205) roll the transaction back: the unit is
  run again (`is_transient`), never reported as a driver error.
- **Recursive walks** are not cut: MariaDB stops a recursive CTE after
  ``max_recursive_iterations`` (1 000 by default) and MySQL after ``cte_max_recursion_depth``
  (1 000); every connection of the store raises its own limit.
- **Search** keys a side table, ``message_terms (term, seq)``, by each message's search terms
  (its tokens under its chat's and its user's masks, as signed 64-bit numbers): a search joins
  the query's terms there, reading the scope's entries only. The table is its primary key
  alone, one B-tree: a message's row keeps its terms (``search_hashes``, packed: `pack_terms`),
  and a delete takes out exactly those keys (migration 0014).
- **Packets.** A statement is one packet of at most ``max_allowed_packet`` bytes: a store
  reads it on each connection, says once if it is too small for the largest message a store
  takes (`PACKET_NEEDED`), and refuses a statement that does not fit as the driver would send
  it (escapes and all: ``mysql_packet``) with the setting that would take it.
- ``schema=`` names a database on the same server (created when missing under
  ``migrate="auto"``).
- **Read replicas** (MariaDB): positions are the sequence numbers of the primary's GTIDs and
  tokens the GTIDs themselves (``mysql_replicas``); MySQL refuses ``read_replicas=``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy import (
    Column,
    ColumnElement,
    Connection,
    LargeBinary,
    MetaData,
    Select,
    String,
    Table,
    Text,
    and_,
    bindparam,
    case,
    cast,
    delete,
    event,
    func,
    literal,
    select,
    text,
    type_coerce,
    update,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.schema import CreateSchema

from agentcontext.errors import (
    ContextError,
    InvalidInputError,
    StoreError,
    StoreUnavailableError,
)
from agentcontext.store._db.schema import VERSION_TABLE
from agentcontext.store._db.schema import branches as B
from agentcontext.store._db.schema import chats as C
from agentcontext.store._db.schema import messages as M
from agentcontext.store._dialects.base import (
    AppendRefused,
    Dialect,
    EngineOptions,
    MessageRow,
    Mode,
    candidate_columns,
    orig,
)
from agentcontext.store._dialects.mysql_packet import (
    PACKET_NEEDED,
    check_packet,
    packet_needed,
    warn_small_packet,
)
from agentcontext.store._dialects.mysql_replicas import (
    Domain,
    check_primary,
    format_token,
    parse_token,
    replay_position,
    settle_token,
    write_position,
)
from agentcontext.store._dialects.mysql_search import (
    QUERY_TERMS,
    TERMS,
    hex_literal,
    index_keys,
    int8_terms,
    query_terms_params,
    terms_hex,
    unindex,
    unpack_terms,
)
from agentcontext.store._dialects.mysql_session import (
    COMMITTED,
    check_connect_args,
    install_hooks,
    reset,
)
from agentcontext.store._rows.decode import damaged_time
from agentcontext.store._rows.terms import ScopedTerms

__all__ = [
    "PACKET_NEEDED",
    "MySQLDialect",
    "nopad_collation",
]

_SYSTEM_SCHEMAS = frozenset({"mysql", "information_schema", "performance_schema", "sys"})
_MIGRATION_LOCK = "agentcontext_migrate"

_TRANSIENT = frozenset({1205, 1213})
_UNIQUE = frozenset({1062, 1586})
_FOREIGN_KEY = frozenset({1216, 1217, 1451, 1452})
_OUT_OF_RANGE = frozenset({1264, 1292, 1367, 1406, 1690})
_UNREACHABLE = frozenset({1040, 1044, 1045, 1129, 1130, 2002, 2003, 2005, 2006, 2013, 2055})
_TOO_LARGE = frozenset({1153, 1301})
_UNKNOWN_DATABASE = 1049


def errno(exc: BaseException) -> int | None:
    """The server's (or the client's) error number of a MariaDB/MySQL error, if any."""
    found = orig(exc)
    args = getattr(found, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def nopad_collation(conn: Connection) -> str:
    """The binary, non-padding ``utf8mb4`` collation of the server ``conn`` reaches."""
    return "utf8mb4_nopad_bin" if getattr(conn.dialect, "is_mariadb", False) else "utf8mb4_0900_bin"


class MySQLDialect(Dialect):
    """MariaDB and MySQL through asyncmy (or aiomysql)."""

    name = "mysql"
    aliases = ("mariadb",)
    title = "MariaDB/MySQL"
    not_a_replica = "is not a replica of the primary's domain (its gtid_slave_pos names none)"
    driver = "asyncmy"
    drivers = ("asyncmy", "aiomysql")
    options = frozenset(
        {"connect_timeout", "command_timeout", "schema", "read_replicas", "replica_wait"}
    )
    first_revision = "0011"  # the schema as it was then, made at once
    append_chunk = 500
    atomic_append = True  # a statement that commits itself (MariaDB), or a unit that commits
    exact_candidates = False
    search_mode = "read"
    # No partial index here: one active branch per chat is a unique index on a generated
    # column, compaction summaries have an index of their own; the search table is ours.
    migration_only = frozenset(
        {"message_terms", "active_chat_id", "uq_branches_chat_id_active", "ix_messages_compactions"}
    )
    entries_go_with_rows = True  # delete_messages deletes them first
    compound_append = True
    """Whether an append on MariaDB is one compound statement (`_append_compound`); MySQL
    has none and runs its statements one by one (as MariaDB does with this off)."""

    def __init__(self, *, schema: str | None = None, replicas: bool = False) -> None:
        self.schema = schema
        self.replicas = replicas
        """Whether the store has read replicas (`check_primary` at open)."""
        self.domain = Domain()
        """The primary's replication domain (positions and tokens: ``mysql_replicas``)."""

    # --- engine -----------------------------------------------------------------------------

    @classmethod
    def check_schema(cls, schema: str) -> None:
        if schema in _SYSTEM_SCHEMAS:
            raise InvalidInputError(
                f"schema {schema!r} is not a usable schema name: it is a system database of "
                "MariaDB/MySQL, and a store must not put its tables there; choose a tenant's "
                "own name, e.g. 'tenant_acme'"
            )

    @classmethod
    def from_url(cls, url: URL, options: EngineOptions) -> MySQLDialect:
        return MySQLDialect(
            schema=options.schema, replicas="read_replicas" in options.changed_options
        )

    @classmethod
    def from_engine(cls, engine: AsyncEngine, options: EngineOptions) -> MySQLDialect:
        install_hooks(engine, None)
        return MySQLDialect(
            schema=options.schema, replicas="read_replicas" in options.changed_options
        )

    def make_engine(self, url: URL, options: EngineOptions, kwargs: dict[str, Any]) -> AsyncEngine:
        connect_args = dict(kwargs.pop("connect_args", None) or {})
        connect_args.setdefault("connect_timeout", int(max(1, round(options.connect_timeout))))
        given = url
        if "charset" not in url.query:  # (another one is refused: `check_connect_args`)
            url = url.update_query_dict({"charset": "utf8mb4"})
        # The server closes a connection idle for wait_timeout (8 hours by default).
        kwargs.setdefault("pool_recycle", 3600)
        # Writes lock what they change and read the latest rows: no snapshot is needed
        # (`prepare` asks for one where a call reads several times).
        kwargs.setdefault("isolation_level", "READ COMMITTED")
        # A connection back in the pool is rolled back only when the server says it is in a
        # transaction (`reset`): after a commit that is a round trip saved on every write.
        kwargs.setdefault("pool_reset_on_return", None)
        engine = create_async_engine(url, connect_args=connect_args, **kwargs)
        if not {"creator", "async_creator"} & kwargs.keys():  # (or the URL is not used)
            check_connect_args(engine, given, connect_args)
        if kwargs["pool_reset_on_return"] is None:
            event.listen(engine.sync_engine, "reset", reset)
        install_hooks(engine, options.command_timeout)
        return engine

    def prepare(self, conn: Connection, mode: Mode) -> None:
        if mode == "snapshot":
            # InnoDB's REPEATABLE READ for the unit's transaction (begun by its first read):
            # the reads of the unit see one snapshot. A statement SQLAlchemy runs as any other,
            # so that a connection the server closed meanwhile is found dead and replaced (an
            # isolation level set through execution_options reaches the driver unwrapped, and
            # a dead connection went back to the pool); nothing to reset afterwards either.
            conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")

    def on_open(self, conn: Connection) -> None:
        if self.replicas:
            check_primary(conn)
        row = conn.exec_driver_sql("SELECT @@max_allowed_packet, @@log_bin, @@binlog_format").one()
        if int(row[1] or 0) and str(row[2]).upper() == "STATEMENT":
            raise InvalidInputError(
                "this server logs statements (binlog_format=STATEMENT), which InnoDB cannot "
                "do for the store's READ COMMITTED transactions: every write would fail. Set "
                "binlog_format=ROW (or MIXED) on the server"
            )
        warn_small_packet(int(row[0]), self.sealer.encrypted)

    def database_identity(self, conn: Connection) -> tuple[Any, ...]:
        # The server; and without schema=, the connection's database, where the store's
        # tables are. With schema= they are named in it (`_names`, the schema translation),
        # whichever database a connection is in.
        if self.schema is not None:
            row = conn.exec_driver_sql("SELECT @@hostname, @@port, @@datadir").one()
        else:
            row = conn.exec_driver_sql("SELECT @@hostname, @@port, @@datadir, DATABASE()").one()
        return ("mysql", *row)

    # --- read replicas (MariaDB's GTIDs: ``mysql_replicas``) ----------------------------------

    def write_position(self, conn: Connection) -> int | None:
        return write_position(conn, self.domain)

    def replay_position(self, conn: Connection) -> int | None:
        return replay_position(conn, self.domain)

    def replica_identity(self, conn: Connection) -> tuple[Any, ...] | None:
        # A replica holds every database of its primary: a URL naming another one of them
        # reads another store. With schema=, both name the tables in it.
        if self.schema is not None:
            return (self.schema,)
        return (conn.exec_driver_sql("SELECT DATABASE()").scalar_one(),)

    def format_token(self, position: int) -> str:
        return format_token(position, self.domain)

    def parse_token(self, token: object, name: str = "after") -> int:
        return parse_token(token, self.domain, name)

    def settle_token(self, position: int) -> int:
        return settle_token(position, self.domain)

    # --- values ------------------------------------------------------------------------------

    def encode_time(self, moment: datetime) -> datetime:
        return moment.astimezone(UTC).replace(tzinfo=None)

    def decode_time(self, value: Any) -> Any:
        if isinstance(value, datetime):
            return value.replace(tzinfo=UTC)
        return damaged_time(value)

    def raw_json(self, column_: Any) -> ColumnElement[Any]:
        # The UTF-8 bytes of the text: no str made for each row only to be parsed.
        return cast(column_, LargeBinary)

    def raw_time(self, column_: Any) -> ColumnElement[Any]:
        return type_coerce(column_, mysql.DATETIME(fsp=6))

    # --- statements --------------------------------------------------------------------------

    def insert(self, table: Table) -> Any:
        return mysql.insert(table)

    def insert_if_absent(self, table: Table) -> Any:
        insert = mysql.insert(table)
        key = table.primary_key.columns[0].name
        return insert.on_duplicate_key_update({key: insert.inserted[key]})

    def insert_blobs(self, table: Table) -> Any:
        # Touch an existing row (it stays locked until the writer's transaction ends, so a
        # concurrent garbage collection cannot delete it).
        insert = mysql.insert(table)
        return insert.on_duplicate_key_update(size=insert.inserted.size)

    def metadata_filter(self, column: Any, wanted: Mapping[str, str | int | bool]) -> Any:
        clauses = []
        for key, value in wanted.items():
            path = "$." + json.dumps(key, ensure_ascii=False)  # the key as the document has it
            found = func.json_extract(column, literal(path, String))
            if isinstance(value, bool):
                kind, shown = "BOOLEAN", "true" if value else "false"
            elif isinstance(value, int):
                kind, shown = "INTEGER", str(value)
            else:
                kind, shown = "STRING", value
            # Compared as UTF-8 bytes: exactly, whatever the connection's collation.
            clauses.append(and_(
                func.json_type(found) == kind,
                cast(func.json_unquote(found), LargeBinary)
                == cast(literal(shown, String), LargeBinary),
            ))  # fmt: skip
        return and_(*clauses)

    def chats_after_cursor(self, page: Select[Any]) -> Select[Any]:
        # Given the choice, MariaDB reads the user's chats by equality on user_id alone and
        # skips the newer ones row by row (5 050 rows for a page at a depth of 5 000 of a
        # 10 000-chat user): held to this index, it takes the range (user_id, updated_at),
        # which starts at the cursor.
        return page.with_hint(C, "FORCE INDEX (ix_chats_user_id_updated_at_id)")

    def roles_filter(self, column_: ColumnElement[Any]) -> ColumnElement[bool]:
        return func.json_contains(bindparam("roles", type_=Text), func.json_quote(column_)) == 1

    def roles_value(self, roles: Sequence[str]) -> Any:
        return json.dumps(list(roles))

    def lock_chat(self, conn: Connection, chat_id: str) -> None:
        conn.execute(select(literal(1)).where(C.c.id == chat_id).with_for_update())

    def update_returning(
        self, conn: Connection, table: Table, where: Sequence[Any], values: Mapping[str, Any],
        column_: Any,
    ) -> Any:  # fmt: skip
        # The driver counts matched rows (CLIENT_FOUND_ROWS): an update that changes nothing
        # still counts.
        if not conn.execute(update(table).where(*where).values(**values)).rowcount:
            return None
        return conn.scalar(select(column_).where(*where))

    def upsert_returning(
        self, conn: Connection, table: Table, values: Mapping[str, Any], keys: Sequence[Any],
        updates: Mapping[str, Any], returning: Sequence[Any],
    ) -> Any:  # fmt: skip
        insert = mysql.insert(table).values(**values)
        changed = {
            name: insert.inserted[name] if value == "excluded" else value
            for name, value in updates.items()
        }
        conn.execute(insert.on_duplicate_key_update(**changed))
        return conn.execute(
            select(*returning).where(*(key == values[key.name] for key in keys))
        ).one()

    def upsert_messages(self, conn: Connection, rows: list[dict[str, Any]]) -> list[Any]:
        self._check_packet(conn, [value for row in rows for value in row.values()], len(rows))
        insert = mysql.insert(M)
        same = M.c.chat_id == insert.inserted.chat_id

        def kept(name: str) -> Any:
            return case((same, insert.inserted[name]), else_=M.c[name])

        statement = insert.values(
            data=bindparam("data_json", type_=Text), search_hashes=_UNHEX_TERMS
        ).on_duplicate_key_update(
            name=kept("name"), type=kept("type"), data=kept("data"), version=kept("version"),
            search_hashes=kept("search_hashes"),
        )  # fmt: skip
        conn.execute(statement, rows)
        wanted = {row["id"]: row["chat_id"] for row in rows}
        found = conn.execute(
            select(M.c.id, M.c.seq, M.c.chat_id).where(M.c.id.in_(list(wanted)))
        ).all()
        return [(i, seq) for i, seq, chat_id in found if wanted.get(i) == chat_id]

    def delete_messages(self, conn: Connection, where: ColumnElement[bool]) -> int:
        # The search entries first: the side table has no foreign key to check on each of
        # the hundred rows a message's save writes (migration 0012), so they go here, the one
        # way messages are deleted, by the keys each row keeps (migration 0014).
        found = conn.execute(select(M.c.seq, M.c.search_hashes).where(where))
        unindex(conn, [(int(seq), unpack_terms(packed)) for seq, packed in found])
        # InnoDB checks a foreign key at each row, not at the end of the statement: a parent
        # deleted before its child would be refused. The links inside what goes are cut first.
        conn.execute(update(M).where(where, M.c.parent_id.is_not(None)).values(parent_id=None))
        return int(conn.execute(delete(M).where(where)).rowcount or 0)

    # --- the append of a save ------------------------------------------------------------------

    def append(
        self,
        conn: Connection,
        branch_id: str,
        rows: Sequence[MessageRow],
        *,
        first: bool,
        new_head: str,
        touched_at: datetime,
        owner: str,
        report_version: bool = True,
    ) -> int | None:
        # Run on its own ("atomic": outside a transaction), the append commits itself;
        # inside a transaction (the caller's, or a unit's), it leaves the commit to it.
        alone = not conn.in_transaction()
        if self.compound_append and getattr(conn.dialect, "is_mariadb", False):
            return self._append_compound(
                conn, branch_id, rows, first=first, new_head=new_head, touched_at=touched_at,
                owner=owner, commit=alone,
            )  # fmt: skip
        version = self._append_statements(
            conn, branch_id, rows, first=first, new_head=new_head, touched_at=touched_at,
            owner=owner,
        )  # fmt: skip
        if alone:
            conn.commit()
        return version

    def _append_statements(
        self,
        conn: Connection,
        branch_id: str,
        rows: Sequence[MessageRow],
        *,
        first: bool,
        new_head: str,
        touched_at: datetime,
        owner: str,
    ) -> int:
        """MySQL's append (and MariaDB's without `compound_append`): its statements one by one,
        in the caller's transaction."""
        chat_id = rows[0].chat_id
        # One locking read of the chat row, then the branch row (the lock order of every
        # writer): the owner the search terms were made for, the version, the head.
        found = conn.execute(_LOCK_FOR_APPEND, {"chat_id": chat_id, "branch_id": branch_id}).first()
        if found is None:
            raise AppendRefused("branch")  # (or the chat is gone: the general path says)
        user_id, version, head, depth = found
        if user_id != owner:
            raise AppendRefused("owner")
        if head != rows[0].parent_id:
            raise AppendRefused("moved")
        version = int(version) + (1 if first else 0)
        entries = [sorted(int8_terms(row.terms)) for row in rows]  # (each row's keys, once)
        values = [
            {
                "id": row.id,
                "chat_id": chat_id,
                "parent_id": row.parent_id,
                "depth": int(depth) + step,
                "name": row.name,
                "type": row.type,
                "data_json": row.data,
                "terms_hex": terms_hex(terms),
                "created_at": row.created_at,
                "version": version,
            }
            for step, (row, terms) in enumerate(zip(rows, entries, strict=True), 1)
        ]
        self._check_packet(conn, [value for row in values for value in row.values()], len(rows))
        try:
            if conn.dialect.insert_returning:
                # MariaDB: the rows and their seq in one statement (INSERT ... RETURNING).
                seqs = dict(conn.execute(_INSERT_MESSAGES_RETURNING, values).all())
            else:
                conn.execute(_INSERT_MESSAGES, values)
                seqs = dict(
                    conn.execute(
                        select(M.c.id, M.c.seq).where(M.c.id.in_([row.id for row in rows]))
                    ).all()
                )
        except DBAPIError as exc:
            if self.is_unique_violation(exc):
                raise AppendRefused("exists") from None
            raise
        index_keys(conn, [(int(seqs[r.id]), terms) for r, terms in zip(rows, entries, strict=True)])
        # The chat's activity and version, then the branch's head: two statements on one row
        # each, which the server runs in less time than one that joins the two rows (its
        # plan alone took longer than both).
        conn.execute(
            update(C)
            .where(C.c.id == chat_id)
            .values(
                updated_at=touched_at,
                version=version,
                message_count=C.c.message_count + len(rows),
            )
        )
        conn.execute(
            update(B)
            .where(B.c.id == branch_id)
            .values(head_message_id=new_head, head_depth=int(depth) + len(rows))
        )
        return version

    def _append_compound(
        self,
        conn: Connection,
        branch_id: str,
        rows: Sequence[MessageRow],
        *,
        first: bool,
        new_head: str,
        touched_at: datetime,
        owner: str,
        commit: bool,
    ) -> int:
        """MariaDB's append: the statements of `append` in one compound statement (``BEGIN
        NOT ATOMIC ... END``), one round trip; its checks refuse with a ``SIGNAL`` naming
        the `AppendRefused` reason, before anything is written. With ``commit``, the
        statement ends with the transaction's ``COMMIT`` (no second round trip), and the
        connection is marked so that closing it does not roll back (`install_hooks`)."""
        chat_id = rows[0].chat_id
        encode_time = self.encode_time
        params: list[Any] = [owner, rows[0].parent_id, 1 if first else 0, chat_id, branch_id]
        # Each message's search entries in key order (term; one seq each).
        entries = [sorted(int8_terms(row.terms)) for row in rows]
        for row in rows:
            params += (
                row.id, chat_id, row.parent_id, row.name, row.type, row.data,
                encode_time(row.created_at),
            )  # fmt: skip
        if len(rows) > 1:  # (one row's seq is the insert's LAST_INSERT_ID())
            params += [row.id for row, terms in zip(rows, entries, strict=True) if terms]
        params += (encode_time(touched_at), chat_id, new_head, branch_id)
        sql = _compound_append(self._names(conn), len(rows), entries, commit)
        self._check_packet(conn, params, len(rows), sql)
        try:
            version = int(conn.exec_driver_sql(sql, tuple(params)).scalar_one())
        except DBAPIError as exc:
            reason = _refused_reason(exc)
            if reason is not None:
                raise AppendRefused(reason) from None
            if self.is_unique_violation(exc):
                raise AppendRefused("exists") from None
            raise
        if commit:
            conn.info[COMMITTED] = True
        return version

    def _check_packet(
        self, conn: Connection, values: Sequence[object], rows: int, sql: str = ""
    ) -> None:
        """Refuse a statement the server would refuse for its size (`check_packet`)."""
        needed = packet_needed(self.sealer.encrypted)
        check_packet(conn, values, rows=rows, needed=needed, sql=sql)

    def _names(self, conn: Connection) -> dict[str, str]:
        """The tables of a compound statement as it writes them: in the store's schema,
        quoted, with ``%`` doubled for the driver's parameter format."""
        quote = conn.dialect.identifier_preparer.quote
        prefix = "" if self.schema is None else f"{quote(self.schema)}."
        return {
            table: f"{prefix}{quote(table)}".replace("%", "%%")
            for table in ("chats", "branches", "messages", "message_terms")
        }

    # --- search ------------------------------------------------------------------------------

    def message_upsert(self) -> Any:
        raise NotImplementedError("MariaDB/MySQL upserts messages in upsert_messages")

    def search_row_values(self, terms: ScopedTerms) -> dict[str, Any]:
        # The row keeps its terms, by which its entries are deleted (`delete_messages`).
        return {"terms_hex": terms_hex(sorted(int8_terms(terms)))}

    def index_rows(self, conn: Connection, rows: Sequence[tuple[int, ScopedTerms]]) -> None:
        # (Each row's search_hashes was written with it: `search_row_values`, `append`.)
        index_keys(conn, [(seq, int8_terms(terms)) for seq, terms in rows])

    def unindex_rows(self, conn: Connection, rows: Sequence[tuple[int, ScopedTerms]]) -> None:
        unindex(conn, [(seq, int8_terms(terms)) for seq, terms in rows])

    def search_shape(self, terms: int) -> int:
        # A statement per number of terms joined: a join repeating a term would cost a
        # lookup of the table's primary key per candidate (a third of a one-word search's
        # statement at a million messages).
        return max(1, min(terms, QUERY_TERMS))

    def _candidates(self, scope: ColumnElement[bool], shape: int) -> Select[Any]:
        # The first term's rows of the scope, newest first, that every other term has too:
        # each a join on the side table's key (term, seq); the server starts from whichever
        # term it finds fewer rows of.
        first = TERMS.alias("t0")
        joined: Any = first
        for index in range(1, shape):
            other = TERMS.alias(f"t{index}")
            joined = joined.join(
                other, and_(other.c.term == bindparam(f"term_{index}"), other.c.seq == first.c.seq)
            )
        joined = joined.join(M, M.c.seq == first.c.seq)
        return (
            select(*candidate_columns(self))
            .select_from(joined)
            .where(
                first.c.term == bindparam("term_0"), first.c.seq < bindparam("before_seq"), scope
            )
            .order_by(first.c.seq.desc())
            .limit(bindparam("search_limit"))
        )

    def search_params(self, mask: int, hashes: list[int]) -> dict[str, Any]:
        # (the statement of `search_shape(len(hashes))` joins this many terms)
        return query_terms_params(mask, hashes)

    # --- locks and errors ----------------------------------------------------------------------

    def take_migration_lock(self, connection: Connection) -> None:
        # A named lock of the server: held by this connection until released (DDL commits
        # transactions, so no transaction-scoped lock outlives the first statement). One
        # name for the whole server: with one per database, a migration failed once in a
        # CREATE TABLE while another database of the server was migrated (cause not found);
        # migrations are short and rare, so a server runs them one at a time.
        got = connection.execute(
            text("SELECT GET_LOCK(:name, :seconds)"), {"name": _MIGRATION_LOCK, "seconds": 300}
        ).scalar()
        if got != 1:
            raise StoreError(
                "another process has been migrating a database of this MariaDB/MySQL server "
                "for five minutes (migrations of one server run one at a time); wait for it "
                "to end, then try again"
            )

    def release_migration_lock(self, connection: Connection) -> None:
        connection.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": _MIGRATION_LOCK})

    def enter_schema(self, connection: Connection, schema: str, *, create: bool) -> None:
        # A schema is a database of the server (its tables state their own collation). The
        # migrations' tables are translated to it.
        if create and not _database_exists(connection, schema):
            # (Made IF NOT EXISTS all the same: the driver logs the warning of one that
            # exists, so it is looked for first.)
            connection.execute(CreateSchema(schema, if_not_exists=True))
        connection.execution_options(schema_translate_map={None: schema})

    def prepare_migrations(self, connection: Connection, schema: str | None) -> None:
        # Alembic names the version table's primary key, which these servers ignore with a
        # warning logged by the driver: the table is made here first, as Alembic would.
        _VERSION.create(connection, checkfirst=True)

    def is_transient(self, exc: BaseException) -> bool:
        return errno(exc) in _TRANSIENT

    def is_unique_violation(self, exc: BaseException) -> bool:
        return errno(exc) in _UNIQUE

    def is_foreign_key_violation(self, exc: BaseException) -> bool:
        return errno(exc) in _FOREIGN_KEY

    def is_out_of_range(self, exc: BaseException) -> bool:
        found = orig(exc)
        return errno(exc) in _OUT_OF_RANGE or isinstance(found, OverflowError)

    def translate(
        self, exc: BaseException, reason: str, url: URL, busy: bool
    ) -> ContextError | None:
        shown = url.render_as_string(hide_password=True)
        number = errno(exc)
        if number == _UNKNOWN_DATABASE:
            return StoreUnavailableError(
                f"the database {url.database!r} does not exist on the server of {shown}; "
                f"create it with: CREATE DATABASE `{url.database}` CHARACTER SET utf8mb4 (the "
                "store then creates its tables on first use, or run: agentcontext migrate "
                "upgrade)"
            )
        if number in _TOO_LARGE:
            needed = packet_needed(self.sealer.encrypted)
            return InvalidInputError(
                f"a statement was larger than the server of {shown} allows ({reason}); raise "
                f"max_allowed_packet to {needed} ({needed // 2**20}M) or more on the server"
            )
        if number in _TRANSIENT:
            return StoreUnavailableError(
                f"the server of {shown} kept rolling this call back to break deadlocks, or it "
                f"waited too long for a row lock ({reason}); nothing was written: try again "
                "(innodb_lock_wait_timeout bounds the wait)"
            )
        if number in _UNREACHABLE:
            return StoreUnavailableError(
                f"cannot reach the database at {shown}: {reason}. Check that the server is "
                "running, the URL is right and the user may connect; the store reconnects by "
                "itself once it is back"
            )
        return None


_REFUSED = "agentcontext: append refused: "
_REFUSE = f"SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{_REFUSED}%s';"
"""A compound append's refusal (error 1644), naming the `AppendRefused` reason."""


def _compound_append(
    names: Mapping[str, str], count: int, entries: list[list[int]], commit: bool
) -> str:
    """The compound statement of an append of ``count`` rows whose search entries are
    ``entries`` (one list per row), ending with a ``COMMIT`` if ``commit``. Its parameters,
    in order: the owner, the expected head, the version's bump, the chat, the branch; each
    row's id, chat, parent, name, type, data and time; the id of each row that has entries
    (if there are several rows); the time of the chat's activity, the chat, the new head,
    the branch. What is formatted in are quoted table names, integers and hexadecimal digits
    (each row's packed terms, `pack_terms`); every other value is a parameter."""
    chats, branches, messages = names["chats"], names["branches"], names["messages"]
    # The chat row, then the branch row, locked (every writer's lock order); the owner and
    # the head compared in the columns' binary collation; nothing written before the checks.
    parts = [
        "BEGIN NOT ATOMIC DECLARE f, o, h INT DEFAULT 0; DECLARE v, d, s BIGINT; "  # noqa: S608
        "SELECT STRAIGHT_JOIN 1, c.user_id = %s, b.head_message_id <=> %s, c.version + %s, "
        f"b.head_depth INTO f, o, h, v, d FROM {chats} AS c JOIN {branches} AS b "
        "ON b.chat_id = c.id WHERE c.id = %s AND b.id = %s FOR UPDATE; "
        f"IF f = 0 THEN {_REFUSE % 'branch'} END IF; "
        f"IF o = 0 THEN {_REFUSE % 'owner'} END IF; "
        f"IF h = 0 THEN {_REFUSE % 'moved'} END IF; "
        f"INSERT INTO {messages} (id, chat_id, parent_id, depth, name, type, data, "
        "search_hashes, created_at, version) VALUES ",
        ", ".join(
            f"(%s, %s, %s, d + {step}, %s, %s, %s, {hex_literal(terms)}, %s, v)"
            for step, terms in enumerate(entries, 1)
        ),
        "; ",
    ]
    for terms in entries:
        if terms:  # under the seq the server gave the row
            parts += (
                "SET s = LAST_INSERT_ID(); "  # the seq of the one row inserted
                if count == 1
                else f"SELECT seq INTO s FROM {messages} WHERE id = %s; ",  # noqa: S608
                "INSERT IGNORE INTO ",
                names["message_terms"],
                " (seq, term) VALUES ",
                "(s, ",
                "), (s, ".join(map(str, terms)),  # (ints: nothing else is formatted in)
                ")",
                "; ",
            )
    parts.append(
        f"UPDATE {chats} SET updated_at = %s, version = v, message_count = message_count + "  # noqa: S608
        f"{count:d} WHERE id = %s; UPDATE {branches} SET head_message_id = %s, "
        f"head_depth = d + {count:d} WHERE id = %s; {'COMMIT; ' if commit else ''}SELECT v; END"
    )
    return "".join(parts)


_REASONS: dict[str, Literal["branch", "owner", "moved"]] = {
    "branch": "branch",
    "owner": "owner",
    "moved": "moved",
}


def _refused_reason(exc: BaseException) -> Literal["branch", "owner", "moved"] | None:
    """The reason a compound append refused with (`_REFUSE`), if that is the error."""
    if errno(exc) != 1644:
        return None
    args: tuple[Any, ...] = tuple(getattr(orig(exc), "args", ()))
    message = str(args[1]) if len(args) > 1 else ""
    return _REASONS.get(message[len(_REFUSED) :]) if message.startswith(_REFUSED) else None


def _database_exists(connection: Connection, name: str) -> bool:
    """Whether the server has the database ``name`` (compared as the server compares database
    names: exactly, unless ``lower_case_table_names`` folds them)."""
    found = connection.execute(
        text("SELECT 1 FROM information_schema.schemata WHERE schema_name = :name"),
        {"name": name},
    ).first()
    return found is not None


_VERSION = Table(VERSION_TABLE, MetaData(), Column("version_num", String(32), primary_key=True))
"""Alembic's version table, as Alembic makes it (but for its primary key's name)."""

_UNHEX_TERMS = func.unhex(bindparam("terms_hex", type_=Text), type_=LargeBinary)
"""A message's ``search_hashes`` from `terms_hex` (the parameter ``terms_hex``)."""
_INSERT_MESSAGES = mysql.insert(M).values(
    data=bindparam("data_json", type_=Text), search_hashes=_UNHEX_TERMS
)
_INSERT_MESSAGES_RETURNING = _INSERT_MESSAGES.returning(M.c.id, M.c.seq)
_LOCK_FOR_APPEND = (
    select(C.c.user_id, C.c.version, B.c.head_message_id, B.c.head_depth)
    .prefix_with("STRAIGHT_JOIN")  # the chat row is read (and locked) before the branch row
    .select_from(C)
    .join(B, B.c.chat_id == C.c.id)
    .where(C.c.id == bindparam("chat_id"), B.c.id == bindparam("branch_id"))
    .with_for_update()
)
"""The rows of an append (run for many rows at once: one multi-row statement)."""
