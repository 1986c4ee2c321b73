"""Context fragments: the building blocks of a system prompt and of a conversation.

A `ContextFragment` is a named piece of data. Fragments that are not messages form the
system prompt (a renderer turns them into XML, Markdown, TOML or TOON); message fragments
(``type="message"``) are the conversation and carry a codec that gives back a
`Message`.

The builders return ready-made fragments:

```python
role("You are a SQL expert.")
hint("Use CTEs for complex queries.")
term("NPL", "non-performing loan")
guardrail("Never expose PII", reason="GDPR")      # None optionals are left out of data
fragment("database", hint("PostgreSQL 15"), hint("Tables: users, orders"))
user("Hello!")                                   # a message fragment
```

Fragments are immutable (frozen dataclasses); use `dataclasses.replace` to change one.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, TypeAlias, Union, runtime_checkable

from agentcontext._validate import check_id
from agentcontext.errors import InvalidInputError, InvalidTypeError
from agentcontext.messages import Message, Role, TextPart

__all__ = [
    "ContextFragment",
    "FragmentCodec",
    "FragmentData",
    "FragmentType",
    "LazyValue",
    "MessageCodec",
    "alias",
    "analogy",
    "assistant",
    "assistant_text",
    "check_fragment_data",
    "clarification",
    "correction",
    "example",
    "explain",
    "fragment",
    "glossary",
    "guardrail",
    "hint",
    "identity",
    "is_empty_assistant_placeholder",
    "is_fragment",
    "is_lazy_fragment",
    "is_message_fragment",
    "last_assistant_message",
    "message",
    "message_fragment",
    "message_of",
    "new_message_id",
    "persona",
    "policy",
    "preference",
    "principle",
    "quirk",
    "resolve_lazy_message",
    "role",
    "style_guide",
    "term",
    "user",
    "with_message_id",
    "workflow",
]

FragmentType = Literal["fragment", "message"]
"""``"fragment"`` for system-prompt content, ``"message"`` for conversation messages."""


@runtime_checkable
class FragmentCodec(Protocol):
    """Converts a fragment between its storage shape and the shape it is used in.

    ``encode()`` returns the JSON-able value that is stored; ``decode()`` returns the value
    used for rendering (non-message fragments) or given to the model (message fragments: a
    `Message`). A renderer always renders ``decode()``, never
    the fragment's ``data``.
    """

    def encode(self) -> Any:
        """Return the storage shape (JSON-able)."""
        ...

    def decode(self) -> Any:
        """Return the shape used for rendering or for the model."""
        ...


@dataclass(frozen=True, slots=True)
class ContextFragment:
    """A named piece of context.

    Attributes:
        name: The fragment's name; renderers use it as tag, heading or key. For message
            fragments it is the role (``"user"``, ``"assistant"``, ``"system"``).
        data: The content (see `FragmentData`); ``None`` for message fragments, whose
            content comes from their codec.
        id: An identifier; message fragments carry their message id, other fragments usually
            have none.
        type: ``"fragment"`` (system prompt) or ``"message"`` (conversation).
        persist: Whether the engine stores the fragment when it saves (True for messages).
        codec: Encodes the fragment for storage and decodes it for rendering or the model.
        metadata: Free-form operational data; never rendered.
    """

    name: str
    data: FragmentData = None
    id: str | None = None
    type: FragmentType = "fragment"
    persist: bool = False
    codec: FragmentCodec | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise InvalidTypeError(
                f"ContextFragment name must be a str, not {type(self.name).__name__}"
            )
        if self.type not in ("fragment", "message"):
            raise InvalidInputError(
                f"ContextFragment type must be 'fragment' or 'message', not {self.type!r}"
            )
        if self.id is not None and not isinstance(self.id, str):
            raise InvalidTypeError(
                f"ContextFragment id must be a str or None, not {type(self.id).__name__}"
            )
        if not isinstance(self.metadata, dict):
            raise InvalidTypeError(
                f"ContextFragment metadata must be a dict, not {type(self.metadata).__name__}"
            )


LazyValue: TypeAlias = Callable[..., Any] | Awaitable[Any] | AsyncIterable[Any] | Iterable[Any]
"""A value materialised by the engine before rendering: an async or sync callable (called
with a `LoadContext` when it takes one argument), an awaitable, a
sync or async generator, or another iterable (a set becomes a list, a mapping a dict)."""

FragmentData: TypeAlias = Union[  # noqa: UP007 (forward references need typing.Union)
    str,
    int,
    float,
    bool,
    ContextFragment,
    list["FragmentData"],
    dict[str, "FragmentData"],
    LazyValue,
    None,
]
"""What a fragment may hold: a primitive, a nested fragment, a list or a str-keyed dict of
these, or a lazy value (see `agentcontext.lazy`)."""


MAX_FRAGMENT_DEPTH = 200
"""Deepest nesting of fragments, lists and dicts a renderer accepts (each level counts one)."""


# --- guards --------------------------------------------------------------------------------


def is_fragment(value: object) -> bool:
    """Return whether ``value`` is a `ContextFragment`."""
    return isinstance(value, ContextFragment)


def is_message_fragment(value: object) -> bool:
    """Return whether ``value`` is a message fragment (``type == "message"``)."""
    return isinstance(value, ContextFragment) and value.type == "message"


def is_lazy_fragment(value: object) -> bool:
    """Return whether ``value`` is a message fragment whose id is resolved later.

    Such fragments come from `last_assistant_message`; the engine resolves them
    (`resolve_lazy_message`) at save and resolve time.
    """
    return isinstance(value, ContextFragment) and isinstance(value.codec, _LastAssistantCodec)


def check_fragment_data(fragment: ContextFragment, what: str) -> None:
    """Refuse fragment data that no renderer can show: nested deeper than
    `MAX_FRAGMENT_DEPTH` levels (fragments, lists and dicts), or containing itself.

    The walk is iterative, so any depth is refused cleanly. Lazy values, message fragments and
    fragments with a codec are not entered (they are materialised or decoded later).

    Raises:
        InvalidInputError: naming ``what`` and where in the data the problem is.
    """
    if fragment.type == "message" or fragment.codec is not None:
        return
    # (value, path, depth); a container leaves ``active`` once the stack shrinks back below
    # the length it had when the container was entered.
    stack: list[tuple[object, str, int]] = [(fragment.data, "data", 1)]
    active: set[int] = {id(fragment)}
    exits: list[tuple[int, int]] = []
    while stack:
        while exits and len(stack) <= exits[-1][0]:
            active.discard(exits.pop()[1])
        value, path, depth = stack.pop()
        if isinstance(value, ContextFragment):
            if value.type == "message" or value.codec is not None:
                continue
            children: list[tuple[object, str]] = [(value.data, f"{path}<{value.name}>")]
        elif isinstance(value, dict):
            children = [
                (item, f"{path}[{key!r}]")
                for key, item in value.items()
                if isinstance(item, _NESTED)
            ]
        elif isinstance(value, (list, tuple)):
            children = [
                (item, f"{path}[{index}]")
                for index, item in enumerate(value)
                if isinstance(item, _NESTED)
            ]
        else:
            continue
        if depth > MAX_FRAGMENT_DEPTH:
            raise InvalidInputError(
                f"{what} is nested deeper than {MAX_FRAGMENT_DEPTH} levels at {_short(path)}; "
                "no renderer can show it: flatten the data"
            )
        if id(value) in active:
            raise InvalidInputError(
                f"{what} contains itself at {_short(path)}; remove the reference to itself"
            )
        active.add(id(value))
        exits.append((len(stack), id(value)))
        stack.extend((child, where, depth + 1) for child, where in reversed(children))


_NESTED = (ContextFragment, dict, list, tuple)


def _short(path: str) -> str:
    return path if len(path) <= 120 else f"{path[:120]}…"


# --- generic and domain builders -----------------------------------------------------------


def _pruned(**fields: FragmentData) -> dict[str, FragmentData]:
    """The fields whose value is not None, in the given order."""
    return {key: value for key, value in fields.items() if value is not None}


def fragment(name: str, *children: FragmentData) -> ContextFragment:
    """A fragment named ``name`` whose data is the list of ``children``.

    For example:

    ```python
    fragment("database", hint("PostgreSQL 15"), hint("Tables: users, orders"))
    ```
    """
    return ContextFragment(name=name, data=list(children))


def role(text: str) -> ContextFragment:
    """The assistant's role or main instruction: ``role("You are a SQL expert.")``."""
    return ContextFragment(name="role", data=text)


