"""MariaDB's and MySQL's search index: the side table ``message_terms`` and its keys.

A message is indexed under each of its search terms (its tokens' hashes under its chat's and
its user's masks, as signed 64-bit numbers: `int8_terms`), one row ``(term, seq)`` each, in a
table that is its primary key alone (migration 0014). The message's row keeps the same keys
packed in ``messages.search_hashes`` (`pack_terms`), by which its entries are deleted
(`unindex`), whatever became of the data key that made them. `MySQLDialect` (``mysql.py``)
writes and reads the table with these.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from sqlalchemy import BigInteger, Column, Connection, MetaData, Table, delete, tuple_
from sqlalchemy.dialects import mysql

from agentcontext.store._rows.terms import ScopedTerms

__all__ = [
    "QUERY_TERMS",
    "TERMS",
    "hex_literal",
    "index_keys",
    "int8_terms",
    "pack_terms",
    "query_terms_params",
    "terms_hex",
    "unindex",
    "unpack_terms",
]

TERMS = Table(
    "message_terms",
    MetaData(),
    Column("term", BigInteger, primary_key=True),
    Column("seq", BigInteger, primary_key=True),
)
"""The search index of MariaDB/MySQL (made by the migrations): one row per search term of a
message, keyed ``(term, seq)`` and nothing else (migration 0014). The message's row keeps the
same terms packed in ``search_hashes`` (`pack_terms`): `MySQLDialect.delete_messages` takes
its entries out by their keys, with it (no foreign key: migration 0012)."""

QUERY_TERMS = 4
"""Terms one search statement joins (a longer query's other words are checked in Python)."""

_SIGN = 1 << 63
_MASK64 = (1 << 64) - 1


def pack_terms(terms: Sequence[int]) -> bytes | None:
    """A message's search terms as its row keeps them (``messages.search_hashes``): 8 bytes
    each, big-endian signed, in the order given (None for none). Part of the on-disk format
    (migration 0014 packs them the same way on the server)."""
    return struct.pack(f">{len(terms)}q", *terms) if terms else None


def terms_hex(terms: Sequence[int]) -> str | None:
    """`pack_terms` in hexadecimal digits, as statements send it (``UNHEX``, or an ``X''``
    literal): no driver has to escape bytes (aiomysql cannot with PyMySQL 1.2)."""
    packed = pack_terms(terms)
    return None if packed is None else packed.hex()


def unpack_terms(packed: bytes | None) -> list[int]:
    """The terms `pack_terms` packed."""
    if not packed:
        return []
    return list(struct.unpack(f">{len(packed) // 8}q", packed))


def int8_terms(terms: ScopedTerms) -> list[int]:
    """A message's search terms as MariaDB/MySQL keys them: for each token, its hash under its
    chat's mask, then under its user's (their XOR), as a signed 64-bit number. Part of the
    on-disk format."""
    chat, user = terms.chat, terms.user
    hashes = terms.hashes
    return [((h ^ chat) & _MASK64) - _SIGN for h in hashes] + [
        ((h ^ user) & _MASK64) - _SIGN for h in hashes
    ]


def hex_literal(terms: Sequence[int]) -> str:
    """A row's packed terms (`pack_terms`) as a literal of the statement."""
    digits = terms_hex(terms)
    return "NULL" if digits is None else f"X'{digits}'"


def index_keys(conn: Connection, rows: Sequence[tuple[int, Sequence[int]]]) -> None:
    """Insert the search entries ``(term, seq)`` of these ``(seq, terms)``, in key order."""
    keys = sorted((term, seq) for seq, terms in rows for term in terms)
    for start in range(0, len(keys), 5000):
        conn.execute(
            mysql.insert(TERMS).prefix_with("IGNORE"),
            [{"term": term, "seq": seq} for term, seq in keys[start : start + 5000]],
        )


def unindex(conn: Connection, rows: Sequence[tuple[int, Sequence[int]]]) -> None:
    """Delete the search entries ``(term, seq)`` of these ``(seq, terms)``, by their keys, in
    key order (a list of keys the server reads as that many ranges of the primary key)."""
    keys = sorted((term, seq) for seq, terms in rows for term in terms)
    for start in range(0, len(keys), _UNINDEX_CHUNK):
        chunk = keys[start : start + _UNINDEX_CHUNK]
        conn.execute(delete(TERMS).where(tuple_(TERMS.c.term, TERMS.c.seq).in_(chunk)))


_UNINDEX_CHUNK = 1000
"""Keys one delete names (the server's range optimizer plans each list in memory of its own,
``range_optimizer_max_mem_size``; past it, a statement would read the whole table)."""


def query_terms_params(mask: int, hashes: list[int]) -> dict[str, int]:
    """The parameters ``term_0`` ... of a search's statement: its first `QUERY_TERMS` tokens'
    hashes under the scope's ``mask``, as the table keys them."""
    terms = [((h ^ mask) & _MASK64) - _SIGN for h in hashes[:QUERY_TERMS]]
    return {f"term_{index}": term for index, term in enumerate(terms or [0])}
