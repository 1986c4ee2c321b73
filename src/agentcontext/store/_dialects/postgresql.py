"""PostgreSQL through asyncpg, directly or behind PgBouncer in transaction pooling mode.

Lone statements run without BEGIN/COMMIT round trips (autocommit), except behind PgBouncer,
where every statement runs in a transaction; the append of a save is one statement that
locks the chat then the branch (the lock order of every writer) and compare-and-swaps the
head; search candidates are the messages whose search terms (an ``int4[]`` under a GIN index:
each token under its chat's and its user's masks) contain the query's, in the scope searched
only, checked exactly in Python; concurrent migrations are serialised by an advisory lock.
"""

from __future__ import annotations

import re
import shlex
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any, Literal

from sqlalchemy import (
    ColumnElement,
    Connection,
    DateTime,
    Integer,
    LargeBinary,
    Select,
    String,
    Table,
    Text,
    bindparam,
    cast,
    func,
    literal,
    select,
    text,
    type_coerce,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.schema import CreateSchema

from agentcontext._drivers import unknown_arguments
from agentcontext.errors import ContextError, InvalidInputError, StoreError, StoreUnavailableError
from agentcontext.store._db.schema import SEARCH_HASHES_INDEX
from agentcontext.store._db.schema import chats as C
from agentcontext.store._db.schema import messages as M
from agentcontext.store._dialects import postgresql_search as _search
from agentcontext.store._dialects.base import (
    AppendRefused,
    Dialect,
    EngineOptions,
    MessageRow,
    Mode,
    candidate_columns,
    message_upsert,
    orig,
    sqlstate,
)
from agentcontext.store._rows.terms import ScopedTerms

__all__ = ["PostgresDialect", "int4_terms", "terms_text", "unique_statement_name"]

_TRUE = ("1", "true", "yes", "on")
_MIGRATION_LOCK_KEY = 0x61676E7463747800 >> 8  # "agntctx", fits a signed bigint

_APPEND_SQL = """
WITH touched AS (
    UPDATE chats SET updated_at = :touched_at, version = version + :bump,
                     message_count = message_count + :count
    WHERE id = :chat_id AND user_id = :owner
    RETURNING version
), cur AS (
    SELECT b.head_message_id, b.head_depth FROM branches AS b, touched
    WHERE b.id = :branch_id AND b.chat_id = :chat_id
    FOR UPDATE OF b
), present AS (
    SELECT ln((SELECT count(*) FROM cur)) AS ok FROM touched
), guard AS (
    SELECT 1 / (CASE WHEN cur.head_message_id IS NOT DISTINCT FROM CAST(:expected AS VARCHAR)
                     THEN 1 ELSE 0 END) AS ok
    FROM cur
), ins AS (
    INSERT INTO messages (id, chat_id, parent_id, depth, name, type, data, search_hashes,
                          created_at, version)
    SELECT r.id, :chat_id, r.parent_id, cur.head_depth + r.step, r.name, r.type,
           CAST(r.data AS JSON), CAST(r.hashes AS INT4[]), r.created_at, touched.version
    FROM touched, cur, guard,
         unnest(CAST(:ids AS VARCHAR[]), CAST(:parents AS VARCHAR[]), CAST(:names AS VARCHAR[]),
                CAST(:types AS VARCHAR[]), CAST(:datas AS TEXT[]), CAST(:hashes AS TEXT[]),
                CAST(:created AS TIMESTAMPTZ[]))
           WITH ORDINALITY AS r(id, parent_id, name, type, data, hashes, created_at, step)
    WHERE guard.ok = 1
    RETURNING 1
), moved AS (
    UPDATE branches SET head_message_id = :new_head, head_depth = cur.head_depth + :count
    FROM cur
    WHERE branches.id = :branch_id AND (SELECT count(*) FROM ins) = :count
    RETURNING 1
)
SELECT (SELECT version FROM touched), (SELECT count(*) FROM moved), (SELECT ok FROM present),
       (SELECT count(*) FROM touched)
"""
_PG_APPEND = text(_APPEND_SQL)
"""One statement, one round trip, atomic on its own. Data dependencies fix the order of its
parts, and with it the lock order every writer follows (the chat row, then the branch row):
``touched`` locks the chat and bumps its version and message count (only if it still belongs
to the user the search terms were made for), ``cur`` locks the branch
and reads its head and the head's depth, ``present`` fails the whole statement (the
logarithm of zero, nothing applied: the chat's row is left as it was) when the chat was
touched but its branch is gone (deleted, or of another chat), ``guard`` fails it (division by
zero) when the head is not the expected one, ``ins`` inserts the messages chained below it,
``moved`` moves the head. An existing id breaks the unique index: the statement fails too.
(``present`` is read by the final SELECT, which is what makes PostgreSQL evaluate it: a
``SELECT`` step runs only as far as something reads it.) Each row's search terms come as the
text of an ``int4[]`` (`terms_text`), cast per row: cheaper, in Python and in the server,
than slicing one flat array."""


_WRITE_POSITION = "SELECT pg_current_wal_insert_lsn() - CAST('0/0' AS pg_lsn)"
_REPLAY_POSITION = (
    "SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() - CAST('0/0' AS pg_lsn) END"
)
"""WAL positions (LSNs) as byte offsets, compared as numbers. NULL on a server not in recovery:
a promoted standby keeps its last replayed position, but no longer follows the primary."""

_REPLICA_IDENTITY = (
    "SELECT (SELECT system_identifier FROM pg_control_system()), d.oid "
    "FROM pg_database AS d WHERE d.datname = current_database()"
)
"""The cluster's system identifier (kept by its physical standbys, new in any other cluster)
and the database's oid (the same on a standby): a standby's other database, or another
cluster's, differs in one of them."""

_INT4_ARRAY = postgresql.ARRAY(Integer())


class PostgresDialect(Dialect):
    """PostgreSQL through asyncpg (directly or behind PgBouncer in transaction mode)."""

    name = "postgresql"
    title = "PostgreSQL"
    driver = "asyncpg"
    options = frozenset(
        {"connect_timeout", "command_timeout", "pgbouncer", "schema", "read_replicas",
         "replica_wait"}
    )  # fmt: skip
    append_chunk = 50_000  # arrays: one statement, however many rows
    exact_candidates = False
    raw_json_misleads_planner = True  # json_send of the column is guessed 32 bytes wide
    migration_only = frozenset({SEARCH_HASHES_INDEX})  # a model's index would be on SQLite too
    entries_go_with_rows = True  # search_hashes is a column of the row

    def __init__(self, *, pgbouncer: bool = False, schema: str | None = None) -> None:
        self.pgbouncer = pgbouncer
        self.schema = schema
        self._append = _PG_APPEND if schema is None else _qualified(_APPEND_SQL, schema)
        self._plans = _search.Plans(text if schema is None else partial(_qualified, schema=schema))
        self.atomic_needs_commit = pgbouncer
        """Behind PgBouncer in transaction pooling mode every statement runs in a transaction:
        outside one, the preparing and the running of a statement may reach different server
        connections."""

    # --- engine -----------------------------------------------------------------------------

    @classmethod
    def from_url(cls, url: URL, options: EngineOptions) -> PostgresDialect:
        flag = url.query.get("pgbouncer")
        wanted = bool(options.pgbouncer) or (isinstance(flag, str) and flag.lower() in _TRUE)
        if options.schema is not None:
            return PostgresDialect(pgbouncer=wanted, schema=options.schema)
        return _PGBOUNCER if wanted else _POSTGRES

    @classmethod
    def from_engine(cls, engine: AsyncEngine, options: EngineOptions) -> PostgresDialect:
        if options.schema is not None:
            return PostgresDialect(pgbouncer=bool(options.pgbouncer), schema=options.schema)
        return _PGBOUNCER if options.pgbouncer else _POSTGRES

    @classmethod
    def check_schema(cls, schema: str) -> None:
        if schema.startswith("pg_"):
            raise InvalidInputError(
                f"schema {schema!r} is not a usable schema name: PostgreSQL reserves names "
                "starting with 'pg_' for its system schemas (pg_catalog, pg_toast, pg_temp_N, "
                "...), and a store must not put its tables there; choose a tenant's own name, "
                "e.g. 'tenant_acme'"
            )
        if schema == "information_schema":
            raise InvalidInputError(
                "schema 'information_schema' is not a usable schema name: it is PostgreSQL's "
                "system schema of catalogue views (the SQL standard's), and a store must not "
                "put its tables there; choose a tenant's own name, e.g. 'tenant_acme'"
            )

    def make_engine(self, url: URL, options: EngineOptions, kwargs: dict[str, Any]) -> AsyncEngine:
        connect_args = dict(kwargs.pop("connect_args", None) or {})
        _refuse_libpq_options(url, connect_args)
        connect_args.setdefault("timeout", float(options.connect_timeout))
        if options.command_timeout is not None:
            connect_args.setdefault("command_timeout", options.command_timeout)
        if self.pgbouncer:
            connect_args.setdefault("statement_cache_size", 0)
            connect_args.setdefault("prepared_statement_cache_size", 0)
            connect_args.setdefault("prepared_statement_name_func", unique_statement_name)
        engine = create_async_engine(
            url.difference_update_query(["pgbouncer"]), connect_args=connect_args, **kwargs
        )
        _refuse_unknown_arguments(engine, url, connect_args)
        return engine

    def prepare(self, conn: Connection, mode: Mode) -> None:
        if mode == "snapshot":
            conn.execution_options(isolation_level="REPEATABLE READ")
        elif mode != "write" and not self.pgbouncer:
            # No BEGIN and COMMIT round trips for lone statements.
            conn.execution_options(isolation_level="AUTOCOMMIT")

    def database_identity(self, conn: Connection) -> tuple[Any, ...]:
        # The database's oid and the server's start time tell apart databases of one name on
        # two servers (or ports), and reach the same answer through PgBouncer.
        row = conn.exec_driver_sql(
            "SELECT current_database(), d.oid, pg_postmaster_start_time() "
            "FROM pg_database AS d WHERE d.datname = current_database()"
        ).one()
        return ("postgresql", row[0], int(row[1]), row[2].isoformat())

    def write_position(self, conn: Connection) -> int | None:
        # The insert position, not the write position: with synchronous_commit=off a commit
        # has returned before its record is written, and only the insert position is past it.
        if not self.pgbouncer and not conn.in_transaction():
            # After a transaction's commit: one round trip, no BEGIN. (After a lone statement
            # the connection is in autocommit already.)
            conn.execution_options(isolation_level="AUTOCOMMIT")
        value = conn.exec_driver_sql(_WRITE_POSITION).scalar_one()
        return None if value is None else int(value)

    def replay_position(self, conn: Connection) -> int | None:
        # NULL on a server that is not in recovery (not a standby, or one promoted since).
        value = conn.exec_driver_sql(_REPLAY_POSITION).scalar_one()
        return None if value is None else int(value)

    def replica_identity(self, conn: Connection) -> tuple[Any, ...] | None:
        row = conn.exec_driver_sql(_REPLICA_IDENTITY).one()
        return (int(row[0]), int(row[1]))

    def encode_time(self, moment: datetime) -> datetime:
        return moment.astimezone(UTC)

    def decode_time(self, value: Any) -> Any:
        assert isinstance(value, datetime)
        return value if value.tzinfo is UTC else value.astimezone(UTC)

    def raw_json(self, column_: Any) -> ColumnElement[Any]:
        # The json type's own binary output: its text in the client's encoding (UTF-8 for
        # asyncpg), one copy on the server; a cast to text and convert_to cost three.
        return func.json_send(column_, type_=LargeBinary)

    def raw_time(self, column_: Any) -> ColumnElement[Any]:
        return type_coerce(column_, DateTime(timezone=True))

    def insert(self, table: Table) -> Any:
        return postgresql.insert(table)

    def insert_blobs(self, table: Table) -> Any:
        # Touch an existing row (DO UPDATE) so it stays locked until the writer's transaction
        # ends: a concurrent garbage collection (FOR UPDATE SKIP LOCKED) cannot delete it.
        insert = postgresql.insert(table)
        return insert.on_conflict_do_update(
            index_elements=[table.c.hash], set_={"size": insert.excluded.size}
        )

    def metadata_filter(self, column: Any, wanted: Mapping[str, str | int | bool]) -> Any:
        # (The column is json, kept as written: cast where the filter looks inside.)
        return cast(column, postgresql.JSONB()).contains(dict(wanted))

    def roles_filter(self, column_: ColumnElement[Any]) -> ColumnElement[bool]:
        return column_ == func.any(bindparam("roles", type_=postgresql.ARRAY(String())))

    def roles_value(self, roles: Sequence[str]) -> Any:
        return list(roles)

    def lock_chat(self, conn: Connection, chat_id: str) -> None:
        conn.execute(select(literal(1)).where(C.c.id == chat_id).with_for_update())

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
        params = {
            "owner": owner,
            "touched_at": touched_at,
            "bump": 1 if first else 0,
            "count": len(rows),
            "chat_id": rows[0].chat_id,
            "branch_id": branch_id,
            "expected": rows[0].parent_id,
            "new_head": new_head,
            "ids": [row.id for row in rows],
            "parents": [row.parent_id for row in rows],
            "names": [row.name for row in rows],
            "types": [row.type for row in rows],
            "datas": ["null" if row.data is None else row.data for row in rows],
            "hashes": [terms_text(row.terms) for row in rows],
            "created": [row.created_at for row in rows],
        }
        try:
            version, moved, _, touched = conn.execute(self._append, params).one()
        except DBAPIError as exc:
            state = sqlstate(exc)
            if state == "22012":  # the guard: the head was not the expected one
                raise AppendRefused("moved") from None
            if state == "2201E":  # present: the chat has no such branch (any more)
                raise AppendRefused("branch") from None
            if self.is_unique_violation(exc):
                raise AppendRefused("exists") from None
            raise
        if not touched:
            raise AppendRefused("owner")  # (or the chat is gone: the general path says)
        if not moved:  # (not reached: `present` refuses a missing branch before this)
            raise AppendRefused("branch")
        return int(version)

    def message_upsert(self) -> Any:
        return message_upsert(
            self.insert(M),
            cast(bindparam("data_json", type_=Text), postgresql.JSON),
            search_hashes=bindparam("hashes", type_=_INT4_ARRAY),
        )

    def search_row_values(self, terms: ScopedTerms) -> dict[str, Any]:
        return {"hashes": int4_terms(terms) or None}

    def index_rows(self, conn: Connection, rows: Sequence[tuple[int, ScopedTerms]]) -> None:
        """The terms are a column of the row itself (the GIN index follows it)."""

    def unindex_rows(self, conn: Connection, rows: Sequence[tuple[int, ScopedTerms]]) -> None:
        """The terms go with the row."""

    def _candidates(self, scope: ColumnElement[bool], shape: int) -> Select[Any]:
        # ``@>`` (contains every hash of the query) is what the GIN index on search_hashes
        # answers, without reading the chat's other messages; a large scope's common words
        # are read by windows of the newest rows instead (`postgresql_search`).
        return _search.candidates(scope, candidate_columns(self))

    def search_params(self, mask: int, hashes: list[int]) -> dict[str, Any]:
        folded = _fold(mask)
        return {"query_hashes": [(_folded(h) ^ folded) - _SIGN for h in hashes]}

    search_mode = "snapshot"  # a transaction, for the settings of `prepare_search`

    def prepare_search(
        self, conn: Connection, scope: Literal["chat", "user"], scope_id: str
    ) -> object:
        # A search must never depend on the planner's guess of where the scope's matches
        # are: in its transaction index scans (and sequential scans) are off and the GIN
        # index is read as a bitmap, the matches then sorted newest first, except where the
        # search itself chooses to walk the newest rows (`postgresql_search`).
        return self._plans.prepare(conn, scope, scope_id)

    def fetch_candidates(
        self, conn: Connection, statement: Select[Any], params: dict[str, Any], prepared: object
    ) -> Sequence[Any]:
        return self._plans.fetch(conn, statement, params, prepared)

    def enter_schema(self, connection: Connection, schema: str, *, create: bool) -> None:
        # The schema unqualified names resolve to: ``SET LOCAL`` (``set_config(..., true)``,
        # the value bound, not formatted into the SQL) lasts for the transaction only, so it
        # holds behind PgBouncer in transaction pooling mode too.
        if create:
            connection.execute(CreateSchema(schema, if_not_exists=True))
        quoted = connection.dialect.identifier_preparer.quote_identifier(schema)
        connection.execute(text("SELECT set_config('search_path', :path, true)"), {"path": quoted})

    def take_migration_lock(self, connection: Connection) -> None:
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY})

    def is_unique_violation(self, exc: BaseException) -> bool:
        return sqlstate(exc) == "23505"

    def is_foreign_key_violation(self, exc: BaseException) -> bool:
        return sqlstate(exc) == "23503"

    def is_out_of_range(self, exc: BaseException) -> bool:
        state = sqlstate(exc)
        found = orig(exc)
        return (
            state in {"22003", "22008", "22007"}
            or isinstance(found, OverflowError)
            or "out of range" in str(found)
        )

    def translate(
        self, exc: BaseException, reason: str, url: URL, busy: bool
    ) -> ContextError | None:
        shown = url.render_as_string(hide_password=True)
        # A prepared statement that vanished (26000), that another client already prepared
        # under the same name (42P05), or whose parameters belong to another statement
        # (08P01): asyncpg's statements met other server connections than the one that
        # prepared them, the mark of a pooler in transaction mode the store was not told of.
        state = sqlstate(exc)
        if not self.pgbouncer and (
            state in ("26000", "42P05") or (state == "08P01" and "prepared statement" in reason)
        ):
            return StoreError(
                f"database error on {shown}: {reason}. The server looks like PgBouncer in "
                "transaction pooling mode, where a prepared statement does not outlive its "
                "transaction: add ?pgbouncer=true to the URL (or pass pgbouncer=True to "
                "SqlContextStore)"
            )
        if _names_missing_database(exc):
            words = ["createdb"]
            for flag, value in (("-h", url.host), ("-p", url.port), ("-U", url.username)):
                if value:
                    words += [flag, str(value)]
            words.append(url.database or "")
            return StoreUnavailableError(
                f"the database {url.database!r} does not exist on the server of {shown}; "
                f"create it with: {shlex.join(words)} (the store then creates its tables on "
                "first use, or run: agentcontext migrate upgrade)"
            )
        return None


