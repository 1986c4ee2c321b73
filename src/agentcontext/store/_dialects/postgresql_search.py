"""PostgreSQL's search plans: the scope's candidates newest first, at a cost bounded by what
the search returns, whatever the planner would guess.

The GIN index of the messages' terms finds every match of the scope at once, as a bitmap: a
search then sorts them and keeps the newest. That costs what the scope matches, which is
right for a small scope or a rare word, and wrong for a common word in a large one (a user
with 10 000 chats: 600 000 matches read for the newest 200, over half a second). There the
newest matches are among the newest rows of the table, so the search walks the table's
newest rows instead, in windows of sequence numbers read through the primary key (a window
of ``w`` numbers reads at most ``w`` rows), each window newest first, until it has its page.

The choice is made from two numbers, neither of them a guess of the plan's cost:

- the scope's size (the chats' message counts, read with the settings of the search's
  transaction, in the same statement): a scope of at most `BITMAP_MATCHES` messages is
  always read through the bitmap;
- the planner's estimate of the query's matches (its statistics of the terms' frequencies):
  at most `BITMAP_MATCHES` means the bitmap.

A walk that has read four times the expected matches without filling its page (the matches
are older than the table's newest rows) reads the rest through the bitmap: the whole costs at
most a few times what the bitmap alone would, and the hits are the same, in the same order.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import (
    ColumnElement,
    Connection,
    Integer,
    Select,
    TextClause,
    bindparam,
    func,
    literal_column,
    select,
    type_coerce,
)
from sqlalchemy.dialects import postgresql

from agentcontext.store._db.schema import chats as C
from agentcontext.store._db.schema import messages as M

__all__ = ["BITMAP_MATCHES", "Plans", "SearchScope", "candidates"]

BITMAP_MATCHES = 20_000
"""A scope of at most this many messages, or a query expected to match at most this many, is
read through the GIN index's bitmap."""

_GROWTH = 2
"""Each window of a walk that did not fill its page is this many times the one before."""

INT4_ARRAY = postgresql.ARRAY(Integer)


@dataclass(frozen=True, slots=True)
class SearchScope:
    """What a search's first statement read: the scope's messages and the newest seq."""

    size: int
    top: int


def contains(*, walk: bool) -> ColumnElement[bool]:
    """The candidates' condition: their terms hold every query term. The walk's form is one
    the GIN index cannot answer (the column concatenated with nothing), so that a window is
    read through the primary key alone."""
    column: Any = M.c.search_hashes
    if walk:
        column = column.op("||")(literal_column("'{}'::int4[]"))
    return type_coerce(column, INT4_ARRAY).contains(bindparam("query_hashes", type_=INT4_ARRAY))


_WALKS: dict[int, tuple[Select[Any], Select[Any]]] = {}
"""The window statement of each candidates statement (kept with it, by its identity)."""


def candidates(scope: ColumnElement[bool], columns: Sequence[Any]) -> Select[Any]:
    """The scope's candidates before ``before_seq``, newest first, through the GIN index
    (the bitmap of every match, sorted); its window statement is remembered beside it."""
    before: Any = bindparam("before_seq")
    statement = (
        select(*columns)
        .where(scope, M.c.seq < before, contains(walk=False))
        .order_by(M.c.seq.desc())
        .limit(bindparam("search_limit"))
    )
    window = (
        select(*columns)
        .where(scope, M.c.seq < before, M.c.seq >= bindparam("lowest_seq"), contains(walk=True))
        .order_by(M.c.seq.desc())
        .limit(bindparam("search_limit"))
    )
    _WALKS[id(statement)] = (statement, window)
    return statement


class Plans:
    """How a store searches (one per schema: the estimate is raw SQL, named in it)."""

    def __init__(self, qualify: Callable[[str], TextClause]) -> None:
        self._estimate = qualify(
            "EXPLAIN (FORMAT JSON) SELECT 1 FROM messages "
            "WHERE search_hashes @> CAST(:query_hashes AS int4[])"
        )

    def prepare(self, conn: Connection, scope: Literal["chat", "user"], scope_id: str) -> Any:
        """The search's settings (for its transaction only), the scope's size and the
        newest seq, in one statement (its subqueries planned before the settings apply)."""
        size, top = conn.execute(_PREPARE[scope], {"scope_id": scope_id}).one()[4:]
        return SearchScope(int(size or 0), int(top or 0))

    def fetch(
        self, conn: Connection, statement: Select[Any], params: dict[str, Any], prepared: object
    ) -> Sequence[Any]:
        """One page of candidates, through the bitmap or by windows (see the module)."""
        walk = _WALKS.get(id(statement))
        if (
            walk is None
            or not isinstance(prepared, SearchScope)
            or prepared.size <= BITMAP_MATCHES
            or prepared.top <= 0
        ):
            return conn.execute(statement, params).all()
        expected = self._expected(conn, params["query_hashes"])
        if expected <= BITMAP_MATCHES:
            return conn.execute(statement, params).all()
        limit = int(params["search_limit"])
        upper = min(int(params["before_seq"]), prepared.top + 1)
        # Matches per seq, were they spread evenly: a first window expected to hold twice
        # the page.
        width = math.ceil(2 * limit / min(1.0, expected / prepared.top))
        rows: list[Any] = []
        walked = 0
        while True:
            need = limit - len(rows)
            lowest = max(upper - width, 0)
            found = conn.execute(
                walk[1],
                {**params, "before_seq": upper, "lowest_seq": lowest, "search_limit": need},
            ).all()
            rows += found
            if len(found) == need or lowest == 0:
                return rows
            walked += upper - lowest
            upper = lowest
            if walked >= 4 * expected:
                more = {**params, "before_seq": upper, "search_limit": limit - len(rows)}
                return rows + list(conn.execute(statement, more).all())
            width *= _GROWTH

    def _expected(self, conn: Connection, hashes: list[int]) -> float:
        """The planner's estimate of the messages holding every term (its statistics)."""
        found = conn.execute(self._estimate, {"query_hashes": hashes}).scalar_one()
        plan = json.loads(found) if isinstance(found, str) else found
        return float(plan[0]["Plan"]["Plan Rows"])


def _prepare(scope: str) -> Select[Any]:
    wanted = C.c.id if scope == "chat" else C.c.user_id
    size = (
        select(func.coalesce(func.sum(C.c.message_count), 0))
        .where(wanted == bindparam("scope_id"))
        .scalar_subquery()
    )
    return select(
        # The candidates' statement is planned for its values, and its bitmap read: the
        # walks are the library's choice, never the planner's.
        func.set_config("plan_cache_mode", "force_custom_plan", True),
        func.set_config("enable_indexscan", "off", True),
        func.set_config("enable_seqscan", "off", True),
        # A user's chats are joined by hashing them, never looped over for each match: with
        # no statistics yet (a database just restored or imported, not yet analyzed) the
        # planner took both sides for a few rows, and looped (seconds for a common word).
        func.set_config("enable_nestloop", "off", True),
        size,
        select(func.max(M.c.seq)).scalar_subquery(),
    )


_PREPARE = {scope: _prepare(scope) for scope in ("chat", "user")}
