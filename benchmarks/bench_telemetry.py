"""What telemetry costs: off (no OpenTelemetry), the API without an SDK, and a recording SDK.

    python benchmarks/bench_telemetry.py [--rounds 7] [--calls 2000] [--json]

Each mode runs in a fresh interpreter (a process has one global tracer provider):

- **off**: ``opentelemetry`` made unimportable, as when it is not installed;
- **api**: ``opentelemetry-api`` importable, no SDK configured (the API's no-op tracer and meter);
- **sdk**: the SDK's ``TracerProvider`` with a span processor that drops every span, and a
  ``MeterProvider`` with an in-memory reader: every span is built and every duration recorded.

In each, per call, the median over the rounds of each round's median call (each round
``--calls`` calls of each, instrumented and bare alternating):

- **wrapper**: an empty instrumented coroutine method against the same method unwrapped: what
  the decorator alone adds to every verb (each call timed alone: the clock's own cost is in
  both figures, the difference is the wrapper's);
- **add()**: ``_telemetry.add`` outside any instrumented call (what ``_save.py`` pays per
  compare-and-swap attempt);
- **resolve / save / search**: ``ContextEngine.resolve()`` on a warm engine (20 messages),
  ``save()`` of one message, and ``search_messages()``, on an in-memory store, against the same
  method unwrapped (``__wrapped__``) on the same engine and store.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

MODES = ("off", "api", "sdk")


def _block_opentelemetry() -> None:
    import importlib.abc

    class NoOpenTelemetry(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
            if name.split(".")[0] == "opentelemetry":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, NoOpenTelemetry())


def _install_sdk() -> None:
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

    provider = TracerProvider()
    provider.add_span_processor(SpanProcessor())  # the base class drops every span
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))


async def per_call(
    instrumented: Callable[[], Awaitable[object]],
    bare: Callable[[], Awaitable[object]],
    calls: int,
    rounds: int,
) -> tuple[float, float]:
    """Seconds per call of each: the median over the rounds of each round's median call.

    The two are called in turn, in alternating order (instrumented first, then bare first), and
    each call is timed alone, so drift and the machine's noise fall on both alike.
    """
    medians: dict[bool, list[float]] = {True: [], False: []}
    clock = time.perf_counter
    for round_ in range(rounds + 1):  # the first round warms up
        times: dict[bool, list[float]] = {True: [], False: []}
        for i in range(calls):
            order = (True, False) if i % 2 else (False, True)
            for which in order:
                call = instrumented if which else bare
                start = clock()
                await call()
                times[which].append(clock() - start)
        if round_:
            for which in (True, False):
                medians[which].append(statistics.median(times[which]))
    return statistics.median(medians[True]), statistics.median(medians[False])


async def measure(mode: str, calls: int, rounds: int) -> dict[str, Any]:
    from agentcontext import ContextEngine, InMemoryContextStore, assistant_text, user
    from agentcontext import _telemetry as telemetry

    class Owner:
        chat_id, user_id, branch = "bench-chat", "bench-user", "main"

        @telemetry.verb("bench")
        async def noop(self) -> None:
            return None

    owner = Owner()
    bare_noop = Owner.noop.__wrapped__  # type: ignore[attr-defined]
    results: dict[str, Any] = {"mode": mode}
    on, off = await per_call(lambda: owner.noop(), lambda: bare_noop(owner), calls * 10, rounds)
    results["wrapper_ns"] = (on - off) * 1e9
    results["noop_ns"] = off * 1e9

    start = time.perf_counter()
    for _ in range(calls * 10):
        telemetry.add(telemetry.SAVE_ATTEMPTS)
    results["add_ns"] = (time.perf_counter() - start) / (calls * 10) * 1e9

    async with InMemoryContextStore() as store:
        engine = ContextEngine(store=store, chat_id="bench-chat", user_id="bench-user")
        for i in range(10):
            engine.set(user(f"question {i} about the ledger"), assistant_text(f"answer {i}"))
            await engine.save()
        resolve = ContextEngine.resolve.__wrapped__  # type: ignore[attr-defined]
        on, off = await per_call(engine.resolve, lambda: resolve(engine), calls, rounds)
        results["resolve"] = (on, off)

        save = ContextEngine.save.__wrapped__  # type: ignore[attr-defined]
        counter = iter(range(10**9))

        async def save_on() -> object:
            engine.set(user(f"message {next(counter)}"))
            return await engine.save()

        async def save_off() -> object:
            engine.set(user(f"message {next(counter)}"))
            return await save(engine)

        results["save"] = await per_call(save_on, save_off, max(calls // 10, 20), rounds)

        search = type(store).search_messages.__wrapped__

        async def search_off() -> object:
            return await search(store, "bench-chat", "ledger")

        results["search"] = await per_call(
            lambda: store.search_messages("bench-chat", "ledger"), search_off, calls // 4, rounds
        )
    results["imported"] = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")[:3]
    return results


def child(mode: str, calls: int, rounds: int) -> None:
    if mode == "off":
        _block_opentelemetry()
    elif mode == "sdk":
        _install_sdk()
    print(json.dumps(asyncio.run(measure(mode, calls, rounds))))


def run_mode(mode: str, calls: int, rounds: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", mode, "--calls", str(calls), "--rounds", str(rounds)],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def report(results: list[dict[str, Any]]) -> str:
    lines = [
        "| mode | wrapper per call | add() | resolve() | save() | search_messages() |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        cells = [r["mode"], f"{r['wrapper_ns']:.0f} ns", f"{r['add_ns']:.0f} ns"]
        for verb in ("resolve", "save", "search"):
            on, off = r[verb]
            cells.append(f"{on * 1e6:.1f} / {off * 1e6:.1f} µs ({(on - off) / off:+.1%})")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("resolve/save/search: instrumented / bare, per call (the difference in percent).")
    lines.append(f"An empty coroutine method costs {results[0]['noop_ns']:.0f} ns per call here.")
    for r in results:
        lines.append(f"{r['mode']}: OpenTelemetry modules imported: {r['imported'] or 'none'}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.calls, args.rounds)
        return
    results = [run_mode(mode, args.calls, args.rounds) for mode in MODES]
    print(json.dumps(results, indent=2) if args.json else report(results))


if __name__ == "__main__":
    main()
