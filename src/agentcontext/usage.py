"""Token usage in one shape, whichever SDK reported it.

`normalize_usage` reads the usage objects (or their dicts) of OpenAI Chat Completions
(``prompt_tokens``, ``completion_tokens``, ``prompt_tokens_details.cached_tokens``,
``completion_tokens_details.reasoning_tokens``), the OpenAI Responses API and the OpenAI
Agents SDK (``input_tokens``, ``output_tokens``, ``input_tokens_details.cached_tokens``,
``output_tokens_details.reasoning_tokens``, ``requests``), Anthropic (``input_tokens``
without the cache, ``cache_creation_input_tokens``, ``cache_read_input_tokens``,
``output_tokens``) and pydantic-ai (``input_tokens``, ``cache_read_tokens``,
``output_reasoning_tokens`` or ``details["reasoning_tokens"]``, ``requests``; older
releases' ``request_tokens`` and ``response_tokens``), LangChain's ``usage_metadata``
(``input_token_details.cache_read``, ``output_token_details.reasoning``), and the Vercel AI
SDK's ``LanguageModelUsage``, which the original package stores in a chat's metadata
(``inputTokens``, ``outputTokens``, ``totalTokens``, ``reasoningTokens``,
``cachedInputTokens``, or ``inputTokenDetails.cacheReadTokens`` /
``outputTokenDetails.reasoningTokens`` in newer releases).

The result always has the same six counts:

* ``input_tokens``: every input token, cached or not (Anthropic's three input counts added);
* ``output_tokens``: every output token, reasoning included;
* ``cached_input_tokens``: input tokens read from the provider's prompt cache;
* ``reasoning_tokens``: output tokens spent on reasoning;
* ``total_tokens``: as reported, else input plus output;
* ``requests``: model requests (as reported, else 1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from agentcontext.errors import InvalidInputError, InvalidTypeError

__all__ = ["USAGE_KEYS", "add_usage", "as_mapping", "normalize_usage"]

USAGE_KEYS = (
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "reasoning_tokens",
    "total_tokens",
    "requests",
)
"""The keys of a normalised usage dict, in order."""

_CAMEL_KEYS = frozenset(
    ("inputTokens", "outputTokens", "totalTokens", "inputTokenDetails", "outputTokenDetails")
)


def as_mapping(value: Any) -> Mapping[str, Any] | None:
    """A usage object (an SDK's pydantic model, a dataclass, a dict) as a mapping, or None."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return value
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        dumped = dump()
        if isinstance(dumped, Mapping):
            return dumped
    if hasattr(value, "__dict__"):
        return {k: v for k, v in vars(value).items() if not k.startswith("_")}
    return None


def _count(source: Mapping[str, Any] | None, key: str) -> int | float:
    if source is None:
        return 0
    value = source.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInputError(
            f"usage {key!r} must be a number of tokens, got {type(value).__name__}"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidInputError(f"usage {key!r} must be a finite number, got {value!r}")
    if value < 0:
        raise InvalidInputError(f"usage {key!r} must not be negative, got {value!r}")
    return value


def _nested(source: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    return as_mapping(source.get(key))


def normalize_usage(usage: Any) -> dict[str, int | float]:
    """Token usage of any supported SDK as one dict of six counts.

    Args:
        usage: An OpenAI Chat Completions, Responses, Agents SDK, Anthropic or pydantic-ai
            usage object, or its dict form. Keys of none of these shapes are ignored.

    Returns:
        ``{"input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens",
        "total_tokens", "requests"}`` (see the module docs for what each count holds).

    Raises:
        InvalidTypeError: ``usage`` is neither a mapping nor an object with fields.
        InvalidInputError: A count is not a finite, non-negative number.
    """
    source = as_mapping(usage)
    if source is None:
        raise InvalidTypeError(
            "usage must be a dict of token counts or an SDK usage object (anything with "
            f"model_dump() or attributes), got {type(usage).__name__}"
        )
    if _CAMEL_KEYS.intersection(source):  # the AI SDK's LanguageModelUsage (the original)
        input_tokens = _count(source, "inputTokens")
        output_tokens = _count(source, "outputTokens")
        cached = _count(_nested(source, "inputTokenDetails"), "cacheReadTokens") or _count(
            source, "cachedInputTokens"
        )
        reasoning = _count(_nested(source, "outputTokenDetails"), "reasoningTokens") or _count(
            source, "reasoningTokens"
        )
        total = _count(source, "totalTokens") or input_tokens + output_tokens
        requests = _count(source, "requests") if "requests" in source else 1
        return _usage(input_tokens, output_tokens, cached, reasoning, total, requests)
    if "request_tokens" in source or "response_tokens" in source:  # pydantic-ai before 1.0
        input_tokens = _count(source, "request_tokens")
        output_tokens = _count(source, "response_tokens")
        cached = _count(_nested(source, "details"), "cached_tokens")
        reasoning = _count(_nested(source, "details"), "reasoning_tokens")
    elif "prompt_tokens" in source or "completion_tokens" in source:  # Chat Completions
        input_tokens = _count(source, "prompt_tokens")
        output_tokens = _count(source, "completion_tokens")
        cached = _count(_nested(source, "prompt_tokens_details"), "cached_tokens")
        reasoning = _count(_nested(source, "completion_tokens_details"), "reasoning_tokens")
    elif "cache_read_input_tokens" in source or "cache_creation_input_tokens" in source:
        cached = _count(source, "cache_read_input_tokens")  # Anthropic: input excludes cache
        input_tokens = (
            _count(source, "input_tokens") + cached + _count(source, "cache_creation_input_tokens")
        )
        output_tokens = _count(source, "output_tokens")
        reasoning = 0
    else:  # Responses, Agents SDK, pydantic-ai, plain dicts
        input_tokens = _count(source, "input_tokens")
        output_tokens = _count(source, "output_tokens")
        cached = (
            _count(_nested(source, "input_tokens_details"), "cached_tokens")
            or _count(source, "cache_read_tokens")
            or _count(_nested(source, "input_token_details"), "cache_read")  # LangChain
        )
        reasoning = (
            _count(_nested(source, "output_tokens_details"), "reasoning_tokens")
            or _count(source, "output_reasoning_tokens")
            or _count(_nested(source, "details"), "reasoning_tokens")
            or _count(_nested(source, "output_token_details"), "reasoning")  # LangChain
        )
    cached = cached or _count(source, "cached_input_tokens")
    reasoning = reasoning or _count(source, "reasoning_tokens")
    total = _count(source, "total_tokens") or input_tokens + output_tokens
    requests = _count(source, "requests") if "requests" in source else 1
    return _usage(input_tokens, output_tokens, cached, reasoning, total, requests)


def _usage(*counts: int | float) -> dict[str, int | float]:
    return dict(zip(USAGE_KEYS, counts, strict=True))


def add_usage(total: Mapping[str, Any], usage: Mapping[str, Any]) -> dict[str, int | float]:
    """Add a normalised usage to a running total (missing or non-numeric counts are 0).

    Args:
        total: The running total (a normalised usage dict, ``{}``, or a total in the AI SDK's
            shape, as the original package stores it in a chat it wrote: it is converted).
        usage: What `normalize_usage` returned for one call.

    Returns:
        The new total, with the six keys of `normalize_usage`.
    """
    if _CAMEL_KEYS.intersection(total) and not any(key in total for key in USAGE_KEYS):
        try:
            total = normalize_usage(total)
        except InvalidInputError:
            total = {}
    out: dict[str, int | float] = {}
    for key in USAGE_KEYS:
        current = total.get(key)
        if isinstance(current, bool) or not isinstance(current, int | float):
            current = 0
        increment = usage.get(key) or 0
        out[key] = current + increment
    return out