def hint(text: str) -> ContextFragment:
    """A rule or preference that should always apply: ``hint("Use CTEs.")``."""
    return ContextFragment(name="hint", data=text)


def term(name: str, definition: str) -> ContextFragment:
    """A domain term and its meaning: ``term("NPL", "non-performing loan")``."""
    return ContextFragment(name="term", data={"name": name, "definition": definition})


def guardrail(
    rule: str, *, reason: str | None = None, action: str | None = None
) -> ContextFragment:
    """A hard rule, why it exists, and what to do when it is triggered.

    Data: ``{"rule", "reason"?, "action"?}``.
    """
    return ContextFragment(name="guardrail", data=_pruned(rule=rule, reason=reason, action=action))


def explain(concept: str, explanation: str, *, therefore: str | None = None) -> ContextFragment:
    """A concept explained, optionally with what to do about it.

    Data: ``{"concept", "explanation", "therefore"?}``.
    """
    return ContextFragment(
        name="explain",
        data=_pruned(concept=concept, explanation=explanation, therefore=therefore),
    )


def example(question: str, answer: str, *, note: str | None = None) -> ContextFragment:
    """A question and its correct answer (few-shot example).

    Data: ``{"question", "answer", "note"?}``.
    """
    return ContextFragment(
        name="example", data=_pruned(question=question, answer=answer, note=note)
    )


