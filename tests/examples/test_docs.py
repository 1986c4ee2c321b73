"""The integration pages stay in sync with the examples they quote.

Every Python block of docs/integrations/<page>.md must be a verbatim excerpt of the example
(or of its test, for the fake clients), and the sample requests and outputs shown on the pages
must be what the examples really send and print.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agentcontext import ContextEngine, SqlContextStore
from tests.examples import test_anthropic_agent, test_openai_agent, test_pydantic_ai_agent
from tests.examples.helpers import DOCS, EXAMPLES, load_example

PAGES = {
    "openai.md": "openai_agent",
    "anthropic.md": "anthropic_agent",
    "pydantic-ai.md": "pydantic_ai_agent",
}
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def blocks(page: str, language: str) -> list[str]:
    text = (DOCS / page).read_text(encoding="utf-8")
    return [body for lang, body in FENCE.findall(text) if lang == language]


@pytest.mark.parametrize(("page", "example"), PAGES.items())
def test_every_python_block_is_quoted_from_the_example(page: str, example: str) -> None:
    sources = [
        (EXAMPLES / f"{example}.py").read_text(encoding="utf-8"),
        (Path(__file__).parent / f"test_{example}.py").read_text(encoding="utf-8"),
    ]
    python_blocks = blocks(page, "python")
    assert len(python_blocks) >= 3
    for block in python_blocks:
        assert any(block in source for source in sources), f"not in {example}.py:\n{block}"
    text = (DOCS / page).read_text(encoding="utf-8")
    assert f"examples/{example}.py" in text


async def test_the_openai_page_shows_the_request_the_example_sends(tmp_path: Path) -> None:
    answer = "It is sunny and 24 °C in Paris."
    client = test_openai_agent.FakeOpenAI(
        test_openai_agent.completion(calls=[("call_1", "get_weather", '{"city": "Paris"}')]),
        test_openai_agent.completion(answer),
    )
    url = f"sqlite+aiosqlite:///{tmp_path / 'chat.db'}"
    await load_example("openai_agent").run(client, url, [test_openai_agent.PARIS])
    sent = [*client.requests[-1]["messages"], {"role": "assistant", "content": answer}]

    [sample] = (json.loads(block) for block in blocks("openai.md", "json"))
    system = sample[0]["content"]
    assert system.endswith("...") and sent[0]["content"].startswith(system[:-3])
    assert sample[1:] == sent[1:]


async def test_the_anthropic_page_shows_the_request_the_example_sends(tmp_path: Path) -> None:
    answer = "It is sunny and 24 °C in Paris."
    client = test_anthropic_agent.FakeAnthropic(
        test_anthropic_agent.reply("Let me check.", ("toolu_1", "get_weather", {"city": "Paris"})),
        test_anthropic_agent.reply(answer),
    )
    url = f"sqlite+aiosqlite:///{tmp_path / 'chat.db'}"
    await load_example("anthropic_agent").run(client, url, [test_anthropic_agent.PARIS])
    async with SqlContextStore(url) as store:
        context = ContextEngine(store=store, chat_id="anthropic-demo", user_id="demo-user")
        context.set(*load_example("anthropic_agent").system_prompt())
        sent = (await context.resolve()).to_anthropic()

    [sample] = (json.loads(block) for block in blocks("anthropic.md", "json"))
    assert sample["system"].endswith("...")
    assert sent["system"].startswith(sample["system"][:-3])
    assert sample["messages"] == sent["messages"]


def test_the_pydantic_ai_page_shows_what_the_script_prints() -> None:
    [console] = blocks("pydantic-ai.md", "console")
    assert console.count(test_pydantic_ai_agent.OUTPUT) == 2
