"""The probe's searches of `bench_scale.py`, alone: with the pages in memory, and from disk.

    python benchmarks/bench_scale_search.py DATA_DIR [--reps 7] [--out FILE]

`bench_scale.py` times its search cells in turns with the other cells of their group, among
them `LIKE` scans of the big user's chats, which at a million messages read the whole 1.4 GB
file for 3 s between two searches of the probe. What it reports for a search in a small scope
is then partly a read from disk. This cell measures the same searches (the probe chat and the
probe user, a common and a rare word) on the SQLite databases that ``bench_scale.py --keep
--data-dir DATA_DIR`` kept, each call on a new store (opened and connected untimed), in a
fresh process, two ways:

- **in memory**: one untimed call first, so that the pages it reads are in the OS cache;
- **from disk**: the OS page cache dropped before each call (``/proc/sys/vm/drop_caches``;
  needs root, else this mode is skipped with the reason).

Medians of ``--reps`` calls; growth = the largest database over the smallest. The search
results are checked (20 hits for the common word, 1 and 3 for the rare one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from agentcontext import SqlContextStore

COMMON, RARE = "flaflyn", "zebracorn"  # bench_scale's words (its dataset version 1)
CALLS = {
    "search_messages(probe chat, common word)": ("chat", COMMON, 20),
    "search_messages(probe chat, rare word)": ("chat", RARE, 1),
    "search_user_messages(probe user, common word)": ("user", COMMON, 20),
    "search_user_messages(probe user, rare word)": ("user", RARE, 3),
}


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as caches:
        caches.write("3\n")


async def one(path: Path, scope: str, word: str, hits: int, cold: bool) -> float:
    if cold:
        drop_caches()
    async with SqlContextStore(f"sqlite+aiosqlite:///{path}") as store:
        await store.list_chats(user_id="nobody")  # connected, untimed

        async def call() -> list[Any]:
            if scope == "chat":
                return await store.search_messages("probe-0", word)
            return await store.search_user_messages("probe-user", word)

        if not cold:
            await call()
        started = time.perf_counter()
        found = await call()
        took = time.perf_counter() - started
    assert len(found) == hits, (scope, word, len(found))
    return took


async def measure(path: Path, cold: bool, reps: int) -> dict[str, float]:
    out = {}
    for name, (scope, word, hits) in CALLS.items():
        out[name] = statistics.median(
            [await one(path, scope, word, hits, cold) for _ in range(reps)]
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    found = sorted(
        (int(m.group(1)), p)
        for p in args.data_dir.glob("scale-*-v1.db")
        if (m := re.fullmatch(r"scale-(\d+)-v1\.db", p.name))
    )
    if len(found) < 2:
        sys.exit(f"need two databases kept by bench_scale.py --keep in {args.data_dir}")
    modes = {"in memory": False, "from disk": True}
    try:
        drop_caches()
    except OSError as exc:
        print(f"from disk: skipped, the page cache cannot be dropped here ({exc})")
        del modes["from disk"]
    results: dict[str, dict[int, dict[str, float]]] = {}
    for mode, cold in modes.items():
        results[mode] = {size: asyncio.run(measure(path, cold, args.reps)) for size, path in found}
    small, large = found[0][0], found[-1][0]
    print(f"| cell | mode | {small:,} | {large:,} | growth |\n|---|---|---:|---:|---:|")
    for name in CALLS:
        for mode in results:
            a, b = results[mode][small][name], results[mode][large][name]
            print(f"| {name} | {mode} | {a * 1e3:.2f} ms | {b * 1e3:.2f} ms | {b / a:.2f}x |")
    if args.out:
        args.out.write_text(json.dumps({"reps": args.reps, "results": results}, indent=1))


if __name__ == "__main__":
    main()
