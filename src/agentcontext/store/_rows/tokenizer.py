"""The one tokenizer of full-text search, and what both backends derive from it.

Search has one meaning on every backend because the words are found here, in Python, for the
indexed text and for the query alike; the databases only look up what this module produced:

- SQLite indexes the tokens in a contentless FTS5 table (the ``ascii`` tokenizer splits the
  space-joined tokens back exactly as given);
- PostgreSQL keeps the 32-bit hashes of each message's distinct tokens (`token_hashes`) in
  an ``int4[]`` column under a GIN index and finds the messages whose array contains every
  hash of the query; two tokens may share a hash, so every candidate is checked here against
  the real tokens.

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

import re
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate, chain, compress, count, zip_longest
from operator import add, sub
from zlib import crc32

__all__ = [
    "iter_tokens",
    "query_tokens",
    "score",
    "token_hash",
    "token_hashes",
    "tokens",
    "word_hits",
]

_WORD = re.compile(r"[^\W_]+")
_SEPARATOR = re.compile(r"[\W_]")
_CJK_RANGES = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
_CJK = re.compile(f"[{_CJK_RANGES}]")
_TOKEN = re.compile(f"(?=\\w)[{_CJK_RANGES}]|[^\\W_{_CJK_RANGES}]+")
"""A token of folded text: a CJK letter alone, or a run of other letters and digits."""
_CJK_RUNS = re.compile(f"([{_CJK_RANGES}]+)")
_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_ASCII_FOLD = bytes(
    (code | 0x20 if 0x41 <= code <= 0x5A else code) if code >= 0x80 or chr(code).isalnum() else 0x20
    for code in range(256)
)
"""For UTF-8: ASCII letters lower-cased, other ASCII characters but digits made a space, the
bytes of other characters kept. The text keeps its length in characters."""


def _fold(run: str) -> str:
    """NFKD, combining marks removed, case-folded."""
    if run.isascii():
        return run.lower()
    decomposed = unicodedata.normalize("NFKD", run)
    if not decomposed.isascii():
        decomposed = "".join(c for c in decomposed if not unicodedata.combining(c))
    return decomposed.casefold()


# How a text is folded. Folding acts on each character on its own: NFKD decomposes character
# by character and only reorders combining marks, which are all removed, and case folding has
# no context. So a run folds to its characters' folds put together, and a text is folded
# without being cut into runs first, in passes over the whole text rather than per word:
#
# - every non-ASCII character that separates runs becomes a space (a lone surrogate too);
# - ASCII letters are lower-cased and the other ASCII characters but digits become spaces, in
#   one translation of the UTF-8 bytes;
# - every other character that folding changes is replaced by its fold, in one pass per such
#   character of the text, with NUL for what in a fold is neither letter nor digit (``½``
#   gives ``1``, U+2044, ``2``);
# - the tokens are what `str.split` finds, unless a character is "odd" (a CJK letter, or one
#   that folds to CJK letters or to NUL): then CJK letters are taken one by one (`_CJK_RUNS`)
#   or the text is cut by `_TOKEN`.
#
# A text with more than `_MANY` characters to replace (Hangul, say) is folded whole instead:
# NFKD, marks removed, case folding, a pass each. Its separators are spaces by then: one could
# fold to nothing (a combining mark) or to letters (``™``) and join the runs around it.
#
# `iter_tokens` keeps each run's span: the first two steps keep the text's length, so cutting
# it at spaces gives the runs where they were, and cutting the replaced text (a fold holds no
# space) gives their folds, in the same order.


class _Learnt:
    """What folding does to each character seen so far (ASCII needs nothing of this)."""

    __slots__ = (
        "changing",
        "cjk",
        "folds",
        "known",
        "marked",
        "marks",
        "odd",
        "plain",
        "separators",
    )

    def __init__(self) -> None:
        self.plain: set[str] = set(map(chr, range(128)))
        """Characters that need nothing: ASCII, and letters and digits that fold to themselves
        (not CJK, no combining mark in their NFKD)."""
        self.separators: set[str] = set()
        """Characters that separate runs (neither letters nor digits): made spaces."""
        self.folds: dict[str, str] = {}
        """Letters and digits that fold to something else: their fold, with NUL for what in it
        is neither letter nor digit."""
        self.changing: set[str] = set()
        """The keys of `folds`."""
        self.odd: set[str] = set()
        """Letters and digits whose run may give other than one token: CJK letters, and those
        folding to CJK letters or to what is neither letter nor digit."""
        self.cjk: dict[str, str] = {}
        """The odd characters: the CJK letters of their fold (maybe none)."""
        self.marks: dict[str, str] = {}
        """Letters and digits whose NFKD holds combining marks: those marks."""
        self.marked: set[str] = set()
        """The keys of `marks`."""
        self.known: set[str] = set(self.plain)
        """Every character learnt (added last: the rest is in place by then)."""

    def learn(self, char: str) -> None:
        if _WORD.fullmatch(char) is None:
            self.separators.add(char)
        else:
            decomposed = unicodedata.normalize("NFKD", char)
            marks = "".join(c for c in decomposed if unicodedata.combining(c))
            folded = _SEPARATOR.sub("\0", _fold(char))
            odd = "\0" in folded or _CJK.search(folded) is not None
            if odd:
                self.cjk[char] = "".join(_CJK.findall(folded))
                self.odd.add(char)
            if marks:
                self.marks[char] = marks
                self.marked.add(char)
            if folded != char:
                self.folds[char] = folded
                self.changing.add(char)
            elif not odd and not marks:
                self.plain.add(char)
        self.known.add(char)


_learnt = _Learnt()
"""Replaced by a new one (not cleared) past `_LEARNT_AT_MOST`, so a call under way in
another thread keeps a consistent one."""
_LEARNT_AT_MOST = 1 << 15
"""Characters remembered at most; past that, all are forgotten and learnt again."""
_MANY = 24
"""More characters to replace than this, and the text is folded whole."""


def _forget() -> None:
    global _learnt
    _learnt = _Learnt()


def _look(text: str) -> tuple[set[str], list[tuple[str, str]] | None, str, bool, str | None]:
    """What folding ``text`` (not all ASCII) takes: the characters that separate runs, the
    others to replace and by what (``None``: too many, fold the text whole), the combining
    marks to remove then, whether a run may give other than one token, and then the CJK
    letters the folded text holds (``None``: too many characters to say)."""
    size = len(text)
    if size > 96 and len(text.encode("utf-8", "surrogatepass")) - size < 32:  # few non-ASCII
        chars = set(_NON_ASCII.findall(text))
    else:
        chars = set(text)
    learnt = _learnt
    rest = chars - learnt.plain
    new = rest - learnt.known
    if new:
        if len(learnt.known) + len(new) > _LEARNT_AT_MOST:
            _forget()
            learnt = _learnt
            new = rest = chars - learnt.plain
        for char in new:
            learnt.learn(char)
    changing = rest & learnt.changing
    marks = ""
    changes: list[tuple[str, str]] | None = None
    if len(changing) > _MANY:
        marks = "".join([learnt.marks[char] for char in rest & learnt.marked])
    else:
        changes = [(char, learnt.folds[char]) for char in changing]
    odd = rest & learnt.odd
    letters = "".join([learnt.cjk[char] for char in odd]) if len(odd) <= _MANY else None
    return rest & learnt.separators, changes, marks, bool(odd), letters


def _fold_whole(text: str, marks: str) -> str:
    text = unicodedata.normalize("NFKD", text)
    for mark in set(marks):
        text = text.replace(mark, "")
    return text.casefold()


def tokens(text: str) -> list[str]:
    """The tokens of ``text``, in order (see the module documentation)."""
    if text.isascii():
        return text.encode().translate(_ASCII_FOLD).decode().split()
    separators, changes, marks, odd, letters = _look(text)
    for char in separators:
        text = text.replace(char, " ")
    if changes is None:
        text = _fold_whole(text, marks)
    else:
        for char, replacement in changes:
            text = text.replace(char, replacement)
    text = text.encode().translate(_ASCII_FOLD).decode()
    if not odd:
        return text.split()
    if changes is None or len(text) <= 64:
        return _TOKEN.findall(text)
    # Only letters, digits and spaces are left (NUL became a space): CJK letters one by one,
    # a few distinct ones (CJK words in other text) each spaced apart in a pass of its own.
    if letters is not None:
        for letter in set(letters):
            text = text.replace(letter, f" {letter} ")
        return text.split()
    pieces = _CJK_RUNS.split(text)
    words = map(str.split, pieces[0::2])
    runs = map(list, pieces[1::2])
    return list(chain.from_iterable(chain.from_iterable(zip_longest(words, runs, fillvalue=()))))


def _chunk_columns(text: str, offset: int) -> tuple[list[str], list[int], list[int], bool]:
    """The runs of a text that starts at ``offset`` of the whole one, between two runs: each
    run folded, where it starts and ends, and whether a run may give other than one token (then
    it gives what `_TOKEN` finds in it, maybe nothing)."""
    changes: list[tuple[str, str]] | None = []
    odd = False
    if not text.isascii():
        separators, changes, marks, odd, _ = _look(text)
        for char in separators:
            text = text.replace(char, " ")
    text = text.encode().translate(_ASCII_FOLD).decode()  # the runs keep their spans
    runs = text.split(" ")  # and empty strings between separators
    folded = runs
    if changes is None:
        folded = _fold_whole(text.replace(" ", "\0"), marks).split("\0")
    elif changes:
        for char, replacement in changes:
            text = text.replace(char, replacement)
        folded = text.split(" ")
    lengths = list(map(len, runs))
    ends = list(map(add, accumulate(lengths), count(offset)))  # one separator after each run
    starts = map(sub, ends, lengths)
    # Runs that folded to nothing are no runs.
    return (
        list(compress(folded, folded)),
        list(compress(starts, folded)),
        list(compress(ends, folded)),
        odd,
    )


def _run_tokens(run: str) -> list[str]:
    """The tokens of one folded run of an odd text."""
    return [run] if run.isascii() and run.isalnum() else _TOKEN.findall(run)


def _chunk_tokens(text: str, offset: int) -> Iterator[tuple[str, int, int]]:
    """`iter_tokens` of a text that starts at ``offset`` of the whole one, between two runs."""
    runs, starts, ends, odd = _chunk_columns(text, offset)
    spans = zip(runs, starts, ends, strict=True)
    if not odd:  # one token per run
        return spans
    return iter([(token, start, end) for run, start, end in spans for token in _run_tokens(run)])


_CHUNK = 4096
"""`iter_tokens` folds this many characters at a time (or a little more), so a caller that
stops early does not pay for a long text's end."""


