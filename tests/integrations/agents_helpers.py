"""A scripted OpenAI Agents SDK model (no network) and the agent the session tests run."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, ModelSettings, function_tool, set_tracing_disabled
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
)
from openai.types.responses.response_reasoning_item import Summary

set_tracing_disabled(True)  # no trace export: the tests run offline


def say(text: str, n: int) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id=f"msg_{n}",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


def call(call_id: str, city: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        id=f"fc_{call_id}",
        type="function_call",
        call_id=call_id,
        name="get_weather",
        arguments=json.dumps({"city": city}),
        status="completed",
    )


def think(n: int, text: str) -> ResponseReasoningItem:
    return ResponseReasoningItem(
        id=f"rs_{n}",
        type="reasoning",
        summary=[Summary(type="summary_text", text=text)],
        encrypted_content=f"gAAAA-secret-{n}",
    )


class ScriptedModel(Model):
    """Answers each model call with the next scripted list of output items."""

    def __init__(self, script: list[list[Any]]) -> None:
        self.script = list(script)
        self.inputs: list[list[TResponseInputItem]] = []

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: Any,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        self.inputs.append(list(input) if isinstance(input, list) else [input])  # type: ignore[list-item]
        output = self.script.pop(0)
        usage = Usage(requests=1, input_tokens=10, output_tokens=5, total_tokens=15)
        return ModelResponse(output=output, usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError


WEATHER = {"paris": "sunny, 24 °C", "tokyo": "rainy, 18 °C"}


@function_tool
def get_weather(city: str) -> str:
    """The weather of a city."""
    return WEATHER.get(city.lower(), "cloudy, 15 °C")


def build_agent(model: Model) -> Agent[Any]:
    return Agent(
        name="travel", instructions="You are a travel assistant.", model=model, tools=[get_weather]
    )


def turn(n: int, city: str) -> list[list[Any]]:
    """Two model calls: reason and call the tool, then answer."""
    return [
        [think(n, f"I need the weather in {city}."), call(f"call_{n}", city)],
        [say(f"{city}: {WEATHER[city.lower()]}.", n)],
    ]
