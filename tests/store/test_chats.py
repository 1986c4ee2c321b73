"""Chats: create, upsert, get, update, list, delete — on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import base64
from datetime import UTC

import pytest

from agentcontext import errors
from agentcontext.store import ChatUpdate, SqlContextStore
from tests.helpers import chain


async def test_create_chat_has_aware_timestamps_and_an_active_main_branch(
    store: SqlContextStore,
) -> None:
    chat = await store.create_chat("c1", user_id="u1", title="T", metadata={"k": "v"})
    assert (chat.id, chat.user_id, chat.title, chat.metadata) == ("c1", "u1", "T", {"k": "v"})
    stored = await store.get_chat("c1")
    assert stored == chat
    assert stored.created_at.tzinfo is not None
    assert stored.created_at.utcoffset() == UTC.utcoffset(None)
    branches = await store.list_branches("c1")
    assert [(b.name, b.is_active, b.head_message_id) for b in branches] == [("main", True, None)]


async def test_create_chat_twice_raises_and_keeps_the_first(store: SqlContextStore) -> None:
    await store.create_chat("c1", user_id="u1", title="first")
    with pytest.raises(errors.ChatExistsError, match="upsert_chat"):
        await store.create_chat("c1", user_id="u2", title="second")
    chat = await store.get_chat("c1")
    assert chat is not None and (chat.user_id, chat.title) == ("u1", "first")
    assert len(await store.list_branches("c1")) == 1


async def test_upsert_chat_returns_the_existing_chat_unchanged(store: SqlContextStore) -> None:
    created = await store.upsert_chat("c1", user_id="u1", title="a", metadata={"x": 1})
    again = await store.upsert_chat("c1", user_id="u2", title="b", metadata={"x": 2})
    assert again == created
    assert again.user_id == "u1"


async def test_concurrent_upserts_create_one_chat(store: SqlContextStore) -> None:
    chats = await asyncio.gather(*(store.upsert_chat("c1", user_id="u1") for _ in range(10)))
    assert len({c.created_at for c in chats}) == 1
    assert len(await store.list_branches("c1")) == 1


async def test_get_unknown_chat_is_none(store: SqlContextStore) -> None:
    assert await store.get_chat("nope") is None


async def test_update_chat_applies_only_given_fields(store: SqlContextStore) -> None:
    chat = await store.create_chat("c1", user_id="u1", title="T", metadata={"a": 1})
    updated = await store.update_chat("c1", lambda c: ChatUpdate(metadata={**c.metadata, "b": 2}))
    assert updated.title == "T"
    assert updated.metadata == {"a": 1, "b": 2}
    assert updated.updated_at > chat.updated_at
    cleared = await store.update_chat("c1", lambda c: ChatUpdate(title=None))
    assert cleared.title is None and cleared.metadata == {"a": 1, "b": 2}
    same = await store.update_chat("c1", lambda c: None)
    assert same == cleared


async def test_update_chat_is_atomic_under_concurrency(store: SqlContextStore) -> None:
    await store.create_chat("c1", user_id="u1", metadata={"n": 0})

    def bump(chat):  # type: ignore[no-untyped-def]
        return ChatUpdate(metadata={"n": chat.metadata["n"] + 1})

    await asyncio.gather(*(store.update_chat("c1", bump) for _ in range(25)))
    chat = await store.get_chat("c1")
    assert chat is not None and chat.metadata == {"n": 25}


async def test_update_chat_errors(store: SqlContextStore) -> None:
    with pytest.raises(errors.ChatNotFoundError):
        await store.update_chat("nope", lambda c: None)
    await store.create_chat("c1", user_id="u1", metadata={"a": 1})
    with pytest.raises(errors.InvalidTypeError):
        await store.update_chat("c1", lambda c: {"title": "x"})  # type: ignore[arg-type,return-value]
    with pytest.raises(errors.SerializationError):
        await store.update_chat("c1", lambda c: ChatUpdate(metadata={"x": float("nan")}))
    chat = await store.get_chat("c1")
    assert chat is not None and chat.metadata == {"a": 1}


async def test_list_chats_filters_by_user_and_orders_by_activity(store: SqlContextStore) -> None:
    for name in ("a", "b", "c"):
        await store.create_chat(name, user_id="u1")
    await store.create_chat("other", user_id="u2")
    assert [c.id for c in await store.list_chats(user_id="u1")] == ["c", "b", "a"]
    # A save is activity: "a" moves to the front.
    branch = await store.get_active_branch("a")
    assert branch is not None
    result = await store.append_messages(branch.id, chain("a", 2), expected_head=None)
    assert result.ok
    listed = await store.list_chats(user_id="u1")
    assert [c.id for c in listed] == ["a", "c", "b"]
    assert (listed[0].message_count, listed[0].branch_count) == (2, 1)
    assert {c.id for c in await store.list_chats()} == {"a", "b", "c", "other"}


async def test_list_chats_ties_break_deterministically(store: SqlContextStore) -> None:
    for name in ("x1", "x2", "x3"):
        await store.create_chat(name, user_id="u1")
    # Force identical activity times.
    chat = await store.get_chat("x1")
    assert chat is not None
    from sqlalchemy import update

    from agentcontext.store._db.schema import chats

    async with store.engine.begin() as conn:
        await conn.execute(update(chats).values(updated_at=chat.updated_at))
    first = [c.id for c in await store.list_chats(user_id="u1")]
    assert first == ["x3", "x2", "x1"]
    assert first == [c.id for c in await store.list_chats(user_id="u1")]


async def test_list_chats_pages_cover_everything_once(store: SqlContextStore) -> None:
    for i in range(23):
        await store.create_chat(f"c{i:02d}", user_id="u1")
    pages = []
    for offset in range(0, 30, 5):
        pages.extend(c.id for c in await store.list_chats(user_id="u1", limit=5, offset=offset))
    assert sorted(pages) == sorted(f"c{i:02d}" for i in range(23))
    assert len(pages) == 23
    assert await store.list_chats(user_id="u1", limit=0) == []


async def test_a_cursor_pages_through_once_while_chats_gain_activity(
    store: SqlContextStore,
) -> None:
    """Paging with ``after=`` (the cursor of the last chat listed) lists every chat that does
    not move exactly once, whatever others gain activity meanwhile (they go to the top, which
    the pages already left); ties of activity time are broken by id."""
    from sqlalchemy import update

    from agentcontext.store._db.schema import chats

    for i in range(23):
        await store.create_chat(f"c{i:02d}", user_id="u1")
    async with store.engine.begin() as conn:  # some share one activity time
        first = await store.get_chat("c00")
        assert first is not None
        await conn.execute(
            update(chats)
            .where(chats.c.id.in_(["c03", "c04", "c05"]))
            .values(updated_at=first.updated_at)
        )
    seen: list[str] = []
    after = None
    moved = []
    while True:
        page = await store.list_chats(user_id="u1", limit=4, after=after)
        if not page:
            break
        seen.extend(chat.id for chat in page)
        after = page[-1].cursor
        # A chat not listed yet gains activity: it moves to the top, out of the later pages.
        later = [f"c{i:02d}" for i in range(23) if f"c{i:02d}" not in seen]
        if later:
            await store.update_chat(later[0], lambda chat: ChatUpdate())
            moved.append(later[0])
    assert len(seen) == len(set(seen))  # nothing listed twice
    assert set(seen) | set(moved) == {f"c{i:02d}" for i in range(23)}
    assert not set(seen) & set(moved)  # the moved ones went to the top, above the pages left


async def test_bad_cursors_are_refused(store: SqlContextStore) -> None:
    await store.create_chat("a", user_id="u")
    with pytest.raises(errors.InvalidInputError, match="cursor"):
        await store.list_chats(after="not a cursor")
    with pytest.raises(errors.InvalidTypeError):
        await store.list_chats(after=42)  # type: ignore[arg-type]
    cursor = (await store.list_chats())[0].cursor
    assert await store.list_chats(after=cursor) == []


@pytest.mark.parametrize(
    "raw",
    [
        "0001-01-01T00:00:00+14:00\nx",  # before year 1 once in UTC
        "9999-12-31T23:00:00-14:00\nx",  # after year 9999 once in UTC
        "2020-01-01T00:00:00+00:00\nx\x00y",  # ids hold no NUL
        "2020-01-01T00:00:00+00:00\n" + "x" * 256,  # nor more than 255 characters
    ],
)
async def test_a_cursor_no_listed_chat_has_is_refused_alike_everywhere(
    store: SqlContextStore, raw: str
) -> None:
    """A crafted cursor whose time or chat id no chat can have is the same
    `InvalidInputError` as any malformed cursor, on every backend (never an OverflowError
    or a driver error)."""
    await store.create_chat("a", user_id="u")
    crafted = base64.urlsafe_b64encode(raw.encode()).decode()
    with pytest.raises(errors.InvalidInputError, match="is not a cursor of list_chats"):
        await store.list_chats(after=crafted)
    with pytest.raises(errors.InvalidInputError, match="is not a cursor of list_chats"):
        await store.list_chats(user_id="u", after=crafted)


async def test_a_chat_that_gains_activity_moves_ahead_of_the_cursor(
    store: SqlContextStore,
) -> None:
    """What `ChatInfo.cursor` promises: no chat is listed twice, a chat that gained no
    activity is never skipped, and one that did moves ahead of the cursor, where a new
    listing from the start finds it."""
    for i in range(6):
        await store.create_chat(f"c{i}", user_id="u")  # c5 newest
    first = await store.list_chats(user_id="u", limit=3)
    assert [c.id for c in first] == ["c5", "c4", "c3"]
    await store.update_chat("c4", lambda chat: ChatUpdate())  # listed already
    await store.update_chat("c1", lambda chat: ChatUpdate())  # not listed yet
    rest = await store.list_chats(user_id="u", after=first[-1].cursor)
    assert [c.id for c in rest] == ["c2", "c0"]  # c4 not again, c1 moved ahead
    assert {c.id for c in await store.list_chats(user_id="u", limit=2)} == {"c1", "c4"}


async def test_chat_metadata_reads_back_as_written_on_every_backend(
    store: SqlContextStore,
) -> None:
    # PostgreSQL's jsonb wrote numbers back in its own form: 1e308 came back as a 309-digit
    # int and -0.0 as 0.0, and the chat's export differed from SQLite's and MariaDB's.
    import math

    written = {"e": 1e308, "x": 1.5e300, "neg": -0.0, "small": 1e-300, "n": 12, "s": "1e308"}
    await store.create_chat("floats", user_id="u", metadata=written)
    found = (await store.get_chat("floats")).metadata  # type: ignore[union-attr]
    assert found == written
    assert {key: type(value) for key, value in found.items()} == {
        key: type(value) for key, value in written.items()
    }
    assert math.copysign(1.0, found["neg"]) == -1.0
    exported = (await store.export_chat("floats")).model_dump(mode="json")
    assert exported["chat"]["metadata"]["e"] == 1e308
    listed = await store.list_chats(metadata={"n": 12})
    assert [chat.id for chat in listed] == ["floats"]


async def test_list_chats_metadata_filter_is_exact_and_typed(store: SqlContextStore) -> None:
    await store.create_chat("s", user_id="u", metadata={"k": "1", "team": "red"})
    await store.create_chat("i", user_id="u", metadata={"k": 1, "team": "red"})
    await store.create_chat("b", user_id="u", metadata={"k": True, "team": "blue"})
    await store.create_chat("n", user_id="u", metadata={"nested": {"k": 1}})
    ids = lambda chats: sorted(c.id for c in chats)
    assert ids(await store.list_chats(metadata={"k": "1"})) == ["s"]
    assert ids(await store.list_chats(metadata={"k": 1})) == ["i"]
    assert ids(await store.list_chats(metadata={"k": True})) == ["b"]
    assert ids(await store.list_chats(metadata={"team": "red"})) == ["i", "s"]
    assert ids(await store.list_chats(metadata={"team": "red", "k": 1})) == ["i"]
    assert ids(await store.list_chats(metadata={})) == ["b", "i", "n", "s"]


@pytest.mark.parametrize(
    "key", ["a'b", 'a"b', "$.k", "k') OR 1=1 --", "'; DROP TABLE chats; --", "ключ", "a.b", "%_"]
)
async def test_list_chats_metadata_keys_are_bound_not_spliced(
    store: SqlContextStore, key: str
) -> None:
    await store.create_chat("hit", user_id="u", metadata={key: "v"})
    await store.create_chat("miss", user_id="u", metadata={"k": "v"})
    assert [c.id for c in await store.list_chats(metadata={key: "v"})] == ["hit"]
    assert len(await store.list_chats()) == 2


async def test_list_chats_rejects_bad_filters(store: SqlContextStore) -> None:
    with pytest.raises(errors.InvalidInputError, match="str, int or bool"):
        await store.list_chats(metadata={"k": 1.5})  # type: ignore[dict-item]
    with pytest.raises(errors.InvalidInputError):
        await store.list_chats(metadata={"k": None})  # type: ignore[dict-item]
    with pytest.raises(errors.InvalidInputError):
        await store.list_chats(limit=-1)
    with pytest.raises(errors.InvalidTypeError):
        await store.list_chats(offset="1")  # type: ignore[arg-type]


async def test_delete_chat_removes_everything(store: SqlContextStore) -> None:
    await store.create_chat("c1", user_id="u1")
    await store.create_chat("keep", user_id="u1")
    branch = await store.get_active_branch("c1")
    assert branch is not None
    await store.append_messages(branch.id, chain("c1", 4), expected_head=None)
    await store.create_checkpoint("c1", "cp", "m1")
    await store.fork_branch("c1", "main", head_message_id="m1", activate=False)
    keep = await store.get_active_branch("keep")
    assert keep is not None
    await store.append_messages(keep.id, chain("keep", 2, prefix="k"), expected_head=None)

    assert await store.delete_chat("c1") is True
    assert await store.get_chat("c1") is None
    assert await store.get_message("m0") is None
    assert await store.get_branch("c1", "main") is None
    assert await store.search_user_messages("u1", "message") != []
    assert all(r.chat_id == "keep" for r in await store.search_user_messages("u1", "message"))
    assert await store.delete_chat("c1") is False
    # The index entries are gone too: none under the deleted chat's terms, the kept chat's two
    # under the user's.
    if store.dialect_name == "sqlite":
        from sqlalchemy import text

        from agentcontext.store._dialects.sqlite import SqliteDialect
        from agentcontext.store._rows.terms import query_terms

        match = text("SELECT count(*) FROM messages_fts WHERE messages_fts MATCH :q")
        counts = {}
        async with store.engine.connect() as conn:
            for kind, scope in (("user", "u1"), ("chat", "c1"), ("chat", "keep")):
                q = SqliteDialect().search_params(*query_terms(["message"], kind, scope))
                counts[scope] = await conn.scalar(match, {"q": q["search_query"]})
        assert counts == {"u1": 2, "c1": 0, "keep": 2}


async def test_delete_chat_honours_the_user_guard(store: SqlContextStore) -> None:
    await store.create_chat("c1", user_id="Alice")
    assert await store.delete_chat("c1", user_id="alice") is False
    assert await store.delete_chat("c1", user_id="bob") is False
    assert await store.get_chat("c1") is not None
    assert await store.delete_chat("c1", user_id="Alice") is True
    assert await store.delete_chat("unknown", user_id="Alice") is False


async def test_message_counts_follow_every_write_path(store: SqlContextStore) -> None:
    from tests.helpers import rec

    await store.create_chat("c", user_id="u")
    main = await store.get_active_branch("c")
    assert main is not None

    async def count() -> int:
        (info,) = await store.list_chats(user_id="u")
        return info.message_count

    assert await count() == 0
    await store.append_messages(main.id, chain("c", 3), expected_head=None)  # fast path
    assert await count() == 3
    stale = await store.append_messages(main.id, [rec("x", "c", "m1")], expected_head="m1")
    assert not stale.ok
    assert await count() == 3  # a lost compare-and-swap counts nothing
    await store.add_messages([rec("m2", "c", "m1", "edited"), rec("n", "c", "m2")])  # one update
    assert await count() == 4
    await store.fork_branch(
        "c", "main", head_message_id="m0", activate=False, messages=[rec("f", "c", "m0")]
    )
    assert await count() == 5
    await store.append_messages(  # the general path: an in-place update allowed
        main.id,
        [rec("m2", "c", "m1", "again"), rec("z", "c", "m2")],
        expected_head="m2",
        updates=["m2"],
    )
    assert await count() == 6
    with pytest.raises(errors.MessageNotFoundError):
        await store.append_messages(main.id, [rec("q", "c", "ghost")], expected_head="z")
    assert await count() == 6
    exported = await store.export_chat("c")
    await store.delete_chat("c")
    await store.import_chat(exported)
    assert await count() == 6
