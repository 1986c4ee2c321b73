"""Full-text search (one meaning on every backend) and the whole-graph view."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from sqlalchemy import and_, bindparam, select

from agentcontext import _validate as v
from agentcontext.store import _rows, _text
from agentcontext.store._fastpath import RawQuery
from agentcontext.store._schema import chats as C
from agentcontext.store._schema import messages as M
from agentcontext.store._snapshots import SnapshotsMixin
from agentcontext.store.records import Graph, GraphNode, SearchResult

_SEARCHES: dict[tuple[str, str, str, bool], tuple[Any, RawQuery]] = {}
"""Search statements (and their compiled SQL) by dialect, driver, scope and roles filter."""


class SearchMixin(SnapshotsMixin):
    """The search and graph methods of :class:`~agentcontext.SqlContextStore`."""

    async def search_messages(
        self,
        chat_id: str,
        query: str,
        *,
        roles: Sequence[str] | None = None,
        limit: int = 20,
    ) -> list[SearchResult]:
        v.check_id(chat_id, "chat_id")
        return await self._search("chat", chat_id, query, roles, limit)

    async def search_user_messages(
        self,
        user_id: str,
        query: str,
        *,
        roles: Sequence[str] | None = None,
        limit: int = 20,
    ) -> list[SearchResult]:
        v.check_id(user_id, "user_id")
        return await self._search("user", user_id, query, roles, limit)

    def _search_statement(
        self, scope: Literal["chat", "user"], with_roles: bool
    ) -> tuple[Any, RawQuery]:
        """The search query for a scope, built and compiled once per dialect and shape."""
        key = (self._dialect.name, self._engine.dialect.driver, scope, with_roles)
        found = _SEARCHES.get(key)
        if found is None:
            where = (
                M.c.chat_id == bindparam("scope_id")
                if scope == "chat"
                else M.c.chat_id.in_(select(C.c.id).where(C.c.user_id == bindparam("scope_id")))
            )
            if with_roles:
                where = and_(where, self._dialect.roles_filter(M.c.name))
            statement = self._dialect.search(where)
            found = _SEARCHES[key] = (statement, RawQuery.of(statement, self._engine.dialect))
        return found

    async def _search(
        self,
        scope: Literal["chat", "user"],
        scope_id: str,
        query: object,
        roles: object,
        limit: object,
    ) -> list[SearchResult]:
        text = v.check_text(query, "query")
        wanted_roles = None if roles is None else v.check_str_list(roles, "roles")
        checked_limit = v.check_int(limit, "limit", minimum=1)
        terms = _text.plain_terms(text)
        params: dict[str, Any] = {
            "scope_id": scope_id,
            "search_query": self._dialect.search_value(terms),
            "search_limit": checked_limit,
        }
        if wanted_roles:
            params["roles"] = self._dialect.roles_value(wanted_roles)
        rows: list[Any] = []
        if terms and wanted_roles != []:
            statement, raw = self._search_statement(scope, bool(wanted_roles))
            # One read statement: the driver-level path (one thread hand-off on SQLite, one
            # round trip on PostgreSQL) returns raw rows, decoded below.
            fetched = await self._fetch_raw(raw, params)
            if fetched is None:
                async with self._tx() as conn:
                    rows = list((await conn.execute(statement, params)).all())
            else:
                rows = [_rows.decode_message_row(row, self._dialect.is_sqlite) for row in fetched]
        if not rows and scope == "chat":
            async with self._tx() as conn:
                await self._require_chat(conn, scope_id)  # an unknown chat is an error
        native = self._dialect.native_snippets
        return [
            _rows.build(
                SearchResult,
                {
                    "message": _rows.message(row),
                    "rank": float(row[7]),
                    "snippet": row[8] if native else _text.snippet(row[8], terms),
                },
            )
            for row in rows
        ]

    async def get_graph(self, chat_id: str) -> Graph:
        v.check_id(chat_id, "chat_id")
        async with self._tx() as conn:
            await self._require_chat(conn, chat_id)
            rows = (
                await conn.execute(
                    select(M.c.id, M.c.parent_id, M.c.name, M.c.data, M.c.created_at)
                    .where(M.c.chat_id == chat_id)
                    .order_by(M.c.seq)
                )
            ).all()
            branch_list = await self._list_branches(conn, chat_id)
            checkpoint_list = await self._list_checkpoints(conn, chat_id)
        nodes = [
            _rows.build(
                GraphNode,
                {
                    "id": row[0],
                    "parent_id": row[1],
                    "role": row[2],
                    "preview": _text.preview(row[3]),
                    "created_at": row[4],
                },
            )
            for row in rows
        ]
        return _rows.build(
            Graph,
            {
                "chat_id": chat_id,
                "nodes": nodes,
                "branches": branch_list,
                "checkpoints": checkpoint_list,
            },
        )
