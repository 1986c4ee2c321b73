"""LazyResolver: every kind of lazy value, nesting, memoisation, concurrency and bounds."""

from __future__ import annotations

import asyncio
import types
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from agentcontext.errors import FragmentLoadError, InvalidInputError
from agentcontext.fragments import ContextFragment, fragment, hint, last_assistant_message, user
from agentcontext.lazy import LazyResolver, LoadContext, has_lazy_value, is_lazy_value
from agentcontext.renderers import XmlRenderer


async def materialize(*fragments: ContextFragment, **options: int) -> list[ContextFragment]:
    return await LazyResolver(**options).materialize(list(fragments), LoadContext(engine="E"))


async def test_every_kind_of_lazy_value() -> None:
    async def async_loader(ctx: LoadContext) -> str:
        return f"async:{ctx.engine}"

    def sync_loader() -> int:
        return 42

    def gen() -> Iterator[int]:
        yield from (1, 2)

    async def agen() -> AsyncIterator[str]:
        for item in ("x", "y"):
            await asyncio.sleep(0)
            yield item

    async def coro() -> str:
        return "awaited"

    future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    future.set_result("future")
    data = {
        "async": async_loader,
        "sync": sync_loader,
        "lambda": lambda: "λ",
        "coroutine": coro(),
        "future": future,
        "generator": gen(),
        "generator_function": gen,
        "async_generator": agen(),
        "async_generator_function": agen,
        "set": {3, 1, 2},
        "frozenset": frozenset({"b", "a"}),
        "mixed_set": {1, "a"},
        "mapping": types.MappingProxyType({"k": "v"}),
        "int_keyed_mapping": types.MappingProxyType({1: "one"}),
        "range": range(3),
        "dict_keys": {"p": 1, "q": 2}.keys(),
        "tuple": (1, lambda: 2),
        "ordered": OrderedDict(a=lambda: 1),
        "plain": [1, "two", None, 3.5, True],
    }
    [out] = await materialize(ContextFragment(name="all", data=data))
    result = out.data
    assert isinstance(result, dict)
    assert result["async"] == "async:E"
    assert result["sync"] == 42
    assert result["lambda"] == "λ"
    assert result["coroutine"] == "awaited"
    assert result["future"] == "future"
    assert result["generator"] == [1, 2]
    assert result["generator_function"] == [1, 2]
    assert result["async_generator"] == ["x", "y"]
    assert result["async_generator_function"] == ["x", "y"]
    assert result["set"] == [1, 2, 3]  # sorted, so the prompt is stable
    assert result["frozenset"] == ["a", "b"]
    assert sorted(result["mixed_set"], key=str) == [1, "a"]
    assert result["mapping"] == {"k": "v"}
    assert result["int_keyed_mapping"] == [[1, "one"]]
    assert result["range"] == [0, 1, 2]
    assert result["dict_keys"] == ["p", "q"]
    assert result["tuple"] == [1, 2]
    assert result["ordered"] == {"a": 1}
    assert result["plain"] == [1, "two", None, 3.5, True]
    assert not has_lazy_value(out)
    XmlRenderer().render([out])  # renderable now


async def test_top_level_lazy_data_and_nested_lazy_results() -> None:
    async def tables(ctx: LoadContext) -> list[Any]:
        return [{"name": "users", "columns": lambda: ["id", "email"]}, hint(lambda: "from hint")]

    [out] = await materialize(fragment("database", tables, hint(async_text("x"))))
    assert out.data == [
        [{"name": "users", "columns": ["id", "email"]}, hint("from hint")],
        hint("x"),
    ]


def async_text(text: str) -> Any:
    async def load() -> str:
        return text

    return load


async def test_a_lazy_value_may_return_a_fragment_with_lazy_data() -> None:
    def make() -> ContextFragment:
        return fragment("inner", lambda: "deep")

    [out] = await materialize(fragment("outer", make))
    assert out.data == [fragment("inner", "deep")]