def clarification(when: str, ask: str, reason: str) -> ContextFragment:
    """When to ask the user for clarification, what to ask, and why.

    Data: ``{"when", "ask", "reason"}``.
    """
    return ContextFragment(name="clarification", data={"when": when, "ask": ask, "reason": reason})


def workflow(
    task: str,
    steps: Sequence[str],
    *,
    triggers: Sequence[str] | None = None,
    notes: str | None = None,
) -> ContextFragment:
    """A multi-step procedure for a task.

    Data: ``{"task", "steps": [...], "triggers"?: [...], "notes"?}``.
    """
    return ContextFragment(
        name="workflow",
        data=_pruned(
            task=task,
            steps=list(steps),
            triggers=None if triggers is None else list(triggers),
            notes=notes,
        ),
    )


def quirk(issue: str, workaround: str) -> ContextFragment:
    """A data quirk or edge case and its workaround. Data: ``{"issue", "workaround"}``."""
    return ContextFragment(name="quirk", data={"issue": issue, "workaround": workaround})


def style_guide(
    prefer: str, *, never: str | None = None, always: str | None = None
) -> ContextFragment:
    """Style preferences. The fragment is named ``style_guide``.

    Data: ``{"prefer", "never"?, "always"?}``.
    """
    return ContextFragment(
        name="style_guide", data=_pruned(prefer=prefer, never=never, always=always)
    )


def analogy(
    concepts: Sequence[str],
    relationship: str,
    *,
    insight: str | None = None,
    therefore: str | None = None,
    pitfall: str | None = None,
) -> ContextFragment:
    """Related concepts compared through an analogy.

    Data: ``{"concepts": [...], "relationship", "insight"?, "therefore"?, "pitfall"?}``.
    """
    return ContextFragment(
        name="analogy",
        data=_pruned(
            concepts=list(concepts),
            relationship=relationship,
            insight=insight,
            therefore=therefore,
            pitfall=pitfall,
        ),
    )


def glossary(entries: Mapping[str, str]) -> ContextFragment:
    """Business terms mapped to the expressions that compute them.

    Data: a list of ``{"term", "expression"}`` objects, in the order of ``entries`` (a
    uniform list, which TOON renders as a compact table).
    """
    return ContextFragment(
        name="glossary",
        data=[{"term": key, "expression": value} for key, value in entries.items()],
    )


def principle(
    title: str, description: str, *, policies: Sequence[FragmentData] | None = None
) -> ContextFragment:
    """A guiding principle with optional policies (strings or `policy` fragments).

    Data: ``{"title", "description", "policies"?: [...]}``.
    """
    return ContextFragment(
        name="principle",
        data=_pruned(
            title=title,
            description=description,
            policies=None if policies is None else list(policies),
        ),
    )


def policy(
    rule: str,
    *,
    before: str | None = None,
    reason: str | None = None,
    policies: Sequence[FragmentData] | None = None,
) -> ContextFragment:
    """A rule, what must happen before it applies, why, and nested policies.

    Data: ``{"rule", "before"?, "reason"?, "policies"?: [...]}``.
    """
    return ContextFragment(
        name="policy",
        data=_pruned(
            rule=rule,
            before=before,
            reason=reason,
            policies=None if policies is None else list(policies),
        ),
    )