_SIGN = 1 << 31
_LOW = (1 << 32) - 1


def _fold(value: int) -> int:
    """A 64-bit hash or mask folded to 32 bits (the XOR of its halves)."""
    return ((value >> 32) ^ value) & _LOW


_folds: dict[int, int] = {}


def _folded(value: int) -> int:
    """`_fold` of a token's hash, offset so that the XOR with a folded mask, less 2**31, is a
    signed ``int4`` (remembered: words recur)."""
    found = _folds.get(value)
    if found is None:
        if len(_folds) >= 1 << 17:
            _folds.clear()
        found = _folds[value] = _fold(value) ^ _SIGN
    return found


def int4_terms(terms: ScopedTerms) -> list[int]:
    """A message's search terms as PostgreSQL indexes them: for each token, its hash under
    its chat's mask, then under its user's, folded to a signed ``int4`` (the XOR of the two
    32-bit folds, less 2**31). Part of the on-disk format."""
    folded = list(map(_folded, terms.hashes))
    chat, user = _fold(terms.chat), _fold(terms.user)
    return [(f ^ chat) - _SIGN for f in folded] + [(f ^ user) - _SIGN for f in folded]


def terms_text(terms: ScopedTerms) -> str | None:
    """`int4_terms` as PostgreSQL ``int4[]`` input (``{-5,17}``; None for no token): a bound
    value, cast to ``int4[]`` by the statement."""
    values = int4_terms(terms)
    return "{" + repr(values)[1:-1] + "}" if values else None


