"""The pydantic-ai integration: an Agent on FunctionModel with tools, stored, reloaded, continued."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic_ai import Agent, ModelRetry
from pydantic_ai import messages as ai
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentcontext import ContextEngine, ReasoningPart, SqlContextStore, ToolPart
from agentcontext.integrations.pydantic_ai import (
    from_model_messages,
    history_processor,
    save_run,
    to_model_messages,
)


def weather_model(seen: list[list[ai.ModelMessage]]) -> FunctionModel:
    """Reason, call get_weather for the last prompt's city, then answer from the result."""

    def respond(messages: list[ai.ModelMessage], info: AgentInfo) -> ai.ModelResponse:
        seen.append(list(messages))
        last = messages[-1]
        returns = [p for p in last.parts if isinstance(p, ai.ToolReturnPart)]
        if returns:
            return ai.ModelResponse(parts=[ai.TextPart(f"It is {returns[0].content}.")])
        prompt = next(p for p in last.parts if isinstance(p, ai.UserPromptPart))
        city = str(prompt.content).split()[-1].strip("?")
        n = len(seen)
        return ai.ModelResponse(
            parts=[
                ai.ThinkingPart(
                    f"Weather for {city}.",
                    id=f"rs_{n}",
                    signature=f"enc{n}",
                    provider_name="openai",
                ),
                ai.ToolCallPart("get_weather", {"city": city}, f"call_{n}"),
            ]
        )

    return FunctionModel(respond)


def get_weather(city: str) -> str:
    """The weather of a city."""
    return {"Paris": "sunny", "Tokyo": "rainy"}.get(city, "cloudy")


async def run_turn(url: str, prompt: str, seen: list[list[ai.ModelMessage]]) -> str:
    async with SqlContextStore(url) as store:
        context = ContextEngine(store=store, chat_id="c1", user_id="u1")
        agent = Agent(
            weather_model(seen),
            tools=[get_weather],
            capabilities=[ProcessHistory(history_processor(context))],
        )
        result = await agent.run(prompt)
        await save_run(context, result)
        return str(result.output)


async def test_agent_runs_store_reload_and_continue(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'chat.db'}"
    seen: list[list[ai.ModelMessage]] = []
    assert await run_turn(url, "Weather in Paris?", seen) == "It is sunny."
    first_run = seen[-1]
    assert await run_turn(url, "And Tokyo?", seen) == "It is rainy."
    # The second run's first request saw the whole first run, loaded from the store.
    second = seen[2]
    assert [type(m).__name__ for m in second] == ["ModelRequest", "ModelResponse"] * 2 + [
        "ModelRequest"
    ]
    history_calls = [p for m in second for p in m.parts if isinstance(p, ai.ToolCallPart)]
    assert [c.tool_call_id for c in history_calls] == ["call_1"]
    thinking = [p for m in second for p in m.parts if isinstance(p, ai.ThinkingPart)]
    assert [(t.id, t.signature, t.provider_name) for t in thinking] == [("rs_1", "enc1", "openai")]
    assert len(first_run) == 3

    async with SqlContextStore(url) as store:
        context = ContextEngine(store=store, chat_id="c1", user_id="u1")
        messages = await context.get_messages()
        assert [m.role for m in messages] == ["user", "assistant"] * 2
        assert messages[1].parts[0] == ReasoningPart(
            text="Weather for Paris.", item_id="rs_1", encrypted_content="enc1"
        )
        assert messages[1].parts[1] == ToolPart(
            tool_call_id="call_1",
            tool_name="get_weather",
            input={"city": "Paris"},
            state="output-available",
            output="sunny",
        )
        assert messages[3].text == "It is rainy."
        # The same reasoning goes to the Responses API by id with its encrypted content.
        items: list[Any] = (await context.resolve()).to_openai_responses()
        assert items[1] == {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "Weather for Paris."}],
            "encrypted_content": "enc1",
        }
        assert context.chat is not None
        assert context.chat.metadata["usage"]["requests"] == 4


def test_thinking_round_trips_with_provider_metadata() -> None:
    history: list[ai.ModelMessage] = [
        ai.ModelRequest(parts=[ai.UserPromptPart("Hi")]),
        ai.ModelResponse(
            parts=[
                ai.ThinkingPart("plan", signature="sig-a", provider_name="anthropic"),
                ai.ThinkingPart(
                    "", id="redacted_thinking", signature="opaque", provider_name="anthropic"
                ),
                ai.ThinkingPart("o-plan", id="rs_9", signature="enc", provider_name="openai"),
                ai.TextPart("Hello"),
            ]
        ),
    ]
    messages = from_model_messages(history)
    assert messages[1].parts[:3] == [
        ReasoningPart(text="plan", signature="sig-a"),
        ReasoningPart(text="", redacted_data="opaque"),
        ReasoningPart(text="o-plan", item_id="rs_9", encrypted_content="enc"),
    ]
    back = to_model_messages(messages)
    original = history[1].parts
    again = back[1].parts
    for before, after in zip(original, again, strict=True):
        assert type(before) is type(after)
        if isinstance(before, ai.ThinkingPart):
            assert isinstance(after, ai.ThinkingPart)
            assert (after.content, after.id, after.signature, after.provider_name) == (
                before.content,
                before.id,
                before.signature,
                before.provider_name,
            )


async def test_a_tool_asking_for_a_retry_is_stored_as_an_error() -> None:
    def respond(messages: list[ai.ModelMessage], info: AgentInfo) -> ai.ModelResponse:
        last = messages[-1].parts
        if any(isinstance(p, ai.ToolReturnPart | ai.RetryPromptPart) for p in last):
            return ai.ModelResponse(parts=[ai.TextPart("Sorry.")])
        return ai.ModelResponse(parts=[ai.ToolCallPart("flaky", {"city": "x"}, "c9")])

    def flaky(city: str) -> str:
        """Asks for a retry."""
        raise ModelRetry("try another city")

    agent = Agent(FunctionModel(respond), tools=[flaky])
    result = await agent.run("go")
    messages = from_model_messages(result.new_messages())
    call = messages[1].parts[0]
    assert isinstance(call, ToolPart)
    assert call.state == "output-error" and "try another city" in (call.error or "")
    assert messages[1].text == "Sorry."
