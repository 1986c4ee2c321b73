"""Argument checks shared by the store and the engine.

Every public method validates what it is given before it touches the database, so bad input
raises a `ContextError` subclass and changes nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic_core import PydanticSerializationError, from_json, to_json

from agentcontext.errors import InvalidInputError, InvalidTypeError, SerializationError

MAX_ID_LENGTH = 255
"""Longest id (chat, message, user) and name (branch, checkpoint) accepted."""

MAX_JSON_DEPTH = 128
"""Deepest nesting of lists and dicts accepted in stored JSON (metadata, message data)."""

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""Most text one message may hold: 16 MiB, the UTF-8 size of all its strings (text and
reasoning parts, tool inputs and outputs, data parts, metadata).

A message up to this size is stored whole and resolves whole on every backend; the full-text
index holds the first 256 KiB of its searchable text. A larger message is refused when it is
set on an engine, before any request could send it.
"""

MAX_COUNT = 2**31 - 1
"""Largest limit, offset or count accepted (what every backend can bind as a row count)."""

MAX_INT64 = 2**63 - 1
"""Largest integer a database column or a filter value may hold."""

MAX_JSON_INT_BITS = 13_000
"""Largest integer (in bits, about 3 900 digits) a stored JSON value may hold; Python itself
refuses to print integers of more than 4 300 digits."""

_JSON_SCALARS = (str, int, float, bool, type(None))


_F = TypeVar("_F", bound=Callable[..., object])


def type_name(value: object) -> str:
    """A short name of ``value``'s type for error messages."""
    return type(value).__name__


def check_text(value: object, what: str) -> str:
    """Check that ``value`` is a str that PostgreSQL and SQLite can both store."""
    if isinstance(value, str) and "\x00" in value:
        raise InvalidInputError(f"{what} contains a NUL character (\\x00); remove it")
    return check_unicode(value, what)


def check_unicode(value: object, what: str) -> str:
    """Check that ``value`` is a str that encodes to UTF-8 (no lone surrogates).

    NUL characters are allowed: for text kept as bytes (blobs), not in database text columns.
    """
    if not isinstance(value, str):
        raise InvalidTypeError(f"{what} must be a str, got {type_name(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInputError(
            f"{what} contains a lone surrogate and is not valid Unicode; "
            "decode your input with errors='replace' first"
        ) from None
    return value


def too_big(size: int, what: str) -> InvalidInputError:
    """The error for a message over `MAX_MESSAGE_BYTES`: both sizes in MiB with two decimals,
    the message's rounded up (a message one byte over never reads as the limit), and exactly
    in bytes."""
    return InvalidInputError(
        f"{what} holds {_size(size, up=True)} of text (the UTF-8 size of its strings); a "
        f"message holds at most {_size(MAX_MESSAGE_BYTES)}. Split the text into several "
        "messages, or keep large content out of the conversation, as a file of a "
        "ContextSnapshot"
    )


