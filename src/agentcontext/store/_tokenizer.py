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
from itertools import accumulate, chain, compress, count
from operator import add, sub

__all__ = [
    "SIGNATURE_BITS",
    "iter_tokens",
    "query_tokens",
    "score",
    "signature",
    "signature_masks",
    "tokens",
]

_WORD = re.compile(r"[^\W_]+")
_SEPARATOR = re.compile(r"[\W_]")
_CJK_RANGES = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
_CJK = re.compile(f"[{_CJK_RANGES}]")
_TOKEN = re.compile(f"(?=\\w)[{_CJK_RANGES}]|[^\\W_{_CJK_RANGES}]+")
"""A token of folded text: a CJK letter alone, or a run of other letters and digits."""
_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_ASCII = frozenset(map(chr, range(128)))
_ASCII_FOLD = bytes(
    (code | 0x20 if 0x41 <= code <= 0x5A else code) if code >= 0x80 or chr(code).isalnum() else 0x20
    for code in range(256)
)
"""For UTF-8: ASCII letters lower-cased, other ASCII characters but digits made a space, the
bytes of other characters kept. The text keeps its length in characters."""


# How a text is folded. Folding (NFKD, combining marks removed, case folding) acts on each
# character on its own: NFKD decomposes character by character and only reorders combining
# marks, which are all removed, and case folding has no context. So a run folds to its
# characters' folds put together, and a text is folded without being cut into runs first:
# every character that separates runs becomes a space (a lone surrogate too, so the text can
# be encoded), ASCII letters are lower-cased (both by one translation of the UTF-8 bytes),
# every other character that folding changes is replaced by its fold (one pass per such
# character of the text, not per word), and the tokens are what `str.split` finds. A run
# gives other than one token only when a character of it folds to a CJK letter or to
# something other than letters and digits (``½`` to ``1``, U+2044, ``2``): texts holding
# such a character are cut by `_TOKEN` instead. A text with many characters to replace is
# folded whole (NFKD, marks removed, case folding: a pass each) after its separators became
# spaces, since a separator could fold to nothing (a combining mark) or to letters (``™``)
# and join the runs around it.
#
# What a non-ASCII character needs is learnt the first time it is seen:
_PLAIN: set[str] = set()
"""Letters and digits that fold to themselves, not CJK."""
_PLAIN_CJK: set[str] = set()
"""CJK letters that fold to themselves."""
_OTHER: dict[str, tuple[str | None, bool, str]] = {}
"""Every other character: what it is replaced by (a space for a character that separates
runs; its fold, with NUL for what separates tokens in it; ``None``: itself), whether its run
may give other than one token, the combining marks of its NFKD."""
_LEARNT_AT_MOST = 1 << 15
"""Characters remembered at most (the rest are looked at again each time)."""
_MANY = 24
"""More characters to replace than this, and the text is folded whole."""
_SPACE: tuple[str | None, bool, str] = (" ", False, "")


def _fold(run: str) -> str:
    """NFKD, combining marks removed, case-folded."""
    if run.isascii():
        return run.lower()
    decomposed = unicodedata.normalize("NFKD", run)
    if not decomposed.isascii():
        decomposed = "".join(c for c in decomposed if not unicodedata.combining(c))
    return decomposed.casefold()


def _learn(char: str) -> tuple[str | None, bool, str]:
    """What folding does to a non-ASCII character (as in `_OTHER`). Remembered."""
    info: tuple[str | None, bool, str]
    if _WORD.fullmatch(char) is None:
        info = _SPACE
    else:
        decomposed = unicodedata.normalize("NFKD", char)
        marks = "".join(c for c in decomposed if unicodedata.combining(c))
        folded = _SEPARATOR.sub("\0", _fold(char))
        odd = "\0" in folded or _CJK.search(folded) is not None
        info = (None if folded == char else folded, odd, marks)
    if len(_PLAIN) + len(_PLAIN_CJK) + len(_OTHER) < _LEARNT_AT_MOST:
        if info[0] is None and not info[2]:
            (_PLAIN_CJK if info[1] else _PLAIN).add(char)
        else:
            _OTHER[char] = info
    return info


