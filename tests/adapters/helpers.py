"""Strict validation of adapter output against the SDKs' own parameter types."""

from __future__ import annotations

import itertools
from typing import Any

from anthropic.types import MessageParam, TextBlockParam
from openai.types.chat import ChatCompletionMessageParam
from openai.types.responses import ResponseInputItemParam
from pydantic import ConfigDict, TypeAdapter

_STRICT = ConfigDict(extra="forbid")
_OPENAI: TypeAdapter[Any] = TypeAdapter(list[ChatCompletionMessageParam], config=_STRICT)
_RESPONSES: TypeAdapter[Any] = TypeAdapter(list[ResponseInputItemParam], config=_STRICT)
_ANTHROPIC: TypeAdapter[Any] = TypeAdapter(list[MessageParam], config=_STRICT)
_SYSTEM: TypeAdapter[Any] = TypeAdapter(str | list[TextBlockParam], config=_STRICT)


def consume(value: Any) -> Any:
    """Walk a validated value, consuming pydantic's lazy iterators (which validates them)."""
    if isinstance(value, dict):
        return {key: consume(item) for key, item in value.items()}
    if value is None or isinstance(value, str | bytes | int | float | bool):
        return value
    if hasattr(value, "__iter__"):
        return [consume(item) for item in value]
    return value


def valid_openai(messages: Any) -> list[dict[str, Any]]:
    assert consume(_OPENAI.validate_python(messages)) == messages
    return list(messages)


def valid_responses(items: Any) -> list[dict[str, Any]]:
    assert consume(_RESPONSES.validate_python(items)) == items
    return list(items)


def valid_anthropic(request: Any) -> dict[str, Any]:
    assert set(request) <= {"system", "messages"}
    if "system" in request:
        assert consume(_SYSTEM.validate_python(request["system"])) == request["system"]
    assert consume(_ANTHROPIC.validate_python(request["messages"])) == request["messages"]
    roles = [m["role"] for m in request["messages"]]
    assert all(a != b for a, b in itertools.pairwise(roles)), roles
    return dict(request)


def breakpoints(value: Any) -> int:
    """How many ``cache_control`` markers a request holds."""
    if isinstance(value, dict):
        return ("cache_control" in value) + sum(breakpoints(v) for v in value.values())
    if isinstance(value, list):
        return sum(breakpoints(v) for v in value)
    return 0


def http_of(sdk: str) -> Any:
    """The HTTP package an SDK is built on (``httpx``, or ``httpx2`` in newer releases), whose
    ``MockTransport`` and ``AsyncClient`` the SDK's client accepts."""
    import importlib

    base = importlib.import_module(f"{sdk}._base_client")
    return getattr(base, "httpx2", None) or base.httpx
