"""Fragments, builders, guards and message fragments."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcontext.errors import InvalidInputError, InvalidTypeError
from agentcontext.fragments import (
    ContextFragment,
    FragmentCodec,
    MessageCodec,
    alias,
    analogy,
    assistant,
    assistant_text,
    clarification,
    correction,
    example,
    explain,
    fragment,
    glossary,
    guardrail,
    hint,
    identity,
    is_empty_assistant_placeholder,
    is_fragment,
    is_lazy_fragment,
    is_message_fragment,
    last_assistant_message,
    message,
    message_fragment,
    message_of,
    persona,
    policy,
    preference,
    principle,
    quirk,
    resolve_lazy_message,
    role,
    style_guide,
    term,
    user,
    with_message_id,
    workflow,
)
from agentcontext.messages import (
    DataPart,
    Message,
    ReasoningPart,
    TextPart,
    ToolPart,
)

# --- ContextFragment -----------------------------------------------------------------------


def test_fragment_defaults() -> None:
    f = ContextFragment(name="x")
    assert f.data is None
    assert f.id is None
    assert f.type == "fragment"
    assert f.persist is False
    assert f.codec is None
    assert f.metadata == {}


def test_fragment_is_frozen_and_replace_copies() -> None:
    f = hint("a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.data = "b"  # type: ignore[misc]
    g = dataclasses.replace(f, data="b")
    assert (f.data, g.data) == ("a", "b")


def test_fragment_validates_fields() -> None:
    with pytest.raises(InvalidTypeError):
        ContextFragment(name=3)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        ContextFragment(name="x", type="other")  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        ContextFragment(name="x", id=5)  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        ContextFragment(name="x", metadata=[])  # type: ignore[arg-type]


def test_fragments_compare_by_value() -> None:
    assert hint("a") == hint("a")
    assert hint("a") != hint("b")
    assert term("a", "b") == ContextFragment(name="term", data={"name": "a", "definition": "b"})


# --- builders ------------------------------------------------------------------------------


def test_fragment_builder_holds_children_in_order() -> None:
    f = fragment("database", hint("PG"), "loose", {"a": 1})
    assert f.name == "database"
    assert f.data == [hint("PG"), "loose", {"a": 1}]
    assert fragment("empty").data == []


@pytest.mark.parametrize(
    ("built", "name", "data"),
    [
        (role("You are helpful."), "role", "You are helpful."),
        (hint("Use CTEs"), "hint", "Use CTEs"),
        (
            term("NPL", "non-performing loan"),
            "term",
            {"name": "NPL", "definition": "non-performing loan"},
        ),
        (guardrail("No PII"), "guardrail", {"rule": "No PII"}),
        (
            guardrail("No PII", reason="GDPR", action="Refuse"),
            "guardrail",
            {"rule": "No PII", "reason": "GDPR", "action": "Refuse"},
        ),
        (guardrail("No PII", action="Refuse"), "guardrail", {"rule": "No PII", "action": "Refuse"}),
        (
            explain("DAU", "daily users"),
            "explain",
            {"concept": "DAU", "explanation": "daily users"},
        ),
        (
            explain("DAU", "daily users", therefore="divide"),
            "explain",
            {"concept": "DAU", "explanation": "daily users", "therefore": "divide"},
        ),
        (example("q", "a"), "example", {"question": "q", "answer": "a"}),
        (example("q", "a", note="n"), "example", {"question": "q", "answer": "a", "note": "n"}),
        (clarification("w", "a", "r"), "clarification", {"when": "w", "ask": "a", "reason": "r"}),
        (workflow("t", ["s1", "s2"]), "workflow", {"task": "t", "steps": ["s1", "s2"]}),
        (
            workflow("t", ("s1",), triggers=["x"], notes="n"),
            "workflow",
            {"task": "t", "steps": ["s1"], "triggers": ["x"], "notes": "n"},
        ),
        (workflow("t", [], triggers=[]), "workflow", {"task": "t", "steps": [], "triggers": []}),
        (quirk("i", "w"), "quirk", {"issue": "i", "workaround": "w"}),
        (style_guide("p"), "style_guide", {"prefer": "p"}),
        (
            style_guide("p", never="n", always="a"),
            "style_guide",
            {"prefer": "p", "never": "n", "always": "a"},
        ),
        (analogy(["a", "b"], "r"), "analogy", {"concepts": ["a", "b"], "relationship": "r"}),
        (
            analogy(["a"], "r", insight="i", therefore="t", pitfall="p"),
            "analogy",
            {
                "concepts": ["a"],
                "relationship": "r",
                "insight": "i",
                "therefore": "t",
                "pitfall": "p",
            },
        ),
        (
            glossary({"revenue": "SUM(x)", "aov": "AVG(x)"}),
            "glossary",
            [{"term": "revenue", "expression": "SUM(x)"}, {"term": "aov", "expression": "AVG(x)"}],
        ),
        (glossary({}), "glossary", []),
        (principle("t", "d"), "principle", {"title": "t", "description": "d"}),
        (identity(), "identity", {}),
        (identity(name="Sam"), "identity", {"name": "Sam"}),
        (identity(role="VP"), "identity", {"role": "VP"}),
        (persona("Freya"), "persona", {"name": "Freya"}),
        (
            persona("Freya", role="r", objective="o", tone="t"),
            "persona",
            {"name": "Freya", "role": "r", "objective": "o", "tone": "t"},
        ),
        (alias("big table", "orders"), "alias", {"term": "big table", "meaning": "orders"}),
        (preference("dates", "ISO"), "preference", {"aspect": "dates", "value": "ISO"}),
        (
            correction("status", "1 = on"),
            "correction",
            {"subject": "status", "clarification": "1 = on"},
        ),
    ],
)
def test_builder_shapes(built: ContextFragment, name: str, data: object) -> None:
    assert built.name == name
    assert built.data == data
    assert built.type == "fragment"
    assert built.persist is False
    assert built.id is None
    assert built.codec is None
    if isinstance(data, dict):
        assert list(built.data) == list(data)  # type: ignore[arg-type]  # key order is part of the shape


def test_principle_and_policy_nest_policies() -> None:
    inner = policy("Use COALESCE")
    outer = policy(
        "Check nulls", before="Aggregating", reason="Nulls skew sums", policies=[inner, "x"]
    )
    p = principle("Correctness", "Prefer it", policies=[outer])
    assert outer.data == {
        "rule": "Check nulls",
        "before": "Aggregating",
        "reason": "Nulls skew sums",
        "policies": [inner, "x"],
    }
    assert p.data == {"title": "Correctness", "description": "Prefer it", "policies": [outer]}
    assert principle("t", "d", policies=[]).data == {
        "title": "t",
        "description": "d",
        "policies": [],
    }


def test_builders_copy_their_sequences() -> None:
    steps = ["a"]
    w = workflow("t", steps)
    steps.append("b")
    assert w.data == {"task": "t", "steps": ["a"]}


# --- guards --------------------------------------------------------------------------------


def test_guards() -> None:
    assert is_fragment(hint("a"))
    assert not is_fragment({"name": "hint", "data": "a"})
    assert not is_message_fragment(hint("a"))
    assert is_message_fragment(user("hi"))
    assert not is_message_fragment("user")
    assert is_lazy_fragment(last_assistant_message("x"))
    assert not is_lazy_fragment(assistant_text("x"))
    assert not is_lazy_fragment(hint("x"))


def test_message_codec_is_a_fragment_codec() -> None:
    codec = user("hi").codec
    assert isinstance(codec, FragmentCodec)
    assert isinstance(codec, MessageCodec)


# --- message fragments ---------------------------------------------------------------------


def test_user_from_text() -> None:
    f = user("Hello!", id="m1")
    assert (f.name, f.id, f.type, f.persist, f.data) == ("user", "m1", "message", True, None)
    msg = message_of(f)
    assert msg == Message(id="m1", role="user", parts=[TextPart(text="Hello!")])
    assert f.codec is not None
    assert f.codec.encode() == {
        "id": "m1",
        "role": "user",
        "parts": [{"type": "text", "text": "Hello!"}],
    }
    assert f.codec.decode() is msg


def test_user_generates_distinct_hex_ids() -> None:
    a, b = user("a"), user("b")
    assert a.id and b.id and a.id != b.id
    assert len(a.id) == 32 and int(a.id, 16) >= 0
    assert message_of(a).id == a.id


def test_user_from_message_keeps_or_overrides_id() -> None:
    msg = Message(id="m1", role="user", parts=[TextPart(text="x")])
    assert user(msg).id == "m1"
    renamed = user(msg, id="m2")
    assert renamed.id == "m2" and message_of(renamed).id == "m2"
    assert msg.id == "m1"  # the original is not changed


def test_role_mismatch_is_refused() -> None:
    msg = Message(id="m1", role="assistant", parts=[])
    with pytest.raises(InvalidInputError, match="message"):
        user(msg)
    with pytest.raises(InvalidInputError):
        assistant(Message(id="m", role="user", parts=[]))
    with pytest.raises(InvalidInputError):
        message(msg, role="user")


def test_wrong_content_types_are_refused() -> None:
    with pytest.raises(InvalidTypeError):
        user(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        assistant_text(Message(id="m", role="assistant", parts=[]))  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        message_fragment("hi")  # type: ignore[arg-type]


def test_assistant_and_assistant_text() -> None:
    reply = Message(
        id="a1",
        role="assistant",
        parts=[ReasoningPart(text="thinking"), TextPart(text="Hi")],
    )
    f = assistant(reply)
    assert (f.name, f.id) == ("assistant", "a1")
    assert message_of(f) is reply
    t = assistant_text("Hi there", id="a2")
    assert message_of(t) == Message(id="a2", role="assistant", parts=[TextPart(text="Hi there")])
    assert message_of(assistant("plain")).role == "assistant"


def test_message_builder_roles() -> None:
    assert message("hi").name == "user"
    s = message("Be brief", role="system")
    assert s.name == "system" and message_of(s).role == "system"
    a = message(Message(id="x", role="assistant", parts=[]))
    assert a.name == "assistant" and a.id == "x"
    assert message("t", role="assistant", id="q").id == "q"
    with pytest.raises(InvalidInputError):
        message("t", role="tool")  # type: ignore[arg-type]


def test_message_fragment_from_stored_json() -> None:
    stored = user("hi", id="u1").codec.encode()  # type: ignore[union-attr]
    again = message_fragment(Message.model_validate(stored))
    assert again == user("hi", id="u1")


def test_message_codec_round_trip_with_every_part() -> None:
    msg = Message(
        id="m",
        role="assistant",
        parts=[
            TextPart(text="t"),
            ReasoningPart(text="r"),
            ToolPart(
                tool_call_id="c",
                tool_name="sql",
                input={"q": None},
                state="output-available",
                output=[1],
            ),
            DataPart(name="d", data={"k": 1}),
        ],
        metadata={"usage": 3},
    )
    encoded = MessageCodec(msg).encode()
    assert "error" not in encoded["parts"][2]  # None fields are left out
    assert encoded["parts"][2]["input"] == {"q": None}  # but not None inside data
    assert Message.model_validate(encoded) == msg


def test_message_of_refuses_non_messages_and_lazy() -> None:
    with pytest.raises(InvalidInputError, match="not a message fragment"):
        message_of(hint("x"))
    with pytest.raises(InvalidInputError, match="resolve_lazy_message"):
        message_of(last_assistant_message("x"))


def test_message_of_accepts_a_codec_decoding_to_a_dict() -> None:
    class DictCodec:
        def encode(self) -> dict[str, object]:
            return {"id": "d", "role": "user", "parts": [{"type": "text", "text": "x"}]}

        def decode(self) -> dict[str, object]:
            return self.encode()

    f = ContextFragment(name="user", type="message", persist=True, codec=DictCodec())
    assert message_of(f) == Message(id="d", role="user", parts=[TextPart(text="x")])

    class BadCodec(DictCodec):
        def decode(self) -> int:  # type: ignore[override]
            return 3

    with pytest.raises(InvalidTypeError):
        message_of(ContextFragment(name="user", type="message", codec=BadCodec()))


def test_with_message_id_changes_both_ids() -> None:
    f = user("hi", id="old")
    g = with_message_id(f, "new")
    assert g.id == "new"
    assert message_of(g).id == "new"
    assert message_of(g).parts == message_of(f).parts
    assert f.id == "old" and message_of(f).id == "old"


def test_last_assistant_message_is_lazy_until_resolved() -> None:
    lazy = last_assistant_message("Corrected answer")
    assert (lazy.name, lazy.type, lazy.persist, lazy.id, lazy.data) == (
        "assistant",
        "message",
        True,
        None,
        None,
    )
    assert lazy.codec is not None
    with pytest.raises(InvalidInputError):
        lazy.codec.decode()
    with pytest.raises(InvalidInputError):
        lazy.codec.encode()
    resolved = resolve_lazy_message(lazy, last_assistant_id="a9")
    assert resolved == assistant_text("Corrected answer", id="a9")
    fresh = resolve_lazy_message(lazy, last_assistant_id=None)
    assert fresh.id and fresh.id != "a9"
    assert message_of(fresh).parts == [TextPart(text="Corrected answer")]
    plain = user("x")
    assert resolve_lazy_message(plain, last_assistant_id="z") is plain


def test_empty_assistant_placeholder_rule() -> None:
    def make(role: str, *parts: object) -> Message:
        return Message(id="p", role=role, parts=list(parts))  # type: ignore[arg-type]

    assert is_empty_assistant_placeholder(make("assistant"))
    assert is_empty_assistant_placeholder(make("assistant", TextPart(text="")))
    assert is_empty_assistant_placeholder(
        make("assistant", TextPart(text=" \n"), TextPart(text=""))
    )
    assert not is_empty_assistant_placeholder(make("assistant", TextPart(text="Hi")))
    assert not is_empty_assistant_placeholder(make("assistant", ReasoningPart(text="")))
    assert not is_empty_assistant_placeholder(
        make("assistant", ToolPart(tool_call_id="c", tool_name="t", state="input-available"))
    )
    assert not is_empty_assistant_placeholder(make("user"))
    assert is_empty_assistant_placeholder(message_of(assistant_text("")))


_PARTS = st.one_of(
    st.builds(TextPart, text=st.sampled_from(["", " ", "\n\t", "Hi", " Hi", "Hi "])),
    st.builds(ReasoningPart, text=st.sampled_from(["", "thinking"])),
    st.builds(
        ToolPart,
        tool_call_id=st.just("c"),
        tool_name=st.just("t"),
        state=st.just("input-available"),
    ),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["user", "assistant", "system"]), st.lists(_PARTS, max_size=3)),
        max_size=12,
    )
)
def test_the_chain_cache_finds_exactly_the_placeholders(
    shapes: list[tuple[str, list[Any]]],
) -> None:
    # The cache's scan skips most messages by their first part; it must agree with the rule.
    from agentcontext._conversation import _placeholders

    messages = [
        Message(id=f"m{i}", role=role, parts=parts)  # type: ignore[arg-type]
        for i, (role, parts) in enumerate(shapes)
    ]
    assert _placeholders(messages) == {m.id for m in messages if is_empty_assistant_placeholder(m)}


@pytest.mark.parametrize("builder", [user, assistant_text])
def test_a_message_id_given_is_checked_as_every_id(builder: Any) -> None:
    """An empty id became a random one without a word; a wrong one is refused at once."""
    with pytest.raises(InvalidInputError, match="must not be empty"):
        builder("text", id="")
    with pytest.raises(InvalidInputError, match="limit is 255"):
        builder("text", id="x" * 256)
    with pytest.raises(InvalidTypeError):
        builder("text", id=7)
    assert builder("text", id="m-1").id == "m-1"
