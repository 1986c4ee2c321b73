"""SqlContextStore: the conversation graph in SQLite or PostgreSQL through SQLAlchemy async.

The implementation is split by subject: ``_core`` (engine, schema, transactions, errors),
``_chats``, ``_messages`` (with ``_chain``), ``_branches`` (and checkpoints), ``_search``
(and the graph view), ``_transfer`` (export and import); dialect differences live in
``_dialect``.
"""

from __future__ import annotations

from typing import Any

from agentcontext.store._chats import ChatsMixin
from agentcontext.store._transfer import TransferMixin

__all__ = ["InMemoryContextStore", "SqlContextStore"]


class SqlContextStore(ChatsMixin, TransferMixin):
    """A :class:`~agentcontext.ContextStore` on SQLite (``sqlite+aiosqlite://``) or
    PostgreSQL (``postgresql+asyncpg://``).

    Args:
        url_or_engine: a database URL, or an ``AsyncEngine`` you own (the store never disposes
            an engine it did not create).
        migrate: ``"auto"`` (default) upgrades the schema to the newest revision on first use,
            safely when several processes start at once; ``False`` only checks it and raises
            :class:`~agentcontext.SchemaOutdatedError` naming the command to run.
        **engine_options: passed to ``create_async_engine``. Extra options:
            ``sqlite_busy_timeout`` (seconds, default 30), ``sqlite_synchronous`` (``"normal"``,
            the default, or ``"full"`` to sync every commit to disk before it returns),
            ``postgres_connect_timeout`` (seconds, default 10) and ``pgbouncer`` (``True``
            behind PgBouncer in transaction pooling mode).

    Use it as an async context manager, or call :meth:`initialize` and :meth:`close`::

        async with SqlContextStore("sqlite+aiosqlite:///chat.db") as store:
            chat = await store.upsert_chat("chat-1", user_id="user-1")
    """


class InMemoryContextStore(SqlContextStore):
    """An SQLite in-memory store for tests and notebooks; its data dies with it."""

    def __init__(self, **engine_options: Any) -> None:
        super().__init__("sqlite+aiosqlite:///:memory:", migrate="auto", **engine_options)
