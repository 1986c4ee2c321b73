"""Model prices and context limits: registered models first, then genai-prices' bundled data.

The ``genai-prices`` package ships its price data inside the wheel; this module only reads that
data (``genai_prices.data_snapshot.get_snapshot()``), which never touches the network. If the
application itself installed a newer snapshot through ``genai_prices.UpdatePrices``, that one is
used, since it is what the application chose.
"""

from __future__ import annotations

import difflib
import re
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from agentcontext._tokens import Tokenizer
from agentcontext.errors import InvalidInputError, InvalidTypeError, ModelNotFoundError

__all__ = [
    "ModelSpec",
    "family_encoding",
    "find_model",
    "register",
    "unregister",
]

_SEPARATORS = (":", "/")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What the estimate needs to know about one model."""

    model_id: str
    """The canonical id (``gpt-4o`` for ``openai:gpt-4o``)."""
    provider: str | None
    context_window: int | None
    source: str
    """``registered`` or ``genai-prices <version>``."""
    aliases: tuple[str, ...]
    """Lower-case ids a tokenizer can be registered under for this model."""
    input_price_per_mtok: Decimal | None = None
    """For registered models: the flat input price in USD per million tokens."""
    tokenizer: str | Tokenizer | None = None
    """For registered models: the tokenizer (or tokenizer / encoding name) to use."""
    _genai: tuple[Any, Any] | None = None
    """For genai-prices models: ``(Provider, ModelInfo)``."""

    def input_price_for(self, tokens: int) -> Decimal | None:
        """The input price per million tokens that applies to a prompt of ``tokens`` tokens."""
        if self._genai is None:
            return self.input_price_per_mtok
        _, model = self._genai
        price = model.get_prices(datetime.now(UTC)).input_mtok
        if price is None:
            return None
        if isinstance(price, Decimal):
            return price
        # Tiered prices: the highest tier whose threshold the prompt passes applies to all tokens.
        applied: Decimal = price.base
        for tier in price.tiers:
            if tokens > tier.start:
                applied = tier.price
        return applied

    def input_cost(self, tokens: int) -> Decimal | None:
        """The input cost of ``tokens`` prompt tokens in USD, or ``None`` if no price is known."""
        if self._genai is None:
            if self.input_price_per_mtok is None:
                return None
            return self.input_price_per_mtok * tokens / Decimal(1_000_000)
        if self.input_price_for(tokens) is None:
            return None
        from genai_prices import Usage

        provider, model = self._genai
        calculation = model.calc_price(Usage(input_tokens=tokens), provider)
        cost: Decimal = calculation.input_price
        return cost


# --- registered models ----------------------------------------------------------------------------

_lock = threading.Lock()
_registered: dict[str, ModelSpec] = {}


def _normalise(model_id: object, argument: str = "model_id") -> str:
    if not isinstance(model_id, str):
        raise InvalidTypeError(f"{argument} must be a str, got {type(model_id).__name__}")
    key = model_id.strip().lower()
    if not key:
        raise InvalidInputError(f"{argument} must not be empty, e.g. 'openai:gpt-4o'")
    return key


def _price(value: object, argument: str) -> Decimal | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal | str):
        raise InvalidTypeError(
            f"{argument} must be a number (USD per million tokens), got {type(value).__name__}"
        )
    try:
        price = Decimal(str(value))
    except ArithmeticError as exc:
        raise InvalidInputError(f"{argument} must be a number, got {value!r}") from exc
    if not price.is_finite() or price < 0:
        raise InvalidInputError(f"{argument} must be a finite number >= 0, got {value!r}")
    return price


def register(
    model_id: str,
    *,
    context_window: int | None,
    input_price_per_mtok: object = None,
    output_price_per_mtok: object = None,
    provider: str | None = None,
    tokenizer: str | Tokenizer | None = None,
) -> ModelSpec:
    """Validate and store a user-registered model (see ``agentcontext.estimate.register_model``)."""
    key = _normalise(model_id)
    if context_window is not None and (
        isinstance(context_window, bool) or not isinstance(context_window, int)
    ):
        raise InvalidTypeError(
            f"context_window must be an int or None, got {type(context_window).__name__}"
        )
    if context_window is not None and context_window <= 0:
        raise InvalidInputError(f"context_window must be > 0, got {context_window}")
    input_price = _price(input_price_per_mtok, "input_price_per_mtok")
    _price(output_price_per_mtok, "output_price_per_mtok")
    provider_key = _normalise(provider, "provider") if provider is not None else None
    if (
        tokenizer is not None
        and not isinstance(tokenizer, str)
        and not callable(tokenizer)
        and not callable(getattr(tokenizer, "encode", None))
    ):
        raise InvalidTypeError(
            "tokenizer must be a name, a callable str -> int, or an object with "
            f"encode(str) -> list[int]; got {type(tokenizer).__name__}"
        )
    bare = key
    for separator in _SEPARATORS:
        prefix, found, rest = key.partition(separator)
        if found and provider_key is not None and prefix == provider_key:
            bare = rest
            break
    aliases = {key, bare}
    if provider_key is not None:
        aliases |= {f"{provider_key}{separator}{bare}" for separator in _SEPARATORS}
    spec = ModelSpec(
        model_id=model_id.strip(),
        provider=provider.strip() if provider is not None else None,
        context_window=context_window,
        source="registered",
        aliases=tuple(sorted(aliases)),
        input_price_per_mtok=input_price,
        tokenizer=tokenizer,
    )
    with _lock:
        for alias in aliases:
            _registered[alias] = spec
    return spec


def unregister(model_id: str) -> bool:
    """Forget a registered model (under every alias it was stored with)."""
    key = _normalise(model_id)
    with _lock:
        spec = _registered.get(key)
        if spec is None:
            return False
        for alias in spec.aliases:
            if _registered.get(alias) is spec:
                del _registered[alias]
        return True


def _find_registered(key: str) -> ModelSpec | None:
    with _lock:
        if key in _registered:
            return _registered[key]
        for separator in _SEPARATORS:
            prefix, found, rest = key.partition(separator)
            if found and rest in _registered:
                spec = _registered[rest]
                if spec.provider is None or spec.provider.lower() == prefix:
                    return spec
    return None


# --- genai-prices ---------------------------------------------------------------------------------


def _genai_source() -> str:
    try:
        return f"genai-prices {version('genai-prices')}"
    except PackageNotFoundError:  # pragma: no cover - the package is a dependency
        return "genai-prices"


def _find_genai(key: str) -> ModelSpec | None:
    from genai_prices import data_snapshot

    snapshot = data_snapshot.get_snapshot()
    attempts: list[tuple[str | None, str]] = []
    for separator in _SEPARATORS:
        prefix, found, rest = key.partition(separator)
        if found and rest and data_snapshot.find_provider_by_id(snapshot.providers, prefix):
            attempts.append((prefix, rest))
    attempts.append((None, key))
    for separator in _SEPARATORS:
        prefix, found, rest = key.partition(separator)
        if found and rest:
            attempts.append((None, rest))
    for provider_id, reference in attempts:
        try:
            provider, model = snapshot.find_provider_model(reference, None, provider_id, None)
        except LookupError:
            continue
        aliases = {key, model.id.lower()} | {
            f"{provider.id}{separator}{model.id}".lower() for separator in _SEPARATORS
        }
        return ModelSpec(
            model_id=model.id,
            provider=provider.id,
            context_window=model.context_window,
            source=_genai_source(),
            aliases=tuple(sorted(aliases)),
            _genai=(provider, model),
        )
    return None


def _suggestions(key: str) -> list[str]:
    from genai_prices import data_snapshot

    snapshot = data_snapshot.get_snapshot()
    full: dict[str, str] = {}
    for provider in snapshot.providers:
        for model in provider.models:
            full.setdefault(model.id.lower(), f"{provider.id}:{model.id}")
    with _lock:
        for alias, spec in _registered.items():
            full.setdefault(alias, spec.model_id)
    bare = key
    for separator in _SEPARATORS:
        _, found, rest = key.partition(separator)
        if found and rest:
            bare = rest
            break
    names = difflib.get_close_matches(bare, list(full), n=5, cutoff=0.6)
    return [full[name] for name in names]


def find_model(model_id: str) -> ModelSpec:
    """Find a model by id; registered models win over genai-prices.

    Accepts ``gpt-4o``, ``openai:gpt-4o``, ``openai/gpt-4o`` (and any case).

    Raises:
        ModelNotFoundError: neither a registered model nor genai-prices' data knows the id.
    """
    key = _normalise(model_id)
    spec = _find_registered(key) or _find_genai(key)
    if spec is not None:
        return spec
    suggestions = _suggestions(key)
    hint = f" Did you mean: {', '.join(suggestions)}?" if suggestions else ""
    raise ModelNotFoundError(
        f"model {model_id!r} not found in the price data of {_genai_source()} nor among "
        f"registered models.{hint} To use it anyway, register it first: "
        f"agentcontext.register_model({model_id!r}, context_window=..., "
        "input_price_per_mtok=...)"
    )


# --- tokenizer family -----------------------------------------------------------------------------

_O200K = re.compile(r"^(?:gpt-4o|chatgpt-4o|gpt-4\.1|gpt-4\.5|gpt-5|gpt-oss|o1|o3|o4|codex)")
_CL100K = re.compile(r"^(?:gpt-4|gpt-3\.5|gpt-35|text-embedding-|davinci-002|babbage-002)")


def family_encoding(spec: ModelSpec) -> str:
    """The tiktoken encoding closest to the model's own tokenizer.

    OpenAI's current models use ``o200k_base`` and older ones ``cl100k_base``; for every other
    provider, whose tokenizers are not published as tiktoken files, ``cl100k_base`` serves as
    the proxy (as in the original package).
    """
    name = spec.model_id.lower().rsplit("/", 1)[-1]
    if _O200K.match(name):
        return "o200k_base"
    if _CL100K.match(name):
        return "cl100k_base"
    return "cl100k_base"
