"""Reminders: the fragment, its context, and how its text goes into a message and comes out."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypeAlias

from agentcontext.errors import ReminderError
from agentcontext.fragments import ContextFragment, is_message_fragment
from agentcontext.messages import Message, TextPart, ToolPart
from agentcontext.store.records import Chat

__all__ = [
    "METADATA_KEY",
    "ONCE_KEY",
    "Predicate",
    "Reminder",
    "ReminderContext",
    "ReminderTarget",
    "ReminderText",
    "append_to_message",
    "append_to_tool_output",
    "is_reminder",
    "reminder",
    "reminder_of",
    "inserted_texts",
    "part_ranges",
    "strip_reminders",
    "tag",
    "text_ranges",
]

ReminderTarget: TypeAlias = Literal["user", "tool-output"]
"""Where a fired reminder goes: the outgoing user message, or the latest tool result."""

METADATA_KEY = "reminders"
"""The key of a message's metadata that lists the inserted reminder ranges."""

ONCE_KEY = "agentcontext.reminders.once"
"""The reserved key of a chat's metadata that holds the fired ``once=`` latches."""

OPEN_TAG = "<system-reminder>"
CLOSE_TAG = "</system-reminder>"
_SEPARATOR = "\n\n"


@dataclass(frozen=True, slots=True)
class ReminderContext:
    """What a reminder's predicate and text function are given.

    Attributes:
        turn: The number of the current turn: the user messages of the conversation up to and
            including the current one (the first user message is turn 1).
        target: ``"user"`` or ``"tool-output"``: the kind of message being amended.
        message: The message the reminder would be appended to (the outgoing user message,
            or the assistant message holding the latest tool result).
        content: The plain text of ``message`` (its text parts joined).
        messages: The conversation up to and including ``message``, oldest first: the stored
            branch followed by the pending messages.
        last_message: The message before ``message`` in the conversation, or None.
        chat: The chat record (read fresh when the reminders are evaluated).
        usage: The chat's tracked token usage (``chat.metadata["usage"]``, see
            `ContextEngine.track_usage`); empty when none was tracked.
        branch: The name of the engine's branch.
        now: When the reminders are evaluated (timezone-aware UTC).
        last_message_at: When the newest stored message of the branch was saved; None when
            the branch has no stored message.
        elapsed: Seconds from ``last_message_at`` to ``now``; None on an empty branch.
        tool_outcome: The newest tool call with a result (state ``"output-available"`` or
            ``"output-error"``) in ``messages``, or None.
    """

    turn: int
    target: ReminderTarget
    message: Message
    content: str
    messages: Sequence[Message]
    last_message: Message | None
    chat: Chat
    usage: Mapping[str, Any]
    branch: str
    now: datetime
    last_message_at: datetime | None
    elapsed: float | None
    tool_outcome: ToolPart | None


Predicate: TypeAlias = Callable[[ReminderContext], "bool | Awaitable[bool]"]
"""A plain or async callable of a `ReminderContext` that says whether a reminder fires."""

ReminderText: TypeAlias = (
    str | ContextFragment | Callable[[ReminderContext], "str | Awaitable[str]"]
)
"""A reminder's text: a string, a fragment (rendered as XML), or a plain or async callable of
a `ReminderContext` returning the text (an empty string means "do not fire")."""


