"""The bloom signatures PostgreSQL search used in revisions 0003 to 0006 (``search_sig``).

The store no longer writes or reads them: revision 0008 replaced them by token hashes under a
GIN index (`_tokenizer.token_hashes`). They are kept for the migrations only: 0003 computes
them on its way up and 0008 recomputes them on its way down, so a downgraded database
searches as it did.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

__all__ = ["SIGNATURE_BITS", "signature"]

SIGNATURE_BITS = (1024, 4096, 16384)
"""The sizes a signature comes in, by the number of distinct tokens of the message."""

_PER_CLASS = (80, 320)
"""Most distinct tokens for the first two sizes (about 13 bits per token)."""

_PROBES = 7
"""Bits set per token (double hashing)."""


def _probes(token: str) -> tuple[int, int]:
    digest = hashlib.blake2b(token.encode("utf-8"), digest_size=16).digest()
    return int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:], "little") | 1


def _bits(size: int, words: Sequence[str]) -> str:
    value = 0
    top = size - 1
    for word in words:
        first, step = _probes(word)
        for i in range(_PROBES):
            value |= 1 << (top - (first + i * step) % size)
    return "x" + format(value, f"0{size // 4}x")


def signature(tokens: Sequence[str]) -> str | None:
    """The bloom signature of a message's tokens as PostgreSQL ``bit varying`` input (``x``
    and hex digits), None for no token. Its size grows with the number of distinct tokens, so
    long messages do not saturate it."""
    distinct = list(dict.fromkeys(tokens))
    if not distinct:
        return None
    count = len(distinct)
    size = next(
        (bits for bits, most in zip(SIGNATURE_BITS, _PER_CLASS, strict=False) if count <= most),
        SIGNATURE_BITS[-1],
    )
    return _bits(size, distinct)
