# ruff: noqa: RUF001
"""The search tokenizer, per message, against its first (run-by-run) version.

    python benchmarks/bench_tokenizer.py [--runs 7] [--number 2000]

Each text kind is a set of messages of about 400 characters, seeded (the same every run):

- **workload**: the store benchmarks' text (``_workload.py``: Zipf-distributed pseudo-words,
  some punctuation) with a few words with accents or other non-ASCII letters and an emoji;
- **ASCII**: the same text without them;
- **German**, **Turkish**, **Japanese**, **Korean**: paragraphs of those languages (umlauts
  and ``ß``; dotted and dotless ``i``; kana and kanji, which are a token each; Hangul
  syllables, which decompose into letters, so many distinct characters change that the text
  is folded whole).

For each, the microseconds per message of ``tokens`` (what a save indexes), of
``iter_tokens`` run to the end (what a snippet reads) and of ``query_tokens`` on a short
query, for the version copied in ``tests/store/test_tokenizer.py`` and the current one, both
timed in the same run, in turns; the best of ``--runs`` rounds of ``--number`` calls.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import _workload  # noqa: E402
from tests.store.test_tokenizer import (  # noqa: E402
    _reference_iter_tokens,
    _reference_query_tokens,
    _reference_tokens,
)

from agentcontext.store._rows import tokenizer as _tokenizer  # noqa: E402

NON_ASCII_WORDS = ["café", "naïve", "Straße", "İstanbul", "größer", "résumé", "Zürich", "señor"]

GERMAN = (
    "Die Straßenbahn fährt über die Brücke, während die Fußgänger am Ufer entlang gehen. "
    "Größere Städte wie München, Köln und Düsseldorf haben ein dichtes Netz öffentlicher "
    "Verkehrsmittel; außerhalb der Ballungsräume ist man häufig auf das Auto angewiesen. "
    "Für Pendler, die täglich zwischen Wohnort und Arbeitsplatz hin- und herfahren, zählt "
    "vor allem die Pünktlichkeit der Züge. "
)
TURKISH = (
    "İstanbul'un tarihi yarımadasında yürürken, Ayasofya'nın kubbesi gökyüzüne doğru "
    "yükseliyor. Şehrin sokaklarında çay bahçeleri, küçük dükkânlar ve balıkçılar göze "
    "çarpıyor; Boğaz'ın kıyısında oturan insanlar gün batımını izliyor. Ilık bir rüzgâr "
    "esiyor ve martıların sesi vapur düdüklerine karışıyor, ÇOK GÜZEL BİR AKŞAM. "
)
JAPANESE = (
    "東京は日本の首都であり、世界でも有数の大都市です。新宿や渋谷などの繁華街には、"
    "昼夜を問わず多くの人々が集まります。電車のネットワークは非常に発達していて、"
    "通勤や通学に欠かせない交通手段となっています。一方で、浅草や谷中のような下町には、"
    "昔ながらの街並みが残っており、ゆったりとした時間が流れています。週末には、"
    "公園で花見を楽しんだり、美術館や博物館を訪れたりする人も多いです。"
    "最近では、外国からの観光客も増えており、英語の案内表示やWi-Fiの整備が進んでいます。"
)

KOREAN = (
    "서울은 대한민국의 수도이며, 한강을 따라 발달한 큰 도시입니다. 지하철과 버스가 잘 "
    "연결되어 있어서 어디든 쉽게 갈 수 있습니다. 경복궁과 북촌 한옥마을에서는 옛 모습을 "
    "볼 수 있고, 강남과 명동에서는 현대적인 거리를 걸을 수 있습니다. 주말에는 많은 "
    "사람들이 한강 공원에서 자전거를 타거나 치킨을 먹으며 시간을 보냅니다. "
)


def _cut(paragraph: str, rng: random.Random, length: int = _workload.TEXT_LENGTH) -> str:
    start = rng.randrange(len(paragraph))
    return (paragraph * 3)[start : start + length]


def texts(kind: str, count: int = 50) -> list[str]:
    """``count`` messages of one kind."""
    rng = random.Random(7)
    out = []
    for _ in range(count):
        if kind in ("workload", "ASCII"):
            words = _workload.text(rng).split(" ")
            if kind == "workload":
                for _ in range(3):
                    words[rng.randrange(len(words))] = rng.choice(NON_ASCII_WORDS)
                words.insert(rng.randrange(len(words)), "🙂")
            out.append(" ".join(words))
        else:
            paragraph = {
                "German": GERMAN,
                "Turkish": TURKISH,
                "Japanese": JAPANESE,
                "Korean": KOREAN,
            }[kind]
            out.append(_cut(paragraph, rng))
    return out


def per_call(fns: list[Callable[[str], object]], inputs: list[str], runs: int, number: int):
    """The best time per call of each of ``fns`` over ``inputs``, in microseconds."""
    best = [float("inf")] * len(fns)
    rounds = max(1, number // len(inputs))
    for _ in range(runs):
        for index, fn in enumerate(fns):
            started = time.perf_counter()
            for _ in range(rounds):
                for text in inputs:
                    fn(text)
            taken = (time.perf_counter() - started) / (rounds * len(inputs))
            best[index] = min(best[index], taken)
    return [seconds * 1e6 for seconds in best]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--number", type=int, default=2000)
    args = parser.parse_args()
    kinds = ["workload", "ASCII", "German", "Turkish", "Japanese", "Korean"]
    for kind in kinds:
        for text in texts(kind):
            assert _tokenizer.tokens(text) == _reference_tokens(text)
            assert list(_tokenizer.iter_tokens(text)) == list(_reference_iter_tokens(text))
    pairs: list[tuple[str, Callable[[str], object], Callable[[str], object], bool]] = [
        ("tokens", _reference_tokens, _tokenizer.tokens, False),
        (
            "iter_tokens",
            lambda t: list(_reference_iter_tokens(t)),
            lambda t: list(_tokenizer.iter_tokens(t)),
            False,
        ),
        ("query_tokens", _reference_query_tokens, _tokenizer.query_tokens, True),
    ]
    print(f"Python {sys.version.split()[0]}; µs per call, best of {args.runs} rounds")
    print()
    print("| text | chars | function | before | after | speed-up |")
    print("|---|---:|---|---:|---:|---:|")
    for kind in kinds:
        inputs = texts(kind)
        for name, old, new, short in pairs:
            sample = [" ".join(text.split(" ")[3:6]) for text in inputs] if short else inputs
            if kind in ("Japanese", "Korean") and short:
                sample = [text[10:16] for text in inputs]
            before, after = per_call([old, new], sample, args.runs, args.number)
            chars = sum(map(len, sample)) / len(sample)
            print(
                f"| {kind} | {chars:.0f} | {name} | {before:.1f} | {after:.1f} "
                f"| {before / after:.1f}x |"
            )


if __name__ == "__main__":
    main()
