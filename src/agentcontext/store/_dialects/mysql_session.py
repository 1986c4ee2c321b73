"""A MariaDB/MySQL connection's session and transactions: what the store sets up when a
connection opens, when a transaction starts, and what it sends (or need not send) when the
connection goes back to the pool.

**Reads without a rollback (MariaDB, engines the store made).** With the server's
``autocommit`` off, every statement opens a transaction, a read's too, and SQLAlchemy closes
it with a ``ROLLBACK``: one round trip of three in a request that reads a chat and saves a
turn. A MariaDB connection of an engine the store made runs with ``autocommit`` on instead, as
SQLite's connections do: a read (and the append's compound statement, which opens and commits
its own transaction) is one round trip, and a unit that writes several statements starts its
transaction itself (the ``begin`` hook: ``START TRANSACTION``, or a snapshot's
``REPEATABLE READ`` with ``WITH CONSISTENT SNAPSHOT``). Any other transaction on such a
connection (a caller's, ``store.begin()``, a migration) runs with ``autocommit`` off, as on any
connection, and the ``checkout`` hook turns it on again. An engine a caller made keeps its own
setting, and the store then works as it would with ``autocommit`` off.

**When a rollback is skipped.** Only when nothing can be open: the server's last status says
``autocommit`` is on and no transaction is open, and no statement has failed on the
connection since (a failed statement does not report the status, and may leave a
transaction open: a ``SIGNAL`` after ``START TRANSACTION`` in a compound statement); or the
last statement committed the transaction itself and the server says none is open (`COMMITTED`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from agentcontext.store._dialects.base import BEGIN_OPTION

__all__ = ["COMMITTED", "autocommits", "in_transaction", "install_hooks", "reset"]

_IN_TRANSACTION = 1
"""The server's status flag SERVER_STATUS_IN_TRANS, as the drivers keep it."""
_AUTOCOMMIT = 2
"""The server's status flag SERVER_STATUS_AUTOCOMMIT."""
COMMITTED = "agentcontext_committed"
"""A connection's ``info`` key: its last statement committed the transaction itself (a
compound append), so that SQLAlchemy's rollback when the connection closes is skipped."""
_FAILED = "agentcontext_failed"
"""A connection's ``info`` key: a statement failed on it since it was last reset."""
_AUTOCOMMIT_READS = "agentcontext_autocommit"
"""A connection's ``info`` key: the store runs it with ``autocommit`` on (see the module)."""


def _status(dbapi_connection: Any) -> int | None:
    driver = getattr(dbapi_connection, "driver_connection", dbapi_connection)
    status = getattr(driver, "server_status", None)
    return status if isinstance(status, int) else None


def autocommits(conn: Connection) -> bool:
    """Whether ``conn`` is one of the store's MariaDB connections that run with ``autocommit``
    on (and the caller has not asked SQLAlchemy for ``AUTOCOMMIT``): then a unit of several
    statements, or a transaction of the caller's, must start its transaction itself."""
    if not conn.info.get(_AUTOCOMMIT_READS):
        return False
    level = conn.get_execution_options().get("isolation_level") or getattr(
        conn.dialect, "isolation_level", None
    )
    status = _status(conn.connection.dbapi_connection)
    return level != "AUTOCOMMIT" and status is not None and bool(status & _AUTOCOMMIT)


def in_transaction(conn: Connection) -> bool:
    """Whether the server has a transaction open on ``conn``: its last status says, unless a
    statement failed on it since (a failure reports no status: the server is asked)."""
    status = _status(conn.connection.dbapi_connection)
    if status is None or conn.info.get(_FAILED):
        return bool(conn.exec_driver_sql("SELECT @@in_transaction").scalar())
    return bool(status & _IN_TRANSACTION)


def _nothing_open(dbapi_connection: Any, info: dict[str, Any] | None) -> bool:
    """Whether the connection has certainly no transaction open on the server, by its last
    status: trusted when no statement failed since, and either autocommit is on or the last
    statement committed the transaction itself."""
    status = _status(dbapi_connection)
    if status is None or status & _IN_TRANSACTION or info is None:
        return False
    committed = info.pop(COMMITTED, False)
    if info.get(_FAILED):
        return False
    return committed or bool(status & _AUTOCOMMIT)


def _skip_needless_rollback(do_rollback: Any) -> Any:
    """The dialect's rollback, skipped when the connection has certainly nothing to roll back
    (a round trip saved on every read and every save)."""

    def rollback(dbapi_connection: Any) -> None:
        try:
            info = dbapi_connection.info  # (the pool's connection: its record's info)
        except (AttributeError, NotImplementedError):
            info = None  # (a connection being set up)
        info = info if isinstance(info, dict) else None
        if not _nothing_open(dbapi_connection, info):
            do_rollback(dbapi_connection)
            if info is not None:
                info.pop(_FAILED, None)  # whatever had failed is rolled back

    return rollback


