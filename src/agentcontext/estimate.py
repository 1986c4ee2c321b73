"""Offline token, cost and context-limit estimates for a prompt.

`estimate_context` counts the tokens of a system prompt, of each of its fragments and of
each message, and prices the total for a model:

- **Prices and context limits** come from the ``genai-prices`` package's bundled data (read
  offline; never downloaded at run time) unless the model was registered with
  `register_model`, which takes precedence.
- **Tokens** come from a tiktoken encoding when its data is already on the machine
  (``o200k_base`` for OpenAI's current models, ``cl100k_base`` for older OpenAI models and as
  the proxy for every other provider), from a tokenizer registered with
  `register_tokenizer`, or else from a documented approximation
  (`approximate_tokens`), in which case ``Estimate.approximate`` is ``True``.

Nothing here makes a network call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field

from agentcontext import _models_catalog, _tokens
from agentcontext._sent import (
    MESSAGE_OVERHEAD_TOKENS,
    REPLY_PRIMING_TOKENS,
    MessageEstimate,
    clear_token_cache,
    message_tokens_of,
)
from agentcontext._tokens import EncodingTokenizer, TokenCounter, Tokenizer, approximate_tokens
from agentcontext.errors import InvalidInputError, InvalidTypeError

__all__ = [
    "MESSAGE_OVERHEAD_TOKENS",
    "REPLY_PRIMING_TOKENS",
    "Estimate",
    "EncodingTokenizer",
    "FragmentEstimate",
    "MessageEstimate",
    "Tokenizer",
    "approximate_tokens",
    "estimate_context",
    "register_model",
    "register_tokenizer",
    "unregister_model",
    "unregister_tokenizer",
]


class FragmentEstimate(BaseModel):
    """The tokens of one context fragment, rendered on its own."""

    model_config = ConfigDict(frozen=True)

    name: str
    tokens: int


class Estimate(BaseModel):
    """How many input tokens a prompt takes for a model, what it costs, and whether it fits.

    JSON-serialisable (``estimate.model_dump(mode="json")`` / ``model_dump_json()``).

    ``input_tokens`` = ``system_prompt_tokens`` + the sum of ``messages[*].tokens`` +
    ``overhead_tokens``. ``fragments`` break the system prompt down per fragment (each rendered
    on its own, so their sum can differ slightly from ``system_prompt_tokens``).

    ``cost`` is the input cost in US dollars as a ``float`` (computed exactly with ``Decimal``
    from the per-million-token price, then converted), or ``None`` when no input price is known.
    Tiered prices are applied the way providers bill them: the tier the whole prompt reaches
    prices all of its tokens; ``input_price_per_mtok`` is the rate that was applied.
    """

    model_config = ConfigDict(frozen=True, protected_namespaces=())

    model_id: str = Field(description="The model's canonical id, e.g. 'gpt-4o'.")
    provider: str | None = Field(description="The provider id, e.g. 'openai', if known.")
    tokenizer: str = Field(
        description="What counted the tokens: 'tiktoken/<encoding>', a registered name, "
        "or 'approximate'."
    )
    approximate: bool = Field(
        description="True when the documented approximation was used instead of a tokenizer."
    )
    input_tokens: int = Field(description="Total input tokens of the request.")
    system_prompt_tokens: int
    overhead_tokens: int = Field(
        description="Message framing: MESSAGE_OVERHEAD_TOKENS per message sent (a non-blank "
        "system prompt counts as one) plus REPLY_PRIMING_TOKENS, or 0 for an empty request."
    )
    fragments: list[FragmentEstimate]
    messages: list[MessageEstimate]
    context_limit: int | None = Field(description="The model's context window, if known.")
    exceeds_context: bool = Field(description="input_tokens > context_limit.")
    cost: float | None = Field(description="Input cost in USD, or None if no price is known.")
    input_price_per_mtok: float | None = Field(
        description="USD per million input tokens applied to this prompt, if known."
    )
    price_source: str = Field(description="'registered' or 'genai-prices <version>'.")


# --- registration ---------------------------------------------------------------------------------

_tokenizers: dict[str, Tokenizer] = {}


def _check_tokenizer(tokenizer: object) -> Tokenizer:
    if isinstance(tokenizer, EncodingTokenizer) or callable(tokenizer):
        return cast(Tokenizer, tokenizer)
    raise InvalidTypeError(
        "tokenizer must be a callable str -> int (the count) or an object with "
        f"encode(str) -> list[int]; got {type(tokenizer).__name__}"
    )


def register_tokenizer(name_or_model: str, tokenizer: Tokenizer) -> None:
    """Register a tokenizer under a model id or a name.

    ``tokenizer`` is any callable ``str -> int`` returning the token count, or an object with
    ``encode(str) -> list[int]`` (a ``tiktoken.Encoding``, a Hugging Face tokenizer, ...).

    - Under a **model id** (``"openai:gpt-4o"``, ``"gpt-4o"``, or a registered model's id) it
      counts the tokens of that model, before anything else.
    - Under a **tiktoken encoding name** (``"o200k_base"``, ``"cl100k_base"``) it stands in for
      that encoding for every model that uses it: a way to provide an encoding offline.
    - Under **any other name**, a model registered with ``register_model(..., tokenizer=name)``
      uses it.

    Registering again under the same key replaces the previous tokenizer.

    Raises:
        InvalidTypeError: the key is not a string or the tokenizer has the wrong shape.
        InvalidInputError: the key is empty.
    """
    key = _models_catalog._normalise(name_or_model, "name_or_model")
    _tokenizers[key] = _check_tokenizer(tokenizer)
    _forget_counts()


def unregister_tokenizer(name_or_model: str) -> bool:
    """Remove a tokenizer registered with `register_tokenizer`; ``True`` if one was."""
    key = _models_catalog._normalise(name_or_model, "name_or_model")
    removed = _tokenizers.pop(key, None) is not None
    _forget_counts()
    return removed


def register_model(
    model_id: str,
    *,
    context_window: int | None,
    input_price_per_mtok: float | Decimal | str | None = None,
    output_price_per_mtok: float | Decimal | str | None = None,
    provider: str | None = None,
    tokenizer: str | Tokenizer | None = None,
) -> None:
    """Register a model's context window, prices and tokenizer for `estimate_context`.

    Registered models take precedence over the genai-prices data, so this also overrides a
    known model (a fine-tune, a self-hosted deployment, a negotiated price).

    Args:
        model_id: The id to estimate with, e.g. ``"acme:llama-3-70b"``. Matching is
            case-insensitive; with ``provider="acme"``, ``"acme:llama-3-70b"``,
            ``"acme/llama-3-70b"`` and ``"llama-3-70b"`` all find it.
        context_window: The maximum number of input tokens, or ``None`` if unknown.
        input_price_per_mtok: USD per million input tokens (``None``: no cost is computed).
        output_price_per_mtok: USD per million output tokens (kept for reference).
        provider: The provider's name, reported in the estimate.
        tokenizer: A tokenizer (callable ``str -> int`` or object with ``encode``), or a name:
            one given to `register_tokenizer`, or a tiktoken encoding such as
            ``"o200k_base"`` (used only if available offline). ``None``: the default choice.

    Raises:
        InvalidTypeError, InvalidInputError: an argument has the wrong type or value.
    """
    _forget_counts()
    _models_catalog.register(
        model_id,
        context_window=context_window,
        input_price_per_mtok=input_price_per_mtok,
        output_price_per_mtok=output_price_per_mtok,
        provider=provider,
        tokenizer=tokenizer,
    )


def unregister_model(model_id: str) -> bool:
    """Remove a model registered with `register_model`; ``True`` if one was."""
    _forget_counts()
    return _models_catalog.unregister(model_id)


# --- choosing a counter ---------------------------------------------------------------------------


def _named_counter(name: str) -> TokenCounter | None:
    """A registered tokenizer called ``name``, else the offline tiktoken encoding ``name``."""
    key = name.strip().lower()
    if key in _tokenizers:
        return _tokens.adapt_tokenizer(name, _tokenizers[key])
    return _tokens.encoding_counter(key)


def _forget_counts() -> None:
    clear_token_cache()


def default_counter() -> TokenCounter:
    """The counter used without a model: ``cl100k_base`` if available offline, else the
    approximation."""
    return _named_counter("cl100k_base") or _tokens.approximate_counter()


def _counter_for(spec: _models_catalog.ModelSpec, requested: str) -> TokenCounter:
    for alias in (requested, *spec.aliases):
        if alias in _tokenizers:
            return _tokens.adapt_tokenizer(alias, _tokenizers[alias])
    if spec.tokenizer is not None:
        if isinstance(spec.tokenizer, str):
            counter = _named_counter(spec.tokenizer)
            if counter is not None:
                return counter
        else:
            return _tokens.adapt_tokenizer(f"{spec.model_id} tokenizer", spec.tokenizer)
    for encoding in dict.fromkeys((_models_catalog.family_encoding(spec), "cl100k_base")):
        counter = _named_counter(encoding)
        if counter is not None:
            return counter
    return _tokens.approximate_counter()


def _fragment_pairs(fragments: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    if isinstance(fragments, str | bytes | Mapping):
        raise InvalidTypeError("fragments must be a sequence of (name, rendered text) pairs")
    pairs: list[tuple[str, str]] = []
    for index, pair in enumerate(fragments):
        if (
            not isinstance(pair, tuple | list)
            or len(pair) != 2
            or not isinstance(pair[0], str)
            or not isinstance(pair[1], str)
        ):
            raise InvalidTypeError(
                f"fragments[{index}] must be a (name, rendered text) pair of strings"
            )
        pairs.append((pair[0], pair[1]))
    return pairs


def estimate_context(
    model_id: str,
    *,
    system_prompt: str,
    fragments: Sequence[tuple[str, str]],
    messages: Sequence[Any],
) -> Estimate:
    """Estimate the input tokens, cost and context fit of a prompt for a model, offline.

    Args:
        model_id: ``"gpt-4o"``, ``"openai:gpt-4o"``, ``"openai/gpt-4o"``,
            ``"anthropic:claude-sonnet-4-5"``, or a model registered with
            `register_model`.
        system_prompt: The rendered system prompt, as sent.
        fragments: ``(fragment name, that fragment rendered on its own)`` pairs, for the
            per-fragment breakdown.
        messages: ``agentcontext.Message`` objects or dicts with ``id``, ``role`` and
            ``parts``. Only what ``ResolveResult.to_openai()`` / ``to_anthropic()`` send is
            counted: non-blank text; an assistant's finished tool calls (name, input, and
            output or error, as compact JSON unless a string); a user's files by name, media
            type and URL (the content itself, an image or a PDF, is priced differently by each
            provider and is not included). Reasoning and data parts, unfinished tool calls and
            assistant files are never sent and count 0.

    Tokens are counted with, in order of preference: a tokenizer registered for the model,
    the model's registered tokenizer, the model family's tiktoken encoding (``o200k_base``
    or ``cl100k_base``) or ``cl100k_base`` if available offline, and otherwise
    `approximate_tokens`, a heuristic calibrated on ``cl100k_base``: on the mixed corpus
    of ``benchmarks/bench_tokens.py`` (English prose, code, JSON, XML, Markdown, numbers,
    identifiers, emoji, and 13 other languages in 10 scripts) its mean absolute error per
    sample is 6.9 % and its worst 43.8 % (short Chinese text; every other sample is within
    20 %), see ``docs/estimate.md``.

    Each message that is sent, and the system prompt if not blank, adds
    ``MESSAGE_OVERHEAD_TOKENS`` for its framing, and a non-empty request adds
    ``REPLY_PRIMING_TOKENS`` (OpenAI's chat format; other providers are close).

    Returns:
        The `Estimate`.

    Raises:
        ModelNotFoundError: the model is neither registered nor in genai-prices' data; the
            message suggests close names and shows how to register the model.
        InvalidTypeError: an argument has the wrong shape.
    """
    if not isinstance(system_prompt, str):
        raise InvalidTypeError(f"system_prompt must be a str, got {type(system_prompt).__name__}")
    pairs = _fragment_pairs(fragments)
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Iterable):
        raise InvalidTypeError("messages must be a sequence of messages")
    spec = _models_catalog.find_model(model_id)
    counter = _counter_for(spec, model_id.strip().lower())
    count = counter.count

    system_tokens = count(system_prompt) if system_prompt.strip() else 0
    fragment_estimates = [
        FragmentEstimate(name=name, tokens=count(text) if text else 0) for name, text in pairs
    ]
    message_estimates = [
        message_tokens_of(message, index, count) for index, message in enumerate(messages)
    ]
    framed = sum(entry.sent for entry in message_estimates) + (1 if system_tokens else 0)
    overhead = framed * MESSAGE_OVERHEAD_TOKENS + REPLY_PRIMING_TOKENS if framed else 0
    total = system_tokens + sum(entry.tokens for entry in message_estimates) + overhead
    if total < 0:  # pragma: no cover - counts are validated non-negative
        raise InvalidInputError("token counts must not be negative")

    cost = spec.input_cost(total)
    price = spec.input_price_for(total)
    limit = spec.context_window
    return Estimate(
        model_id=spec.model_id,
        provider=spec.provider,
        tokenizer=counter.name,
        approximate=counter.approximate,
        input_tokens=total,
        system_prompt_tokens=system_tokens,
        overhead_tokens=overhead,
        fragments=fragment_estimates,
        messages=message_estimates,
        context_limit=limit,
        exceeds_context=limit is not None and total > limit,
        cost=float(cost) if cost is not None else None,
        input_price_per_mtok=float(price) if price is not None else None,
        price_source=spec.source,
    )