def _pieces(text: str) -> Iterator[tuple[str, int]]:
    """``text`` cut between runs into pieces of about `_CHUNK` characters, with their offsets."""
    size = len(text)
    if size <= _CHUNK:
        yield text, 0
        return
    begin = 0
    while begin < size:
        end = begin + _CHUNK
        if end < size:
            cut = _SEPARATOR.search(text, end)
            end = cut.start() if cut is not None else size
        yield text[begin:end], begin
        begin = end


def iter_tokens(text: str) -> Iterator[tuple[str, int, int]]:
    """``(token, start, end)`` for every token; the span is the run of ``text`` it came from."""
    if len(text) <= _CHUNK:
        return _chunk_tokens(text, 0)
    return chain.from_iterable(_chunk_tokens(piece, at) for piece, at in _pieces(text))


def word_hits(text: str, wanted: set[str]) -> Iterator[tuple[list[int], list[int], list[bool]]]:
    """The words of ``text`` a piece at a time (a word is a run giving at least one token):
    where each starts and ends, and whether it gives one of the ``wanted`` tokens. Each piece
    is folded and matched in a few C-level passes, so a caller may stop early cheaply."""
    for piece, at in _pieces(text):
        runs, starts, ends, odd = _chunk_columns(piece, at)
        if not odd:
            yield starts, ends, list(map(wanted.__contains__, runs))
            continue
        kept: tuple[list[int], list[int], list[bool]] = ([], [], [])
        for run, start, end in zip(runs, starts, ends, strict=True):
            found = _run_tokens(run)
            if found:
                kept[0].append(start)
                kept[1].append(end)
                kept[2].append(not wanted.isdisjoint(found))
        yield kept


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
    norm = _K1 * (1 - _B + _B * len(doc) / average_length) if average_length else _K1
    if len(query) == 1:  # the usual search: one word
        tf = doc.count(query[0])
        return tf * (_K1 + 1) / (tf + norm) if tf else 0
    wanted = set(query)
    # (first position, count) of each query token the message holds, summed in the order the
    # tokens first appear (so the float is the same whatever the order of the query).
    counts = []
    for token in wanted:
        tf = doc.count(token)
        if tf:
            counts.append((doc.index(token), tf))
    counts.sort()
    total = sum(tf * (_K1 + 1) / (tf + norm) for _, tf in counts)
    if len(counts) == len(wanted) and _in_a_row(doc, query):
        total += _PHRASE_BONUS
    return total


