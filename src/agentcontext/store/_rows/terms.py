"""Search terms: a message's tokens, scoped to its chat and to its user.

The search index keys every token by the scope a search names, so a search costs what its
scope holds, not what the database holds: a message is indexed under its chat's terms and
under its user's terms, and a search in one chat (or across one user's chats) reads only the
entries of that chat (or user). A term is the token's 64-bit hash combined with the scope's
64-bit *mask*; each dialect renders it for its index (SQLite: the mask's and the hash's hex
digits, one FTS5 term; PostgreSQL: a signed 32-bit fold of their XOR in a GIN-indexed array;
MariaDB: their XOR as a signed 64-bit key of a side table). The hash and the mask are part of
the on-disk format: they never change, and they are the same in every process.

A match of terms only makes a message a candidate: the search checks each candidate's tokens
(`_ops.search`), so a rare collision of hashes never changes what is found.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from hashlib import blake2b

__all__ = [
    "ScopedTerms",
    "forget_search_key",
    "mask",
    "message_terms",
    "query_terms",
    "token_hashes",
]

_MASK_PERSON = b"agentcontext-sc"
_TOKEN_PERSON = b"agentcontext-tk"
_HASHED_AT_MOST = 1 << 17


def _hash(token: str) -> int:
    digest = blake2b(token.encode("utf-8"), digest_size=8, person=_TOKEN_PERSON).digest()
    return int.from_bytes(digest, "big")


_hashed: dict[str, int] = {}
"""The hash of the tokens seen lately: a conversation's words recur, and a dictionary lookup
of many tokens at once is C-level where hashing them is a Python step each. Replaced by a
new one (not cleared) past `_HASHED_AT_MOST`, so a call under way in another thread keeps a
consistent one."""


def token_hashes(tokens: Iterable[str], key: bytes | None = None) -> list[int]:
    """The 64-bit hashes of the distinct ``tokens``, ascending. With ``key`` (an encrypted
    store: the search key of the user whose text it is), keyed hashes: a reader of the
    database cannot tell which word a term stands for, nor match one user's terms to
    another's."""
    global _hashed
    if key is not None:
        return _keyed_hashes(tokens, key)
    known = _hashed
    distinct = set(tokens)
    new = distinct.difference(known)
    if new:
        if len(known) + len(new) > _HASHED_AT_MOST:
            known = _hashed = {}
            new = distinct
        for token in new:
            known[token] = _hash(token)
    return sorted(set(map(known.__getitem__, distinct)))


_keyed: dict[bytes, dict[str, int]] = {}


def _keyed_hashes(tokens: Iterable[str], key: bytes) -> list[int]:
    known = _keyed.get(key)
    if known is None:
        if len(_keyed) >= 256:
            _keyed.clear()
        known = _keyed[key] = {}
    distinct = set(tokens)
    new = distinct.difference(known)
    if new:
        if len(known) + len(new) > _HASHED_AT_MOST // 8:
            known.clear()
            new = distinct
        for token in new:
            digest = blake2b(token.encode("utf-8"), digest_size=8, key=key, person=_TOKEN_PERSON)
            known[token] = int.from_bytes(digest.digest(), "big")
    return sorted(set(map(known.__getitem__, distinct)))


def forget_search_key(key: bytes) -> None:
    """Drop the memo of a search key's hashes (its user was erased)."""
    _keyed.pop(key, None)


_masks: dict[tuple[str, str], int] = {}


def mask(kind: str, scope_id: str) -> int:
    """The 64-bit mask of a scope: ``kind`` is ``"chat"`` or ``"user"``."""
    key = (kind, scope_id)
    found = _masks.get(key)
    if found is None:
        data = f"{kind}\x00{scope_id}".encode()
        found = int.from_bytes(blake2b(data, digest_size=8, person=_MASK_PERSON).digest(), "big")
        if len(_masks) >= 1 << 16:
            _masks.clear()
        _masks[key] = found
    return found


@dataclass(frozen=True, slots=True)
class ScopedTerms:
    """What the search index holds for one message: its tokens' hashes, under the masks of
    its chat and of its user (each dialect renders the terms from them)."""

    chat: int
    user: int
    hashes: list[int]


def message_terms(
    tokens: Iterable[str], chat_id: str, user_id: str, key: bytes | None = None
) -> ScopedTerms:
    """The terms of a message of ``chat_id`` (owned by ``user_id``) with these tokens
    (``key``: the owner's search key, in an encrypted store)."""
    return ScopedTerms(mask("chat", chat_id), mask("user", user_id), token_hashes(tokens, key))


def query_terms(
    tokens: Iterable[str], kind: str, scope_id: str, key: bytes | None = None
) -> tuple[int, list[int]]:
    """The mask of the scope searched and the hashes of the query's tokens (``key``: the
    search key of the user whose text is searched, in an encrypted store)."""
    return mask(kind, scope_id), token_hashes(tokens, key)