async def test_unchanged_fragments_are_returned_as_they_are() -> None:
    static = fragment("static", hint("a"), {"b": [1, 2]})
    message = user("hi")
    lazy_message = last_assistant_message("x")
    lazy = ContextFragment(name="lazy", data=lambda: 1)
    out = await materialize(static, message, lazy_message, lazy)
    assert out[0] is static
    assert out[1] is message
    assert out[2] is lazy_message
    assert out[3] == ContextFragment(name="lazy", data=1)
    assert callable(lazy.data)  # the original is not changed


async def test_context_carries_engine_and_fragment_path() -> None:
    seen: list[LoadContext] = []

    def loader(ctx: LoadContext) -> str:
        seen.append(ctx)
        return "ok"

    await LazyResolver().materialize(
        [fragment("parent", fragment("child", loader))], LoadContext(engine="engine-1")
    )
    assert seen == [LoadContext(engine="engine-1", path="parent.child")]


async def test_callables_with_optional_or_variadic_parameters() -> None:
    received: list[Any] = []

    def with_default(ctx: Any = None) -> str:
        received.append(ctx)
        return "a"

    def variadic(*args: Any) -> str:
        received.append(args)
        return "b"

    def keyword_only(*, ctx: Any = None) -> str:
        received.append(ctx)
        return "c"

    [out] = await materialize(fragment("x", with_default, variadic, keyword_only))
    assert out.data == ["a", "b", "c"]
    assert isinstance(received[0], LoadContext)
    assert isinstance(received[1][0], LoadContext)
    assert received[2] is None  # keyword-only: called without the context


async def test_loads_run_concurrently() -> None:
    a_started, b_started = asyncio.Event(), asyncio.Event()

    async def a() -> str:
        a_started.set()
        await asyncio.wait_for(b_started.wait(), 2)
        return "a"

    async def b() -> str:
        b_started.set()
        await asyncio.wait_for(a_started.wait(), 2)
        return "b"

    # Sequential loading would time out: each load waits for the other to have started.
    out = await materialize(fragment("one", a), fragment("two", {"x": b}))
    assert [f.data for f in out] == [["a"], [{"x": "b"}]]


async def test_each_lazy_object_loads_once_per_resolver() -> None:
    calls = 0

    async def loader() -> str:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0)
        return "value"

    resolver = LazyResolver()
    fragments = [fragment("a", loader), fragment("b", {"again": loader})]
    first = await resolver.materialize(fragments)
    second = await resolver.materialize(fragments)
    assert calls == 1
    assert first == second
    assert first[1].data == [{"again": "value"}]
    other = LazyResolver()
    await other.materialize(fragments)
    assert calls == 2  # memoised per resolver
    resolver.clear()
    await resolver.materialize(fragments)
    assert calls == 3


async def test_concurrent_materialize_calls_share_one_load() -> None:
    calls = 0
    release = asyncio.Event()

    async def slow() -> str:
        nonlocal calls
        calls += 1
        await release.wait()
        return "shared"

    resolver = LazyResolver()
    fragments = [fragment("x", slow)]
    first = asyncio.create_task(resolver.materialize(fragments))
    second = asyncio.create_task(resolver.materialize(fragments))
    await asyncio.sleep(0.01)
    release.set()
    a, b = await asyncio.gather(first, second)
    assert calls == 1
    assert a[0].data == b[0].data == ["shared"]


async def test_cancelling_one_waiter_does_not_cancel_the_shared_load() -> None:
    release = asyncio.Event()

    async def slow() -> str:
        await release.wait()
        return "done"

    resolver = LazyResolver()
    fragments = [fragment("x", slow)]
    first = asyncio.create_task(resolver.materialize(fragments))
    second = asyncio.create_task(resolver.materialize(fragments))
    await asyncio.sleep(0.01)
    first.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert (await second)[0].data == ["done"]


