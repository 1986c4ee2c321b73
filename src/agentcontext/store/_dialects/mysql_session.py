"""A MariaDB/MySQL connection as the store sets it up: session settings when it opens, and no
rollback round trip when the server says no transaction is open (after a compound append that
committed itself, and on the way back to the pool).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["COMMITTED", "install_hooks", "reset"]

_IN_TRANSACTION = 1
"""The server's status flag SERVER_STATUS_IN_TRANS, as the drivers keep it."""
COMMITTED = "agentcontext_committed"
"""A connection's ``info`` key: its last statement committed the transaction itself (a
compound append), so that SQLAlchemy's rollback when the connection closes is skipped."""


def _skip_committed(do_rollback: Any) -> Any:
    """The dialect's rollback, skipped right after a statement that committed the transaction
    itself, when the server's last status says no transaction is open (a round trip saved on
    every save)."""

    def rollback(dbapi_connection: Any) -> None:
        try:
            info = dbapi_connection.info  # (the pool's connection: its record's info)
        except (AttributeError, NotImplementedError):
            info = None  # (a connection being set up)
        if isinstance(info, dict) and info.pop(COMMITTED, False):
            driver = getattr(dbapi_connection, "driver_connection", None)
            status = getattr(driver, "server_status", None)
            if isinstance(status, int) and not status & _IN_TRANSACTION:
                return
        do_rollback(dbapi_connection)

    return rollback


def reset(dbapi_connection: Any, record: Any, reset_state: Any) -> None:
    """Reset a connection returned to the pool: a rollback unless the server's last status
    says no transaction is open (an unknown status is rolled back)."""
    record.info.pop(COMMITTED, None)
    if reset_state.terminate_only:
        return
    driver = getattr(dbapi_connection, "driver_connection", None)
    status = getattr(driver, "server_status", None)
    if not isinstance(status, int) or status & _IN_TRANSACTION:
        dbapi_connection.rollback()


def install_hooks(engine: AsyncEngine, command_timeout: float | None) -> None:
    """Set every new connection of ``engine`` up for the store (once per engine): UTC session
    time, strict SQL mode, recursive walks of any length, the statement timeout, and what the
    server allows in one statement (read into the connection's ``info``)."""
    sync_engine = engine.sync_engine
    if sync_engine.__dict__.get("_agentcontext_hooks"):
        return
    sync_engine.__dict__["_agentcontext_hooks"] = True
    dialect = sync_engine.dialect
    dialect.do_rollback = _skip_committed(dialect.do_rollback)  # type: ignore[method-assign]

    @event.listens_for(sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("SELECT VERSION(), @@max_allowed_packet")
            version, packet = cursor.fetchone()
            record.info["max_allowed_packet"] = int(packet)
            mariadb = "mariadb" in str(version).lower()
            timeout = 0.0 if command_timeout is None else float(command_timeout)
            if mariadb:
                cursor.execute(_MARIADB_SESSION, (timeout,))
            else:
                cursor.execute(_MYSQL_SESSION, (int(timeout * 1000),))
        finally:
            cursor.close()


_MARIADB_SESSION = (
    "SET SESSION time_zone = '+00:00', "
    "sql_mode = CONCAT(@@sql_mode, ',STRICT_TRANS_TABLES,NO_ZERO_DATE'), "
    "max_recursive_iterations = 4294967295, max_statement_time = %s"
)
"""A MariaDB connection's settings: UTC, strict, recursive walks of any length, the
statement timeout in seconds (0: none)."""
_MYSQL_SESSION = (
    "SET SESSION time_zone = '+00:00', "
    "sql_mode = CONCAT(@@sql_mode, ',STRICT_TRANS_TABLES,NO_ZERO_DATE'), "
    "cte_max_recursion_depth = 4294967295, max_execution_time = %s"
)
"""A MySQL connection's: the same, the timeout in milliseconds (of reads; 0: none)."""
