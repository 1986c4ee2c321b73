"""Lazy fragment data, materialised by the engine before it renders.

A fragment's data, or any value nested in it, may be *lazy*:

* an async callable or a sync callable (called with a `LoadContext` when it accepts
  one positional argument, with no argument otherwise; its result is materialised in turn);
* an awaitable (a coroutine, a task, a future);
* a sync or async generator (its items are collected into a list);
* another iterable that is not a ``list``, ``tuple``, ``dict`` or string: a ``set`` or
  ``frozenset`` becomes a list (sorted when its items can be compared, so the prompt is
  stable); a non-``dict`` mapping becomes a ``dict`` of its pairs when every key is a
  ``str``, otherwise a list of ``[key, value]`` pairs; anything else becomes a list.

For example:

```python
async def open_tickets(ctx: LoadContext) -> list[str]:
    return await ctx.engine.store_of_tickets.titles()   # anything async

context.set(fragment("tickets", open_tickets), hint(lambda: f"Today is {date.today()}"))
```

`LazyResolver` is the step the engine runs before rendering, estimating or
inspecting. It materialises all lazy values concurrently (``asyncio.gather``), each lazy
object **once** per resolver (memoised by identity, also when two ``materialize()`` calls run
at the same time: one load, both await it), and resolves lazy values nested in what a lazy
value returned. It bounds the chain of lazy values (``max_depth``) and the items a generator
or iterable may yield (``max_items``). A failure raises
`FragmentLoadError` naming the fragment path (``parent.child``)
with the original exception as ``__cause__``; a failed load is not memoised, so the next
``materialize()`` tries again.

Sync callables and sync generators run on the event loop: keep them quick, or make them
async. Message fragments and fragments with a codec are returned unchanged.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from agentcontext.errors import FragmentLoadError, InvalidInputError
from agentcontext.fragments import ContextFragment

__all__ = ["LazyResolver", "LoadContext", "has_lazy_value", "is_lazy_value"]

_NOT_LAZY = (str, bytes, bytearray, memoryview, int, float, list, dict, tuple, ContextFragment)


@dataclass(frozen=True, slots=True)
class LoadContext:
    """What a lazy callable receives.

    Attributes:
        engine: The engine that is resolving (a ``ContextEngine``), or whatever the caller
            of `LazyResolver.materialize` passed.
        path: The path of the fragment being loaded, such as ``"database.tables"``.
    """

    engine: Any = None
    path: str = ""


def is_lazy_value(value: object) -> bool:
    """Return whether ``value`` is lazy data that must be materialised before rendering."""
    if value is None or isinstance(value, _NOT_LAZY):
        return False
    if callable(value) or inspect.isawaitable(value):
        return True
    if hasattr(value, "model_dump"):  # a pydantic model iterates over its fields; not lazy
        return False
    return isinstance(value, (AsyncIterable, Iterable))


def has_lazy_value(value: object) -> bool:
    """Return whether ``value`` is lazy or holds a lazy value anywhere inside it.

    Nested fragments are searched too, except message fragments and fragments with a codec.
    """
    return _has_lazy(value, set())


def _has_lazy(value: object, active: set[int]) -> bool:
    while isinstance(value, ContextFragment):
        if value.type == "message" or value.codec is not None:
            return False
        value = value.data
    if value is None or isinstance(value, (str, int, float)):
        return False
    if isinstance(value, (list, tuple, dict)):
        marker = id(value)
        if marker in active:
            return False
        active.add(marker)
        try:
            items = value.values() if isinstance(value, dict) else value
            return any(_has_lazy(item, active) for item in items)
        finally:
            active.discard(marker)
    return is_lazy_value(value)


def _accepts_context(func: Any) -> bool:
    """Whether ``func`` can be called with one positional argument."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return False
    positional = 0
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            return True
        if parameter.kind in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            positional += 1
    return positional >= 1


def _sorted_if_possible(items: list[Any]) -> list[Any]:
    try:
        return sorted(items)
    except TypeError:
        return items


class _TooMany(Exception):
    pass


