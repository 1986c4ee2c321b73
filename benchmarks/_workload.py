"""What the benchmarks measure on: realistic conversations, and timing helpers.

Messages alternate user/assistant and hold about 400 characters of varied text: words drawn
from a vocabulary of 40 000 pseudo-words with a Zipf distribution (a few very common, most
rare, as in real text), so full-text indexes, JSON decoding and disk usage see what they would
in production. Everything is seeded: every run measures the same messages.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from functools import cache
from typing import Any

TEXT_LENGTH = 400

_ONSETS = [
    "",
    "b",
    "c",
    "d",
    "f",
    "g",
    "h",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "w",
    "br",
    "ch",
    "cl",
    "dr",
    "fl",
    "gr",
    "pl",
    "pr",
    "sh",
    "st",
    "th",
    "tr",
    "wh",
]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ee", "ie", "oo", "ou", "y"]
_CODAS = ["", "", "n", "r", "s", "t", "l", "m", "nd", "nt", "rs", "st", "ck", "ng", "sh"]


@cache
def vocabulary(size: int = 40_000) -> list[str]:
    """Distinct pseudo-words, most common first."""
    rng = random.Random(20261124)
    words: dict[str, None] = {}
    while len(words) < size:
        syllables = rng.choice((1, 1, 2, 2, 2, 3, 3, 4))
        word = "".join(
            rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)
        )
        if len(word) > 1:
            words[word] = None
    return list(words)


def text(rng: random.Random, length: int = TEXT_LENGTH) -> str:
    """About ``length`` characters of varied text (Zipf-distributed words, some punctuation)."""
    words = vocabulary()
    out: list[str] = []
    size = 0
    while size < length:
        word = words[int(len(words) ** rng.random()) - 1]  # Zipf, s = 1
        if rng.random() < 0.08:
            word += rng.choice((",", ".", "?", ";", ":"))
        out.append(word)
        size += len(word) + 1
    sentence = " ".join(out)
    return sentence[0].upper() + sentence[1:] + "."


def conversation(n: int, seed: int = 1) -> list[tuple[str, str, str]]:
    """``n`` messages ``(id, role, text)``, alternating user and assistant."""
    rng = random.Random(seed)
    return [
        (uuid.UUID(int=rng.getrandbits(128)).hex, "user" if i % 2 == 0 else "assistant", text(rng))
        for i in range(n)
    ]


def message_data(message_id: str, role: str, body: str) -> dict[str, Any]:
    """The JSON a message is stored as (a `Message` with one text part)."""
    return {"id": message_id, "role": role, "parts": [{"type": "text", "text": body}]}


async def median_time(fn: Callable[[], Awaitable[Any]], runs: int, warmup: int = 1) -> float:
    """The median wall time of ``fn`` in seconds, after ``warmup`` calls. The garbage
    collector runs as usual (as it would for a user), but is emptied before each call."""
    for _ in range(warmup):
        await fn()
    samples = []
    for _ in range(runs):
        gc.collect()
        started = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


async def median_times(
    fns: list[Callable[[], Awaitable[Any]]], runs: int, warmup: int = 1, *, collect: bool = True
) -> list[float]:
    """The median wall time of each of ``fns``, measured in turns (one call of each per
    round), so that whatever the machine does meanwhile weighs on all of them alike.

    With ``collect`` the garbage collector is emptied before each call (for calls that
    allocate a lot, so one call's garbage is not collected in another's time). Without it the
    collector runs as it would in a server handling calls one after another: a full collection
    walks the whole heap and leaves the processor's caches cold, which would add a fixed cost
    of its own to calls lasting a millisecond or two."""
    for fn in fns:
        for _ in range(warmup):
            await fn()
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(runs):
        for fn, taken in zip(fns, samples, strict=True):
            if collect:
                gc.collect()
            started = time.perf_counter()
            await fn()
            taken.append(time.perf_counter() - started)
    return [statistics.median(taken) for taken in samples]


def ms(seconds: float) -> str:
    """Seconds as milliseconds, for tables."""
    return f"{seconds * 1000:,.1f} ms"


def us(seconds: float) -> str:
    """Seconds as microseconds, for tables."""
    return f"{seconds * 1e6:,.0f} µs"


def ratio(value: float, base: float) -> str:
    """``value / base`` as ``1.23x``."""
    return f"{value / base:.2f}x"


def row(*cells: str) -> str:
    """A Markdown table row."""
    return "| " + " | ".join(cells) + " |"
