"""Full-text search with one meaning on every backend.

The backend only proposes *candidates*, newest first, from the search terms of the scope
searched (`_rows.terms`: each token under its chat's and its user's masks, so that the index
entries read are the scope's, not the database's): SQLite from its FTS5 table, PostgreSQL from
the GIN index of its terms. Terms are hashes and may over-match. Here,
in Python and the same on every backend, each candidate's tokens are checked against the
query, the newest `window` matches are ranked (``_tokenizer.score``; ties go to the newer
message), and snippets are cut (``_text.snippet``). Both backends therefore return the same
messages in the same order, with the same ranks and snippets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from sqlalchemy import Connection

from agentcontext import _validate as v
from agentcontext.errors import EncryptionError
from agentcontext.store._db.database import Database
from agentcontext.store._db.schema import chats as C
from agentcontext.store._dialects import Dialect
from agentcontext.store._ops import chats as _chats
from agentcontext.store._rows import decode as _rows
from agentcontext.store._rows import text as _text
from agentcontext.store._rows import tokenizer as _tokenizer
from agentcontext.store._rows.codec import checked_data
from agentcontext.store._rows.terms import query_terms
from agentcontext.store.records import SearchResult

__all__ = ["run", "search", "window"]

WINDOW = 100
"""At least this many of the newest matches are ranked (more for a larger ``limit``)."""

_NO_SEQ_BOUND = 2**62


def window(limit: int) -> int:
    """How many of the newest matches are ranked for a search returning ``limit`` hits."""
    return max(WINDOW, 4 * limit)


_STATEMENTS: dict[tuple[str, str, bool, int], Any] = {}


def search(
    conn: Connection,
    dialect: Dialect,
    scope: Literal["chat", "user"],
    scope_id: str,
    query: Sequence[str],
    roles: Sequence[str] | None,
    limit: int,
) -> list[SearchResult]:
    """The best ``limit`` matches among the newest `window` ones (read)."""
    prepared = dialect.prepare_search(conn, scope, scope_id)
    sealer = dialect.sealer
    if not sealer.encrypted:
        return _search(conn, dialect, scope, scope_id, query, roles, limit, None, prepared)

    # Terms are hashed under the search key of the user whose text it is: the chat's owner,
    # as the sealer last saw it (checked against the chat row when nothing is found).
    def keyed(owner: str | None) -> list[SearchResult]:
        search_key = None if owner is None else sealer.search_key(owner)
        if search_key is None:
            if owner is not None and sealer.never_held(owner):
                _refuse_a_keyring_not_the_datas(conn, dialect, scope, scope_id, owner)
            return []  # an unknown chat, or a user with no key: nothing of theirs is stored
        return _search(conn, dialect, scope, scope_id, query, roles, limit, search_key, prepared)

    def owner() -> str | None:  # read from the chat row, and remembered for the next search
        found = _chats.owner_of(conn, scope_id)
        if found is not None:
            sealer.note_owner(scope_id, found)
        return found

    hinted = sealer.owner_hint(scope_id) if scope == "chat" else scope_id
    found = keyed(hinted if hinted is not None else owner())
    if not found and scope == "chat" and hinted is not None:
        actual = owner()
        if actual != hinted:
            found = keyed(actual)
    return found


def _refuse_a_keyring_not_the_datas(
    conn: Connection, dialect: Dialect, scope: Literal["chat", "user"], scope_id: str, owner: str
) -> None:
    """A user whose key the provider never held nor destroyed: if the scope holds sealed chats
    of theirs, the provider is not the one the data was written with (an `EncryptionError`,
    as a read says), not a scope with nothing to find."""
    wanted = C.c.id == scope_id if scope == "chat" else C.c.user_id == owner
    if dialect.holds_sealed(conn, wanted):
        dialect.sealer.confirm_never_held(owner)
        raise EncryptionError(
            f"the chats of user {owner!r} are sealed under a data key that the key provider "
            "never held (it has no key of that user, and destroyed none): it is not the "
            "keyring the data was written with. Give the store the provider (the keyring) the "
            "data was written with",
            key_id=owner,
        )


def _search(
    conn: Connection,
    dialect: Dialect,
    scope: Literal["chat", "user"],
    scope_id: str,
    query: Sequence[str],
    roles: Sequence[str] | None,
    limit: int,
    search_key: bytes | None,
    prepared: object,
) -> list[SearchResult]:
    mask, hashes = query_terms(query, scope, scope_id, search_key)
    shape = dialect.search_shape(len(hashes))
    key = (dialect.name, scope, bool(roles), shape)
    statement = _STATEMENTS.get(key)
    if statement is None:
        statement = _STATEMENTS[key] = dialect.search_candidates(scope, bool(roles), shape)
    wanted = set(query)
    size = window(limit)
    params: dict[str, Any] = {
        "scope_id": scope_id,
        "search_limit": size if dialect.exact_candidates else 2 * size,
        **dialect.search_params(mask, hashes),
    }
    if roles:
        params["roles"] = dialect.roles_value(roles)
    matches: list[tuple[Any, list[str], str]] = []
    before = _NO_SEQ_BOUND
    while len(matches) < size:
        rows = dialect.fetch_candidates(conn, statement, {**params, "before_seq": before}, prepared)
        for row in rows:
            data = checked_data(dialect, row[6], row[2], row[1])
            searchable = _text.indexed_text(data) if data is not None else ""
            tokens = _tokenizer.tokens(searchable)
            if dialect.exact_candidates or wanted.issubset(tokens):
                matches.append(((*row[1:6], data, row[7]), tokens, searchable))
                if len(matches) == size:
                    break
        if len(rows) < params["search_limit"]:
            break
        before = rows[-1][0]
    if not matches:
        return []
    average = sum(len(tokens) for _, tokens, _ in matches) / len(matches)
    scores = [_tokenizer.score(tokens, query, average) for _, tokens, _ in matches]
    # Best first; among equals the newer message (matches come newest first).
    order = sorted(range(len(matches)), key=lambda i: (-scores[i], i))[:limit]
    out = []
    for i in order:
        row, _, searchable = matches[i]
        out.append(
            _rows.build(
                SearchResult,
                {
                    "message": _rows.message_of(
                        row[0], row[1], row[2], row[3], row[4], row[5], dialect.decode_time(row[6])
                    ),
                    "rank": scores[i],
                    "snippet": _text.snippet(searchable, query),
                },
            )
        )
    return out


async def run(
    db: Database,
    scope: Literal["chat", "user"],
    scope_id: str,
    query: object,
    roles: object,
    limit: object,
) -> list[SearchResult]:
    """A checked search: its tokens, then `search` in one read; an unknown chat (searched by
    chat) raises `ChatNotFoundError` rather than finding nothing."""
    words = _tokenizer.query_tokens(v.check_text(query, "query"))
    wanted = None if roles is None else v.check_str_list(roles, "roles")
    most = v.check_count(limit, "limit", minimum=1, maximum=10_000)

    def read(conn: Connection) -> list[SearchResult]:
        hits: list[SearchResult] = []
        if words and wanted != []:
            hits = search(conn, db.dialect, scope, scope_id, words, wanted, most)
        if not hits and scope == "chat":
            _chats.require(conn, scope_id)
        return hits

    return await db.run(db.dialect.search_mode, read, chat=scope_id if scope == "chat" else None)
