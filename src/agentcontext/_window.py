"""The context window: fitting a request (system prompt + messages) into a model's input limit.

What is sent is counted exactly as `estimate_context` counts it (the same tokenizer, the same
per-message framing), so a fitted request never exceeds the limit by the estimate's count.

How it cuts:

- The messages are grouped into *turns*: a turn starts at a user message and runs to the next
  one (a tool call and its result live in one assistant message, so whole turns and whole
  messages never separate them, on any adapter).
- The system prompt, pinned messages (``metadata={"pinned": True}``), a compaction summary and
  the newest turn are always sent; older turns are left out, oldest first.
- When it must cut, it cuts down to a *low-water mark*, and the cut point moves only when the
  conversation has grown by a band of tokens: the amount dropped is the droppable total rounded
  up to a multiple of the band (``budget - low_water * budget``). Between two moves, every
  request starts with the same messages, so providers' prompt caches keep hitting.

Tokens per message are counted once per process and tokenizer (keyed by the message id and a
fingerprint of its content, so an in-place update is counted again).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass

from agentcontext import _models_catalog
from agentcontext import _validate as v
from agentcontext._sent import (
    CACHE_LIMIT,
    MESSAGE_OVERHEAD_TOKENS,
    REPLY_PRIMING_TOKENS,
    cached_tokens,
    message_tokens_of,
)
from agentcontext._tokens import TokenCounter
from agentcontext.errors import ContextWindowError, InvalidInputError
from agentcontext.messages import Message

__all__ = ["ContextWindow", "Fitted", "fit"]


@dataclass(frozen=True)
class ContextWindow:
    """How much of the conversation `ContextEngine.resolve` may send.

    Args:
        max_tokens: The model's input limit in tokens. Defaults to the context window of
            ``model_id`` in the model catalogue (see `estimate_context`); when both are given,
            ``max_tokens`` wins.
        model_id: The model the request is for: its tokenizer counts the tokens, its
            catalogue entry gives the limit. Without it, tokens are counted with
            ``cl100k_base`` (or the documented approximation when that is not available).
        reserve_output: Tokens kept free for the reply.
        low_water: When it must cut, the request is cut down to this fraction of the budget,
            so the cut point (and with it the start of every request) stays the same for many
            turns. Between 0.1 and 1.0 (1.0: cut only what must go, every turn).

    Example:
        ```python
        result = await engine.resolve(window=ContextWindow(model_id="gpt-4o", reserve_output=4_000))
        result.omitted   # ids of the messages left out
        result.estimate  # the tokens sent
        ```
    """

    max_tokens: int | None = None
    _: KW_ONLY
    model_id: str | None = None
    reserve_output: int = 0
    low_water: float = 0.75

    def __post_init__(self) -> None:
        if self.max_tokens is not None:
            v.check_int(self.max_tokens, "max_tokens", minimum=1)
            v.check_int64(self.max_tokens, "max_tokens")
        if self.model_id is not None:
            v.check_text(self.model_id, "model_id")
        if self.max_tokens is None and self.model_id is None:
            raise InvalidInputError(
                "ContextWindow needs max_tokens or model_id: ContextWindow(128_000) or "
                "ContextWindow(model_id='gpt-4o')"
            )
        v.check_int(self.reserve_output, "reserve_output", minimum=0)
        v.check_int64(self.reserve_output, "reserve_output")
        if (
            isinstance(self.low_water, bool)
            or not isinstance(self.low_water, int | float)
            or not 0.1 <= self.low_water <= 1.0
        ):
            raise InvalidInputError(
                f"low_water must be a number between 0.1 and 1.0, got {self.low_water!r}"
            )

    def resolve_limit(self) -> tuple[int, TokenCounter]:
        """The input limit and the token counter of this window."""
        from agentcontext import estimate

        if self.model_id is not None:
            spec = _models_catalog.find_model(self.model_id)
            counter = estimate._counter_for(spec, self.model_id.strip().lower())
            limit = self.max_tokens if self.max_tokens is not None else spec.context_window
            if limit is None:
                raise InvalidInputError(
                    f"the catalogue has no context limit for {self.model_id!r}; give "
                    "ContextWindow(max_tokens=..., model_id=...)"
                )
            return limit, counter
        assert self.max_tokens is not None
        return self.max_tokens, estimate.default_counter()


@dataclass(frozen=True, slots=True)
class Fitted:
    """The messages to send, the ids left out, and the tokens of the request."""

    messages: list[Message]
    omitted: list[str]
    tokens: int


def message_tokens(
    messages: Sequence[Message],
    counter: TokenCounter,
    raw: Mapping[str, str | bytes | None],
) -> list[int]:
    """Each message's tokens as `estimate_context` counts them, framing included (0 for a
    message of which nothing is sent)."""
    cache = cached_tokens(counter.name)
    texts = raw.get
    lookup = cache.get
    out: list[int] = []
    append = out.append
    for index, message in enumerate(messages):
        message_id = message.id
        stored = texts(message_id)
        fingerprint = hash(stored) if stored is not None else hash(message.model_dump_json())
        found = lookup(message_id)
        if found is not None and found[0] == fingerprint:
            append(found[1])
            continue
        counted = message_tokens_of(message, index, counter.count)
        tokens = counted.tokens + MESSAGE_OVERHEAD_TOKENS if counted.sent else 0
        if len(cache) >= CACHE_LIMIT:
            for stale in list(cache)[: CACHE_LIMIT // 2]:
                del cache[stale]
        cache[message_id] = (fingerprint, tokens)
        append(tokens)
    return out


def _is_pinned(message: Message) -> bool:
    return bool(message.metadata) and message.metadata.get("pinned") is True  # type: ignore[union-attr]


def fit(
    window: ContextWindow,
    system_prompt: str,
    messages: list[Message],
    *,
    keep: Collection[str] = (),
    raw: Mapping[str, str | bytes | None] | None = None,
) -> Fitted:
    """Fit a request into the window (see the module documentation).

    ``keep`` holds the ids of more messages that are always sent (a compaction summary);
    ``raw`` maps stored message ids to their JSON text (a cheap content fingerprint).
    """
    limit, counter = window.resolve_limit()
    budget = limit - window.reserve_output
    tokens = message_tokens(messages, counter, raw or {})
    system = counter.count(system_prompt) + MESSAGE_OVERHEAD_TOKENS if system_prompt.strip() else 0
    priming = REPLY_PRIMING_TOKENS if (system or any(tokens)) else 0
    total = system + priming + sum(tokens)
    if total <= budget:
        return Fitted(messages=messages, omitted=[], tokens=total)

    # Turns: a user message starts one; what comes before the first user message is turn 0.
    starts = [i for i, message in enumerate(messages) if message.role == "user"]
    if not starts or starts[0] != 0:
        starts.insert(0, 0)
    last = starts[-1]  # the newest turn is always sent
    fixed = [m.id in keep or (bool(m.metadata) and _is_pinned(m)) for m in messages]
    pinned = sum(t for t, f in zip(tokens, fixed, strict=True) if f)
    droppable = [0 if f else t for t, f in zip(tokens, fixed, strict=True)]
    allowed = budget - system - priming - pinned
    newest = sum(droppable[last:])
    if newest > allowed:
        required = system + priming + pinned + newest
        raise ContextWindowError(
            f"the request needs at least {required} tokens (system prompt {system}, pinned "
            f"messages {pinned}, newest turn {newest}, framing {priming}) but the window allows "
            f"{budget} (limit {limit} - reserve_output {window.reserve_output}); it is "
            f"{required - budget} tokens too long: shorten the system prompt or the newest "
            "message, unpin messages, or use a model with a larger window",
            required=required,
            allowed=budget,
        )
    # Drop whole turns from the oldest, a band-rounded amount (see the module documentation).
    low = math.floor(window.low_water * allowed)
    band = max(1, allowed - low)
    target = math.ceil((sum(droppable) - low) / band) * band
    dropped = 0
    cut = 0
    for position, start in enumerate(starts):
        if dropped >= target or start == last:
            cut = start
            break
        end = starts[position + 1]
        dropped += sum(droppable[start:end])
    kept: list[Message] = []
    omitted: list[str] = []
    for index, message in enumerate(messages):
        if index >= cut or fixed[index]:
            kept.append(message)
        else:
            omitted.append(message.id)
    sent = system + sum(t for i, t in enumerate(tokens) if i >= cut or fixed[i])
    sent += REPLY_PRIMING_TOKENS if sent else 0
    return Fitted(messages=kept, omitted=omitted, tokens=sent)
