"""Snippets and ranks are exactly those of their first, word-by-word versions.

`snippet` finds a text's words and hits a piece of the text at a time in C-level passes, and
`score` counts the query's tokens with ``list.count``, where both used to take a Python step
per word; the references below are those first versions, verbatim (renamed; the phrase test
they share, `_tokenizer._in_a_row`, is unchanged). On any text, query and window size, the
snippet must be the same string and the rank the same float.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Sequence
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from agentcontext.store._rows import text as _text
from agentcontext.store._rows import tokenizer as _tokenizer
from agentcontext.store._rows.tokenizer import iter_tokens, query_tokens, tokens

from .test_tokenizer import EXAMPLES, _patched, texts

# --- the references, as they were -----------------------------------------------------------


def _reference_snippet(text: str, query: Sequence[str], *, words: int = 16) -> str:
    if not text:
        return ""
    wanted = set(query)
    runs: list[list[Any]] = []  # [start, end, hit] per word of the text
    first_hit: int | None = None
    complete = True
    for token, start, end in iter_tokens(text):
        if runs and runs[-1][0] == start:  # one word giving several tokens (CJK, ½)
            runs[-1][2] = runs[-1][2] or token in wanted
        else:
            if first_hit is not None and len(runs) > first_hit + 4 * words:
                complete = False
                break
            runs.append([start, end, token in wanted])
        if runs[-1][2] and first_hit is None:
            first_hit = len(runs) - 1
    if not runs:
        return " ".join(text[: words * 8].split())
    begin = 0
    if first_hit is not None:
        hits = [i for i, run in enumerate(runs) if run[2]]
        best, best_count = hits[0], 0
        for index, start in enumerate(hits):
            count = bisect.bisect_left(hits, start + words) - index
            if count > best_count:
                best, best_count = start, count
        begin = max(0, min(best - words // 4, len(runs) - words))
    last = min(len(runs), begin + words) - 1
    at_end = complete and last == len(runs) - 1
    pieces: list[str] = []
    cursor = runs[begin][0]
    for start, end, hit in runs[begin : last + 1]:
        pieces.append(text[cursor:start])
        pieces.append(f"<mark>{text[start:end]}</mark>" if hit else text[start:end])
        cursor = end
    if at_end:
        pieces.append(text[cursor:])
    body = " ".join("".join(pieces).split())
    prefix = "…" if text[: runs[begin][0]].strip() else ""
    return f"{prefix}{body}{'' if at_end else '…'}"


def _reference_score(doc: Sequence[str], query: Sequence[str], average_length: float) -> float:
    wanted = set(query)
    counts = Counter(token for token in doc if token in wanted)
    norm = 1.2 * (1 - 0.75 + 0.75 * len(doc) / average_length) if average_length else 1.2
    total = sum(tf * (1.2 + 1) / (tf + norm) for tf in counts.values())
    if len(query) > 1 and len(counts) == len(wanted) and _tokenizer._in_a_row(doc, query):
        total += 1.0
    return total


# --- properties ---------------------------------------------------------------------------

_repeated = st.tuples(texts, st.integers(min_value=1, max_value=40)).map(lambda t: t[0] * t[1])
"""Texts long enough to have more words than a snippet's reach, and hits far apart."""


@st.composite
def _text_and_query(draw: st.DrawFn) -> tuple[str, list[str]]:
    text = draw(st.one_of(texts, _repeated))
    own = tokens(text)
    picked = draw(st.lists(st.sampled_from(own), max_size=3)) if own else []
    other = draw(st.lists(st.sampled_from(["the", "fox", "zz", "日", "1"]), max_size=2))
    return text, list(dict.fromkeys(picked + other))


@settings(max_examples=EXAMPLES, deadline=None)
@given(_text_and_query(), st.integers(min_value=1, max_value=20))
@example(("", ["a"]), 16)
@example(("... --- !!!", ["a"]), 16)  # no word at all
@example(("the quick brown fox", []), 16)  # no query: the start of the text
@example(("a½b ⑴x ﬁ 日本語 x 日本", ["1", "日", "b"]), 2)  # runs giving several tokens
@example(("word " * 200 + "hit " + "word " * 200, ["hit"]), 16)  # a hit far in
@example(("hit " + "word " * 64, ["hit"]), 16)  # exactly the reach after the hit
@example(("hit " + "word " * 65, ["hit"]), 16)  # one word past the reach
@example(("x" * 5000 + " hit " + "y " * 3000, ["hit"]), 4)  # hits in a later piece
def test_snippets_are_the_reference_ones(case: tuple[str, list[str]], words: int) -> None:
    text, query = case
    assert _text.snippet(text, query, words=words) == _reference_snippet(
        text, query, words=words
    ), (text, query)


@settings(max_examples=max(EXAMPLES // 3, 20), deadline=None)
@given(_text_and_query(), st.integers(min_value=1, max_value=12))
def test_snippets_are_the_same_in_pieces(case: tuple[str, list[str]], chunk: int) -> None:
    """Cut into many small pieces, a text gives the same snippet."""
    text, query = case
    with _patched(_CHUNK=chunk):
        assert _text.snippet(text, query, words=3) == _reference_snippet(text, query, words=3)


@settings(max_examples=EXAMPLES, deadline=None)
@given(_text_and_query(), st.floats(min_value=0, max_value=500, allow_nan=False))
@example(("the fox the fox fox", ["fox", "the"]), 4.0)  # a phrase, and counts above one
@example(("fox the", ["the", "fox"]), 0.0)  # not in a row; no average
@example(("a b c", ["zz"]), 3.0)  # no query token in the text
def test_ranks_are_the_reference_ones(case: tuple[str, list[str]], average: float) -> None:
    text, query = case
    doc = tokens(text)
    if not query:
        query = query_tokens("the")
    assert _tokenizer.score(doc, query, average) == _reference_score(doc, query, average)
