"""Measure what importing agentcontext costs on top of SQLAlchemy and pydantic.

Run it with ``python benchmarks/bench_import.py`` (``--runs N`` for more fresh interpreters,
``--json`` for machine-readable output). Each run starts a new interpreter with
``python -X importtime`` that first imports the baseline (SQLAlchemy with its asyncio
extension and ORM, and pydantic's ``BaseModel``), then the statement measured, and reads the
cumulative time of that statement's top-level modules from the ``-X importtime`` report. The
median over the runs is printed, per statement:

- ``import agentcontext``: what every program pays (the goal is at most 60 ms);
- ``from agentcontext import ContextEngine, SqlContextStore``: what a program that opens a
  store pays before its first query;
- ``from agentcontext import *``: every public name.

It also lists, after each statement, which of the heavy optional modules (Alembic, rich,
Pygments, the genai-prices tables, tiktoken) got imported: none should be.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys

BASELINE = (
    "import sqlalchemy, sqlalchemy.ext.asyncio, sqlalchemy.orm; "
    "from pydantic import BaseModel, ConfigDict, Field, TypeAdapter"
)
STATEMENTS = (
    "import agentcontext",
    "from agentcontext import ContextEngine, SqlContextStore",
    "from agentcontext import *",
)
HEAVY = ("alembic", "rich", "pygments", "genai_prices", "tiktoken")
GOAL_MS = 60.0

_MARK = "--- statement ---"
_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)$")


def measure(statement: str) -> tuple[float, list[str]]:
    """One fresh interpreter: milliseconds spent in ``statement``, and the heavy modules loaded."""
    probe = f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    code = f"{BASELINE}\nimport sys\nsys.stderr.write('{_MARK}\\n')\n{statement}\n{probe}"
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, check=True
    )
    lines = done.stderr.splitlines()
    # `-X importtime` reports each module when its import finishes, so the statement's
    # modules are the top-level entries (one space of indentation) after the marker.
    after = lines[lines.index(_MARK) + 1 :]
    total_us = 0
    for line in after:
        match = _LINE.match(line)
        if match and len(match.group(3)) == 1:
            total_us += int(match.group(2))
    heavy = [name for name in done.stdout.strip().split(",") if name]
    return total_us / 1000, heavy


def main(argv: list[str] | None = None) -> int:
    """Print the median import time per statement; 1 if `import agentcontext` misses the goal."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="fresh interpreters per statement")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    results = []
    for statement in STATEMENTS:
        times = []
        heavy: set[str] = set()
        for _ in range(args.runs):
            elapsed, loaded = measure(statement)
            times.append(elapsed)
            heavy.update(loaded)
        results.append(
            {
                "statement": statement,
                "median_ms": round(statistics.median(times), 1),
                "min_ms": round(min(times), 1),
                "heavy_modules": sorted(heavy),
            }
        )
    if args.json:
        print(json.dumps({"baseline": BASELINE, "results": results}, indent=2))
    else:
        print(f"on top of: {BASELINE}")
        print(f"{'statement':<58} {'median':>9} {'min':>9}  heavy modules loaded")
        for row in results:
            heavy_text = ", ".join(row["heavy_modules"]) or "none"
            print(
                f"{row['statement']:<58} {row['median_ms']:>6.1f} ms {row['min_ms']:>6.1f} ms  "
                f"{heavy_text}"
            )
    first = results[0]
    return 0 if first["median_ms"] <= GOAL_MS and not first["heavy_modules"] else 1


if __name__ == "__main__":
    sys.exit(main())
