"""Telemetry off: without OpenTelemetry nothing of it is imported; without an SDK, nothing is
recorded. Each case runs in a fresh interpreter (a process has one global tracer provider)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

PROGRAM = """
import asyncio, importlib.abc, json, sys

if BLOCK:
    class NoOpenTelemetry(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "opentelemetry":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoOpenTelemetry())

from agentcontext import ContextEngine, SqlContextStore, assistant_text, user
from agentcontext import _telemetry


async def main():
    async with SqlContextStore(URL) as store:
        engine = ContextEngine(store=store, chat_id="off-chat", user_id="off-user")
        engine.set(user("hello", id="off-q"), assistant_text("hi", id="off-a"))
        saved = await engine.save()
        result = await engine.resolve()
        hits = await store.search_messages("off-chat", "hello")
    loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
    recording = None
    if not BLOCK:
        from opentelemetry import trace
        recording = trace.get_tracer("probe").start_span("probe").is_recording()
    print(json.dumps({
        "head": saved.head_message_id,
        "messages": [m.id for m in result.messages],
        "hits": [h.message.id for h in hits],
        "tried": _telemetry._checked,
        "api": _telemetry._otel is not None,
        "loaded": loaded,
        "recording": recording,
    }))


asyncio.run(main())
"""


def run(url: str, *, block: bool) -> dict[str, Any]:
    code = f"BLOCK = {block!r}\nURL = {url!r}\n" + textwrap.dedent(PROGRAM)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    outcome: dict[str, Any] = json.loads(done.stdout)
    return outcome


def test_without_opentelemetry_nothing_of_it_is_imported(store_url: str) -> None:
    outcome = run(store_url, block=True)
    assert outcome["head"] == "off-a"
    assert outcome["messages"] == ["off-q", "off-a"]
    assert outcome["hits"] == ["off-q"]
    assert outcome["tried"] is True and outcome["api"] is False
    assert outcome["loaded"] == []


def test_with_the_api_and_no_sdk_nothing_is_recorded(store_url: str) -> None:
    outcome = run(store_url, block=False)
    assert outcome["messages"] == ["off-q", "off-a"] and outcome["hits"] == ["off-q"]
    assert outcome["tried"] is True and outcome["api"] is True
    assert "opentelemetry.trace" in outcome["loaded"]
    assert "opentelemetry.sdk" not in outcome["loaded"]
    assert outcome["recording"] is False


def test_importing_agentcontext_imports_no_opentelemetry() -> None:
    """Even with OpenTelemetry installed, it is imported at the first instrumented call only."""
    code = (
        "import sys, agentcontext.engine, agentcontext.store.sql; "
        "print([m for m in sys.modules if m.split('.')[0] == 'opentelemetry'])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"