class LazyResolver:
    """Materialises lazy fragment data; the engine owns one and runs it before rendering.

    Args:
        max_depth: The longest chain of lazy values allowed (a lazy value returning data
            with lazy values inside counts one more level). Default 10.
        max_items: The most items one generator or iterable may yield. Default 10 000.
    """

    def __init__(self, max_depth: int = 10, max_items: int = 10_000) -> None:
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1:
            raise InvalidInputError(f"max_depth must be an int of at least 1, not {max_depth!r}")
        if isinstance(max_items, bool) or not isinstance(max_items, int) or max_items < 0:
            raise InvalidInputError(f"max_items must be an int of at least 0, not {max_items!r}")
        self.max_depth = max_depth
        self.max_items = max_items
        self._memo: dict[int, tuple[object, asyncio.Future[Any]]] = {}

    def clear(self) -> None:
        """Forget every memoised value, so the next ``materialize()`` loads them again."""
        self._memo.clear()

    async def materialize(
        self, fragments: Sequence[ContextFragment], context: LoadContext | None = None
    ) -> list[ContextFragment]:
        """Return the fragments with every lazy value in their data materialised.

        Fragments without lazy data are returned as they are (the same objects); the others
        are new fragments (the originals are not changed).

        Raises:
            FragmentLoadError: a lazy value failed, a chain of lazy values was longer than
                ``max_depth``, a generator yielded more than ``max_items`` items, or data
                contains itself.
        """
        ctx = context if context is not None else LoadContext()
        return list(
            await asyncio.gather(
                *(self._fragment(f, ctx, f.name, 0, frozenset()) for f in fragments)
            )
        )

    # --- walking -----------------------------------------------------------------------------

    async def _fragment(
        self,
        fragment: ContextFragment,
        ctx: LoadContext,
        path: str,
        depth: int,
        chain: frozenset[int],
    ) -> ContextFragment:
        if fragment.type == "message" or fragment.codec is not None:
            return fragment
        if not _has_lazy(fragment.data, set()):
            return fragment
        data = await self._walk(fragment.data, ctx, path, "", depth, chain, frozenset())
        return replace(fragment, data=data)

    async def _walk(
        self,
        value: Any,
        ctx: LoadContext,
        path: str,
        where: str,
        depth: int,
        chain: frozenset[int],
        ancestors: frozenset[int],
    ) -> Any:
        if value is None or isinstance(value, (str, int, float)):
            return value
        if isinstance(value, ContextFragment):
            return await self._fragment(value, ctx, f"{path}.{value.name}", depth, chain)
        if isinstance(value, (list, tuple, dict)):
            marker = id(value)
            if marker in ancestors:
                raise FragmentLoadError(
                    f"the data of fragment '{path}' contains itself{_at(where)}", path=path
                )
            inner = ancestors | {marker}
            if isinstance(value, dict):
                keys = list(value)
                results = await asyncio.gather(
                    *(
                        self._walk(value[k], ctx, path, f"{where}[{k!r}]", depth, chain, inner)
                        for k in keys
                    )
                )
                return dict(zip(keys, results, strict=True))
            return list(
                await asyncio.gather(
                    *(
                        self._walk(item, ctx, path, f"{where}[{i}]", depth, chain, inner)
                        for i, item in enumerate(value)
                    )
                )
            )
        if is_lazy_value(value):
            return await self._load(value, ctx, path, where, depth, chain)
        return value  # not lazy and not fragment data: left for the renderer to report

    async def _load(
        self,
        lazy: object,
        ctx: LoadContext,
        path: str,
        where: str,
        depth: int,
        chain: frozenset[int],
    ) -> Any:
        marker = id(lazy)
        if marker in chain:
            raise FragmentLoadError(
                f"lazy data of fragment '{path}'{_at(where)} produces itself", path=path
            )
        if depth >= self.max_depth:
            raise FragmentLoadError(
                f"lazy data of fragment '{path}'{_at(where)} nests deeper than "
                f"max_depth={self.max_depth}",
                path=path,
            )
        entry = self._memo.get(marker)
        task: asyncio.Future[Any]
        if entry is None or entry[0] is not lazy:
            task = asyncio.ensure_future(
                self._produce(lazy, ctx, path, where, depth, chain | {marker})
            )
            self._memo[marker] = (lazy, task)
            task.add_done_callback(lambda done: self._forget_failure(marker, done))
        else:
            task = entry[1]
        return await asyncio.shield(task)

    def _forget_failure(self, marker: int, task: asyncio.Future[Any]) -> None:
        if task.cancelled() or task.exception() is not None:
            entry = self._memo.get(marker)
            if entry is not None and entry[1] is task:
                del self._memo[marker]

    async def _produce(
        self,
        lazy: object,
        ctx: LoadContext,
        path: str,
        where: str,
        depth: int,
        chain: frozenset[int],
    ) -> Any:
        try:
            raw = await self._call(lazy, replace(ctx, path=path))
        except FragmentLoadError:
            raise
        except _TooMany:
            raise FragmentLoadError(
                f"lazy data of fragment '{path}'{_at(where)} yielded more than "
                f"max_items={self.max_items} items",
                path=path,
            ) from None
        except Exception as exc:
            raise FragmentLoadError(
                f"loading lazy data of fragment '{path}'{_at(where)} failed: "
                f"{type(exc).__name__}: {exc}",
                path=path,
            ) from exc
        return await self._walk(raw, ctx, path, where, depth + 1, chain, frozenset())

    async def _call(self, lazy: object, ctx: LoadContext) -> Any:
        """One step of materialisation: call, await, or collect."""
        if callable(lazy):
            return lazy(ctx) if _accepts_context(lazy) else lazy()
        if inspect.isawaitable(lazy):
            return await lazy
        if isinstance(lazy, AsyncIterable):
            return await self._collect_async(lazy)
        if isinstance(lazy, Mapping):
            pairs = self._collect(lazy.items())
            if all(isinstance(key, str) for key, _ in pairs):
                return dict(pairs)
            return [[key, value] for key, value in pairs]
        if isinstance(lazy, (set, frozenset)):
            return _sorted_if_possible(self._collect(lazy))
        if isinstance(lazy, Iterable):
            return self._collect(lazy)
        return lazy

    def _collect(self, iterable: Iterable[Any]) -> list[Any]:
        items: list[Any] = []
        iterator = iter(iterable)
        try:
            for item in iterator:
                if len(items) >= self.max_items:
                    raise _TooMany
                items.append(item)
        finally:
            close = getattr(iterator, "close", None)
            if close is not None and len(items) >= self.max_items:
                close()
        return items

    async def _collect_async(self, iterable: AsyncIterable[Any]) -> list[Any]:
        items: list[Any] = []
        iterator: AsyncIterator[Any] = aiter(iterable)
        try:
            async for item in iterator:
                if len(items) >= self.max_items:
                    raise _TooMany
                items.append(item)
        finally:
            aclose = getattr(iterator, "aclose", None)
            if aclose is not None and len(items) >= self.max_items:
                await aclose()
        return items


def _at(where: str) -> str:
    return f" at data{where}" if where else ""