def _qualified(sql: str, schema: str) -> Any:
    """``sql`` with the store's tables named in ``schema`` (raw SQL is not translated by
    SQLAlchemy's ``schema_translate_map``)."""
    for name in ("messages", "branches", "chats"):
        sql = re.sub(rf"\b(UPDATE|FROM|INTO|JOIN)(\s+){name}\b", rf'\1\2"{schema}".{name}', sql)
        sql = re.sub(rf"(,\s*){name}\b(?=\s+AS\b)", rf'\1"{schema}".{name}', sql)
    return text(sql)


_POSTGRES = PostgresDialect()
_PGBOUNCER = PostgresDialect(pgbouncer=True)


def unique_statement_name() -> str:
    """A prepared-statement name no other client can hold (behind PgBouncer)."""
    # asyncpg numbers statements per client connection; behind PgBouncer two clients would
    # collide on one server connection. A random name cannot.
    return f"__agentcontext_{uuid.uuid4().hex}__"


_SEARCH_PATH = re.compile(r"(?:-c\s*|--)search_path\s*=\s*([^\s,]+)")


def _refuse_libpq_options(url: URL, connect_args: Mapping[str, Any]) -> None:
    """Refuse, when the store is made, what asyncpg would only refuse on the first connection
    with a raw ``TypeError``: libpq's ``options`` (``?options=-csearch_path%3Dacme``, a common
    way to pick a schema), in the URL or in ``connect_args``."""
    given = url.query.get("options")
    where, drop = "the URL's options=", "remove options= from the URL"
    if given is None and "options" in connect_args:
        given = connect_args["options"]
        where, drop = "connect_args={'options': ...}", "remove 'options' from connect_args"
    if given is None:
        return
    found = _SEARCH_PATH.search(" ".join(given) if isinstance(given, tuple) else str(given))
    if found is not None:
        schema = found.group(1).strip("'\"")
        raise InvalidInputError(
            f"{where} (libpq's '-c search_path=...') is not supported by the asyncpg driver, "
            f"and a store does not follow a search_path: to keep a tenant's tables in schema "
            f"{schema!r}, pass schema={schema!r} to SqlContextStore (on the command line: "
            f"--schema {schema}, or AGENTCONTEXT_SCHEMA={schema}) and {drop}"
        )
    raise InvalidInputError(
        f"{where} (libpq's '-c name=value' settings) is not supported by the asyncpg driver: "
        "pass server settings as connect_args={'server_settings': {'name': 'value'}}, and a "
        f"tenant's schema as schema='name' (on the command line: --schema name), and {drop}"
    )