def identity(*, name: str | None = None, role: str | None = None) -> ContextFragment:
    """Who the user is. Data: ``{"name"?, "role"?}``."""
    return ContextFragment(name="identity", data=_pruned(name=name, role=role))


def persona(
    name: str,
    *,
    role: str | None = None,
    objective: str | None = None,
    tone: str | None = None,
) -> ContextFragment:
    """The assistant's persona. Data: ``{"name", "role"?, "objective"?, "tone"?}``."""
    return ContextFragment(
        name="persona", data=_pruned(name=name, role=role, objective=objective, tone=tone)
    )


def alias(term: str, meaning: str) -> ContextFragment:
    """What the user means by a term. Data: ``{"term", "meaning"}``."""
    return ContextFragment(name="alias", data={"term": term, "meaning": meaning})


def preference(aspect: str, value: str) -> ContextFragment:
    """How the user wants something done. Data: ``{"aspect", "value"}``."""
    return ContextFragment(name="preference", data={"aspect": aspect, "value": value})


def correction(subject: str, clarification: str) -> ContextFragment:
    """A correction the user made. Data: ``{"subject", "clarification"}``."""
    return ContextFragment(
        name="correction", data={"subject": subject, "clarification": clarification}
    )


# --- message fragments ---------------------------------------------------------------------


def new_message_id() -> str:
    """A fresh message id (a random UUID4 as 32 hex characters)."""
    return uuid.uuid4().hex


class MessageCodec:
    """The codec of a message fragment.

    ``encode()`` returns ``message.model_dump(mode="json", exclude_none=True)`` (the stored
    JSON); ``decode()`` returns the `Message` itself.
    """

    __slots__ = ("_message",)

    def __init__(self, message: Message) -> None:
        if not isinstance(message, Message):
            raise InvalidTypeError(f"MessageCodec needs a Message, not {type(message).__name__}")
        self._message = message

    @property
    def message(self) -> Message:
        """The message this codec holds."""
        return self._message

    def encode(self) -> dict[str, Any]:
        """The message as JSON-able data, ``None`` fields left out."""
        return self._message.model_dump(mode="json", exclude_none=True)

    def decode(self) -> Message:
        """The message."""
        return self._message

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MessageCodec):
            return self._message == other._message
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._message.id)

    def __repr__(self) -> str:
        return f"MessageCodec({self._message!r})"


