"""The SQLAlchemy instrumentation snippet of docs/production.md traces the store's statements,
pasted as it is, on SQLite and PostgreSQL: each statement of a save is a client span under the
save's span. It runs in a fresh interpreter (a process has one global tracer provider)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)
DOCUMENTED_URL = '"postgresql+asyncpg://app@db/agents"'

PROGRAM = """
import asyncio, json

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

from agentcontext import ContextEngine, SqlContextStore, assistant_text, user


async def main():
    SNIPPET
    async with store:
        engine = ContextEngine(store=store, chat_id="c1", user_id="u1")
        engine.set(user("hello", id="q1"), assistant_text("hi", id="a1"))
        await engine.save()
    spans = exporter.get_finished_spans()
    [save] = [s for s in spans if s.name == "agentcontext.save"]
    statements = [
        s for s in spans
        if s.kind is SpanKind.CLIENT and s.name != "connect"
        and s.parent is not None and s.parent.span_id == save.context.span_id
    ]
    print(json.dumps([
        {"name": s.name, "text": str(s.attributes.get("db.statement") or s.attributes.get("db.query.text"))}
        for s in statements
    ]))


asyncio.run(main())
"""


def the_snippet() -> str:
    blocks = FENCE.findall((ROOT / "docs" / "production.md").read_text(encoding="utf-8"))
    [snippet] = [block for block in blocks if "SQLAlchemyInstrumentor().instrument(" in block]
    return str(snippet)


def test_the_documented_snippet_traces_every_statement_of_a_save(store_url: str) -> None:
    snippet = the_snippet()
    assert DOCUMENTED_URL in snippet
    pasted = textwrap.indent(snippet.replace(DOCUMENTED_URL, repr(store_url)), "    ").strip()
    code = textwrap.dedent(PROGRAM).replace("SNIPPET", pasted)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    statements: list[dict[str, Any]] = json.loads(done.stdout)
    assert statements, "the snippet instrumented nothing"
    assert any("messages" in s["text"] and "INSERT" in s["text"].upper() for s in statements), (
        statements
    )
