"""The code of the integration pages runs as written: each page's Python blocks, put
together, make a module whose functions are called here with offline models."""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Any

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage

from agentcontext import ContextEngine, SqlContextStore, ToolPart
from tests.integrations.agents_helpers import ScriptedModel, turn

DOCS = Path(__file__).resolve().parents[2] / "docs" / "integrations"
FENCE = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def page_module(page: str) -> types.ModuleType:
    code = "\n\n".join(FENCE.findall((DOCS / page).read_text(encoding="utf-8")))
    module = types.ModuleType(f"docs_{page.replace('-', '_').removesuffix('.md')}")
    exec(compile(code, str(DOCS / page), "exec"), module.__dict__)
    return module


async def test_the_openai_agents_page(tmp_path: Path) -> None:
    page = page_module("openai-agents.md")
    url = f"sqlite+aiosqlite:///{tmp_path / 'a.db'}"
    model = ScriptedModel(turn(1, "Paris") + turn(2, "Tokyo"))
    answers = await page.chat(model, url, ["Weather in Paris?", "And Tokyo?"])
    assert answers == ["Paris: sunny, 24 °C.", "Tokyo: rainy, 18 °C."]

    popped, branch, branches = await page.correct_last_question(url, "And Rome?")
    assert popped["type"] == "message" and popped["role"] == "assistant"
    assert branch == "main-v2" and branches == 2
    async with SqlContextStore(url) as store:
        context = ContextEngine(store=store, chat_id="trip-1", user_id="user-1")
        messages = await context.get_messages()
    assert messages[-1].text == "And Rome?"
    assert len(messages) == 10  # 5 items per turn, the last answer popped, a question added


class ToolModel(FakeMessagesListChatModel):
    """A scripted chat model that accepts tools (as a real one would)."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


async def test_the_langchain_page(tmp_path: Path) -> None:
    page = page_module("langchain.md")
    url = f"sqlite+aiosqlite:///{tmp_path / 'l.db'}"
    model = ToolModel(
        responses=[
            AIMessage(
                content="",
                tool_calls=[{"id": "call_1", "name": "get_weather", "args": {"city": "Paris"}}],
            ),
            AIMessage(content="It is sunny, 24 °C."),
        ]
    )
    assert await page.ask(model, url, "Weather in Paris?") == "It is sunny, 24 °C."
    async with SqlContextStore(url) as store:
        context = ContextEngine(store=store, chat_id="chat-1", user_id="user-1")
        question, answer = await context.get_messages()
    assert question.text == "Weather in Paris?"
    assert answer.parts[0] == ToolPart(
        tool_call_id="call_1",
        tool_name="get_weather",
        input={"city": "Paris"},
        state="output-available",
        output="sunny, 24 °C",
    )
    assert answer.text == "It is sunny, 24 °C."