# --- PostgreSQL token hashes ------------------------------------------------------------

_INT4_OFFSET = 1 << 31


def token_hash(token: str) -> int:
    """The 32-bit hash PostgreSQL indexes for a token: the CRC-32 (``zlib.crc32``, the
    polynomial of zlib, PNG and Ethernet) of its UTF-8 bytes minus 2**31, a signed ``int4``.

    Part of the on-disk format: ``messages.search_hashes`` holds these values, so they must
    never change (and they are the same in every process; Python's ``hash()`` is not)."""
    return crc32(token.encode("utf-8")) - _INT4_OFFSET


_hashed: dict[str, int] = {}
"""`token_hash` of the tokens seen lately: a conversation's words recur, and a dictionary
lookup of many tokens at once is C-level where hashing them is a Python step each. Replaced
by a new one (not cleared) past `_HASHED_AT_MOST`, so a call under way in another thread
keeps a consistent one."""
_HASHED_AT_MOST = 1 << 16


def token_hashes(tokens: Iterable[str]) -> list[int]:
    """The distinct `token_hash` values of ``tokens``, ascending (one canonical array per set
    of tokens). Two tokens may share a hash: a match of hashes only makes a message a
    candidate, whose tokens are then checked."""
    global _hashed
    known = _hashed
    distinct = set(tokens)
    new = distinct.difference(known)
    if new:
        if len(known) + len(new) > _HASHED_AT_MOST:
            known = _hashed = {}
            new = distinct
        for token in new:
            known[token] = token_hash(token)
    return sorted(set(map(known.__getitem__, distinct)))