async def test_failures_name_the_path_and_chain_the_cause() -> None:
    async def broken(ctx: LoadContext) -> str:
        raise KeyError("missing table")

    with pytest.raises(FragmentLoadError) as info:
        await materialize(fragment("database", fragment("tables", {"list": [1, broken]})))
    error = info.value
    assert error.path == "database.tables"
    assert "database.tables" in str(error)
    assert "['list'][1]" in str(error)
    assert isinstance(error.__cause__, KeyError)


async def test_a_failed_load_is_retried_next_time() -> None:
    attempts = 0

    def flaky() -> str:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise RuntimeError("first time fails")
        return "second time works"

    resolver = LazyResolver()
    fragments = [fragment("x", flaky)]
    with pytest.raises(FragmentLoadError):
        await resolver.materialize(fragments)
    out = await resolver.materialize(fragments)
    assert out[0].data == ["second time works"]
    await resolver.materialize(fragments)
    assert attempts == 2  # the success is memoised


def _chain(length: int) -> Any:
    value: Any = "end"
    for _ in range(length):
        value = (lambda inner: lambda: inner)(value)
    return value


async def test_max_depth_bounds_chains_of_lazy_values() -> None:
    [out] = await materialize(fragment("ok", _chain(10)))
    assert out.data == ["end"]
    with pytest.raises(FragmentLoadError, match="max_depth=10") as info:
        await materialize(fragment("deep", _chain(11)))
    assert info.value.path == "deep"
    [out] = await materialize(fragment("ok", _chain(3)), max_depth=3)
    with pytest.raises(FragmentLoadError, match="max_depth=3"):
        await materialize(fragment("ok", _chain(4)), max_depth=3)


async def test_max_items_bounds_generators_and_closes_them() -> None:
    closed = False

    def numbers(n: int) -> Iterator[int]:
        nonlocal closed
        try:
            yield from range(n)
        finally:
            closed = True

    [out] = await materialize(fragment("ok", numbers(10)), max_items=10)
    assert out.data == [list(range(10))]
    closed = False
    with pytest.raises(FragmentLoadError, match="max_items=10") as info:
        await materialize(fragment("many", numbers(11)), max_items=10)
    assert info.value.path == "many"
    assert closed

    async def forever() -> AsyncIterator[int]:
        i = 0
        while True:
            yield i
            i += 1

    with pytest.raises(FragmentLoadError, match="max_items=5"):
        await materialize(fragment("infinite", forever()), max_items=5)
    with pytest.raises(FragmentLoadError, match="max_items=2"):
        await materialize(fragment("set", {1, 2, 3}), max_items=2)


async def test_self_producing_and_self_containing_data_are_errors() -> None:
    def itself() -> Any:
        return itself

    with pytest.raises(FragmentLoadError, match="itself"):
        await materialize(fragment("loop", itself))
    loop: list[Any] = [lambda: 1]
    loop.append(loop)
    with pytest.raises(FragmentLoadError, match="itself"):
        await materialize(ContextFragment(name="cycle", data=loop))


def test_resolver_options_are_validated() -> None:
    for bad in ({"max_depth": 0}, {"max_items": -1}, {"max_depth": True}, {"max_depth": 1.5}):
        with pytest.raises(InvalidInputError):
            LazyResolver(**bad)  # type: ignore[arg-type]


def test_is_lazy_value() -> None:
    async def coro() -> None:
        return None

    pending = coro()
    lazy = [lambda: 1, pending, {1}, iter([1]), (i for i in []), types.MappingProxyType({})]
    plain = ["s", b"b", 1, 1.0, True, None, [1], {"a": 1}, (1,), hint("x")]
    try:
        assert all(is_lazy_value(v) for v in lazy)
        assert not any(is_lazy_value(v) for v in plain)
        assert has_lazy_value(fragment("x", {"a": [lambda: 1]}))
        assert not has_lazy_value(fragment("x", {"a": [1]}))
    finally:
        pending.close()


async def test_a_lazy_value_reaching_a_renderer_is_a_clear_error() -> None:
    with pytest.raises(InvalidInputError, match=r"resolve|materiali"):
        XmlRenderer().render([fragment("x", lambda: 1)])