@dataclass(frozen=True, slots=True)
class Reminder:
    """The settings of one reminder (kept in its fragment's ``metadata["reminder"]``).

    Attributes:
        text: A string, or a callable of the `ReminderContext` giving one.
        when: The predicate; None fires every time.
        target: ``"user"`` or ``"tool-output"``.
        once: An id: the reminder fires at most once per conversation under that id.
    """

    text: str | Callable[[ReminderContext], str | Awaitable[str]]
    when: Predicate | None
    target: ReminderTarget
    once: str | None

    async def holds(self, context: ReminderContext) -> bool:
        """Whether the predicate holds (True without one).

        Raises:
            ReminderError: the predicate raised (chained).
        """
        if self.when is None:
            return True
        return await evaluate(self.when, context, what=f"predicate of reminder {self.label}")

    @property
    def label(self) -> str:
        """How errors name this reminder: its ``once`` id, else the start of its text."""
        if self.once is not None:
            return f"once={self.once!r}"
        if isinstance(self.text, str):
            text = self.text if len(self.text) <= 40 else self.text[:39] + "…"
            return repr(text)
        return f"with text function {getattr(self.text, '__qualname__', type(self.text).__name__)}"

    async def render(self, context: ReminderContext) -> str:
        """The reminder's text for ``context`` ("" when a text function declines).

        Raises:
            ReminderError: the text function raised (chained) or did not return a str.
        """
        if isinstance(self.text, str):
            return self.text
        try:
            value = self.text(context)
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:
            raise ReminderError(
                f"the text function of a reminder raised {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(value, str):
            raise ReminderError(
                f"a reminder's text function must return a str, got {type(value).__name__}"
            )
        return value


async def evaluate(predicate: Predicate, context: ReminderContext, *, what: str) -> bool:
    """Call a plain or async predicate; its answer's truth value.

    Raises:
        ReminderError: the predicate raised (chained as ``__cause__``).
    """
    try:
        value = predicate(context)
        if inspect.isawaitable(value):
            value = await value
    except ReminderError:
        raise
    except Exception as exc:
        raise ReminderError(
            f"a reminder {what} raised {type(exc).__name__}: {exc}; fix the predicate "
            "(it is called with a ReminderContext)"
        ) from exc
    if value is True or value is False:
        return value
    try:
        return bool(value)
    except Exception as exc:  # a numpy array, a pandas Series: no single truth value
        raise ReminderError(
            f"the {what} returned a {type(value).__name__}, which has no truth value "
            f"({type(exc).__name__}: {exc}); make it return True or False"
        ) from exc


def reminder(
    text_or_fragment: ReminderText,
    *,
    when: Predicate | None = None,
    target: ReminderTarget = "user",
    once: str | None = None,
) -> ContextFragment:
    """A reminder: text appended as ``<system-reminder>…</system-reminder>`` to the outgoing
    message when its predicate holds.

    Set it on the engine like any fragment (``engine.set(reminder(...))``); it is kept with
    the system-prompt fragments but never rendered into the prompt. At ``resolve()`` (or at
    ``save()`` / ``begin_turn()`` when no resolve came first) every reminder whose predicate
    holds is appended to the outgoing user message, or, with ``target="tool-output"``, to the
    latest tool result of the outgoing assistant message. The pending message is replaced by
    the amended one, so ``save()`` stores exactly what was sent, and the inserted ranges go to
    the message's ``metadata["reminders"]`` (`strip_reminders` removes them for display).

    Args:
        text_or_fragment: The text; a fragment (rendered as XML); or a plain or async callable
            of the `ReminderContext` returning the text (return ``""`` to skip this time).
        when: A predicate (`every_n_turns`, `tool_failed`, ... or any plain or async callable
            of the `ReminderContext` returning a bool); None fires every time.
        target: ``"user"`` (default) or ``"tool-output"``.
        once: An id: the reminder fires at most once per conversation. The latch is stored in
            the chat's metadata when the reminder fires, so no other engine, in this process
            or another, fires it again.

    Returns:
        A fragment named ``"reminder"`` (its settings in ``metadata["reminder"]``).

    Raises:
        ReminderError: empty text, a message fragment, a bad target, a predicate that is not
            callable or an empty ``once`` id.

    For example:

    ```python
    engine.set(reminder("Stay on the task.", when=every_n_turns(5)))
    engine.set(reminder("Welcome back!", when=elapsed(3600), once="welcome-back"))
    ```
    """
    text: str | Callable[[ReminderContext], str | Awaitable[str]]
    if isinstance(text_or_fragment, ContextFragment):
        if is_message_fragment(text_or_fragment) or is_reminder(text_or_fragment):
            raise ReminderError(
                "reminder() takes text, a system-prompt fragment or a function; "
                f"got a {text_or_fragment.name!r} message or reminder fragment"
            )
        from agentcontext.renderers import XmlRenderer

        try:
            text = XmlRenderer().render([text_or_fragment])
        except Exception as exc:
            raise ReminderError(
                f"reminder() could not render fragment {text_or_fragment.name!r}: {exc} "
                "(lazy data is not supported in reminders; pass a function instead)"
            ) from exc
        if not text.strip():
            raise ReminderError(f"reminder() fragment {text_or_fragment.name!r} renders empty")
    elif isinstance(text_or_fragment, str):
        if not text_or_fragment.strip():
            raise ReminderError("reminder() text must not be empty or only whitespace")
        text = text_or_fragment
    elif callable(text_or_fragment):
        text = text_or_fragment
    else:
        raise ReminderError(
            "reminder() takes a str, a fragment or a function of the ReminderContext, "
            f"got {type(text_or_fragment).__name__}"
        )
    if when is not None and not callable(when):
        raise ReminderError(
            f"reminder(when=...) takes a predicate (a callable), got {type(when).__name__}"
        )
    if target not in ("user", "tool-output"):
        raise ReminderError(f"reminder(target=...) must be 'user' or 'tool-output', not {target!r}")
    if once is not None and (not isinstance(once, str) or not once.strip() or len(once) > 255):
        raise ReminderError(
            f"reminder(once=...) takes a non-empty id of at most 255 characters, got {once!r}"
        )
    config = Reminder(text=text, when=when, target=target, once=once)
    return ContextFragment(name="reminder", data=None, metadata={"reminder": config})


def is_reminder(fragment: object) -> bool:
    """Whether ``fragment`` is a reminder made by `reminder`."""
    return (
        isinstance(fragment, ContextFragment)
        and fragment.name == "reminder"
        and isinstance(fragment.metadata.get("reminder"), Reminder)
    )


def reminder_of(fragment: ContextFragment) -> Reminder:
    """The settings of a reminder fragment."""
    config = fragment.metadata.get("reminder")
    if not isinstance(config, Reminder):
        raise ReminderError(f"fragment {fragment.name!r} is not a reminder")
    return config


def tag(text: str) -> str:
    """``text`` wrapped in ``<system-reminder>`` tags."""
    return f"{OPEN_TAG}{text}{CLOSE_TAG}"


def _records(message: Message) -> list[dict[str, Any]]:
    metadata = message.metadata or {}
    found = metadata.get(METADATA_KEY)
    if not isinstance(found, list):
        return []
    return [dict(item) for item in found if isinstance(item, Mapping)]


def _with_records(message: Message, parts: list[Any], added: list[dict[str, Any]]) -> Message:
    metadata = dict(message.metadata or {})
    metadata[METADATA_KEY] = _records(message) + added
    return message.model_copy(update={"parts": parts, "metadata": metadata})


def append_to_message(message: Message, texts: Sequence[str]) -> Message:
    """``message`` with each text appended, tagged, to its last text part (a new text part
    when it has none); the inserted ranges are added to ``metadata["reminders"]``."""
    if not texts:
        return message
    parts = list(message.parts)
    index = next((i for i in range(len(parts) - 1, -1, -1) if isinstance(parts[i], TextPart)), None)
    if index is None:
        parts.append(TextPart(text=""))
        index = len(parts) - 1
    part = parts[index]
    assert isinstance(part, TextPart)
    current = part.text
    added: list[dict[str, Any]] = []
    for text in texts:
        start = len(current)
        current += (_SEPARATOR if current else "") + tag(text)
        added.append({"start": start, "end": len(current), "part": index})
    parts[index] = part.model_copy(update={"text": current})
    return _with_records(message, parts, added)


def append_to_tool_output(message: Message, index: int, texts: Sequence[str]) -> Message:
    """``message`` with ``texts`` appended, tagged, to the result of its tool part ``index``.

    A text result or error gets the tags at its end (the range recorded with ``"field"``);
    any other result is wrapped as ``{"result": ..., "system_reminder": ...}`` (recorded with
    ``"wrapped": True``).
    """
    if not texts:
        return message
    parts = list(message.parts)
    part = parts[index]
    assert isinstance(part, ToolPart)
    insertion = "\n".join(tag(text) for text in texts)
    field = "error" if part.state == "output-error" else "output"
    value = getattr(part, field)
    record: dict[str, Any] = {"part": index, "field": field}
    if field == "error" or isinstance(value, str):
        current = value or ""
        start = len(current)
        current += (_SEPARATOR if current else "") + insertion
        record.update(start=start, end=len(current))
        parts[index] = part.model_copy(update={field: current})
    else:
        record["wrapped"] = True
        wrapped = {"result": value, "system_reminder": insertion}
        parts[index] = part.model_copy(update={"output": wrapped})
    return _with_records(message, parts, [record])


def _cut(text: str, ranges: list[tuple[int, int]]) -> str:
    """``text`` without the given ranges (clamped; overlaps merged)."""
    spans = sorted(
        (max(0, min(len(text), s)), max(0, min(len(text), e))) for s, e in ranges if e > s
    )
    out: list[str] = []
    cursor = 0
    for start, end in spans:
        if end <= cursor:
            continue
        out.append(text[cursor : max(cursor, start)])
        cursor = max(cursor, end)
    out.append(text[cursor:])
    return "".join(out)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _utf16_index(text: str, offset: int) -> int:
    """The index in ``text`` of a JavaScript (UTF-16 code unit) offset, clamped to the text."""
    if offset <= 0:
        return 0
    if text.isascii() or all(ord(char) <= 0xFFFF for char in text):
        return min(offset, len(text))
    units = 0
    for index, char in enumerate(text):
        if units >= offset:
            return index
        units += 2 if ord(char) > 0xFFFF else 1
    return len(text)


def part_ranges(metadata: object, index: int, text: str) -> list[tuple[int, int]]:
    """The reminder ranges recorded for text part ``index`` (whose text is ``text``), as
    indexes into ``text``, from a message's raw ``metadata``.

    Reads both kinds of record in ``metadata["reminders"]``: those this library writes
    (``{"part", "start", "end"}``, offsets in characters) and those of the original package
    (``{"id", "text", "target", "partIndex", "start", "end", "mode"}``, offsets in UTF-16
    code units, as JavaScript counts them), so a chat the original stored shows and strips
    its reminders too. Malformed records are skipped; ranges are not clamped or merged.
    """
    if not isinstance(metadata, Mapping):
        return []
    found = metadata.get(METADATA_KEY)
    if not isinstance(found, list):
        return []
    ranges: list[tuple[int, int]] = []
    for record in found:
        if not isinstance(record, Mapping) or "field" in record or "wrapped" in record:
            continue
        original = "part" not in record and "partIndex" in record
        position = _int(record.get("partIndex" if original else "part"))
        start, end = _int(record.get("start")), _int(record.get("end"))
        if position != index or start is None or end is None:
            continue
        if original:
            start, end = _utf16_index(text, start), _utf16_index(text, end)
        ranges.append((start, end))
    return ranges


def text_ranges(message: Message) -> dict[int, list[tuple[int, int]]]:
    """The reminder ranges of each text part of ``message`` (see `part_ranges`)."""
    found: dict[int, list[tuple[int, int]]] = {}
    if not message.metadata or METADATA_KEY not in message.metadata:
        return found
    for index, part in enumerate(message.parts):
        if isinstance(part, TextPart):
            ranges = part_ranges(message.metadata, index, part.text)
            if ranges:
                found[index] = ranges
    return found


def inserted_texts(message: Message, target: ReminderTarget) -> list[str]:
    """The text each recorded reminder insertion of ``target`` holds in ``message``."""
    out: list[str] = []
    if target == "user":
        for position, ranges in text_ranges(message).items():
            text_part = message.parts[position]
            assert isinstance(text_part, TextPart)
            out.extend(text_part.text[start:end] for start, end in ranges)
        return out
    for record in _records(message):
        index = _int(record.get("part"))
        if index is None or not 0 <= index < len(message.parts):
            continue
        part = message.parts[index]
        if not isinstance(part, ToolPart):
            continue
        if record.get("wrapped") is True and isinstance(part.output, dict):
            inserted = part.output.get("system_reminder")
            if isinstance(inserted, str):
                out.append(inserted)
            continue
        field = record.get("field")
        start, end = _int(record.get("start")), _int(record.get("end"))
        value = getattr(part, field) if field in ("output", "error") else None
        if isinstance(value, str) and start is not None and end is not None:
            out.append(value[start:end])
    return out


def _is_synthetic(message: Message) -> bool:
    """Whether the original package made this whole message to carry a reminder."""
    synthetic = (message.metadata or {}).get("synthetic")
    return isinstance(synthetic, Mapping) and synthetic.get("source") == "reminder"


def strip_reminders(message: Message) -> Message:
    """``message`` without the reminders the engine inserted: what its author wrote.

    Uses the ranges in ``metadata["reminders"]`` (malformed entries are ignored), removes
    them from the text parts and tool results they were inserted into, drops a text part left
    empty, unwraps wrapped tool results, and removes the ``"reminders"`` key from the metadata
    (``metadata`` becomes None when nothing else is left). A message without reminders comes
    back unchanged.

    Records stored by the original package (``partIndex``, offsets in UTF-16 code units) are
    read as well (see `text_ranges`), and a message the original made only to carry a
    reminder (``metadata["synthetic"]["source"] == "reminder"``) loses its text parts.

    For example:

    ```python
    for message in (await engine.resolve()).messages:
        show(strip_reminders(message).text)
    ```
    """
    if not isinstance(message, Message):
        raise ReminderError(f"strip_reminders() takes a Message, got {type(message).__name__}")
    if message.metadata is None:
        return message
    if _is_synthetic(message):
        rest = {k: val for k, val in message.metadata.items() if k != "synthetic"}
        kept = [part for part in message.parts if not isinstance(part, TextPart)]
        return message.model_copy(update={"parts": kept, "metadata": rest or None})
    if METADATA_KEY not in message.metadata:
        return message
    texts = text_ranges(message)
    tool_ranges: dict[tuple[int, str], list[tuple[int, int]]] = {}
    unwrap: set[int] = set()
    for record in _records(message):
        index = _int(record.get("part"))
        if index is None or not 0 <= index < len(message.parts):
            continue
        field = record.get("field")
        if record.get("wrapped") is True:
            unwrap.add(index)
            continue
        start, end = _int(record.get("start")), _int(record.get("end"))
        if start is None or end is None:
            continue
        if field in ("output", "error"):
            tool_ranges.setdefault((index, field), []).append((start, end))
    parts: list[Any] = []
    for index, part in enumerate(message.parts):
        if isinstance(part, TextPart) and index in texts:
            stripped = _cut(part.text, texts[index])
            if stripped:
                parts.append(part.model_copy(update={"text": stripped}))
            continue
        if isinstance(part, ToolPart):
            update: dict[str, Any] = {}
            output = part.output
            if index in unwrap and isinstance(output, dict) and "result" in output:
                update["output"] = output["result"]
            for field in ("output", "error"):
                value = getattr(part, field)
                if (index, field) in tool_ranges and isinstance(value, str):
                    update[field] = _cut(value, tool_ranges[(index, field)])
            if update:
                part = part.model_copy(update=update)
        parts.append(part)
    metadata = {k: val for k, val in message.metadata.items() if k != METADATA_KEY}
    return message.model_copy(update={"parts": parts, "metadata": metadata or None})
