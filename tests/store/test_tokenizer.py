# ruff: noqa: RUF001
"""The search tokenizer gives exactly the tokens (and spans) of its first, run-by-run version.

The tokenizer folds a text whole, in a few passes, where it used to fold each run of letters
and digits on its own; the reference below is that first version, verbatim (renamed). Every
token, span and query must be the same on any text. ``AGENTCONTEXT_TOKENIZER_EXAMPLES`` runs
more examples than the suite does.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import unicodedata
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agentcontext.store._rows import tokenizer as _tokenizer
from agentcontext.store._rows.tokenizer import iter_tokens, query_tokens, tokens

EXAMPLES = int(os.environ.get("AGENTCONTEXT_TOKENIZER_EXAMPLES", "300"))

# --- the reference: the run-by-run tokenizer, as it was -------------------------------------

_reference_ASCII_WORD = re.compile(r"[a-z0-9]+")
_reference_WORD = re.compile(r"[^\W_]+")
_reference_CJK = re.compile(
    "[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]"
)


def _reference_fold(run: str) -> str:
    """NFKD, combining marks removed, case-folded."""
    if run.isascii():
        return run.lower()
    decomposed = unicodedata.normalize("NFKD", run)
    if not decomposed.isascii():
        decomposed = "".join(c for c in decomposed if not unicodedata.combining(c))
    return decomposed.casefold()


def _reference_split(folded: str) -> Iterator[str]:
    """The tokens of one folded run: letter/digit runs, CJK characters one by one."""
    for word in _reference_WORD.findall(folded):
        if word.isascii() or not _reference_CJK.search(word):
            yield word
            continue
        start = 0
        for hit in _reference_CJK.finditer(word):
            if hit.start() > start:
                yield word[start : hit.start()]
            yield hit.group()
            start = hit.end()
        if start < len(word):
            yield word[start:]


def _reference_iter_tokens(text: str) -> Iterator[tuple[str, int, int]]:
    """``(token, start, end)`` for every token; the span is the run of ``text`` it came from."""
    if text.isascii():
        for hit in _reference_ASCII_WORD.finditer(text.lower()):
            yield hit.group(), hit.start(), hit.end()
        return
    for run in _reference_WORD.finditer(text):
        for token in _reference_split(_reference_fold(run.group())):
            yield token, run.start(), run.end()


def _reference_tokens(text: str) -> list[str]:
    """The tokens of ``text``, in order."""
    if text.isascii():
        return _reference_ASCII_WORD.findall(text.lower())
    out: list[str] = []
    for run in _reference_WORD.findall(text):
        out.extend(_reference_split(_reference_fold(run)))
    return out


def _reference_query_tokens(query: str) -> list[str]:
    return list(dict.fromkeys(_reference_tokens(query)))


# --- texts --------------------------------------------------------------------------------

TRAPS = (
    # compatibility characters that decompose into letters, digits, punctuation or spaces
    "½¼⅓⅞ﬁﬂﬀﬃﬅ™℠℡℅№㎏㍱㋿Ⓐⓐ①⑴⒜²³₂Ⅻⅻ𝐀𝔸🄰🅐🄐ªº…‥"
    "\uff26\uff4f\uff4f\uff01\uff1f\uff3f\uff0e\u3000\u00a0\u2002\u2007\u202f\u00a8\u00af\u00b4"
    # case folding that changes lengths or needs the NFKD first
    "ßẞİıIiſŉǰΐΰΣσςΆ΅ᾳᾼﬆﬓ"
    # combining marks, alone or in decompositions; marks that fold to letters (U+0345)
    "\u0300\u0301\u0308\u0327\u0340\u0344\u0345\u20dd\u0f73\u0f75\u0f81\u302a\u3099\u309a"
    # halfwidth voiced-sound marks (letters that fold to nothing), kana with them, CJK
    "ﾞﾟｶﾞﾊﾟ゛゜がパヴ・゠ー日本語東京テスト한국어가힣ᄀ\u3040\u3097\u309f\u30ff\u4dbf\u4e00\u9fff"
    "\ufa0e\ufa6e\uf900\U00020000\U0002a6e0\U0003134f\U00031350\U0002f800"
    # emoji and joiners; other scripts; digits of other scripts
    "🙂🦊👍🏽👨\u200d👩\u200d👧🇫🇷\u200b\u200c\u2060\ufeff\ufe0f"
    "Ελλάδαмоскваمرحباשלוםहिन्दीไทย٣٤५๓"
    # separators and everything that joins words elsewhere
    "_-.,;:'\"/\\@#$%^&*()[]{}<>=+~`|!? \t\n\r\x0b\x0c\x1c\x1f\x00\x7f"
)

_alphabet = st.one_of(
    st.sampled_from(TRAPS),
    st.characters(codec="utf-8"),  # any character but a surrogate
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),  # lone surrogates (rarely)
    st.characters(min_codepoint=0x20, max_codepoint=0x7E),
    st.characters(min_codepoint=0x00C0, max_codepoint=0x024F),  # accented Latin
    st.characters(min_codepoint=0x0300, max_codepoint=0x036F),  # combining marks
    st.characters(min_codepoint=0x1F00, max_codepoint=0x1FFF),  # polytonic Greek
    st.characters(min_codepoint=0x2100, max_codepoint=0x24FF),  # letterlike, numbers, enclosed
    st.characters(min_codepoint=0x3000, max_codepoint=0x33FF),  # CJK punctuation, kana, compat
    st.characters(min_codepoint=0x4E00, max_codepoint=0x4E80),  # CJK
    st.characters(min_codepoint=0xAC00, max_codepoint=0xAC80),  # Hangul
    st.characters(min_codepoint=0xF900, max_codepoint=0xFB4F),  # compat CJK, presentation forms
    st.characters(min_codepoint=0xFF00, max_codepoint=0xFFEF),  # halfwidth and fullwidth
    st.characters(min_codepoint=0x1D400, max_codepoint=0x1D7FF),  # mathematical letters
    st.characters(min_codepoint=0x1F100, max_codepoint=0x1FAFF),  # enclosed, emoji
    st.characters(min_codepoint=0x20000, max_codepoint=0x2000F),  # CJK beyond the BMP
    st.characters(min_codepoint=0x3133F, max_codepoint=0x3135F),  # the end of that range
)
_words = st.lists(
    st.one_of(
        st.sampled_from(["the", "Fox", "café", "İstanbul", "straße", "naïve", "x²", "½", "ﬁle"]),
        st.text(_alphabet, min_size=1, max_size=8),
    ),
    max_size=30,
).map(" ".join)
texts = st.one_of(st.text(_alphabet, max_size=80), _words)


def _assert_same(text: str) -> None:
    assert tokens(text) == _reference_tokens(text), text
    assert list(iter_tokens(text)) == list(_reference_iter_tokens(text)), text
    assert query_tokens(text) == _reference_query_tokens(text), text


# --- properties ---------------------------------------------------------------------------


@settings(max_examples=EXAMPLES, deadline=None)
@given(texts)
@example("")
@example("plain ASCII, with punctuation: foo.bar@example.com 3.14159 snake_case")
@example("Ein Straßenfest in İstanbul, naïve Ångström café 🙂 for 50%")
@example("a½b ½x 1½ ⅞")  # a letter or digit run that folds to two tokens
@example("ﬁle ﬀ ﬃx")  # ligatures
@example("a™b x℠y 5㎏ n№1 c℅o")  # separators that fold to letters: blanked, not joined
@example("Ⓐb ⓐⓑ 🄰🄱 ⑴⒜")  # enclosed forms: letters for some, symbols folding to letters
@example("\uff26\uff4f\uff4f\uff01bar\uff3fbaz\u3000qux")  # fullwidth letters and separators
@example("e\u0301x a\u0308\u0301b \u0301start end\u0301")  # combining marks in the text
@example("a\u0345b ᾳ ᾼ")  # a mark that case-folds to a letter, and letters holding it
@example("a\u0340b a\u0344b \u0f73x \u0f75")  # separators whose NFKD is only marks
@example("a΅b ¨x ´y")  # separators decomposing into a space and marks
@example("ß ẞ STRASSE straße ﬆ ﬅ ſ")  # case folding that lengthens
@example("İ İstanbul ı ISTANBUL i̇")  # dotted and dotless i
@example("ŉ ǰ ΐ ΰ ΣΑΣ σας")  # case folding with marks, final sigma
@example("ｶﾞ ﾊﾟ ﾞ ﾟaﾞb")
@example("aﾞ ﾞ b ﾟ")  # halfwidth voiced marks: letters folding to nothing
@example("が パ ヴ か\u3099 ゛゜・゠ー")  # kana with (and without) composed voiced marks
@example("東京は日本の首都です。テストtest日本x語")  # CJK one by one, Latin between
@example("日本 a½b ⑴x ﬁ")  # CJK, and letters folding to more than one token
@example("東京は日本の首都です。テストtest日本x語 " * 4 + "a½b ⑴x ﬁ ｶﾞ")  # the same, longer
@example("한국어 가힣 ᄀᄁ")  # Hangul (syllables decompose into jamo)
@example("\U00020000a\U0003134fb\U00031350c \U0002f800")  # CJK beyond the BMP, and past it
@example("\u3040\u3097\u309f\u30ff\u4dbf\u4e00\u9fff\ufa0e")  # the CJK ranges' edges
@example("👍🏽 👨\u200d👩\u200d👧 🇫🇷 a\u200bb c\u200dd e\ufeff\ufe0ff")  # emoji and joiners
@example("snake_case __dunder__ ＿x＿")  # underscores separate
@example("x²³ ₂ Ⅻ ⅻ ٣٤ ५ ๓ 𝐀𝔸")  # digits and letters of other forms
@example("a\x00b \x1c\x1f\x0b\x0c")  # NUL and odd whitespace
@example("a\ud800b \udfff é\udc80x")  # lone surrogates (from JSON's escapes) separate
def test_tokens_spans_and_queries_are_the_reference_ones(text: str) -> None:
    _assert_same(text)


@contextlib.contextmanager
def _patched(**values: object) -> Iterator[None]:
    saved = {name: getattr(_tokenizer, name) for name in values}
    for name, value in values.items():
        setattr(_tokenizer, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(_tokenizer, name, value)


@settings(max_examples=max(EXAMPLES // 3, 20), deadline=None)
@given(texts, st.integers(min_value=1, max_value=12))
@example("aé b½c 日本 ﬁ e\u0301x", 1)
def test_spans_are_the_same_in_chunks(text: str, chunk: int) -> None:
    """`iter_tokens` folds long texts a piece at a time; the cuts change nothing."""
    with _patched(_CHUNK=chunk):
        assert list(iter_tokens(text)) == list(_reference_iter_tokens(text)), text


def test_a_long_text_in_chunks() -> None:
    piece = "Straße naïve ½ 日本語 ﬁle e\u0301x İstanbul 🙂 a™b foo_bar " * 3
    text = piece * (3 * _tokenizer._CHUNK // len(piece))
    assert len(text) > 2 * _tokenizer._CHUNK
    _assert_same(text)
    _assert_same("é" + "x" * (2 * _tokenizer._CHUNK) + " é")  # one run longer than a chunk


@settings(max_examples=max(EXAMPLES // 3, 20), deadline=None)
@given(texts, st.sampled_from([0, 1, 3]))
@example("가나다 한국어 ÀÉÎÕÜ ﬁ½ ﹰx", 0)
def test_the_same_when_texts_are_folded_whole(text: str, many: int) -> None:
    """Past a number of characters to replace, a text is folded whole instead."""
    with _patched(_MANY=many):
        _assert_same(text)


@settings(max_examples=max(EXAMPLES // 3, 20), deadline=None)
@given(texts)
def test_the_same_when_characters_are_forgotten(text: str) -> None:
    """Past a bound, the characters learnt are forgotten and learnt again."""
    with _patched(_LEARNT_AT_MOST=0):
        _tokenizer._forget()
        _assert_same(text)
        assert set(map(chr, range(128))) | set(text) >= _tokenizer._learnt.known


def test_threads_that_learn_and_forget_at_once() -> None:
    """A thread that makes the others' characters forgotten does not change their tokens."""
    samples = [
        "".join(chr(code) for code in range(start, start + 40)) + " Straße ½ 日本 e\u0301x"
        for start in range(0xA0, 0x3000, 37)
    ]
    expected = [(_reference_tokens(text), list(_reference_iter_tokens(text))) for text in samples]

    def work(offset: int) -> bool:
        order = samples[offset:] + samples[:offset]
        wanted = expected[offset:] + expected[:offset]
        return all(
            (tokens(text), list(iter_tokens(text))) == pair
            for text, pair in zip(order, wanted, strict=True)
        )

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with _patched(_LEARNT_AT_MOST=300), ThreadPoolExecutor(4) as pool:
            assert all(pool.map(work, [i * len(samples) // 4 for i in range(4)]))
    finally:
        sys.setswitchinterval(interval)


@functools.cache
def _changed_by_folding() -> list[str]:
    """Every character that folding changes (CJK letters fold to themselves: only the edges of
    their ranges are taken)."""
    chars = []
    for code in range(0x80, 0x110000):
        char = chr(code)
        if 0xD800 <= code <= 0xDFFF:
            continue
        if (
            unicodedata.combining(char)
            or unicodedata.decomposition(char)
            or (char.casefold() != char)
        ):
            chars.append(char)
    edges = [(0x3040, 0x30FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF)]
    for low, high in [*edges, (0x20000, 0x3134F)]:
        chars.extend(chr(code) for code in (low - 1, low, low + 1, high - 1, high, high + 1))
    return chars


@pytest.mark.parametrize("many", [_tokenizer._MANY, 0])
@pytest.mark.parametrize("context", ["{}", "a{}b", "é{}x", "日{}ab{}", "{}\u0301é"])
def test_every_character_that_folding_changes(context: str, many: int) -> None:
    """Each such character in a few surroundings, replaced or in a text folded whole."""
    with _patched(_MANY=many):
        for char in _changed_by_folding():
            text = context.format(char, char)
            assert tokens(text) == _reference_tokens(text), text
            assert list(iter_tokens(text)) == list(_reference_iter_tokens(text)), text
