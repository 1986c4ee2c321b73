"""The one tokenizer of full-text search, and what both backends derive from it.

Search has one meaning on every backend because the words are found here, in Python, for the
indexed text and for the query alike; the databases only look up what this module produced:

- SQLite indexes the tokens in a contentless FTS5 table (the ``ascii`` tokenizer splits the
  space-joined tokens back exactly as given);
- PostgreSQL keeps a small bloom signature per message (`signature`) and tests it with
  one bitwise AND per row; a signature can only over-match, so every candidate is checked
  here against the real tokens.

**Tokens.** The text is cut into runs of letters and digits (Python's ``str.isalnum``; an
underscore separates). Each run is folded: compatibility-decomposed (NFKD), stripped of
combining marks (accents), and case-folded, so ``İstanbul``, ``ISTANBUL`` and ``istanbul``
are one token, as are ``café`` and ``cafe``. Han, Hiragana and Katakana characters are a
token each (those scripts do not separate words with spaces). Punctuation only separates:
``foo.bar@example.com`` is the tokens ``foo``, ``bar``, ``example`` and ``com``; so are the
parts of URLs, paths (``/usr/local/bin``) and decimals (``3.14159``). A query matches a
message that holds every token of the query, so such text is found by any of its words and
by its whole text.

**Ranking** (`score`) is BM25's term saturation and length normalisation over the
candidates at hand, plus a bonus when the query's tokens appear in a row, in order.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter
from collections.abc import Iterator, Sequence

__all__ = [
    "SIGNATURE_BITS",
    "iter_tokens",
    "query_tokens",
    "score",
    "signature",
    "signature_masks",
    "tokens",
]

_ASCII_WORD = re.compile(r"[a-z0-9]+")
_WORD = re.compile(r"[^\W_]+")
_CJK = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]")


def _fold(run: str) -> str:
    """NFKD, combining marks removed, case-folded."""
    if run.isascii():
        return run.lower()
    decomposed = unicodedata.normalize("NFKD", run)
    if not decomposed.isascii():
        decomposed = "".join(c for c in decomposed if not unicodedata.combining(c))
    return decomposed.casefold()


def _split(folded: str) -> Iterator[str]:
    """The tokens of one folded run: letter/digit runs, CJK characters one by one."""
    for word in _WORD.findall(folded):
        if word.isascii() or not _CJK.search(word):
            yield word
            continue
        start = 0
        for hit in _CJK.finditer(word):
            if hit.start() > start:
                yield word[start : hit.start()]
            yield hit.group()
            start = hit.end()
        if start < len(word):
            yield word[start:]


def iter_tokens(text: str) -> Iterator[tuple[str, int, int]]:
    """``(token, start, end)`` for every token; the span is the run of ``text`` it came from."""
    if text.isascii():
        for hit in _ASCII_WORD.finditer(text.lower()):
            yield hit.group(), hit.start(), hit.end()
        return
    for run in _WORD.finditer(text):
        for token in _split(_fold(run.group())):
            yield token, run.start(), run.end()


def tokens(text: str) -> list[str]:
    """The tokens of ``text``, in order (see the module documentation)."""
    if text.isascii():
        return _ASCII_WORD.findall(text.lower())
    out: list[str] = []
    for run in _WORD.findall(text):
        out.extend(_split(_fold(run)))
    return out


def query_tokens(query: str) -> list[str]:
    """The distinct tokens of a query, in the order they first appear."""
    return list(dict.fromkeys(tokens(query)))


# --- ranking ------------------------------------------------------------------------------

_K1 = 1.2
_B = 0.75
_PHRASE_BONUS = 1.0


def _in_a_row(doc: Sequence[str], query: Sequence[str]) -> bool:
    first, size = query[0], len(query)
    start = 0
    while True:
        try:
            at = doc.index(first, start)
        except ValueError:
            return False
        if list(doc[at : at + size]) == list(query):
            return True
        start = at + 1


def score(doc: Sequence[str], query: Sequence[str], average_length: float) -> float:
    """How well a message (its tokens) matches the query tokens; higher is better.

    BM25's saturating term frequency with length normalisation against ``average_length``
    (the mean length of the messages being ranked), summed over the query's tokens, plus a
    bonus of 1 when the query (of two tokens or more) occurs in a row and in order. Pure
    arithmetic on tokens: the same on every backend.
    """
    wanted = set(query)
    counts = Counter(token for token in doc if token in wanted)
    norm = _K1 * (1 - _B + _B * len(doc) / average_length) if average_length else _K1
    total = sum(tf * (_K1 + 1) / (tf + norm) for tf in counts.values())
    if len(query) > 1 and len(counts) == len(wanted) and _in_a_row(doc, query):
        total += _PHRASE_BONUS
    return total


# --- PostgreSQL signatures ----------------------------------------------------------------

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


def signature(distinct: Sequence[str]) -> str:
    """A bloom signature of a message's distinct tokens, as PostgreSQL ``bit varying`` input
    (``x`` and hex digits). Its size grows with the number of tokens, so long messages do not
    saturate it."""
    count = len(distinct)
    size = next(
        (bits for bits, most in zip(SIGNATURE_BITS, _PER_CLASS, strict=False) if count <= most),
        SIGNATURE_BITS[-1],
    )
    return _bits(size, distinct)


def signature_masks(query: Sequence[str]) -> dict[int, str]:
    """For each signature size, the bits a message holding every query token has set."""
    return {size: _bits(size, query) for size in SIGNATURE_BITS}
