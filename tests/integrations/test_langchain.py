"""The LangChain integration: real langchain-core messages, a fake chat model and a real tool."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool

from agentcontext import (
    ContextEngine,
    Message,
    SqlContextStore,
    TextPart,
    ToolPart,
    message,
    user,
)
from agentcontext.integrations.langchain import from_langchain, to_langchain


@tool
def get_weather(city: str) -> str:
    """The weather of a city."""
    return {"Paris": "sunny"}.get(city, "cloudy")


async def test_a_tool_loop_is_stored_and_sent_back(tmp_path: Path) -> None:
    model = FakeMessagesListChatModel(
        responses=[
            AIMessage(
                content="Checking.",
                tool_calls=[{"id": "call_1", "name": "get_weather", "args": {"city": "Paris"}}],
                usage_metadata={
                    "input_tokens": 20,
                    "output_tokens": 5,
                    "total_tokens": 25,
                    "input_token_details": {"cache_read": 12},
                },
            ),
            AIMessage(content="It is sunny in Paris."),
        ]
    )
    async with SqlContextStore(f"sqlite+aiosqlite:///{tmp_path / 'c.db'}") as store:
        context = ContextEngine(store=store, chat_id="c1", user_id="u1")
        context.set(user("Weather in Paris?"))
        await context.save()
        resolved = await context.resolve()
        sent = to_langchain(resolved.messages, "You are terse.")
        assert [type(m) for m in sent] == [SystemMessage, HumanMessage]
        first = await model.ainvoke(sent)
        assert isinstance(first, AIMessage)
        results = [get_weather.invoke(call) for call in first.tool_calls]  # ToolMessages
        second = await model.ainvoke([*sent, first, *results])
        [answer] = from_langchain([first, *results, second])
        assert answer.parts == [
            TextPart(text="Checking."),
            ToolPart(
                tool_call_id="call_1",
                tool_name="get_weather",
                input={"city": "Paris"},
                state="output-available",
                output="sunny",
            ),
            TextPart(text="It is sunny in Paris."),
        ]
        assert answer.metadata is not None
        assert answer.metadata["usage"]["cached_input_tokens"] == 12
        context.set(message(answer))
        await context.save()

    async with SqlContextStore(f"sqlite+aiosqlite:///{tmp_path / 'c.db'}") as store:
        context = ContextEngine(store=store, chat_id="c1", user_id="u1")
        again = to_langchain((await context.resolve()).messages)
        assert [type(m) for m in again] == [HumanMessage, AIMessage, ToolMessage, AIMessage]
        assert again[1].content == "Checking."
        assert isinstance(again[1], AIMessage)
        assert again[1].tool_calls == [
            {"id": "call_1", "name": "get_weather", "args": {"city": "Paris"}, "type": "tool_call"}
        ]
        assert isinstance(again[2], ToolMessage)
        assert (again[2].content, again[2].tool_call_id, again[2].status) == (
            "sunny",
            "call_1",
            "success",
        )
        assert again[3].content == "It is sunny in Paris."


def test_errors_and_system_messages_round_trip() -> None:
    messages = [
        Message(id="s", role="system", parts=[TextPart(text="Be brief.")]),
        Message(id="u", role="user", parts=[TextPart(text="Go")]),
        Message(
            id="a",
            role="assistant",
            parts=[
                ToolPart(
                    tool_call_id="c1",
                    tool_name="t",
                    input={"x": 1},
                    state="output-error",
                    error="boom",
                ),
                ToolPart(tool_call_id="c2", tool_name="t", input={}, state="input-available"),
                TextPart(text="Failed."),
            ],
        ),
    ]
    sent = to_langchain(messages)
    assert [type(m) for m in sent] == [
        SystemMessage,
        HumanMessage,
        AIMessage,
        ToolMessage,
        AIMessage,
    ]
    assert isinstance(sent[3], ToolMessage) and sent[3].status == "error"
    back = from_langchain(sent)
    assert [m.role for m in back] == ["system", "user", "assistant"]
    assert back[2].parts == [messages[2].parts[0], messages[2].parts[2]]  # unfinished call left out


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None)
@given(
    text=st.text(min_size=1).filter(str.strip),
    args=st.dictionaries(st.text(max_size=8), json_values, max_size=4),
    output=st.dictionaries(st.text(min_size=1, max_size=8), json_values, min_size=1, max_size=4),
)
def test_assistant_turns_round_trip(
    text: str, args: dict[str, object], output: dict[str, object]
) -> None:
    call = ToolPart(
        tool_call_id="c1", tool_name="t", input=args, state="output-available", output=output
    )
    turn = Message(id="a", role="assistant", parts=[call, TextPart(text=text)])
    [back] = from_langchain(to_langchain([turn]))
    assert back.parts == turn.parts
