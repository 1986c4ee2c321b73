"""examples/telemetry.py runs, and the Telemetry section of docs/production.md shows it as it is:
its program blocks are excerpts of the example and its output block is what the example
prints."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.examples.helpers import EXAMPLES, ROOT

FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def section() -> str:
    text = (ROOT / "docs" / "production.md").read_text(encoding="utf-8")
    start = text.index("\n## Telemetry\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def run_example() -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "telemetry.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout


def test_the_example_prints_the_request_span_with_agentcontexts_spans_inside() -> None:
    printed = run_example().splitlines()
    assert printed[0] == "handle request"
    children = [line.strip() for line in printed if line.startswith("  agentcontext.")]
    assert children == ["agentcontext.search", "agentcontext.resolve", "agentcontext.save"]
    assert "    gen_ai.conversation.id = 'chat-2'" in printed
    assert "    agentcontext.search.hits = 1" in printed  # the first request's question
    assert printed[-3:] == [
        f"agentcontext.operation.duration (s) {verb!r}: 2 call(s)"
        for verb in ("search", "resolve", "save")
    ]


def test_the_docs_show_the_example_and_its_output() -> None:
    blocks = FENCE.findall(section())
    source = (EXAMPLES / "telemetry.py").read_text(encoding="utf-8")
    python = [body for language, body in blocks if language == "python"]
    assert python[0] in source
    assert "tracer_provider = TracerProvider()" in python[0]
    assert "async def handle(" in python[0]
    [output] = [body for language, body in blocks if language == "text"]
    assert output == run_example()
    assert "examples/telemetry.py" in section()