def _look(text: str) -> tuple[list[str], list[tuple[str, str]], str, bool]:
    """What folding ``text`` (not all ASCII) takes: the characters that separate runs, the
    others to replace (and by what), the combining marks of their NFKD, and whether a run may
    give other than one token."""
    if len(text.encode("utf-8", "surrogatepass")) - len(text) < 32:  # few non-ASCII characters
        chars = set(_NON_ASCII.findall(text))
    else:
        chars = set(text).difference(_ASCII)
    odd = not chars.isdisjoint(_PLAIN_CJK)
    separators: list[str] = []
    changes: list[tuple[str, str]] = []
    marks = ""
    for char in chars.difference(_PLAIN, _PLAIN_CJK):
        replacement, odd_char, found = _OTHER.get(char) or _learn(char)
        if replacement == " ":
            separators.append(char)
            continue
        if replacement is not None:
            changes.append((char, replacement))
        odd = odd or odd_char
        marks += found
    return separators, changes, marks, odd


def _fold_whole(text: str, marks: str) -> str:
    text = unicodedata.normalize("NFKD", text)
    for mark in set(marks):
        text = text.replace(mark, "")
    return text.casefold()


def tokens(text: str) -> list[str]:
    """The tokens of ``text``, in order (see the module documentation)."""
    if text.isascii():
        return text.encode().translate(_ASCII_FOLD).decode().split()
    separators, changes, marks, odd = _look(text)
    for char in separators:
        text = text.replace(char, " ")
    if len(changes) > _MANY:
        text = _fold_whole(text, marks)
    else:
        for char, replacement in changes:
            text = text.replace(char, replacement)
    text = text.encode().translate(_ASCII_FOLD).decode()
    return _TOKEN.findall(text) if odd else text.split()


def _chunk_tokens(text: str, offset: int) -> Iterator[tuple[str, int, int]]:
    """`iter_tokens` of a text that starts at ``offset`` of the whole one, between two runs."""
    if text.isascii():
        changes: list[tuple[str, str]] = []
        odd = False
    else:
        separators, changes, marks, odd = _look(text)
        for char in separators:
            text = text.replace(char, " ")
    text = text.encode().translate(_ASCII_FOLD).decode()  # the runs keep their spans
    runs = text.split(" ")  # and empty strings between separators
    folded = runs
    if len(changes) > _MANY:
        folded = _fold_whole(text.replace(" ", "\0"), marks).split("\0")
    elif changes:
        for char, replacement in changes:
            text = text.replace(char, replacement)
        folded = text.split(" ")
    lengths = list(map(len, runs))
    ends = list(map(add, accumulate(lengths), count(offset)))  # one separator after each run
    spans = compress(zip(folded, map(sub, ends, lengths), ends, strict=True), folded)
    if not odd:  # one token per run, unless it folded to nothing
        return spans
    return iter([(token, start, end) for run, start, end in spans for token in _TOKEN.findall(run)])


_CHUNK = 4096
"""`iter_tokens` folds this many characters at a time (or a little more), so a caller that
stops early does not pay for a long text's end."""


def _chunks(text: str) -> Iterator[Iterator[tuple[str, int, int]]]:
    size = len(text)
    begin = 0
    while begin < size:
        end = begin + _CHUNK
        if end < size:
            cut = _SEPARATOR.search(text, end)
            end = cut.start() if cut is not None else size
        yield _chunk_tokens(text[begin:end], begin)
        begin = end


def iter_tokens(text: str) -> Iterator[tuple[str, int, int]]:
    """``(token, start, end)`` for every token; the span is the run of ``text`` it came from."""
    if len(text) <= _CHUNK:
        return _chunk_tokens(text, 0)
    return chain.from_iterable(_chunks(text))


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
