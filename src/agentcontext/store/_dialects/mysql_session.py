"""A MariaDB/MySQL connection as the store sets it up: the driver's arguments checked when the
store is made, session settings when it opens, and no rollback round trip when the server says
no transaction is open (after a compound append that committed itself, and on the way back to
the pool).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from agentcontext._drivers import unknown_arguments
from agentcontext.errors import InvalidInputError
from agentcontext.store._dialects.mysql_packet import check_statement

__all__ = ["COMMITTED", "check_connect_args", "install_hooks", "reset"]

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

    @event.listens_for(sync_engine, "before_cursor_execute")
    def _check_size(conn: Any, cursor: Any, statement: str, parameters: Any, *_rest: Any) -> None:
        # A statement over the packet limit is dropped by the server with the connection:
        # refused here instead, naming the setting (`check_statement`).
        check_statement(conn, statement, parameters)

    @event.listens_for(sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("SELECT VERSION(), @@max_allowed_packet, @@sql_mode")
            version, packet, mode = cursor.fetchone()
            record.info["max_allowed_packet"] = int(packet)
            mariadb = "mariadb" in str(version).lower()
            timeout = 0.0 if command_timeout is None else float(command_timeout)
            if mariadb:
                cursor.execute(_MARIADB_SESSION, (sql_mode(mode), timeout))
            else:
                cursor.execute(_MYSQL_SESSION, (sql_mode(mode), int(timeout * 1000)))
        finally:
            cursor.close()


_DROPPED_MODES = frozenset({"ORACLE", "EMPTY_STRING_IS_NULL"})


def sql_mode(current: object) -> str:
    """The SQL mode of a store's connection, from the one it opened with (the server's, or
    the URL's ``init_command``): strict, without zero dates, without ``ORACLE`` (under
    which MariaDB parses another language: the compound statement of an append would not
    parse) and without ``EMPTY_STRING_IS_NULL`` (an empty title would read back as none);
    the rest is kept (``ANSI_QUOTES`` as SQLAlchemy found it when it connected)."""
    text = current.decode() if isinstance(current, bytes) else str(current or "")
    modes = [mode for mode in text.split(",") if mode and mode not in _DROPPED_MODES]
    modes += [mode for mode in ("STRICT_TRANS_TABLES", "NO_ZERO_DATE") if mode not in modes]
    return ",".join(modes)


_MARIADB_SESSION = (
    "SET SESSION time_zone = '+00:00', sql_mode = %s, "
    "max_recursive_iterations = 4294967295, max_statement_time = %s"
)
"""A MariaDB connection's settings: UTC, the SQL mode (`sql_mode`), recursive walks of any
length, the statement timeout in seconds (0: none)."""
_MYSQL_SESSION = (
    "SET SESSION time_zone = '+00:00', sql_mode = %s, "
    "cte_max_recursion_depth = 4294967295, max_execution_time = %s"
)
"""A MySQL connection's: the same, the timeout in milliseconds (of reads; 0: none)."""


def check_connect_args(engine: AsyncEngine, url: URL, connect_args: Mapping[str, Any]) -> None:
    """Refuse (`InvalidInputError`), when the store is made, what would fail only when the
    first connection opens, or later: a character set other than ``utf8mb4`` (the store's
    text is utf8mb4: under ``utf8`` or ``latin1`` an emoji fails to compare or to encode), and
    an argument the driver's ``connect()`` does not take (``?bogus=1``), in ``url``'s query or
    in ``connect_args``. ``engine`` is the store's, made of ``url``."""
    shown = url.render_as_string(hide_password=True)
    for where, given in (
        (f"the URL {shown}", url.query.get("charset")),
        ("connect_args", connect_args.get("charset")),
    ):
        values = given if isinstance(given, tuple) else () if given is None else (given,)
        if any(str(value).lower() != "utf8mb4" for value in values):
            shown_value = ",".join(map(str, values))
            raise InvalidInputError(
                f"{where} sets charset={shown_value}: a store's connections use utf8mb4 (its "
                "tables are utf8mb4, and other character sets cannot carry every character, "
                "emoji among them); drop charset from "
                + ("the URL's query" if where != "connect_args" else "connect_args")
                + " (the store sets utf8mb4), or set it to utf8mb4"
            )
    from_url, from_args, takes = unknown_arguments(engine, connect_args)
    driver = engine.sync_engine.dialect.driver
    for where, names in ((f"the URL {shown}", from_url), ("connect_args", from_args)):
        if names:
            drop = "the URL's query" if where != "connect_args" else "connect_args"
            raise InvalidInputError(
                f"{where} passes {', '.join(map(repr, names))} to the {driver} driver, "
                f"whose connect() does not take {'it' if len(names) == 1 else 'them'}; remove "
                f"{'it' if len(names) == 1 else 'them'} from {drop} (it takes: "
                f"{', '.join(takes)})"
            )
