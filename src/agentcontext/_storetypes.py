"""What kind of store the engine was given, checked once per type of store (a check against a
runtime protocol inspects every method, and a fresh engine per request would pay it each
time)."""

from __future__ import annotations

from agentcontext import _validate as v
from agentcontext.errors import InvalidTypeError
from agentcontext.store.protocols import ConsistencyTokens, EngineStore

__all__ = ["check_store", "takes_tokens"]

_STORE_TYPES: set[type] = set()
"""Types checked to be `EngineStore`s already."""

_TOKEN_TYPES: dict[type, bool] = {}
"""Whether stores of a type take consistency tokens (a save asks it every time)."""


def check_store(store: object) -> None:
    """Refuse anything but an `EngineStore`."""
    kind = type(store)
    if kind in _STORE_TYPES:
        return
    if not isinstance(store, EngineStore):
        raise InvalidTypeError(
            f"store must be a ContextStore (such as SqlContextStore), got {v.type_name(store)}"
        )
    _STORE_TYPES.add(kind)


def takes_tokens(store: object) -> bool:
    """Whether ``store`` takes consistency tokens (`ConsistencyTokens`)."""
    kind = type(store)
    found = _TOKEN_TYPES.get(kind)
    if found is None:
        found = _TOKEN_TYPES[kind] = isinstance(store, ConsistencyTokens)
    return found