def _size(size: int, *, up: bool = False) -> str:
    """``16.01 MiB (16 777 217 bytes)``: hundredths of a MiB, rounded up or to nearest."""
    hundredths = -(-size * 100 // 2**20) if up else round(size * 100 / 2**20)
    return f"{hundredths // 100}.{hundredths % 100:02d} MiB ({size:,} bytes)".replace(",", " ")


def check_message_size(message: Any, what: str) -> None:
    """Refuse a `Message` whose strings hold more than `MAX_MESSAGE_BYTES` (UTF-8).

    Cheap for the usual message: characters are counted first, and bytes only when four bytes
    per character could pass the limit."""
    chars = 0
    walk: list[Any] = []
    for part in message.parts:
        text = getattr(part, "text", None)
        if isinstance(text, str) and part.type in ("text", "reasoning"):
            chars += len(text)
        else:
            walk.append(part.model_dump())
    if message.metadata:
        walk.append(message.metadata)
    if walk:
        chars += _string_size(walk, len)
    if chars * 4 <= MAX_MESSAGE_BYTES:
        return
    size = _string_size(message.model_dump(), lambda text: len(text.encode("utf-8", "replace")))
    if size > MAX_MESSAGE_BYTES:
        raise too_big(size, what)


def _string_size(value: Any, measure: Any) -> int:
    """The size of the strings in ``value``, each container counted once (a value that
    contains itself is refused later, by `check_json`)."""
    total = 0
    stack = [value]
    seen: set[int] = set()
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += measure(item)
        elif isinstance(item, (dict, list, tuple)):
            if id(item) in seen:
                continue
            seen.add(id(item))
            if isinstance(item, dict):
                for key, child in item.items():
                    if isinstance(key, str):
                        total += measure(key)
                    stack.append(child)
            else:
                stack.extend(item)
    return total


def check_id(value: object, what: str) -> str:
    """Check an id or a name: a non-empty str of at most 255 characters, no NUL, valid Unicode."""
    check_text(value, what)
    assert isinstance(value, str)
    if not value:
        raise InvalidInputError(f"{what} must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidInputError(
            f"{what} is {len(value)} characters long; the limit is {MAX_ID_LENGTH}"
        )
    return value


def check_optional_id(value: object, what: str) -> str | None:
    """Like `check_id`, but ``None`` is accepted."""
    return None if value is None else check_id(value, what)


def check_optional_text(value: object, what: str) -> str | None:
    """Like `check_text`, but ``None`` is accepted."""
    return None if value is None else check_text(value, what)


def check_callback(value: _F | None, what: str) -> _F | None:
    """An optional callable argument (a progress callback, say), or `InvalidTypeError`."""
    if value is not None and not callable(value):
        raise InvalidTypeError(f"{what} must be a callable or None, got {type_name(value)}")
    return value


def check_bool(value: object, what: str) -> bool:
    """Check that ``value`` is a bool (not merely truthy)."""
    if not isinstance(value, bool):
        raise InvalidTypeError(f"{what} must be a bool, got {type_name(value)}")
    return value


def check_int(value: object, what: str, *, minimum: int | None = None) -> int:
    """Check that ``value`` is an int (bools refused) not below ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTypeError(f"{what} must be an int, got {type_name(value)}")
    if minimum is not None and value < minimum:
        raise InvalidInputError(f"{what} must be at least {minimum}, got {value}")
    return value


def check_optional_int(value: object, what: str, *, minimum: int | None = None) -> int | None:
    """Like `check_int`, but ``None`` is accepted."""
    return None if value is None else check_int(value, what, minimum=minimum)


def check_count(value: object, what: str, *, minimum: int = 0, maximum: int = MAX_COUNT) -> int:
    """A limit, offset or count: an int between ``minimum`` and ``maximum`` (2**31 - 1)."""
    check_int(value, what, minimum=minimum)
    assert isinstance(value, int)
    if value > maximum:
        raise InvalidInputError(f"{what} must be at most {maximum:,}, got {_short(value)}")
    return value


def check_optional_count(value: object, what: str, *, minimum: int = 0) -> int | None:
    """Like `check_count`, but ``None`` (no limit) is accepted."""
    return None if value is None else check_count(value, what, minimum=minimum)


def check_int64(value: object, what: str, *, minimum: int = -MAX_INT64 - 1) -> int:
    """An int that fits a signed 64-bit column."""
    check_int(value, what, minimum=minimum)
    assert isinstance(value, int)
    if value > MAX_INT64:
        raise InvalidInputError(
            f"{what} must fit in 64 bits (at most {MAX_INT64:,}), got {_short(value)}"
        )
    if value < -MAX_INT64 - 1:
        raise InvalidInputError(f"{what} must fit in 64 bits, got {_short(value)}")
    return value


def check_timestamp(value: object, what: str) -> datetime:
    """An aware datetime that is a valid instant in UTC (years 1 to 9999)."""
    if not isinstance(value, datetime):
        raise InvalidTypeError(f"{what} must be a datetime, got {type_name(value)}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInputError(f"{what} must be timezone-aware, such as datetime.now(UTC)")
    try:
        value.astimezone(UTC)
    except (OverflowError, ValueError):
        raise InvalidInputError(
            f"{what} ({value.isoformat()}) is outside the years 1 to 9999 once in UTC"
        ) from None
    return value


def _short(value: int) -> str:
    """An int for an error message: its digits, or its size when it has too many."""
    if value.bit_length() > 256:
        return f"an integer of {value.bit_length():,} bits"
    return f"{value:,}"


def check_json(value: object, what: str, *, max_bytes: int | None = None) -> None:
    """Check that ``value`` can be stored as JSON with one meaning on every backend.

    Accepted: str, int, float, bool, None, lists and tuples of these, and dicts with str keys.
    Refused with `SerializationError`: NaN and infinite floats, non-string keys, NUL
    characters and lone surrogates in strings or keys, nesting deeper than
    `MAX_JSON_DEPTH`, a value that contains itself, and any other type. With ``max_bytes``,
    strings (keys included) holding more UTF-8 bytes in all are refused (`too_big`).
    """
    size = _plain_message_size(value)
    if size is None:
        size = json_size(value, what)
    if max_bytes is not None and size > max_bytes:
        raise too_big(size, what)


def json_size(value: object, what: str) -> int:
    """`check_json`'s walk of any value: the UTF-8 size of its strings, keys included, or
    `SerializationError` naming the first thing JSON cannot store."""
    # Iterative walk: deep input must not hit Python's recursion limit.
    size = 0
    stack: list[tuple[object, str, int]] = [(value, "$", 0)]
    active: set[int] = set()
    exits: list[tuple[int, int]] = []  # (stack length at which to leave, id)
    while stack:
        while exits and len(stack) <= exits[-1][0]:
            active.discard(exits.pop()[1])
        item, path, depth = stack.pop()
        if isinstance(item, str):
            size += _check_json_str(item, what, path)
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if item.bit_length() > MAX_JSON_INT_BITS:
                raise SerializationError(
                    f"{what} holds an integer of {item.bit_length():,} bits at {path}; JSON "
                    "integers are limited to about 3 900 digits: store it as a string"
                )
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise SerializationError(
                    f"{what} holds {item!r} at {path}; JSON has no NaN or infinity, "
                    "store None or a string instead"
                )
        elif isinstance(item, (dict, list, tuple)):
            if depth >= MAX_JSON_DEPTH:
                raise SerializationError(
                    f"{what} is nested deeper than {MAX_JSON_DEPTH} levels at {path}; flatten it"
                )
            if id(item) in active:
                raise SerializationError(f"{what} contains itself at {path}")
            active.add(id(item))
            exits.append((len(stack), id(item)))
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str):
                        raise SerializationError(
                            f"{what} has the key {key!r} (of type {type_name(key)}) at {path}; "
                            "JSON object keys must be strings: convert it with str()"
                        )
                    size += _check_json_str(key, what, f"{path} (key)")
                    stack.append((child, f"{path}.{key}", depth + 1))
            else:
                for index, child in enumerate(item):
                    stack.append((child, f"{path}[{index}]", depth + 1))
        else:
            raise SerializationError(
                f"{what} holds a value of type {type_name(item)} at {path}, which JSON cannot "
                "represent; convert it to str, int, float, bool, None, list or dict"
            )
    return size


_PLAIN_KEYS = frozenset({"id", "role", "parts", "metadata"})
_PLAIN_PART_KEYS = frozenset({"type", "text"})


def _plain_message_size(value: object) -> int | None:
    """The size `check_json` counts for the usual stored message, a dict of str values whose
    parts are dicts of str values and whose metadata is None (what a plain text message
    dumps to), when every string in it is storable; None for anything else, which the
    full walk then decides. Same answer as the walk, at a fraction of its cost."""
    if type(value) is not dict or not value.keys() <= _PLAIN_KEYS:
        return None
    strings: list[str] = list(value)
    for key, item in value.items():
        if key == "parts":
            if type(item) is not list:
                return None
            for part in item:
                if type(part) is not dict or not part.keys() <= _PLAIN_PART_KEYS:
                    return None
                strings += part
                for text in part.values():
                    if type(text) is not str:
                        return None
                    strings.append(text)
        elif key == "metadata":
            if item is not None:
                return None
        elif type(item) is str:
            strings.append(item)
        else:
            return None
    joined = "".join(strings)
    if "\x00" in joined:
        return None
    if joined.isascii():
        return len(joined)
    try:
        return len(joined.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def _check_json_str(text: str, what: str, path: str) -> int:
    """Check a string of stored JSON; its UTF-8 size."""
    if "\x00" in text:
        raise SerializationError(
            f"{what} has a NUL character (\\x00) at {path}; PostgreSQL cannot store it, remove it"
        )
    if text.isascii():
        return len(text)
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise SerializationError(
            f"{what} has a lone surrogate at {path} and is not valid Unicode; "
            "decode your input with errors='replace' first"
        ) from None


def check_json_object(value: object, what: str) -> dict[str, Any]:
    """Check a JSON object (metadata): a dict with str keys and storable values."""
    if not isinstance(value, Mapping):
        raise InvalidTypeError(f"{what} must be a dict, got {type_name(value)}")
    value = dict(value)
    check_json(value, what)
    return value


def dumps(value: object) -> str:
    """Serialise already-checked JSON compactly (the one serializer the store uses).

    pydantic-core's serializer, five times the standard library's speed on messages, writes
    the same text for checked JSON (`check_json`) but for the exponent of some small floats
    (``0.00001`` for ``1e-05``: the same number); what it declines (nesting past its depth
    limit) goes to the standard library.
    """
    try:
        return to_json(value).decode()
    except PydanticSerializationError:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def loads(text: str | bytes) -> Any:
    """Parse stored JSON (the one parser the store uses).

    pydantic-core's parser, which reads what `dumps` wrote back to the same values as
    the standard library (big integers, floats to the last bit, ``-0.0``) in about half the
    time; documents it declines (nested deeper than about 200 levels) go to the standard
    library.
    """
    try:
        return from_json(text)
    except ValueError:
        return json.loads(text)


def check_str_list(values: object, what: str) -> list[str]:
    """Check an iterable of ids/names (not a bare str)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise InvalidTypeError(f"{what} must be a list of str, got {type_name(values)}")
    return [check_id(v, f"{what}[{i}]") for i, v in enumerate(values)]
