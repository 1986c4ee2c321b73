"""A chain left in the store's memory shares the engine's lists until the engine changes
them: the copy never changes afterwards, and two caches restored from one copy change apart."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from agentcontext import Message, TextPart
from agentcontext._conversation import ChainCache, ChainCopy

KEY = ("c1", 1)
WHEN = datetime(2026, 1, 1, tzinfo=UTC)


def message(message_id: str, text: str = "hello") -> Message:
    return Message(id=message_id, role="user", parts=[TextPart(text=text)])


def loaded(count: int) -> ChainCache:
    cache = ChainCache()
    ids = [f"m{i}" for i in range(count)]
    parents: list[str | None] = [None, *ids[:-1]][:count]
    cache.reset(ids[-1] if ids else None, 1, ids, parents, [message(i) for i in ids])
    return cache


def snapshot(held: ChainCopy) -> tuple[object, ...]:
    return (
        list(held.ids),
        list(held.parents),
        list(held.messages),
        dict(held.index),
        list(held.times),
    )


def chain_of(cache: ChainCache) -> list[str]:
    assert cache.index == {message_id: i for i, message_id in enumerate(cache.ids)}
    assert len(cache.ids) == len(cache.parents) == len(cache.messages) == len(cache.times)
    return list(cache.ids)


def test_a_copy_shares_the_lists_until_the_cache_changes_them() -> None:
    cache = loaded(3)
    held = cache.copy(KEY)
    assert held.ids is cache.ids and held.index is cache.index  # nothing copied yet
    before = snapshot(held)
    cache.append("m3", "m2", message("m3"), WHEN)
    assert held.ids is not cache.ids  # copied before the change
    assert snapshot(held) == before
    assert chain_of(cache) == ["m0", "m1", "m2", "m3"]
    # Once its own, the cache changes its lists in place again.
    own = cache.ids
    cache.append("m4", "m3", message("m4"), WHEN)
    assert cache.ids is own


STEPS = st.lists(
    st.tuples(st.sampled_from(["append", "replace", "truncate", "copy"]), st.integers(0, 50)),
    max_size=12,
)


@given(first=STEPS, second=STEPS, size=st.integers(0, 6))
def test_every_copy_keeps_the_chain_it_was_made_of(
    first: list[tuple[str, int]], second: list[tuple[str, int]], size: int
) -> None:
    """Two caches restored from one copy, each changing its chain (appends, in-place
    updates, rewinds, more copies): every copy made on the way still holds what its cache
    held then, and each cache holds what its own steps made of the chain."""
    origin = loaded(size)
    base = origin.copy(KEY)
    copies: list[tuple[ChainCopy, tuple[object, ...]]] = [(base, snapshot(base))]
    caches = [ChainCache(), ChainCache()]
    expected: list[list[str]] = []
    for cache, steps, name in zip(caches, (first, second), "ab", strict=True):
        cache.restore(base)
        model = list(base.ids)
        for step, (op, n) in enumerate(steps):
            if op == "append":
                new = f"{name}{step}"
                cache.append(new, cache.head, message(new), WHEN)
                model.append(new)
            elif op == "replace" and model:
                target = model[n % len(model)]
                cache.replace(message(target, f"edited {name}{step}"))
            elif op == "truncate" and model:
                keep = n % (len(model) + 1)
                assert cache.truncate(model[keep - 1] if keep else None, reattach=False)
                model = model[:keep]
            elif op == "copy" and cache.version is not None:
                held = cache.copy(KEY)
                copies.append((held, snapshot(held)))
            assert chain_of(cache) == model
        expected.append(model)
    for held, seen in copies:
        assert snapshot(held) == seen
    assert [chain_of(cache) for cache in caches] == expected
    assert chain_of(origin) == list(base.ids)