def reset(dbapi_connection: Any, record: Any, reset_state: Any) -> None:
    """Reset a connection returned to the pool: a rollback when the server's last status says
    a transaction is open, when it is unknown, or when a statement failed since the last
    rollback (its status is not reported)."""
    info = record.info
    status = _status(dbapi_connection)
    unsure = status is None or status & _IN_TRANSACTION or info.get(_FAILED)
    if not reset_state.terminate_only and unsure:
        dbapi_connection.rollback()
    info.pop(COMMITTED, None)
    info.pop(_FAILED, None)


def install_hooks(
    engine: AsyncEngine, command_timeout: float | None, *, autocommit_reads: bool = False
) -> None:
    """Set every new connection of ``engine`` up for the store (once per engine): UTC session
    time, strict SQL mode, recursive walks of any length, the statement timeout, what the
    server allows in one statement (read into the connection's ``info``), and with
    ``autocommit_reads`` (an engine the store made) ``autocommit`` on, on MariaDB."""
    sync_engine = engine.sync_engine
    if sync_engine.__dict__.get("_agentcontext_hooks"):
        return
    sync_engine.__dict__["_agentcontext_hooks"] = True
    dialect = sync_engine.dialect
    dialect.do_rollback = _skip_needless_rollback(dialect.do_rollback)  # type: ignore[method-assign]

    @event.listens_for(sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("SELECT VERSION(), @@max_allowed_packet")
            version, packet = cursor.fetchone()
            record.info["max_allowed_packet"] = int(packet)
            timeout = 0.0 if command_timeout is None else float(command_timeout)
            if "mariadb" in str(version).lower():
                session = _MARIADB_AUTOCOMMIT if autocommit_reads else _MARIADB_SESSION
                cursor.execute(session, (timeout,))
                record.info[_AUTOCOMMIT_READS] = autocommit_reads
            else:
                cursor.execute(_MYSQL_SESSION, (int(timeout * 1000),))
        finally:
            cursor.close()

    @event.listens_for(sync_engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        # A transaction of the caller's (`_on_begin`), or an isolation level set for one unit
        # and reset since, left autocommit off: on again, before the connection serves the
        # next unit.
        status = _status(dbapi_connection)
        if record.info.get(_AUTOCOMMIT_READS) and status is not None and not status & _AUTOCOMMIT:
            dbapi_connection.autocommit(True)

    @event.listens_for(sync_engine, "begin")
    def _on_begin(connection: Connection) -> None:
        # A store's unit says what it needs (`MySQLDialect.prepare`). Any other transaction
        # (the caller's on `store.engine`, `store.begin()`, a migration) runs with autocommit
        # off, as on any connection: should the server end it on its own (a deadlock's
        # victim, DDL's implicit commit), the statements after it open another, which the
        # caller's rollback undoes. The checkout hook turns autocommit on again.
        begin = connection.get_execution_options().get(BEGIN_OPTION)
        if begin == "none" or not autocommits(connection):
            return  # (with autocommit off, the first statement opens the transaction)
        if begin == "snapshot":
            connection.exec_driver_sql(_SNAPSHOT)
        elif begin == "unit":
            connection.exec_driver_sql("START TRANSACTION")
        else:
            dbapi: Any = connection.connection.dbapi_connection
            dbapi.autocommit(False)

    @event.listens_for(sync_engine, "handle_error")
    def _on_error(context: Any) -> None:
        connection = context.connection
        if connection is not None and not connection.closed and not connection.invalidated:
            connection.info[_FAILED] = True


_SNAPSHOT = (
    "BEGIN NOT ATOMIC SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; "
    "START TRANSACTION WITH CONSISTENT SNAPSHOT; END"
)
"""A snapshot unit's start, in one round trip: the next transaction at REPEATABLE READ (the
session stays at READ COMMITTED), its snapshot taken at once."""
_MARIADB_SESSION = (
    "SET SESSION time_zone = '+00:00', "
    "sql_mode = CONCAT(@@sql_mode, ',STRICT_TRANS_TABLES,NO_ZERO_DATE'), "
    "max_recursive_iterations = 4294967295, max_statement_time = %s"
)
"""A MariaDB connection's settings: UTC, strict, recursive walks of any length, the
statement timeout in seconds (0: none)."""
_MARIADB_AUTOCOMMIT = _MARIADB_SESSION + ", autocommit = 1"
"""The same, with ``autocommit`` on (an engine the store made)."""
_MYSQL_SESSION = (
    "SET SESSION time_zone = '+00:00', "
    "sql_mode = CONCAT(@@sql_mode, ',STRICT_TRANS_TABLES,NO_ZERO_DATE'), "
    "cte_max_recursion_depth = 4294967295, max_execution_time = %s"
)
"""A MySQL connection's: the same, the timeout in milliseconds (of reads; 0: none)."""