def _refuse_unknown_arguments(
    engine: AsyncEngine, url: URL, connect_args: Mapping[str, Any]
) -> None:
    """Refuse, when the store is made, a URL query or ``connect_args`` name asyncpg's
    ``connect()`` does not take (``?bogus=1``): it would fail only when the first connection
    opens, as a raw ``TypeError``."""
    from_url, from_args, takes = unknown_arguments(engine, connect_args)
    unknown = sorted({*from_url, *from_args})
    if unknown:
        shown = url.render_as_string(hide_password=True)
        raise InvalidInputError(
            f"the asyncpg driver takes no argument {', '.join(map(repr, unknown))} (from the "
            f"query of the URL {shown} or connect_args): remove it; asyncpg's connect() "
            f"takes {', '.join(takes)}"
        )


def _names_missing_database(error: BaseException) -> bool:
    """Whether the error, or one it was raised from, is PostgreSQL's "database does not
    exist" (SQLSTATE 3D000, invalid_catalog_name)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if getattr(current, "sqlstate", None) == "3D000" or (
            type(current).__name__ == "InvalidCatalogNameError"
        ):
            return True
        nxt = getattr(current, "orig", None) or current.__cause__ or current.__context__
        current = nxt if isinstance(nxt, BaseException) else None
    return False