class _LastAssistantCodec:
    """Placeholder codec of `last_assistant_message`; the engine resolves it."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def _unresolved(self) -> InvalidInputError:
        return InvalidInputError(
            "last_assistant_message() gets its id when the engine saves or resolves; "
            "pass it to ContextEngine.set(), or call resolve_lazy_message() first"
        )

    def encode(self) -> Any:
        """Refused: the fragment must be resolved first."""
        raise self._unresolved()

    def decode(self) -> Any:
        """Refused: the fragment must be resolved first."""
        raise self._unresolved()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _LastAssistantCodec):
            return self.text == other.text
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"last_assistant_message({self.text!r})"


def _as_message(content: object, *, role: Role, id: str | None, builder: str) -> Message:
    if id is not None:  # (an empty one became a random id, without a word)
        check_id(id, f"{builder}(id=...)")
    if isinstance(content, Message):
        if content.role != role:
            raise InvalidInputError(
                f"{builder}() needs a {role!r} message, got role {content.role!r}; "
                f"use message(...) for a message of any role"
            )
        if id is not None and id != content.id:
            return content.model_copy(update={"id": id})
        return content
    if isinstance(content, str):
        return Message(id=id or new_message_id(), role=role, parts=[TextPart(text=content)])
    raise InvalidTypeError(f"{builder}() takes a str or a Message, not {type(content).__name__}")


def message_fragment(msg: Message) -> ContextFragment:
    """The message fragment for ``msg``: named after its role, with its id and a codec."""
    if not isinstance(msg, Message):
        raise InvalidTypeError(f"message_fragment() takes a Message, not {type(msg).__name__}")
    return ContextFragment(
        name=msg.role,
        data=None,
        id=msg.id,
        type="message",
        persist=True,
        codec=MessageCodec(msg),
    )


def user(content: str | Message, *, id: str | None = None) -> ContextFragment:
    """A user message fragment, from text or from a ``Message`` with role ``"user"``.

    ``id`` sets the message id (a fresh one is generated for text when omitted).
    """
    return message_fragment(_as_message(content, role="user", id=id, builder="user"))


def assistant(content: Message | str, *, id: str | None = None) -> ContextFragment:
    """An assistant message fragment, from a ``Message`` with role ``"assistant"`` or text."""
    return message_fragment(_as_message(content, role="assistant", id=id, builder="assistant"))


def assistant_text(text: str, *, id: str | None = None) -> ContextFragment:
    """An assistant message fragment holding one text part."""
    if not isinstance(text, str):
        raise InvalidTypeError(f"assistant_text() takes a str, not {type(text).__name__}")
    return message_fragment(_as_message(text, role="assistant", id=id, builder="assistant_text"))


def message(
    content: str | Message, *, role: Role | None = None, id: str | None = None
) -> ContextFragment:
    """A message fragment of any role.

    Text becomes a message of ``role`` (``"user"`` when omitted); a ``Message`` keeps its own
    role, and ``role``, when given, must match it.
    """
    if isinstance(content, Message):
        return message_fragment(
            _as_message(content, role=role or content.role, id=id, builder="message")
        )
    if role is not None and role not in ("system", "user", "assistant"):
        raise InvalidInputError(
            f"message() role must be 'system', 'user' or 'assistant', not {role!r}"
        )
    return message_fragment(_as_message(content, role=role or "user", id=id, builder="message"))


def last_assistant_message(text: str) -> ContextFragment:
    """An assistant text message whose id is the latest assistant message's on the branch.

    The id is resolved when the engine saves or resolves (pending messages first, then the
    stored branch), so a retry updates that message instead of appending a new one. With no
    assistant message yet, a fresh id is used.
    """
    if not isinstance(text, str):
        raise InvalidTypeError(f"last_assistant_message() takes a str, not {type(text).__name__}")
    return ContextFragment(
        name="assistant",
        data=None,
        id=None,
        type="message",
        persist=True,
        codec=_LastAssistantCodec(text),
    )


# --- helpers for the engine ----------------------------------------------------------------


def message_of(fragment: ContextFragment) -> Message:
    """The `Message` of a (non-lazy) message fragment.

    A codec that decodes to a dict in the message shape is validated into a ``Message``.

    Raises:
        InvalidInputError: ``fragment`` is not a message fragment, or is a lazy one
            (resolve it with `resolve_lazy_message` first).
        InvalidTypeError: its codec does not decode to a message.
    """
    if not is_message_fragment(fragment):
        raise InvalidInputError(
            f"fragment {getattr(fragment, 'name', fragment)!r} is not a message fragment"
        )
    if is_lazy_fragment(fragment):
        raise InvalidInputError(
            "last_assistant_message() fragments have no message until they are resolved; "
            "call resolve_lazy_message() first"
        )
    if fragment.codec is None:
        raise InvalidInputError(f"message fragment {fragment.name!r} has no codec")
    decoded = fragment.codec.decode()
    if isinstance(decoded, Message):
        return decoded
    if isinstance(decoded, Mapping):
        return Message.model_validate(dict(decoded))
    raise InvalidTypeError(
        f"the codec of message fragment {fragment.name!r} decoded to "
        f"{type(decoded).__name__}, not a Message"
    )


def with_message_id(fragment: ContextFragment, new_id: str) -> ContextFragment:
    """A copy of a message fragment whose id and message id are both ``new_id``."""
    msg = message_of(fragment)
    return replace(fragment, id=new_id, codec=MessageCodec(msg.model_copy(update={"id": new_id})))


def resolve_lazy_message(
    fragment: ContextFragment, *, last_assistant_id: str | None
) -> ContextFragment:
    """Resolve a `last_assistant_message` fragment.

    Returns an `assistant_text` fragment with id ``last_assistant_id``, or a fresh id
    when it is None. A fragment that is not lazy is returned unchanged.
    """
    codec = fragment.codec
    if not isinstance(codec, _LastAssistantCodec):
        return fragment
    return assistant_text(codec.text, id=last_assistant_id or new_message_id())


def is_empty_assistant_placeholder(msg: Message) -> bool:
    """Return whether ``msg`` is an empty assistant placeholder.

    The rule does not depend on how the message was built: an assistant message is a
    placeholder when it has no parts, or when every part is a text part whose text is
    empty or only whitespace. Any other part (reasoning, tool call, file, data) makes it
    a real message.
    """
    if msg.role != "assistant":
        return False
    for part in msg.parts:  # noqa: SIM110 - a loop: this runs once per message of a chain
        if not isinstance(part, TextPart) or part.text.strip():
            return False
    return True
