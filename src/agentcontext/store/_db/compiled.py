"""SQL compiled once per process, not once per store.

SQLAlchemy caches each statement's compiled form per engine, keyed by the engine's dialect
object: a store made for one request, one test or one tenant compiles every statement it
runs again (about 0.3 ms each, 2 ms for a rewind). The engines a store makes from a URL share
one cache here instead, keyed by what the compiled SQL depends on: the dialect's class and its
settings once connected (server version, parameter style, JSON functions, feature flags).
Two engines that agree on all of these compile every statement to the same SQL, so the second
one uses the first one's work; engines that differ in any of them keep apart entries.

An engine you make yourself keeps its own cache, as does one made with
``engine_options={"query_cache_size": 0}`` (no caching) or its own ``compiled_cache``.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, MutableMapping
from typing import Any

from sqlalchemy.engine import Dialect as SADialect
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import LRUCache

__all__ = ["SHARED", "SharedCompiled", "dialect_kind", "share"]

_ENTRIES = 2000
"""Statements held (for every kind of engine together); SQLAlchemy's own default is 500 per
engine, and the store runs about 150 distinct statements."""

_OWN_OBJECTS = frozenset(
    {
        "_ischema",
        "_type_memos",
        "dbapi",
        "identifier_preparer",
        "loaded_dbapi",
        "type_compiler",
        "type_compiler_instance",
    }
)
"""Attributes of a dialect that are objects of its own; their class is what compiles alike."""

_SIMPLE = (bool, int, float, str, bytes, type(None))


def _setting(value: Any) -> Any:
    """A dialect attribute as a hashable stand-in: plain values as they are, functions (JSON
    serializers, hooks) by identity, anything else by its class."""
    if isinstance(value, _SIMPLE):
        return value
    if isinstance(value, tuple) and all(isinstance(item, _SIMPLE) for item in value):
        return value
    if callable(value) and not isinstance(value, type):
        try:
            hash(value)
        except TypeError:
            return ("unhashable", type(value))
        return value
    return ("object", type(value))


_KINDS: weakref.WeakKeyDictionary[SADialect, tuple[Any, ...]] = weakref.WeakKeyDictionary()


def dialect_kind(dialect: SADialect) -> tuple[Any, ...]:
    """What a compiled statement of ``dialect`` depends on; dialects of one kind compile any
    statement to the same SQL with the same parameter handling.

    Read when the dialect compiles its first statement, which is after it connected (the
    server's version and features are known by then)."""
    kind = _KINDS.get(dialect)
    if kind is None:
        cls = type(dialect)
        settings = sorted(
            (name, ("object", type(value)) if name in _OWN_OBJECTS else _setting(value))
            for name, value in vars(dialect).items()
            # (A memoized method's memo, kept on the instance once called: its class's.)
            if not callable(getattr(cls, name, None))
        )
        kind = _KINDS[dialect] = (type(dialect), *settings)
    return kind


class SharedCompiled(MutableMapping[Any, Any]):
    """A ``compiled_cache`` for many engines: SQLAlchemy's key with the dialect object
    replaced by its `dialect_kind`."""

    __slots__ = ("_entries",)

    def __init__(self, size: int = _ENTRIES) -> None:
        self._entries: LRUCache[Any, Any] = LRUCache(size)

    @staticmethod
    def _key(key: Any) -> Any:
        if isinstance(key, tuple) and key and isinstance(key[0], SADialect):
            return (dialect_kind(key[0]), *key[1:])
        return key

    def get(self, key: Any, default: Any = None) -> Any:
        return self._entries.get(self._key(key), default)

    def __getitem__(self, key: Any) -> Any:
        return self._entries[self._key(key)]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._entries[self._key(key)] = value

    def __delitem__(self, key: Any) -> None:
        del self._entries[self._key(key)]

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)


SHARED = SharedCompiled()
"""The cache of the engines stores make from URLs."""


def share(engine: AsyncEngine, engine_options: dict[str, Any]) -> None:
    """Let a store's own engine use the shared cache, unless its options ask for no cache or
    for one of their own."""
    if engine_options.get("query_cache_size") == 0:
        return
    if "compiled_cache" in (engine_options.get("execution_options") or {}):
        return
    engine.sync_engine.update_execution_options(compiled_cache=SHARED)
