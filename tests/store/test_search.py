"""Full-text search: one meaning on SQLite (FTS5) and PostgreSQL (tsvector)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agentcontext import errors
from agentcontext.store import MessageRecord, SqlContextStore
from agentcontext.store._rows import text as _text
from agentcontext.store._rows import tokenizer as _tokenizer
from tests.helpers import msg_data, rec

HOSTILE = [
    '"',
    "'",
    '""',
    '"unterminated',
    "a AND",
    "OR",
    "NOT",
    "AND OR NOT",
    "*",
    "foo*",
    "*bar",
    "(",
    ")",
    "((a)",
    "a:b",
    "col:value",
    "messages_fts:x",
    "NEAR(a b)",
    "^a",
    "a + b",
    "-a",
    "a & b | !c",
    "a <-> b",
    "'; DROP TABLE messages; --",
    "%",
    "_",
    "\\",
    "{}",
    "[]",
    "\u00e9t\u00e9",
    "日本語",
    "🙂",
    "a\tb\nc",
    "   ",
    "",
    "a" * 2000,
]


async def _seed(store: SqlContextStore) -> None:
    await store.create_chat("c1", user_id="u1")
    await store.create_chat("c2", user_id="u1")
    await store.create_chat("c3", user_id="u2")
    main = await store.get_active_branch("c1")
    assert main is not None
    await store.append_messages(
        main.id,
        [
            rec("a1", "c1", None, "The quick brown fox jumps over the lazy dog", "user"),
            rec("a2", "c1", "a1", "Foxes are quick; a fox is a fox, fox fox.", "assistant"),
            rec("a3", "c1", "a2", "Nothing to see here", "user"),
        ],
        expected_head=None,
    )
    # A message on another branch of c1, and in other chats.
    await store.fork_branch(
        "c1",
        "main",
        head_message_id="a1",
        activate=False,
        messages=[rec("b1", "c1", "a1", "a branch about the fox and the hound", "assistant")],
    )
    await store.add_message(rec("x1", "c2", None, "fox in chat two", "user"))
    await store.add_message(rec("y1", "c3", None, "fox of another user", "user"))


@pytest.fixture
async def seeded(store: SqlContextStore) -> SqlContextStore:
    await _seed(store)
    return store


async def test_plain_words_all_must_match_across_branches(seeded: SqlContextStore) -> None:
    ids = {r.message.id for r in await seeded.search_messages("c1", "fox")}
    assert ids == {"a1", "a2", "b1"}
    assert {r.message.id for r in await seeded.search_messages("c1", "quick fox")} == {"a1", "a2"}
    assert await seeded.search_messages("c1", "fox unicorn") == []
    # Case-insensitive.
    assert {r.message.id for r in await seeded.search_messages("c1", "FOX LAZY")} == {"a1"}


async def test_rank_is_higher_for_better_matches(seeded: SqlContextStore) -> None:
    results = await seeded.search_messages("c1", "fox")
    assert results[0].message.id == "a2"  # five occurrences beats one
    ranks = [r.rank for r in results]
    assert ranks == sorted(ranks, reverse=True)
    assert all(r > 0 for r in ranks)


async def test_snippets_mark_hits(seeded: SqlContextStore) -> None:
    result = (await seeded.search_messages("c1", "lazy"))[0]
    assert "<mark>lazy</mark>" in result.snippet
    assert "dog" in result.snippet


async def test_roles_and_limit(seeded: SqlContextStore) -> None:
    assert {r.message.id for r in await seeded.search_messages("c1", "fox", roles=["user"])} == {
        "a1"
    }
    assert {
        r.message.id for r in await seeded.search_messages("c1", "fox", roles=["assistant"])
    } == {"a2", "b1"}
    assert await seeded.search_messages("c1", "fox", roles=[]) == []
    assert len(await seeded.search_messages("c1", "fox", limit=2)) == 2
    with pytest.raises(errors.InvalidInputError):
        await seeded.search_messages("c1", "fox", limit=0)
    with pytest.raises(errors.InvalidTypeError):
        await seeded.search_messages("c1", "fox", roles="user")  # type: ignore[arg-type]


async def test_user_wide_search_names_chats_and_respects_owners(seeded: SqlContextStore) -> None:
    hits = await seeded.search_user_messages("u1", "fox")
    assert {(r.chat_id, r.message.id) for r in hits} == {
        ("c1", "a1"),
        ("c1", "a2"),
        ("c1", "b1"),
        ("c2", "x1"),
    }
    assert [r.chat_id for r in await seeded.search_user_messages("u2", "fox")] == ["c3"]
    assert await seeded.search_user_messages("nobody", "fox") == []


async def test_search_in_unknown_chat_raises(seeded: SqlContextStore) -> None:
    with pytest.raises(errors.ChatNotFoundError):
        await seeded.search_messages("nope", "fox")


@pytest.mark.parametrize("query", HOSTILE)
async def test_hostile_plain_text_never_raises(seeded: SqlContextStore, query: str) -> None:
    results = await seeded.search_messages("c1", query)
    assert isinstance(results, list)
    assert all(r.message.chat_id == "c1" for r in results)


async def test_operators_are_plain_words(store: SqlContextStore) -> None:
    await store.create_chat("c", user_id="u")
    await store.add_messages(
        [
            MessageRecord(id="and", chat_id="c", name="user", data=msg_data("cats AND dogs")),
            MessageRecord(id="or", chat_id="c", name="user", data=msg_data("cats or birds")),
        ]
    )
    assert {r.message.id for r in await store.search_messages("c", "cats AND dogs")} == {"and"}
    assert {r.message.id for r in await store.search_messages("c", "or")} == {"or"}
    assert {r.message.id for r in await store.search_messages("c", '"cats"')} == {"and", "or"}
    assert {r.message.id for r in await store.search_messages("c", "cats*")} == {"and", "or"}


async def test_updates_and_deletes_keep_the_index_in_step(store: SqlContextStore) -> None:
    await store.create_chat("c", user_id="u")
    await store.add_message(rec("m", "c", None, "original wording"))
    await store.add_message(rec("m", "c", None, "replacement phrase"))
    assert await store.search_messages("c", "original") == []
    assert [r.message.id for r in await store.search_messages("c", "replacement")] == ["m"]
    await store.delete_chat("c")
    await store.create_chat("c", user_id="u")
    assert await store.search_messages("c", "replacement") == []


async def test_a_search_finds_its_scope_only(store: SqlContextStore) -> None:
    """Terms are scoped: the same word in another chat (of the same user, or of another) is
    not a candidate of this chat's search, nor of another user's."""
    for chat, user in (("a", "u1"), ("b", "u1"), ("c", "u2")):
        await store.create_chat(chat, user_id=user)
        await store.add_message(rec(f"{chat}-m", chat, None, "zebracorn grazing"))
    for chat in ("a", "b", "c"):
        assert [r.message.id for r in await store.search_messages(chat, "zebracorn")] == [
            f"{chat}-m"
        ]
    found = await store.search_user_messages("u1", "zebracorn")
    assert sorted(r.message.id for r in found) == ["a-m", "b-m"]
    assert [r.message.id for r in await store.search_user_messages("u2", "grazing")] == ["c-m"]


async def test_terms_follow_a_chat_created_again_for_another_user(store: SqlContextStore) -> None:
    """A save computes its user-scope terms for the owner it knows of the chat; when the chat
    was deleted and created again for another user meanwhile (by another process: the store
    still holds the old owner), the write is refused and made again for the new owner."""
    from agentcontext import ContextEngine, user

    first = ContextEngine(store=store, chat_id="c", user_id="old")
    first.set(user("zebracorn one", id="m1"))
    await first.save()
    assert await store.delete_chat("c")
    await store.create_chat("c", user_id="new")
    store._memory.owners.note("c", "old")  # what another process's deletion leaves behind
    branch = await store.get_active_branch("c")
    assert branch is not None
    done = await store.append_turn(
        branch.id, [rec("m2", "c", None, "zebracorn two")], expected_head=None
    )
    assert done.ok
    assert [r.message.id for r in await store.search_user_messages("new", "zebracorn")] == ["m2"]
    assert await store.search_user_messages("old", "zebracorn") == []
    assert store._memory.owners.get("c") is None or store._memory.owners.get("c") == "new"


@pytest.fixture
def sync_store(store_url: str) -> Iterator[tuple[asyncio.Runner, SqlContextStore]]:
    runner = asyncio.Runner()
    store = SqlContextStore(store_url)
    runner.run(_seed(store))
    yield runner, store
    runner.run(store.close())
    runner.close()


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(query=st.text(min_size=0, max_size=60))
def test_any_text_is_a_safe_query(
    sync_store: tuple[asyncio.Runner, SqlContextStore], query: str
) -> None:
    runner, store = sync_store
    if "\x00" in query or any(0xD800 <= ord(ch) <= 0xDFFF for ch in query):
        with pytest.raises(errors.InvalidInputError):
            runner.run(store.search_messages("c1", query))
        return
    results = runner.run(store.search_messages("c1", query))
    assert all(r.message.chat_id == "c1" and r.rank > 0 for r in results)
    assert [r.rank for r in results] == sorted((r.rank for r in results), reverse=True)


# --- the indexed prefix -------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    words=st.lists(st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=9)),
    repeat=st.integers(1, 20_000),
)
@example(words=["é" * 7], repeat=20_000)
@example(words=["ab"], repeat=100_000)
def test_the_index_holds_a_bounded_prefix_never_cut_inside_a_word(
    words: list[str], repeat: int
) -> None:
    text = " ".join(words) * repeat
    data = {"id": "m", "role": "user", "parts": [{"type": "text", "text": text}]}
    indexed = _text.indexed_text(data)
    assert text.startswith(indexed)
    assert len(indexed.encode("utf-8")) <= _text.INDEXED_BYTES
    if len(text.encode("utf-8")) <= _text.INDEXED_BYTES:
        assert indexed == text
    elif indexed and text[len(indexed)].isalnum():
        assert not indexed[-1].isalnum()  # a word going on after the cut is left out
    # Its tokens are a prefix of the whole text's tokens (but for one word cut off at the end).
    whole, prefix = _tokenizer.tokens(text), _tokenizer.tokens(indexed)
    assert whole[: len(prefix)] == prefix
