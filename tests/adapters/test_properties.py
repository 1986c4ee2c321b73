"""Any conversation maps to requests that the SDKs' parameter types accept."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agentcontext import Message, ReasoningPart, TextPart, ToolPart
from agentcontext.adapters import to_anthropic, to_openai, to_openai_responses
from tests.adapters.helpers import breakpoints, valid_anthropic, valid_openai, valid_responses

text = st.text(max_size=12)
ids = st.sampled_from(["c1", "c2", "c3"])
reasoning = st.builds(
    ReasoningPart,
    text=text,
    signature=st.none() | st.just("sig"),
    item_id=st.none() | st.sampled_from(["rs_1", "rs_2"]),
    encrypted_content=st.none() | st.just("enc"),
)
tool = st.builds(
    ToolPart,
    tool_call_id=ids,
    tool_name=st.just("t"),
    input=st.none() | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    state=st.sampled_from(["input-available", "output-available", "output-error"]),
    output=st.none() | text,
    error=st.none() | text,
)
user_message = st.builds(
    Message,
    id=st.just("u"),
    role=st.just("user"),
    parts=st.lists(st.builds(TextPart, text=text), max_size=2),
)
assistant_message = st.builds(
    Message,
    id=st.just("a"),
    role=st.just("assistant"),
    parts=st.lists(st.one_of(st.builds(TextPart, text=text), reasoning, tool), max_size=5),
)
conversations = st.lists(st.one_of(user_message, assistant_message), max_size=6)


@settings(max_examples=150, deadline=None)
@given(conversation=conversations, system=text, cache=st.booleans())
def test_every_adapter_output_validates(
    conversation: list[Message], system: str, cache: bool
) -> None:
    valid_openai(to_openai(system, conversation))
    items: list[Any] = valid_responses(to_openai_responses(conversation))
    reasoning_ids = [item["id"] for item in items if item.get("type") == "reasoning"]
    assert len(reasoning_ids) == len(set(reasoning_ids))  # each reasoning item once
    request = valid_anthropic(to_anthropic(system, conversation, cache=cache))
    assert breakpoints(request) <= (3 if cache else 0)
    for entry in request["messages"]:
        if entry["role"] == "assistant" and isinstance(entry["content"], list):
            kinds = [block["type"] for block in entry["content"]]
            if "thinking" in kinds or "redacted_thinking" in kinds:
                assert all(
                    block.get("signature") or block["type"] != "thinking"
                    for block in entry["content"]
                )


def test_stored_reasoning_without_provider_fields_still_loads() -> None:
    old = {"id": "m", "role": "assistant", "parts": [{"type": "reasoning", "text": "hmm"}]}
    message = Message.model_validate(old)
    assert message.parts == [ReasoningPart(text="hmm")]
    assert message.model_dump(exclude_none=True) == old  # how the store writes it: unchanged
