"""What the async drivers take and how they fail, for the store (`store._dialects`,
`store._db`) and the keyring (`encryption`) alike.

What an async driver's ``connect()`` takes: a name in a URL's query or in ``connect_args``
that it does not take fails only when the first connection opens, with a raw ``TypeError``,
so both refuse it when they are made. And `is_connection_error`: whether a failure means the
database could not be reached, or the connection was lost."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["is_connection_error", "unknown_arguments"]

_ADAPTERS: dict[str, frozenset[str]] = {
    "asyncpg": frozenset({"prepared_statement_cache_size", "prepared_statement_name_func"}),
}
"""What SQLAlchemy's adapter of a driver takes itself before calling its ``connect()``
(``async_creator_fn`` for every one)."""


def unknown_arguments(
    engine: AsyncEngine, connect_args: Mapping[str, Any]
) -> tuple[list[str], list[str], list[str]]:
    """The names the driver of ``engine`` would not take: from its URL's query, and from
    ``connect_args``; and the names it takes. All empty when it takes any (``**kwargs``), when
    its signature cannot be read, or when the caller gives its own connect function."""
    if "async_creator_fn" in connect_args:
        return [], [], []
    dialect = engine.sync_engine.dialect
    connect = getattr(getattr(dialect.loaded_dbapi, dialect.driver, None), "connect", None)
    try:
        params = inspect.signature(connect).parameters if connect is not None else {}
    except (TypeError, ValueError):
        return [], [], []
    if not params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return [], [], []
    takes = set(params) | _ADAPTERS.get(dialect.driver, frozenset()) | {"async_creator_fn"}
    _, given = dialect.create_connect_args(engine.sync_engine.url)
    from_url = sorted(set(given) - takes - set(connect_args))
    named = sorted(set(params) - {"loop", "dsn"})
    return from_url, sorted(set(connect_args) - takes), named


_CONNECTION_ERRORS = frozenset(
    {
        "ConnectionDoesNotExistError",
        "CannotConnectNowError",
        "ConnectionFailureError",
        "TooManyConnectionsError",
        "AdminShutdownError",
        "InternalClientError",
        "InvalidAuthorizationSpecificationError",
    }
)


def is_connection_error(exc: BaseException) -> bool:
    """True when the database could not be reached or the connection was lost."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (OSError, ConnectionError, TimeoutError)):
            return True
        if type(current).__name__ in _CONNECTION_ERRORS:
            return True
        message = str(current)
        if "unable to open database file" in message or "connection was closed" in message:
            return True
        nxt = getattr(current, "orig", None) or current.__cause__ or current.__context__
        current = nxt if isinstance(nxt, BaseException) else None
    return False
