"""examples/compaction.py, run offline: the real OpenAI SDK over a fake HTTP transport."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from openai import AsyncOpenAI

from agentcontext import ContextEngine, ContextWindow, SqlContextStore
from tests.examples.helpers import load_example

example = load_example("compaction")

LONG_ANSWER = "A ledger records every transaction of an account, debit and credit. " * 12


class FakeOpenAI:
    """An `AsyncOpenAI` whose HTTP transport answers Chat Completions locally."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.summaries = 0
        transport = httpx.MockTransport(self.handle)
        self.client = AsyncOpenAI(
            api_key="test", http_client=httpx.AsyncClient(transport=transport)
        )

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests.append(body)
        if body["messages"][0]["content"].startswith("Summarise"):
            self.summaries += 1
            content = f"Summary {self.summaries}: ledgers, debits and credits were explained."
        else:
            content = LONG_ANSWER
        return httpx.Response(
            200,
            json={
                "id": f"chatcmpl-{len(self.requests)}",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": content},
                    }
                ],
                "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
            },
        )


async def test_a_long_conversation_stays_in_the_window_and_compacts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    window = ContextWindow(2_000, model_id="gpt-4o-mini", reserve_output=300)
    monkeypatch.setattr(example, "WINDOW", window)
    fake = FakeOpenAI()
    url = f"sqlite+aiosqlite:///{tmp_path / 'chat.db'}"
    questions = [f"Question {i}: how do I book an invoice of {i * 100} euros?" for i in range(20)]
    answers = await example.run(fake.client, url, questions)
    assert answers == [LONG_ANSWER] * 20
    assert fake.summaries >= 2  # compacted more than once: the compactions nest

    turns = [r for r in fake.requests if not r["messages"][0]["content"].startswith("Summarise")]
    last = turns[-1]["messages"]
    assert last[0]["role"] == "system"
    assert last[1]["content"].startswith(f"Summary {fake.summaries - 1}") or last[1][
        "content"
    ].startswith(f"Summary {fake.summaries}")
    assert last[-1]["content"] == questions[-1]

    async with SqlContextStore(url) as store:
        graph = await store.get_graph("long-chat")
        assert sum(node.type == "compaction" for node in graph.nodes) == fake.summaries
        engine = ContextEngine(store=store, chat_id="long-chat", user_id="demo")
        assert engine.head_message_id is None
        await engine.initialize()
        assert engine.head_message_id is not None
        chain = await store.get_message_chain(engine.head_message_id)
        assert len(chain) == 40  # nothing deleted
        fitted = await engine.resolve(window=window)
        assert fitted.estimate is not None and fitted.estimate <= 2_000 - 300


def test_the_docs_quote_the_example() -> None:
    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "context-window.md").read_text(encoding="utf-8")
    source = (root / "examples" / "compaction.py").read_text(encoding="utf-8")
    blocks = page.split("```python\n")[1:]
    quoted = [block.split("```", 1)[0] for block in blocks]
    assert quoted[-1] in source
    assert "examples/compaction.py" in page
