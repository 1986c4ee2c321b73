"""Encryption at rest (DESIGN §2.12), on every backend.

Users' text (message contents, chat titles and metadata) is stored sealed under a data key per
user that a `KeyProvider` holds outside the database: a string planted through every writer is
absent from the raw database (the SQLite file and its WAL, ``pg_dump``, ``mariadb-dump``) while
search still finds it; a value moved to another row does not open; erasure destroys the key, so
a copy taken before cannot be read; missing and wrong keys are `EncryptionError`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib.util
import os
import random
import secrets
import shutil
import subprocess
import uuid
import weakref
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import make_url, text
from sqlalchemy.ext.asyncio import create_async_engine

from agentcontext import (
    ChatNotFoundError,
    ContextEngine,
    CorruptDataError,
    EncryptionError,
    InvalidInputError,
    InvalidTypeError,
    LocalKeyProvider,
    MissingExtraError,
    assistant_text,
    user,
)
from agentcontext._keyring import KEYS
from agentcontext._validate import dumps
from agentcontext.messages import Message
from agentcontext.snapshots import ContextSnapshot
from agentcontext.store import ChatUpdate, MessageRecord, SearchResult, SqlContextStore
from agentcontext.store._rows.sealing import KeyNotHeld
from tests.conftest import fresh_database, pg_admin_url, require_backend
from tests.helpers import chain, run_in_threads

PLANT = "qzvplanted" + secrets.token_hex(4)
SEARCH_EXAMPLES = int(os.environ.get("AGENTCONTEXT_PARITY_EXAMPLES", "60")) // 4


@pytest.fixture
async def provider(tmp_path: Path) -> AsyncIterator[LocalKeyProvider]:
    async with LocalKeyProvider(secrets.token_bytes(32), tmp_path / "keyring.db") as found:
        yield found


def raw_bytes(backend: str, url: str, tmp_path: Path) -> bytes:
    """Everything the database holds, as a reader of its files or dumps sees it."""
    parsed = make_url(url)
    if backend == "sqlite":
        database = Path(str(parsed.database))
        return b"".join(p.read_bytes() for p in database.parent.glob(database.name + "*"))
    if backend in ("postgres", "pgbouncer"):
        command = [
            "pg_dump", "-h", parsed.host or "127.0.0.1", "-p", "5432",
            "-U", parsed.username or "postgres", "--data-only", str(parsed.database),
        ]  # fmt: skip
    else:
        command = [
            "mariadb-dump", "-h", parsed.host or "127.0.0.1", "-P", str(parsed.port or 3306),
            "-u", parsed.username or "root", "--skip-extended-insert", "--hex-blob",
            str(parsed.database),
        ]  # fmt: skip
        if parsed.password:
            command.insert(-1, f"-p{parsed.password}")
    found = subprocess.run(command, capture_output=True, check=True, timeout=120)
    assert len(found.stdout) > 1000  # a dump, not an empty answer
    return found.stdout


async def summarize(messages: list[Message]) -> str:
    return f"summary {PLANT} of {len(messages)} messages"


async def test_a_planted_string_is_nowhere_in_the_raw_database_and_search_finds_it(
    backend: str, store_url: str, tmp_path: Path, provider: LocalKeyProvider
) -> None:
    async with SqlContextStore(store_url, encryption=provider) as store:
        # Every writer of users' text: chats (create, upsert, update), a save, a streaming
        # turn, an in-place update, a compaction, a context snapshot, a resolve record, a blob,
        # an import and a copy.
        await store.create_chat("c1", user_id="u1", title=f"t {PLANT}", metadata={"k": PLANT})
        await store.upsert_chat("c2", user_id="u1", title=f"t2 {PLANT}", metadata={"k": PLANT})
        await store.update_chat("c2", lambda chat: ChatUpdate(title=f"t3 {PLANT}"))
        engine = ContextEngine(store=store, chat_id="c1", user_id="u1")
        for turn in range(4):
            engine.set(user(f"question {turn} {PLANT}"), assistant_text(f"answer {PLANT}"))
            await engine.save()
        await engine.begin_turn(user(f"streamed {PLANT}"))
        await engine.complete_turn(assistant_text(f"streamed answer {PLANT}"))
        head = await engine.head_message()
        assert head is not None
        engine.set(assistant_text(f"edited {PLANT}", id=head.id))
        await engine.save(branch=False)
        await engine.compact(summarize, keep_last_turns=1)
        await engine.update_chat(title=f"renamed {PLANT}")
        draft = ContextSnapshot(summary=f"saw {PLANT}")
        draft.add_file(f"src/{PLANT}.py", f"def f(): return '{PLANT}'\n".encode())
        draft.add_snippet(f"note {PLANT}", f"a note on {PLANT}")
        stored = await engine.snapshot(draft)
        recorded = await engine.resolve(record=True)
        assert recorded.record_id is not None
        blob = await store.put_blob(f"loose {PLANT}".encode(), chat_id="c1")
        export = await store.export_chat("c1")
        await store.delete_chat("c1")
        await store.import_chat(export)
        await store.copy_chat("c1", "c3")

        hits = await store.search_messages("c1", PLANT)
        assert hits and all(PLANT in hit.snippet for hit in hits)
        assert len(await store.search_user_messages("u1", PLANT, limit=100)) > len(hits)
        chats = {chat.id: chat for chat in await store.list_chats(user_id="u1")}
        assert chats["c2"].title == f"t3 {PLANT}" and chats["c2"].metadata == {"k": PLANT}
        assert chats["c1"].title == f"renamed {PLANT}"
        fresh = ContextEngine(store=store, chat_id="c3", user_id="u1")
        texts = [m.model_dump_json() for m in (await fresh.resolve()).messages]
        assert any(f"edited {PLANT}" in t for t in texts)
        # What was sealed reads back as it was written (the snapshot came through the import).
        assert stored.id is not None
        again = await store.get_snapshot(stored.id, with_content=True)
        assert again is not None and again.summary == f"saw {PLANT}"
        assert [item.path for item in again.items] == [item.path for item in draft.items]
        assert [item.blob for item in again.items] == [item.blob for item in draft.items]
        assert again.contents == draft.contents
        listed = await store.list_snapshots("c1")
        assert [item.preview for item in listed[0].items] == [i.preview for i in draft.items]
        assert await store.read_blob(blob, chat_id="c1") == f"loose {PLANT}".encode()
        with pytest.raises(InvalidInputError, match="chat_id"):
            await store.read_blob(blob)
        with pytest.raises(InvalidInputError, match="chat_id"):
            await store.put_blob(b"no chat")
    await provider.aclose()
    raw = raw_bytes(backend, store_url, tmp_path)
    assert PLANT.encode() not in raw
    assert PLANT.encode().hex().encode() not in raw.lower()  # not as hex either
    assert b"acenc1." in raw  # what is there instead
    for item in draft.items:  # blobs are kept at addresses that are not their SHA-256
        assert item.blob is not None and item.blob.encode() not in raw


@pytest.fixture
def search_pairs(
    backend: str, store_url: str, tmp_path: Path
) -> Iterator[tuple[asyncio.Runner, SqlContextStore, SqlContextStore]]:
    """A plain store and an encrypted one on the same database, in one event loop."""
    runner = asyncio.Runner()
    provider = LocalKeyProvider(secrets.token_bytes(32), tmp_path / "pairs-keyring.db")
    plain = SqlContextStore(store_url)
    sealed = SqlContextStore(store_url, encryption=provider)
    yield runner, plain, sealed
    for closing in (plain.close(), sealed.close(), provider.aclose()):
        runner.run(closing)
    runner.close()


async def _fill(store: SqlContextStore, chat: str, owner: str, texts: list[str]) -> None:
    await store.create_chat(chat, user_id=owner)
    records, parent = [], None
    for i, body in enumerate(texts):
        message_id = f"{chat}-{i}"
        role = "user" if i % 2 == 0 else "assistant"
        data = {"id": message_id, "role": role, "parts": [{"type": "text", "text": body}]}
        records.append(
            MessageRecord(id=message_id, chat_id=chat, parent_id=parent, name=role, data=data)
        )
        parent = message_id
    await store.add_messages(records)


def _hits(results: list[SearchResult], chat: str) -> list[tuple[str, float, str]]:
    return [(r.message.id.removeprefix(chat), r.rank, r.snippet) for r in results]


WORDS = ["alpha", "beta", "Gamma", "émigré", "日本語", "x1.5", "a@b.io", "/usr/bin", "🦊", "NEAR"]
sentence = st.lists(st.sampled_from(WORDS), min_size=1, max_size=10).map(" ".join)
query = st.one_of(
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(" ".join),
    st.text(min_size=1, max_size=12).filter(
        lambda t: "\x00" not in t and not any(0xD800 <= ord(c) <= 0xDFFF for c in t)
    ),
)


@settings(
    max_examples=SEARCH_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    texts=st.lists(sentence, min_size=1, max_size=12),
    queries=st.lists(query, min_size=1, max_size=3),
)
def test_encrypted_search_equals_plain_search(
    search_pairs: tuple[asyncio.Runner, SqlContextStore, SqlContextStore],
    texts: list[str],
    queries: list[str],
) -> None:
    runner, plain, sealed = search_pairs
    name = uuid.uuid4().hex[:10]
    pairs = [(plain, f"p{name}", f"up{name}"), (sealed, f"s{name}", f"us{name}")]
    for store, chat, owner in pairs:
        runner.run(_fill(store, chat, owner, texts))
    for searched in queries:
        found = [
            _hits(runner.run(store.search_messages(chat, searched, limit=20)), chat)
            for store, chat, _ in pairs
        ]
        assert found[1] == found[0], f"query {searched!r}: encrypted search differs from plain"
        user_wide = [
            _hits(runner.run(store.search_user_messages(owner, searched, limit=20)), chat)
            for store, chat, owner in pairs
        ]
        assert user_wide[1] == user_wide[0]


async def write_behind(backend: str, store_url: str, statement: str, **values: Any) -> None:
    """Run ``statement`` on the database behind the store's back (a writer outside it)."""
    direct = make_url(store_url)
    if backend == "pgbouncer":  # past the pooler, straight to the server
        direct = direct.set(port=5432).difference_update_query(["pgbouncer"])
    engine = create_async_engine(direct)
    try:
        async with engine.begin() as conn:
            await conn.execute(text(statement), values)
    finally:
        await engine.dispose()


async def copy_value(
    backend: str, store_url: str, table: str, column: str, source: str, target: str
) -> None:
    """Copy a column's value from one row to another as the database holds it, behind the
    store's back (a derived table: MySQL will not read the table it updates)."""
    await write_behind(
        backend,
        store_url,
        f"UPDATE {table} SET {column} = (SELECT {column} FROM (SELECT {column} "
        f"FROM {table} WHERE id = :source) AS t) WHERE id = :target",
        source=source,
        target=target,
    )


async def test_a_value_moved_to_another_row_does_not_open(
    backend: str, store_url: str, provider: LocalKeyProvider
) -> None:
    async with SqlContextStore(store_url, encryption=provider) as store:
        for chat in ("a", "b"):
            await store.create_chat(chat, user_id="u1", title=f"title of {chat}")
            engine = ContextEngine(store=store, chat_id=chat, user_id="u1")
            engine.set(user(f"text of {chat}", id=f"m-{chat}"))
            await engine.save()
    await copy_value(backend, store_url, "messages", "data", "m-a", "m-b")
    await copy_value(backend, store_url, "chats", "title", "a", "b")
    async with SqlContextStore(store_url, encryption=provider) as store:
        with pytest.raises(CorruptDataError) as caught:
            await store.get_messages("b")
        assert caught.value.row_id == "m-b" and "m-b" in str(caught.value)
        assert [r.data["parts"][0]["text"] for r in await store.get_messages("a")] == ["text of a"]
        with pytest.raises(CorruptDataError, match="'b'"):
            await store.get_chat("b")
        infos = {info.id: info for info in await store.list_chats()}
        assert infos["b"].damaged is not None and infos["b"].title is None
        assert infos["a"].title == "title of a"


async def test_a_value_replaced_by_text_in_the_clear_is_corrupt_not_the_users_text(
    backend: str, store_url: str, provider: LocalKeyProvider
) -> None:
    # A database an encrypted store made holds no value in the clear: one found there was
    # written behind the store's back, and is never shown as what the user wrote.
    async with SqlContextStore(store_url, encryption=provider) as store:
        await store.create_chat("c1", user_id="u1", title="sealed title")
        engine = ContextEngine(store=store, chat_id="c1", user_id="u1")
        engine.set(user("sealed text", id="m1"))
        await engine.save()
        forged = dumps({"id": "m1", "role": "user", "parts": [{"type": "text", "text": "FORGED"}]})
        cast = "CAST(:data AS json)" if backend in ("postgres", "pgbouncer") else ":data"
        await write_behind(
            backend, store_url, f"UPDATE messages SET data = {cast} WHERE id = 'm1'", data=forged
        )
        await write_behind(backend, store_url, "UPDATE chats SET title = 'FORGED' WHERE id = 'c1'")
    async with SqlContextStore(store_url, encryption=provider) as store:
        with pytest.raises(CorruptDataError, match="in the clear") as caught:
            await store.get_messages("c1")
        assert caught.value.row_id == "m1"
        with pytest.raises(CorruptDataError, match="in the clear"):
            await ContextEngine(store=store, chat_id="c1", user_id="u1").resolve()
        with pytest.raises(CorruptDataError, match="in the clear"):
            await store.get_chat("c1")
        [listed] = await store.list_chats()
        assert listed.title is None and listed.damaged is not None


async def test_once_migrate_encrypt_has_finished_a_value_in_the_clear_is_corrupt(
    tmp_path: Path, provider: LocalKeyProvider
) -> None:
    # Until `migrate encrypt` finishes, chats it has not reached read in the clear; after
    # it, the database says every value is sealed, and one in the clear is corrupt. What a
    # store without a key provider wrote meanwhile is sealed by running it again.
    from agentcontext.store.admin import encrypt_in_place

    url = f"sqlite+aiosqlite:///{tmp_path / 'data.db'}"
    async with SqlContextStore(url) as plain:
        engine = ContextEngine(store=plain, chat_id="c1", user_id="u1")
        engine.set(user("plain text", id="m1"))
        await engine.save()
        sealed = SqlContextStore(url, encryption=provider)
        assert [r.data["parts"][0]["text"] for r in await sealed.get_messages("c1")] == [
            "plain text"
        ]  # (a database being encrypted: plain chats read as they are)
        await encrypt_in_place(sealed)
        for chat_id, owner in (("c2", "u2"), ("c3", "u3")):  # a store opened before the run
            late = ContextEngine(store=plain, chat_id=chat_id, user_id=owner)
            late.set(user("written in the clear after the run", id=f"m-{chat_id}"))
            await late.save()
        with pytest.raises(CorruptDataError, match="in the clear"):
            await sealed.get_messages("c2")
        # Such a chat is still deleted whole (its search entries too, on SQLite).
        assert (await sealed.erase_user("u3")).chat_ids == ["c3"]
        await sealed.close()
        again = SqlContextStore(url, encryption=provider)  # (not opened yet: the run opens it)
        assert (await encrypt_in_place(again)).chats == 1
        texts = [r.data["parts"][0]["text"] for r in await again.get_messages("c2")]
        assert texts == ["written in the clear after the run"]
        assert [r.data["parts"][0]["text"] for r in await again.get_messages("c1")] == [
            "plain text"
        ]
        assert [hit.message.id for hit in await again.search_messages("c2", "clear")] == ["m-c2"]
        await again.close()
    await write_behind("sqlite", url, "UPDATE chats SET title = 'FORGED' WHERE id = 'c1'")
    async with SqlContextStore(url, encryption=provider) as store:
        with pytest.raises(CorruptDataError, match="in the clear"):
            await store.get_chat("c1")


async def test_a_value_moved_within_a_chain_is_named_by_a_chain_load(
    backend: str, store_url: str, provider: LocalKeyProvider
) -> None:
    async with SqlContextStore(store_url, encryption=provider) as store:
        engine = ContextEngine(store=store, chat_id="a", user_id="u1")
        for n in range(4):
            engine.set(user(f"text {n}", id=f"m-{n}"))
        await engine.save()
    # A later row of the chain gets an earlier one's value.
    await copy_value(backend, store_url, "messages", "data", "m-1", "m-2")
    async with SqlContextStore(store_url, encryption=provider) as store:
        fresh = ContextEngine(store=store, chat_id="a", user_id="u1")
        with pytest.raises(CorruptDataError) as caught:
            await fresh.resolve()
        assert caught.value.row_id == "m-2"


async def test_erasure_destroys_the_key_so_a_backup_cannot_be_read(
    tmp_path: Path, provider: LocalKeyProvider
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'live.db'}"
    async with SqlContextStore(url, encryption=provider) as store:
        for who in ("alice", "bob"):
            await store.create_chat(f"c-{who}", user_id=who, title=f"{who}'s chat")
            engine = ContextEngine(store=store, chat_id=f"c-{who}", user_id=who)
            engine.set(user(f"secret of {who}"))
            await engine.save()
    shutil.copy(tmp_path / "live.db", tmp_path / "backup.db")
    async with SqlContextStore(url, encryption=provider) as store:
        report = await store.erase_user("alice")
        assert report.keys_destroyed == 1 and report.chat_ids == ["c-alice"]
        again = await store.erase_user("alice")
        assert again.keys_destroyed == 0 and again.chat_ids == []
    assert await provider.get_data_key("alice") is None
    assert await provider.destroyed_at("alice") is not None
    backup = f"sqlite+aiosqlite:///{tmp_path / 'backup.db'}"
    async with SqlContextStore(backup, encryption=provider) as store:
        with pytest.raises(EncryptionError, match="alice") as caught:
            await store.get_messages("c-alice")
        assert caught.value.key_id == "alice" and "destroyed" in str(caught.value)
        # alice's chat is listed, as a damaged row (no title), and hides nobody else's.
        listed = {chat.id: chat for chat in await store.list_chats()}
        assert sorted(listed) == ["c-alice", "c-bob"]
        assert listed["c-alice"].title is None
        assert listed["c-alice"].damaged is not None and "destroyed" in listed["c-alice"].damaged
        assert listed["c-bob"].title == "bob's chat" and listed["c-bob"].damaged is None
        assert [r.data["parts"][0]["text"] for r in await store.get_messages("c-bob")] == [
            "secret of bob"
        ]
        bob = await store.list_chats(user_id="bob")
        assert [chat.title for chat in bob] == ["bob's chat"]
        assert await store.search_messages("c-bob", "secret")
        assert await store.search_user_messages("alice", "secret") == []


async def test_a_keyring_older_than_a_users_first_key_makes_no_new_key_for_them(
    tmp_path: Path,
) -> None:
    """A keyring restored from before a user's first key: a save of theirs made a new key
    without a word, their earlier chats then read as damaged ("replaced"), and the chats saved
    meanwhile were lost once the right keyring came back. It is refused, nothing written."""
    master = secrets.token_bytes(32)
    url = f"sqlite+aiosqlite:///{tmp_path / 'data.db'}"
    keyring = tmp_path / "keyring.db"
    async with (
        LocalKeyProvider(master, keyring) as provider,
        SqlContextStore(url, encryption=provider) as store,
    ):
        first = ContextEngine(store=store, chat_id="c-alice", user_id="alice")
        first.set(user("alice was here"))
        await first.save()
        shutil.copy(keyring, tmp_path / "old-keyring.db")  # before bob's first key
        bob = ContextEngine(store=store, chat_id="c-bob", user_id="bob")
        bob.set(user("bob's first words"))
        await bob.save()
    async with (
        LocalKeyProvider(master, tmp_path / "old-keyring.db") as stale,
        SqlContextStore(url, encryption=stale) as store,
    ):
        again = ContextEngine(store=store, chat_id="c-bob-2", user_id="bob")
        again.set(user("more from bob"))
        with pytest.raises(EncryptionError, match="never held") as caught:
            await again.save()
        assert caught.value.key_id == "bob"
        assert await stale.get_data_key("bob") is None  # no key was made
        assert await store.get_chat("c-bob-2") is None
        carol = ContextEngine(store=store, chat_id="c-carol", user_id="carol")
        carol.set(user("a new user saves as before"))
        await carol.save()

    class Bare:  # a provider of the three methods alone: it cannot tell a destroyed key
        get_data_key, create_data_key = stale.get_data_key, stale.create_data_key
        destroy_data_key = stale.destroy_data_key

    async with SqlContextStore(url, encryption=Bare()) as store:
        bare = ContextEngine(store=store, chat_id="c-bob-3", user_id="bob")
        bare.set(user("more from bob"))
        with pytest.raises(EncryptionError, match="cannot say whether it destroyed"):
            await bare.save()
    await stale.aclose()
    async with (
        LocalKeyProvider(master, keyring) as provider,
        SqlContextStore(url, encryption=provider) as store,
    ):
        texts = [r.data["parts"][0]["text"] for r in await store.get_messages("c-bob")]
        assert texts == ["bob's first words"]


async def test_migrate_encrypt_of_a_restored_backup_makes_no_key_for_an_erased_user(
    tmp_path: Path, provider: LocalKeyProvider
) -> None:
    """A run over chats that are sealed already asks for no key: it made a new one for each
    owner, so a backup restored after an erasure got its erased users keys again (their
    erasure no longer on record in the keyring)."""
    from agentcontext.store.admin import encrypt_in_place

    url = f"sqlite+aiosqlite:///{tmp_path / 'live.db'}"
    async with SqlContextStore(url, encryption=provider) as store:
        for who in ("alice", "bob"):
            engine = ContextEngine(store=store, chat_id=f"c-{who}", user_id=who)
            engine.set(user(f"secret of {who}"))
            await engine.save()
    shutil.copy(tmp_path / "live.db", tmp_path / "backup.db")
    async with SqlContextStore(url, encryption=provider) as store:
        await store.erase_user("alice")
    erased_at = await provider.destroyed_at("alice")
    backup = f"sqlite+aiosqlite:///{tmp_path / 'backup.db'}"
    async with SqlContextStore(backup, encryption=provider) as store:
        report = await encrypt_in_place(store)
        assert (report.chats, report.messages) == (0, 0)
        assert await provider.destroyed_at("alice") == erased_at
        assert await provider.get_data_key("alice") is None
        with pytest.raises(EncryptionError, match="destroyed"):
            await store.get_messages("c-alice")


async def test_a_user_whose_key_was_destroyed_is_still_deleted_whole(
    backend: str, store_url: str, provider: LocalKeyProvider
) -> None:
    """A backup restored after an erasure holds rows no key opens any more: every delete
    still works on them (nothing of their text is needed) and says what it deleted, and the
    search of everyone else is untouched."""
    async with SqlContextStore(store_url, encryption=provider) as store:
        for chat_id in ("a1", "a2", "a3", "a4"):
            engine = ContextEngine(store=store, chat_id=chat_id, user_id="alice")
            engine.set(user("secret plans", id=f"{chat_id}-q"), assistant_text("kept secret"))
            await engine.save()
        await store.fork_branch(
            "a4", "main", head_message_id="a4-q", activate=False, name="alt",
            messages=chain("a4", 1, prefix="a4-alt", parent="a4-q"),
        )  # fmt: skip
        await store.create_checkpoint("a4", "cp", "a4-alt0")
        await store.delete_branch("a4", "alt")  # a4-alt0: kept by the checkpoint alone
        engine = ContextEngine(store=store, chat_id="b1", user_id="bob")
        engine.set(user("secret of bob"))
        await engine.save()
        assert await provider.destroy_data_key("alice")
    async with SqlContextStore(store_url, encryption=provider) as store:
        with pytest.raises(EncryptionError):
            await store.get_messages("a1")  # unreadable, as it should be
        assert await store.delete_chat("a1")
        assert not await store.delete_chat("a2", user_id="bob")  # (not bob's)
        purged = await store.purge("a4")
        assert purged.deleted_messages == 0  # (the checkpoint keeps the old head)
        await store.delete_checkpoint("a4", "cp")
        assert (await store.purge("a4")).deleted_messages == 1
        pruned = await store.prune(
            older_than=datetime.now(UTC) + timedelta(days=1), user_id="alice"
        )
        assert sorted(pruned.chat_ids) == ["a2", "a3", "a4"]
        assert all(chat.damaged and "destroyed" in chat.damaged for chat in pruned.chats)
        assert pruned.deleted["messages"] == 6
        erased = await store.erase_user("alice")
        assert erased.chat_ids == [] and erased.keys_destroyed == 0
        assert await store.search_user_messages("alice", "secret") == []
        assert [hit.message.chat_id for hit in await store.search_user_messages("bob", "secret")]
        engine = ContextEngine(store=store, chat_id="c1", user_id="carol")
        engine.set(user("secret recipe"))  # (SQLite may give it a deleted message's row id)
        await engine.save()
        hits = await store.search_messages("c1", "secret")
        assert [hit.snippet for hit in hits] == ["<mark>secret</mark> recipe"]
        assert [chat.id for chat in await store.list_chats()] == ["c1", "b1"]


async def test_without_the_provider_or_with_a_wrong_master_key_nothing_reads(
    tmp_path: Path, provider: LocalKeyProvider
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'data.db'}"
    async with SqlContextStore(url, encryption=provider) as store:
        await store.create_chat("c1", user_id="u1", title="hidden title")
        engine = ContextEngine(store=store, chat_id="c1", user_id="u1")
        engine.set(user("hidden text"))
        await engine.save()
    # Without a provider the database is refused when the store opens, before it could
    # write text in the clear beside the sealed rows (a new chat reads nothing sealed).
    plain = SqlContextStore(url)
    for call in (
        lambda: plain.get_messages("c1"),
        lambda: plain.get_chat("c1"),
        lambda: plain.create_chat("new", user_id="u2", title="in the clear"),
        lambda: ContextEngine(store=plain, chat_id="c2", user_id="u1").resolve(),
    ):
        with pytest.raises(EncryptionError, match="encryption="):
            await call()
    await plain.close()
    async with SqlContextStore(url, encryption=provider) as store:
        assert [chat.id for chat in await store.list_chats()] == ["c1"]
    assert b"in the clear" not in (tmp_path / "data.db").read_bytes()
    wrong = LocalKeyProvider(secrets.token_bytes(32), tmp_path / "keyring.db")
    async with wrong, SqlContextStore(url, encryption=wrong) as store:
        with pytest.raises(EncryptionError, match="another master key"):
            await store.get_messages("c1")
    other = LocalKeyProvider(secrets.token_bytes(32), tmp_path / "other.db")
    async with other, SqlContextStore(url, encryption=other) as store:
        # Another keyring: it never held (nor destroyed) u1's key, and says so.
        with pytest.raises(EncryptionError, match="never held") as caught:
            await store.get_messages("c1")
        assert not isinstance(caught.value, KeyNotHeld)
        with pytest.raises(EncryptionError, match="never held"):
            await store.list_chats()  # not listed as damaged: the keyring is wrong


async def test_a_database_an_encrypted_store_opened_is_refused_by_a_plain_one_even_empty(
    backend: str, store_url: str, provider: LocalKeyProvider
) -> None:
    # The database remembers that an encrypted store opened it, so a store without a key
    # provider (a worker whose keyring setting is missing) writes nothing there in the clear,
    # even before the first sealed row, or after the last one was deleted.
    async with SqlContextStore(store_url, encryption=provider) as store:
        await store.list_chats()
    refused = r"database is encrypted.*encryption="
    plain = SqlContextStore(store_url)
    with pytest.raises(EncryptionError, match=refused):
        await plain.create_chat("clear", user_id="u1", title="in the clear")
    await plain.close()
    async with SqlContextStore(store_url, encryption=provider) as store:
        engine = ContextEngine(store=store, chat_id="c1", user_id="u1")
        engine.set(user("sealed text"))
        await engine.save()
        assert (await store.erase_user("u1")).chat_ids == ["c1"]
        assert await store.list_chats() == []
    plain = SqlContextStore(store_url)
    with pytest.raises(EncryptionError, match=refused):
        await plain.create_chat("clear", user_id="u2", title="in the clear")
    await plain.close()
    async with SqlContextStore(store_url, encryption=provider) as store:
        assert await store.list_chats() == []  # the plain store wrote nothing
        # Stores opened at once mark the database once, and none of them fails for it.
        others = [SqlContextStore(store_url, encryption=provider) for _ in range(3)]
        await asyncio.gather(*(other.initialize() for other in others))
        for other in others:
            await other.close()


async def test_a_database_sealed_before_it_could_say_so_is_still_refused(
    tmp_path: Path, provider: LocalKeyProvider
) -> None:
    # A database encrypted before the setting existed (here: the setting taken away) is
    # known by its newest message.
    url = f"sqlite+aiosqlite:///{tmp_path / 'data.db'}"
    async with SqlContextStore(url, encryption=provider) as store:
        engine = ContextEngine(store=store, chat_id="c1", user_id="u1")
        engine.set(user("sealed text"))
        await engine.save()
    engine_ = create_async_engine(url)
    async with engine_.begin() as conn:
        await conn.execute(text("DELETE FROM agentcontext_settings"))
    await engine_.dispose()
    plain = SqlContextStore(url)
    with pytest.raises(EncryptionError, match=r"holds encrypted data.*no key provider"):
        await plain.list_chats()
    await plain.close()


async def test_a_role_that_may_only_read_opens_a_database_not_yet_marked(
    provider: LocalKeyProvider,
) -> None:
    # A viewer's read-only role cannot record that the database is encrypted: its store opens
    # all the same (the newest message says so) and reads.
    with fresh_database("postgres", "acro") as url:
        async with SqlContextStore(url, encryption=provider) as store:
            engine = ContextEngine(store=store, chat_id="c1", user_id="u1")
            engine.set(user("sealed text"))
            await engine.save()
        role = f"acro_{uuid.uuid4().hex[:8]}"
        admin = create_async_engine(url)
        try:
            async with admin.begin() as conn:
                await conn.execute(text("DELETE FROM agentcontext_settings"))
                await conn.execute(text(f"CREATE ROLE {role} LOGIN"))
                await conn.execute(text(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}"))
            reader = make_url(url).set(username=role).render_as_string(hide_password=False)
            async with SqlContextStore(reader, encryption=provider, migrate=False) as store:
                texts = [m.data["parts"][0]["text"] for m in await store.get_messages("c1")]
                assert texts == ["sealed text"]
            async with admin.connect() as conn:
                marks = (await conn.execute(text("SELECT * FROM agentcontext_settings"))).all()
                assert marks == []
            plain = SqlContextStore(url)
            with pytest.raises(EncryptionError, match="no key provider"):
                await plain.list_chats()
            await plain.close()
        finally:
            async with admin.begin() as conn:
                await conn.execute(text(f"DROP OWNED BY {role}"))
                await conn.execute(text(f"DROP ROLE {role}"))
            await admin.dispose()


async def test_search_with_a_keyring_not_the_datas_says_so_instead_of_finding_nothing(
    backend: str, store_url: str, tmp_path: Path
) -> None:
    master = secrets.token_bytes(32)
    async with (
        LocalKeyProvider(master, tmp_path / "keyring.db") as provider,
        SqlContextStore(store_url, encryption=provider) as store,
    ):
        await _say(store, "a1", "alice", "alice zebra")
        await _say(store, "b1", "bob", "bob zebra")
        assert (await store.erase_user("bob")).keys_destroyed == 1
    async with (
        LocalKeyProvider(master, tmp_path / "another-keyring.db") as other,
        SqlContextStore(store_url, encryption=other) as store,
    ):
        for call in (
            lambda: store.search_messages("a1", "zebra"),
            lambda: store.search_user_messages("alice", "zebra"),
        ):
            with pytest.raises(EncryptionError, match="never held"):
                await call()
        # Nothing to find is still nothing: a user with no chat.
        assert await store.search_user_messages("carol", "zebra") == []
    async with (
        LocalKeyProvider(master, tmp_path / "keyring.db") as provider,
        SqlContextStore(store_url, encryption=provider) as store,
    ):
        # The right keyring: an erased user has nothing to find.
        assert await store.search_user_messages("bob", "zebra") == []
        assert [hit.message.chat_id for hit in await store.search_messages("a1", "zebra")] == ["a1"]


async def test_a_users_first_key_made_by_another_worker_is_found_not_called_a_wrong_keyring(
    backend: str, store_url: str, tmp_path: Path
) -> None:
    """A worker that asked for a user's key a moment ago (none yet) is asked for it afresh
    before it says its keyring is not the data's: another worker has just made it."""
    master = secrets.token_bytes(32)
    async with (
        LocalKeyProvider(master, tmp_path / "keyring.db") as mine,
        LocalKeyProvider(master, tmp_path / "keyring.db") as theirs,
        SqlContextStore(store_url, encryption=mine) as reader,
        SqlContextStore(store_url, encryption=theirs) as writer,
    ):
        assert await reader.search_user_messages("newcomer", "zebra") == []  # (no key yet)
        await _say(writer, "n1", "newcomer", "newcomer zebra")
        hits = await reader.search_user_messages("newcomer", "zebra")
        assert [hit.message.chat_id for hit in hits] == ["n1"]
        texts = [r.data["parts"][0]["text"] for r in await reader.get_messages("n1")]
        assert texts == ["newcomer zebra", "ok"]


async def test_a_role_granted_its_tables_before_the_settings_table_still_opens_a_store(
    tmp_path: Path,
) -> None:
    # A read-only role given SELECT on the tables as they were before revision 0015: stores
    # open (the database known by its newest message) and say which grant is missing.
    with fresh_database("postgres", "acro") as url:
        role = f"acro_{uuid.uuid4().hex[:8]}"
        admin = create_async_engine(url)
        try:
            async with SqlContextStore(url) as store:
                await _say(store, "c1", "u1", "plain words")
            async with admin.begin() as conn:
                await conn.execute(text(f"CREATE ROLE {role} LOGIN"))
                await conn.execute(text(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}"))
                await conn.execute(text(f"REVOKE SELECT ON agentcontext_settings FROM {role}"))
            reader = make_url(url).set(username=role).render_as_string(hide_password=False)
            async with SqlContextStore(reader, migrate=False) as store:
                texts = [m.data["parts"][0]["text"] for m in await store.get_messages("c1")]
                assert texts == ["plain words", "ok"]
        finally:
            async with admin.begin() as conn:
                await conn.execute(text(f"DROP OWNED BY {role}"))
                await conn.execute(text(f"DROP ROLE {role}"))
            await admin.dispose()


async def test_a_keyring_server_that_cannot_be_reached_is_unavailable_not_a_key_error(
    tmp_path: Path,
) -> None:
    import socket

    from agentcontext import StoreUnavailableError

    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    url = f"sqlite+aiosqlite:///{tmp_path / 'data.db'}"
    for keyring in (
        f"postgresql+asyncpg://postgres@127.0.0.1:{port}/keys",
        f"mysql+asyncmy://root@127.0.0.1:{port}/keys",
    ):
        async with (
            LocalKeyProvider(secrets.token_bytes(32), keyring) as provider,
            SqlContextStore(url, encryption=provider) as store,
        ):
            engine = ContextEngine(store=store, chat_id="c1", user_id="u1")
            engine.set(user("text"))
            with pytest.raises(StoreUnavailableError, match="cannot be used") as caught:
                await engine.save()
            assert isinstance(caught.value, EncryptionError)
            assert await store.list_chats() == []


async def test_rotation_wraps_every_key_again_and_rewrites_no_message(tmp_path: Path) -> None:
    old, new = secrets.token_bytes(32), secrets.token_bytes(32)
    url = f"sqlite+aiosqlite:///{tmp_path / 'data.db'}"
    keyring = tmp_path / "keyring.db"
    async with LocalKeyProvider(old, keyring) as provider:
        async with SqlContextStore(url, encryption=provider) as store:
            for who in ("a", "b", "c"):
                await store.create_chat(who, user_id=who)
                engine = ContextEngine(store=store, chat_id=who, user_id=who)
                engine.set(user(f"text of {who}"))
                await engine.save()
        before = (tmp_path / "data.db").read_bytes()
        assert await provider.rotate(new) == 3
    assert (tmp_path / "data.db").read_bytes() == before
    async with LocalKeyProvider(old, keyring) as stale:
        with pytest.raises(EncryptionError, match="another master key"):
            await stale.get_data_key("a")
    renewed = LocalKeyProvider(new, keyring)
    async with renewed, SqlContextStore(url, encryption=renewed) as store:
        for who in ("a", "b", "c"):
            records = await store.get_messages(who)
            assert records[0].data["parts"][0]["text"] == f"text of {who}"


async def test_from_env_reads_a_base64_master_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = secrets.token_bytes(32)
    monkeypatch.setenv("TEST_MASTER", base64.b64encode(key).decode())
    keyring = tmp_path / "keyring.db"
    async with LocalKeyProvider.from_env("TEST_MASTER", keyring=keyring) as provider:
        made = await provider.create_data_key("u1")
        assert len(made) == 32 and await provider.create_data_key("u1") == made
    async with LocalKeyProvider(key, keyring) as same:
        assert await same.get_data_key("u1") == made
    monkeypatch.delenv("TEST_MASTER")
    with pytest.raises(EncryptionError, match="TEST_MASTER"):
        LocalKeyProvider.from_env("TEST_MASTER", keyring=keyring)
    monkeypatch.setenv("TEST_MASTER", "not base64!")
    with pytest.raises(EncryptionError, match="base64"):
        LocalKeyProvider.from_env("TEST_MASTER", keyring=keyring)
    monkeypatch.setenv("TEST_MASTER", base64.b64encode(b"short").decode())
    with pytest.raises(EncryptionError, match="32"):
        LocalKeyProvider.from_env("TEST_MASTER", keyring=keyring)


def test_one_provider_serves_stores_of_every_event_loop(backend: str, tmp_path: Path) -> None:
    """A provider made once (at import, say) and used by stores of several event loops: an
    ``asyncio.run()`` per job, one after another, then a thread per job at once. A keyring
    on a server was reached through connections of the first loop ('another operation is in
    progress', 'attached to a different loop') until each loop had an engine of its own."""
    with contextlib.ExitStack() as stack:
        if backend == "sqlite":
            keyring = str(tmp_path / "shared-keyring.db")
        else:
            keyring = stack.enter_context(fresh_database(backend, "ackeys"))
        provider = LocalKeyProvider(secrets.token_bytes(32), keyring)
        store_url = f"sqlite+aiosqlite:///{tmp_path / 'store.db'}"

        async def job(index: int) -> list[str]:
            async with SqlContextStore(store_url, encryption=provider) as store:
                engine = ContextEngine(store=store, chat_id=f"c{index}", user_id=f"u{index}")
                engine.set(user(f"{PLANT} job {index}"))
                await engine.save()
                hits = await store.search_messages(f"c{index}", PLANT)
                fresh = ContextEngine(store=store, chat_id=f"c{index}", user_id=f"u{index}")
                texts = [m.text for m in (await fresh.resolve()).messages]
                return texts + [hit.message.id for hit in hits]

        for index in range(3):
            texts = asyncio.run(asyncio.wait_for(job(index), 60))
            assert texts[0] == f"{PLANT} job {index}" and len(texts) == 2

        results: dict[int, object] = {}

        def worker(index: int) -> None:
            try:
                results[index] = asyncio.run(asyncio.wait_for(job(index), 60))
            except Exception as exc:  # every failure is reported below
                results[index] = f"{type(exc).__name__}: {exc}"

        assert not run_in_threads(worker, range(3, 7)), "a job hung"
        for index in range(3, 7):
            found = results[index]
            assert isinstance(found, list), found
            assert found[0] == f"{PLANT} job {index}"

        async def keys() -> int:
            counted = 0
            for index in range(7):
                counted += (await provider.get_data_key(f"u{index}")) is not None
            await provider.aclose()
            return counted

        assert asyncio.run(asyncio.wait_for(keys(), 60)) == 7


async def test_first_keys_of_many_users_made_at_once(backend: str, tmp_path: Path) -> None:
    """New users' first saves at the same moment each make a key: on MariaDB the keyring's
    UPDATE-then-INSERT deadlocked them (error 1213, through gap locks); now every key is
    made, once, and a destroyed key's tombstone is still replaced by a new key."""
    with contextlib.ExitStack() as stack:
        if backend == "sqlite":
            keyring = str(tmp_path / "many-keyring.db")
        else:
            keyring = stack.enter_context(fresh_database(backend, "ackeys"))
        async with LocalKeyProvider(secrets.token_bytes(32), keyring) as provider:
            await provider.create_data_key("warm")  # the table made
            users = [f"new-{index}" for index in range(40)]
            for _ in range(3):
                made = await asyncio.gather(*(provider.create_data_key(u) for u in users))
                assert len(set(made)) == len(users)
                again = await asyncio.gather(*(provider.create_data_key(u) for u in users))
                assert again == made
                for name in users:
                    assert await provider.destroy_data_key(name)
            renewed = await provider.create_data_key(users[0])
            assert renewed not in made and await provider.destroyed_at(users[0]) is None
            assert await provider.get_data_key(users[0]) == renewed


async def test_a_rotation_cut_short_by_a_timeout_leaves_keyring_and_provider_agreeing(
    backend: str, tmp_path: Path
) -> None:
    """A caller that stops waiting for `rotate` (a timeout) at any moment: the rotation
    finishes or fails as a whole, and the provider holds the master key the keyring is
    under. Calling again with the same key wraps the keys again and returns the same count."""
    rng = random.Random(secrets.randbits(32))
    with contextlib.ExitStack() as stack:
        if backend == "sqlite":
            keyring = str(tmp_path / "rotated-keyring.db")
        else:
            keyring = stack.enter_context(fresh_database(backend, "ackeys"))
        master = secrets.token_bytes(32)
        async with LocalKeyProvider(master, keyring) as provider:
            keys = {f"u{index}": await provider.create_data_key(f"u{index}") for index in range(6)}
            for _ in range(12):
                new = secrets.token_bytes(32)
                try:
                    counted = await asyncio.wait_for(provider.rotate(new), rng.uniform(0, 0.02))
                except TimeoutError:
                    counted = await provider.rotate(new)  # the same call, once more
                assert counted == len(keys)
                master = new
                async with LocalKeyProvider(master, keyring) as fresh:
                    for name, key in keys.items():
                        assert await fresh.get_data_key(name) == key
                assert await provider.create_data_key("late") is not None
                await provider.destroy_data_key("late")
            # A provider left under the old key (its rotation's event loop ended before the
            # rotation could say so) given the same key again takes it, and counts the same.
            stale = LocalKeyProvider(master, keyring)
            newest = secrets.token_bytes(32)
            assert await provider.rotate(newest) == len(keys)
            assert await stale.rotate(newest) == len(keys)
            for name, key in keys.items():
                stale.forget_cached_key(name)
                assert await stale.get_data_key(name) == key
            await stale.aclose()


_LOOKALIKES = ("alice", "Alice", "ALICE", "alice ", "alicé", "alice\u0301")
"""User ids that MariaDB's default collation takes for one another (case, trailing spaces,
accents)."""


async def test_user_ids_differing_only_in_case_accents_or_spaces_have_keys_of_their_own(
    backend: str, tmp_path: Path
) -> None:
    """The keyring compares user ids exactly, as the store does: on a MariaDB keyring, erasing
    "ALICE" (who has no key) destroyed the key of "alice", and "Alice" got alice's key back,
    which her binding refused as a keyring altered."""
    with contextlib.ExitStack() as stack:
        if backend == "sqlite":
            keyring = str(tmp_path / "lookalikes.db")
        else:
            keyring = stack.enter_context(fresh_database(backend, "ackeys"))
        async with LocalKeyProvider(secrets.token_bytes(32), keyring) as provider:
            alice = await provider.create_data_key("alice")
            assert not await provider.destroy_data_key("ALICE")  # no key of theirs to destroy
            assert not await provider.destroy_data_key("alice ")
            assert await provider.get_data_key("alice") == alice
            made = {name: await provider.create_data_key(name) for name in _LOOKALIKES}
            assert made["alice"] == alice and len(set(made.values())) == len(_LOOKALIKES)
            assert await provider.destroy_data_key("Alice")
            provider.forget_cached_key("alice")
            assert await provider.get_data_key("alice") == alice
            assert await provider.get_data_key("Alice") is None
            for name in _LOOKALIKES[2:]:
                provider.forget_cached_key(name)
                assert await provider.get_data_key(name) == made[name]


async def test_a_mariadb_keyring_made_before_exact_user_ids_is_changed_when_opened() -> None:
    """A keyring whose user id column has the server's default collation (as keyrings were
    made before) is changed to the exact one when a provider opens it, keeping its keys."""
    require_backend("mariadb")
    with fresh_database("mariadb", "ackeys") as keyring:
        master = secrets.token_bytes(32)
        async with LocalKeyProvider(master, keyring) as provider:
            alice = await provider.create_data_key("alice")
        engine = create_async_engine(keyring)
        column = (
            "SELECT collation_name FROM information_schema.columns WHERE table_schema = "
            "DATABASE() AND table_name = 'agentcontext_data_keys' AND column_name = 'user_id'"
        )
        try:
            async with engine.begin() as conn:
                await conn.execute(
                    text(
                        "ALTER TABLE agentcontext_data_keys MODIFY user_id VARCHAR(255) "
                        "CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci NOT NULL"
                    )
                )
            async with LocalKeyProvider(master, keyring) as provider:
                assert not await provider.destroy_data_key("ALICE")
                assert await provider.get_data_key("alice") == alice
            async with engine.connect() as conn:
                assert (await conn.execute(text(column))).scalar() == "utf8mb4_nopad_bin"
        finally:
            await engine.dispose()


async def test_an_older_mariadb_keyring_a_role_cannot_alter_is_refused_naming_the_statement() -> (
    None
):
    """A keyring role without ALTER cannot change the column: the provider refuses the keyring
    (quoting what to run) instead of going on with user ids that match each other."""
    require_backend("mariadb")
    role = f"acnoalter{secrets.token_hex(3)}"
    with fresh_database("mariadb", "ackeys") as keyring:
        parsed = make_url(keyring)
        master = secrets.token_bytes(32)
        async with LocalKeyProvider(master, keyring) as provider:
            alice = await provider.create_data_key("alice")
        engine = create_async_engine(keyring)
        try:
            async with engine.begin() as conn:
                await conn.execute(
                    text(
                        "ALTER TABLE agentcontext_data_keys MODIFY user_id VARCHAR(255) "
                        "CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci NOT NULL"
                    )
                )
                await conn.execute(text(f"CREATE USER '{role}'@'%' IDENTIFIED BY 'pw'"))
                await conn.execute(
                    text(
                        "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON "
                        f"`{parsed.database}`.* TO '{role}'@'%'"
                    )
                )
            limited = parsed.set(username=role, password="pw").render_as_string(hide_password=False)
            async with LocalKeyProvider(master, limited) as provider:
                with pytest.raises(EncryptionError, match="MODIFY user_id") as caught:
                    await provider.destroy_data_key("ALICE")
                assert "utf8mb4_nopad_bin" in str(caught.value)
            async with LocalKeyProvider(master, keyring) as provider:
                assert await provider.get_data_key("alice") == alice  # nothing destroyed
        finally:
            async with engine.begin() as conn:
                await conn.execute(text(f"DROP USER IF EXISTS '{role}'@'%'"))
            await engine.dispose()


async def test_a_keyring_that_cannot_be_reached_when_a_database_is_first_opened(
    tmp_path: Path,
) -> None:
    """The store opens (its keyring is made with the first key, later) and the database is
    marked all the same, sealed whole from the start: a value in the clear is corrupt."""
    import socket
    import sqlite3

    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    url = f"sqlite+aiosqlite:///{tmp_path / 'data.db'}"
    down = LocalKeyProvider(secrets.token_bytes(32), f"postgresql+asyncpg://u@127.0.0.1:{port}/k")
    async with SqlContextStore(url, encryption=down) as store:
        assert await store.list_chats() == []
    await down.aclose()
    with contextlib.closing(sqlite3.connect(tmp_path / "data.db")) as raw:
        names = {row[0] for row in raw.execute("SELECT name FROM agentcontext_settings")}
    assert names == {"sealing", "sealing_complete"}


async def test_a_new_keyring_opened_by_many_providers_at_once(backend: str, tmp_path: Path) -> None:
    """Workers starting together on a new keyring (a provider each, as processes have) all
    create its table: the losers of that race failed with 'table ... already exists'."""
    with contextlib.ExitStack() as stack:
        if backend == "sqlite":
            keyring = str(tmp_path / "new-keyring.db")
        else:
            keyring = stack.enter_context(fresh_database(backend, "ackeys"))
        master = secrets.token_bytes(32)
        providers = [LocalKeyProvider(master, keyring) for _ in range(6)]
        try:
            made = await asyncio.gather(
                *(p.create_data_key(f"worker-{i}") for i, p in enumerate(providers))
            )
            assert len(set(made)) == len(providers)
            assert await providers[0].get_data_key("worker-5") == made[5]
        finally:
            for provider in providers:
                await provider.aclose()


async def test_a_key_another_process_destroyed_seals_nothing_once_rechecked(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes (a store and a provider each, one database, one keyring): after one
    erases a user, the other, which held the user's key, seals a new chat of that user under
    a new key once its held key is due to be asked for again (every half minute; half a second
    here), so that chat stays readable. It was sealed under the destroyed key for as long as
    the key stayed in memory, and no process could read it."""
    from agentcontext import encryption
    from agentcontext.store._rows import sealing

    monkeypatch.setattr(sealing, "WRITE_RECHECK_SECONDS", 0.5)
    monkeypatch.setattr(encryption, "KEY_RECHECK_SECONDS", 0.5)
    master, keyring = secrets.token_bytes(32), tmp_path / "shared.db"
    async with (
        LocalKeyProvider(master, keyring) as mine,
        LocalKeyProvider(master, keyring) as theirs,
        SqlContextStore(store_url, encryption=mine) as serving,
        SqlContextStore(store_url, encryption=theirs) as erasing,
    ):
        engine = ContextEngine(store=serving, chat_id="before", user_id="gone")
        engine.set(user(f"{PLANT} before"))
        await engine.save()
        # Another process: the erasure does not reach the serving store's memory.
        monkeypatch.setattr(sealing, "_sealers", weakref.WeakSet([erasing._dialect.sealer]))
        assert (await erasing.erase_user("gone")).keys_destroyed == 1
        await asyncio.sleep(0.6)
        engine = ContextEngine(store=serving, chat_id="after", user_id="gone")
        engine.set(user(f"{PLANT} after"))
        await engine.save()
        fresh = ContextEngine(store=erasing, chat_id="after", user_id="gone")
        assert [m.text for m in (await fresh.resolve()).messages] == [f"{PLANT} after"]
        assert [hit.message.chat_id for hit in await erasing.search_messages("after", PLANT)] == [
            "after"
        ]


async def test_bad_providers_and_keys_are_refused(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'data.db'}"
    with pytest.raises(InvalidTypeError, match="key provider"):
        SqlContextStore(url, encryption=object())  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="32 bytes"):
        LocalKeyProvider(b"short", tmp_path / "k.db")
    with pytest.raises(InvalidTypeError):
        LocalKeyProvider("x" * 32, tmp_path / "k.db")  # type: ignore[arg-type]
    key = secrets.token_bytes(32)
    # A keyring URL the engine cannot be made for is refused when the provider is made, not
    # on its first key with a raw SQLAlchemy or driver error.
    for keyring, error, match in [
        (f"sqlite:///{tmp_path / 'k.db'}", InvalidInputError, "async driver"),
        (f"sqlite+aiosqlite:///{tmp_path / 'k.db'}?timeout=soon", InvalidInputError, "query"),
        ("nosuch+driver://host/keys", InvalidInputError, "nosuch"),
        (
            "postgresql+psycopg2://u:secret@localhost/keys",
            *(
                (MissingExtraError, "not installed")
                if importlib.util.find_spec("psycopg2") is None
                else (InvalidInputError, "async driver")  # (installed: it is not async)
            ),
        ),
    ]:
        with pytest.raises(error, match=match) as caught:
            LocalKeyProvider(key, keyring)
        assert "secret" not in str(caught.value)


class NoKeyMade:
    """A provider whose ``create_data_key`` returns None (a bug of a provider of one's own)."""

    async def get_data_key(self, user_id: str) -> bytes | None:
        return None

    async def create_data_key(self, user_id: str) -> bytes:
        return None  # type: ignore[return-value]

    async def destroy_data_key(self, user_id: str) -> bool:
        return False


async def test_a_provider_that_makes_no_key_is_named_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'data.db'}"
    async with SqlContextStore(url, encryption=NoKeyMade()) as store:
        engine = ContextEngine(store=store, chat_id="c1", user_id="u1")
        engine.set(user("text"))
        with pytest.raises(EncryptionError, match="returned None from create_data_key"):
            await engine.save()
        assert await store.list_chats() == []


class FlakyProvider:
    """A provider whose keys live in ``inner`` and that fails while ``down``."""

    def __init__(self, inner: LocalKeyProvider) -> None:
        self.inner = inner
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise OSError("vault unreachable")

    async def get_data_key(self, user_id: str) -> bytes | None:
        self._check()
        return await self.inner.get_data_key(user_id)

    async def create_data_key(self, user_id: str) -> bytes:
        self._check()
        return await self.inner.create_data_key(user_id)

    async def destroy_data_key(self, user_id: str) -> bool:
        self._check()
        return await self.inner.destroy_data_key(user_id)


async def test_a_failing_provider_is_an_encryption_error_and_loses_nothing(
    tmp_path: Path, provider: LocalKeyProvider
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'data.db'}"
    flaky = FlakyProvider(provider)
    flaky.down = True
    async with SqlContextStore(url, encryption=flaky) as store:
        with pytest.raises(EncryptionError, match="vault unreachable"):
            await store.create_chat("c1", user_id="u1", title="a title")
        flaky.down = False
        await store.create_chat("c1", user_id="u1", title="a title")
    async with SqlContextStore(url, encryption=flaky) as store:  # no key held yet
        engine = ContextEngine(store=store, chat_id="c1", user_id="u1")
        flaky.down = True
        engine.set(user("text"))
        with pytest.raises(EncryptionError, match="vault unreachable"):
            await engine.save()
        assert len(engine.pending) == 1  # nothing lost
        with pytest.raises(EncryptionError, match="vault unreachable"):
            await store.erase_user("u1")  # the rows go first, then the key cannot be destroyed
        flaky.down = False
        report = await store.erase_user("u1")
        assert report.keys_destroyed == 1


async def test_snapshots_and_records_are_kept_per_user_and_erased_with_the_key(
    tmp_path: Path, provider: LocalKeyProvider
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'data.db'}"
    same = b"the same file in two users' snapshots"
    async with SqlContextStore(url, encryption=provider) as store:
        recorded = {}
        for who in ("alice", "bob"):
            engine = ContextEngine(store=store, chat_id=f"c-{who}", user_id=who)
            engine.set(user(f"hello from {who}"))
            await engine.save()
            draft = ContextSnapshot(summary=f"{who} saw")
            draft.add_file("shared.txt", same)
            await engine.snapshot(draft)
            result = await engine.resolve(record=True)
            assert result.record_id is not None
            recorded[who] = result
            replayed = await engine.replay(result.record_id)
            assert replayed.system_prompt == result.system_prompt
            assert [m.id for m in replayed.messages] == [m.id for m in result.messages]
        # One blob per user for the same content: neither can be found through the other.
        from agentcontext.snapshots import blob_hash

        assert await store.read_blob(blob_hash(same), chat_id="c-alice") == same
        assert await store.read_blob(blob_hash(same), chat_id="c-bob") == same
        await store.erase_user("alice")
        engine = ContextEngine(store=store, chat_id="c-bob", user_id="bob")
        bob = recorded["bob"].record_id
        assert bob is not None
        replayed = await engine.replay(bob)
        assert [m.id for m in replayed.messages] == [m.id for m in recorded["bob"].messages]
        await store.collect_garbage()  # alice's sealed blobs go, nothing of bob's
        assert await store.read_blob(blob_hash(same), chat_id="c-bob") == same


async def test_a_plain_store_does_not_read_sealed_blobs_as_content(
    tmp_path: Path, provider: LocalKeyProvider
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'data.db'}"
    async with SqlContextStore(url, encryption=provider) as store:
        engine = ContextEngine(store=store, chat_id="c1", user_id="u1")
        engine.set(user("hello"))
        await engine.save()
        draft = ContextSnapshot(summary=f"s {PLANT}")
        draft.add_snippet("label", f"content {PLANT}")
        stored = await engine.snapshot(draft)
    assert stored.id is not None
    with pytest.raises(EncryptionError, match="key provider"):
        async with SqlContextStore(url) as plain:
            await plain.get_snapshot(stored.id, with_content=True)
    assert PLANT.encode() not in (tmp_path / "data.db").read_bytes()


async def test_metadata_filters_are_refused_in_an_encrypted_store(
    tmp_path: Path, provider: LocalKeyProvider
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'data.db'}"
    async with SqlContextStore(url, encryption=provider) as store:
        with pytest.raises(InvalidInputError, match="encrypted"):
            await store.list_chats(metadata={"k": "v"})


async def test_a_chat_created_again_for_another_user_is_searched_under_its_new_owner(
    store_url: str, provider: LocalKeyProvider
) -> None:
    async with (
        SqlContextStore(store_url, encryption=provider) as first,
        SqlContextStore(store_url, encryption=provider) as second,
    ):
        await first.create_chat("shared", user_id="alice")
        engine = ContextEngine(store=first, chat_id="shared", user_id="alice")
        engine.set(user("an apple a day", id="alice-1"))
        await engine.save()
        assert [h.message.id for h in await first.search_messages("shared", "apple")] == ["alice-1"]
        # Deleted and created again for bob through another store: the first one's idea of
        # the owner is stale, and its search must still find bob's text, not nothing.
        assert await second.delete_chat("shared")
        await second.create_chat("shared", user_id="bob")
        other = ContextEngine(store=second, chat_id="shared", user_id="bob")
        other.set(user("apple pie", id="bob-1"))
        await other.save()
        for store in (first, second):
            hits = await store.search_messages("shared", "apple")
            assert [h.message.id for h in hits] == ["bob-1"]
        assert await first.search_user_messages("alice", "apple") == []


class _SavingAtDestroy(LocalKeyProvider):
    """Runs ``at_destroy`` once, as the key of a user is destroyed: a save of another store
    committing just before the erasure destroys the key (it holds the key, and sealed under
    it)."""

    at_destroy: Any = None

    async def destroy_data_key(self, user_id: str) -> bool:
        hook, self.at_destroy = self.at_destroy, None
        if hook is not None:
            await hook()
        return await super().destroy_data_key(user_id)


async def test_chats_saved_while_a_user_is_erased_do_not_outlive_the_key(
    store_url: str, tmp_path: Path
) -> None:
    """A chat of the user saved while ``erase_user`` runs (by a store of another process, by
    another store of the process with the same key provider, or by this one) is deleted too,
    or refused: none is left behind sealed under the destroyed key, unreadable, and
    ``list_chats`` lists nothing damaged. Before, such a chat stayed."""
    master = secrets.token_bytes(32)
    async with (
        _SavingAtDestroy(master, tmp_path / "keyring.db") as provider,
        LocalKeyProvider(master, tmp_path / "keyring.db") as elsewhere,  # another process's
        SqlContextStore(store_url, encryption=provider) as store,
        SqlContextStore(store_url, encryption=provider) as sibling,
        SqlContextStore(store_url, encryption=elsewhere) as other,
    ):
        for chat_id, who in (("old", "alice"), ("warm", "alice"), ("b", "bob")):
            engine = ContextEngine(store=other if chat_id == "warm" else store, chat_id=chat_id,
                                   user_id=who)  # fmt: skip
            engine.set(user(f"secret of {who}"))
            await engine.save()

        async def late_save() -> None:
            engine = ContextEngine(store=other, chat_id="late", user_id="alice")
            engine.set(user("the end of a reply"))
            await engine.save()

        provider.at_destroy = late_save
        stop = asyncio.Event()
        refused: list[str] = []

        async def writer(saver: SqlContextStore, name: str) -> None:
            # The saves of stores with the erasing store's provider meanwhile: refused, or
            # deleted.
            turn = 0
            while not stop.is_set():
                turn += 1
                engine = ContextEngine(store=saver, chat_id=f"{name}-{turn}", user_id="alice")
                engine.set(user("typing"))
                try:
                    await engine.save()
                except EncryptionError as exc:
                    refused.append(str(exc))
                except ChatNotFoundError:
                    pass  # opened just before the erasure listed the user's chats: deleted
                await asyncio.sleep(0)

        tasks = [
            asyncio.create_task(writer(store, "mine")),
            asyncio.create_task(writer(sibling, "sib")),
        ]
        await asyncio.sleep(0.01)
        report = await store.erase_user("alice")
        stop.set()
        await asyncio.gather(*tasks)
        assert "late" in report.chat_ids and "old" in report.chat_ids
        assert report.keys_destroyed >= 1
        assert refused and all("being erased" in reason for reason in refused)
        for reader in (store, sibling, other):
            chats = await reader.list_chats()
            assert not [chat.id for chat in chats if chat.damaged], "a chat outlived its key"
            assert "b" in [chat.id for chat in chats]
            for chat in chats:  # alice's chats saved after the erasure, under a new key
                assert await reader.get_messages(chat.id)
        assert not {"old", "warm", "late"} & {chat.id for chat in await store.list_chats()}


async def test_a_list_of_more_users_than_the_store_keeps_keys_of(
    tmp_path: Path, provider: LocalKeyProvider
) -> None:
    """A store keeps the keys of 10 000 users; a call reading more users' rows than that at
    once (``list_chats()`` of a large deployment, a retention batch) keeps them all while it
    runs. Before, it evicted some as it loaded the rest and gave up after four tries."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'data.db'}"
    async with SqlContextStore(url, encryption=provider) as store:
        for n in range(7):
            await store.create_chat(f"c{n}", user_id=f"user{n}", title=f"title {n}")
        sealer = store._dialect.sealer
        sealer._cache_keys = 3  # type: ignore[union-attr]  # (10 000 in a real store)
        sealer.forget("user0")  # some held, some not
        listed = await store.list_chats()
        assert sorted(chat.title or "" for chat in listed) == [f"title {n}" for n in range(7)]
        assert len(await store.list_chats(limit=2)) == 2


async def test_calls_over_more_users_than_the_store_keeps_keys_of_run_at_once(
    tmp_path: Path, provider: LocalKeyProvider
) -> None:
    """Calls running at once, each over more users than the store keeps keys of: the keys
    each needs are kept while it runs, whatever the others load. Before, they evicted each
    other's keys and failed after four tries ("keys kept changing")."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'data.db'}"
    async with SqlContextStore(url, encryption=provider) as store:
        for n in range(40):
            await store.create_chat(f"c{n:02}", user_id=f"user{n}", title=f"title {n}")
        sealer = store._dialect.sealer
        sealer._cache_keys = 3  # type: ignore[union-attr]  # (10 000 in a real store)
        for _ in range(3):
            for n in range(40):
                sealer.forget(f"user{n}")
            pages = await asyncio.gather(
                *(store.list_chats(limit=8, offset=offset) for offset in range(0, 40, 8))
            )
            titles = sorted(chat.title or "" for page in pages for chat in page)
            assert titles == sorted(f"title {n}" for n in range(40))
        assert sealer._pinned == 0  # type: ignore[union-attr]


async def test_read_blob_of_a_hash_that_names_no_blob_in_an_encrypted_store(
    tmp_path: Path, provider: LocalKeyProvider
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'data.db'}"
    async with SqlContextStore(url, encryption=provider) as store:
        await store.create_chat("c1", user_id="u1")
        for blob in ("zz", "abc", "0" * 63, "G" * 64, "A" * 64, "0" * 128):
            assert await store.read_blob(blob, chat_id="c1") is None


# --- the keyring's master key: a provider whose master key is not the keyring's makes no key ---


@contextlib.contextmanager
def _shared_keyring(backend: str, tmp_path: Path, name: str) -> Iterator[tuple[str, str]]:
    """A new keyring on ``backend`` (a SQLite file, or a database of its own on the server):
    as a provider takes it, and as a URL to look into it."""
    if backend == "sqlite":
        path = str(tmp_path / f"{name}.db")
        yield path, f"sqlite+aiosqlite:///{path}"
    else:
        with fresh_database(backend, "ackeys") as url:
            yield url, url


async def _keyring_rows(url: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]] | None]:
    """Everything the keyring holds: its keys (tombstones too) and its master key's check row
    (None: no such table)."""
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            keys = (
                await conn.execute(
                    text(
                        "SELECT user_id, wrapped, master, created_at, destroyed_at "
                        "FROM agentcontext_data_keys ORDER BY user_id"
                    )
                )
            ).all()
        try:
            async with engine.connect() as conn:
                check = (
                    await conn.execute(text("SELECT name, value, master FROM agentcontext_keyring"))
                ).all()
        except Exception:  # (a keyring of the version before has no such table)
            return [tuple(row) for row in keys], None
        return [tuple(row) for row in keys], [tuple(row) for row in check]
    finally:
        await engine.dispose()


async def _say(store: SqlContextStore, chat_id: str, user_id: str, said: str) -> None:
    engine = ContextEngine(store=store, chat_id=chat_id, user_id=user_id)
    engine.set(user(said), assistant_text("ok"))
    await engine.save()


async def test_a_worker_still_holding_the_master_key_of_before_a_rotation_makes_no_key(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rotate` in one process while other workers keep the old master key (until they are
    restarted): such a worker made new users' keys wrapped under the old master key, which
    no process with the new one could open (those users' chats unreadable, their erasure and
    ``list_chats()`` failing). Now it refuses, saying to restart it with the new master key,
    and writes nothing; a worker that had checked the master key just before the rotation
    notices it within `KEY_RECHECK_SECONDS`."""
    from agentcontext import encryption

    old, new = secrets.token_bytes(32), secrets.token_bytes(32)
    store_url = f"sqlite+aiosqlite:///{tmp_path / 'data.db'}"
    with _shared_keyring(backend, tmp_path, "rotated") as (keyring, keyring_url):
        async with (
            LocalKeyProvider(old, keyring) as admin,
            LocalKeyProvider(old, keyring) as worker,
            LocalKeyProvider(old, keyring) as checked,
            LocalKeyProvider(old, keyring) as idle,
        ):
            async with SqlContextStore(store_url, encryption=worker) as store:
                await _say(store, "c-alice", "alice", "alice's text")
            # (No recheck of the master key meanwhile, however slowly this runs.)
            monkeypatch.setattr(encryption, "KEY_RECHECK_SECONDS", 3600.0)
            for provider in (checked, idle):  # (their master key checked, before the rotation)
                assert await provider.get_data_key("nobody") is None
            assert await admin.rotate(new) == 1
            before = await _keyring_rows(keyring_url)
            refused = "another master key.*restart this worker with the new master key"
            async with SqlContextStore(store_url, encryption=worker) as store:
                with pytest.raises(EncryptionError, match=refused):
                    await _say(store, "c-dave", "dave", "dave signs up after the rotation")
            for call in (
                lambda: worker.create_data_key("dave"),
                lambda: worker.get_data_key("dave"),
                lambda: checked.create_data_key("erin"),  # (checked just before: refused too)
                lambda: worker.rotate(secrets.token_bytes(32)),
            ):
                with pytest.raises(EncryptionError, match=refused):
                    await call()
            # The check of the master key is done again once it is that old (half a minute;
            # at once here): a reader notices the rotation.
            assert await idle.get_data_key("nobody") is None  # (checked before: not yet)
            monkeypatch.setattr(encryption, "KEY_RECHECK_SECONDS", 0.0)
            with pytest.raises(EncryptionError, match=refused):
                await idle.get_data_key("nobody")
            assert await _keyring_rows(keyring_url) == before
            # The rotated process and a restarted one read and make every key.
            async with SqlContextStore(store_url, encryption=admin) as store:
                chats = await store.list_chats()
                assert [(chat.id, chat.damaged) for chat in chats] == [("c-alice", None)]
                await _say(store, "c-dave", "dave", "dave again")
                assert (await store.erase_user("dave")).keys_destroyed == 1
            async with (
                LocalKeyProvider(new, keyring) as restarted,
                SqlContextStore(store_url, encryption=restarted) as store,
            ):
                assert await restarted.create_data_key("erin") == await admin.get_data_key("erin")
                records = await store.get_messages("c-alice")
                assert records[0].data["parts"][0]["text"] == "alice's text"


async def test_a_wrong_master_key_neither_reads_nor_makes_keys(
    backend: str, tmp_path: Path
) -> None:
    """A worker given a wrong master key made the keys of users who had none under it: their
    chats could not be read (nor, on SQLite, deleted) by the others. Now it reads and makes
    nothing and the keyring is left as it was."""
    master, wrong = secrets.token_bytes(32), secrets.token_bytes(32)
    store_url = f"sqlite+aiosqlite:///{tmp_path / 'data.db'}"
    with _shared_keyring(backend, tmp_path, "wrong") as (keyring, keyring_url):
        async with LocalKeyProvider(master, keyring) as good:
            async with SqlContextStore(store_url, encryption=good) as store:
                await _say(store, "c-alice", "alice", "alice's text")
            await good.create_data_key("gone")
            assert await good.destroy_data_key("gone")
            before = await _keyring_rows(keyring_url)
            async with LocalKeyProvider(wrong, keyring) as bad:
                async with SqlContextStore(store_url, encryption=bad) as store:
                    for chat_id, who in (("c-alice", "alice"), ("c-carol", "carol")):
                        with pytest.raises(EncryptionError, match="another master key"):
                            await _say(store, chat_id, who, "kumquat")
                for call in (
                    lambda: bad.get_data_key("carol"),
                    lambda: bad.create_data_key("carol"),
                    lambda: bad.create_data_key("gone"),  # (a tombstone is not replaced)
                ):
                    with pytest.raises(EncryptionError, match="another master key") as caught:
                        await call()
                    assert "give the provider the master key" in str(caught.value).lower()
                assert await bad.destroyed_at("gone") is not None  # (needs no master key)
            assert await _keyring_rows(keyring_url) == before
            async with SqlContextStore(store_url, encryption=good) as store:
                chats = await store.list_chats()
                assert [(chat.id, chat.damaged) for chat in chats] == [("c-alice", None)]
                await _say(store, "c-carol", "carol", "carol's text")
                assert (await store.erase_user("carol")).keys_destroyed == 1


async def test_a_new_keyring_opened_at_once_with_two_master_keys_keeps_one(
    backend: str, tmp_path: Path
) -> None:
    """Workers starting together on a new keyring, some with another master key: the first
    master key stored is the keyring's; the others' keys are refused, none is made."""
    first, second = secrets.token_bytes(32), secrets.token_bytes(32)
    with _shared_keyring(backend, tmp_path, "two") as (keyring, keyring_url):
        providers = [LocalKeyProvider((first, second)[i % 2], keyring) for i in range(6)]
        try:
            made = await asyncio.gather(
                *(p.create_data_key(f"worker-{i}") for i, p in enumerate(providers)),
                return_exceptions=True,
            )
        finally:
            for provider in providers:
                await provider.aclose()
        won = [i % 2 for i, found in enumerate(made) if isinstance(found, bytes)]
        assert len(set(won)) == 1 and len(won) == 3, made
        for i, found in enumerate(made):
            if i % 2 != won[0]:
                assert isinstance(found, EncryptionError), found
                assert "another master key" in str(found)
        keys, _ = await _keyring_rows(keyring_url)
        assert sorted(row[0] for row in keys) == [f"worker-{i}" for i in range(won[0], 6, 2)]
        async with LocalKeyProvider((first, second)[won[0]], keyring) as keeper:
            for i in range(won[0], 6, 2):
                assert await keeper.get_data_key(f"worker-{i}") == made[i]


async def test_keys_made_while_the_master_key_is_rotated_open_with_the_new_one(
    backend: str, tmp_path: Path
) -> None:
    """Keys made by workers with the old master key at the moment a rotation runs: each is
    made before the rotation (and wrapped again by it) or refused; none is left wrapped under
    the old master key. A worker's key waits for a rotation under way to end."""
    from agentcontext import encryption

    old, new = secrets.token_bytes(32), secrets.token_bytes(32)
    with _shared_keyring(backend, tmp_path, "during") as (keyring, keyring_url):
        async with (
            LocalKeyProvider(old, keyring) as admin,
            LocalKeyProvider(old, keyring) as worker,
        ):
            for index in range(60):
                await admin.create_data_key(f"old-{index}")
            await worker.create_data_key("warm")

            async def make(index: int) -> bytes:  # (some before the rotation, some after)
                await asyncio.sleep(0.002 * index)
                return await worker.create_data_key(f"new-{index}")

            async def rotate() -> int:
                await asyncio.sleep(0.02)
                return await admin.rotate(new)

            made = await asyncio.gather(
                rotate(), *(make(index) for index in range(30)), return_exceptions=True
            )
            for found in made[1:]:
                assert isinstance(found, bytes) or "another master key" in str(found), found
            # Every key in the keyring was there when the rotation wrapped the keys again (a
            # worker's key refused may have been made just before it: it reads the key back
            # after the rotation), and opens with the new master key.
            keys, _ = await _keyring_rows(keyring_url)
            live = [row[0] for row in keys if row[1] is not None]
            assert made[0] == len(live) >= 61 + sum(isinstance(f, bytes) for f in made[1:]), made
            async with LocalKeyProvider(new, keyring) as renewed:
                for user_id in live:
                    assert await renewed.get_data_key(user_id) is not None
                for index, found in enumerate(made[1:]):
                    if isinstance(found, bytes):
                        assert await renewed.get_data_key(f"new-{index}") == found
            # A rotation under way (its transaction holds the new check value, not committed
            # yet): a worker's key waits for it, then is refused.
            newer = encryption._Master.of(secrets.token_bytes(32))
            async with LocalKeyProvider(new, keyring) as late:
                await late.get_data_key("warm")  # (its master key checked)
                raw = create_async_engine(keyring_url)
                try:
                    async with raw.begin() as conn:
                        await conn.execute(
                            text("UPDATE agentcontext_keyring SET value = :v, master = :m"),
                            {"v": newer.check, "m": newer.fingerprint},
                        )
                        making = asyncio.create_task(late.create_data_key("during"))
                        await asyncio.sleep(0.5)
                        assert not making.done()
                finally:
                    await raw.dispose()
                with pytest.raises(EncryptionError, match="another master key"):
                    await making
            keys, _ = await _keyring_rows(keyring_url)
            assert "during" not in [row[0] for row in keys]


async def test_a_keyring_made_before_the_master_key_check_keeps_working(
    backend: str, tmp_path: Path
) -> None:
    """A keyring of the version before (no check value of its master key) opens as before
    with its master key, which is then stored as the keyring's; a wrong master key is refused
    and writes nothing. If a worker with a wrong master key made a few keys in it already,
    the master key of most of its keys is the keyring's."""

    master, wrong = secrets.token_bytes(32), secrets.token_bytes(32)

    async def as_before(url: str) -> None:  # the keyring as the version before left it
        engine = create_async_engine(url)
        try:
            async with engine.begin() as conn:
                await conn.execute(text("DROP TABLE IF EXISTS agentcontext_keyring"))
        finally:
            await engine.dispose()

    with _shared_keyring(backend, tmp_path, "before") as (keyring, keyring_url):
        async with LocalKeyProvider(master, keyring) as provider:
            made = {who: await provider.create_data_key(who) for who in ("a", "b", "c")}
        await as_before(keyring_url)
        before = await _keyring_rows(keyring_url)
        async with LocalKeyProvider(wrong, keyring) as stale:
            for call in (lambda: stale.get_data_key("a"), lambda: stale.create_data_key("z")):
                with pytest.raises(EncryptionError, match="another master key"):
                    await call()
        keys, check = await _keyring_rows(keyring_url)
        assert keys == before[0] and not check  # (the table made: no check value stored)
        async with LocalKeyProvider(master, keyring) as provider:
            assert await provider.get_data_key("a") == made["a"]
            made["d"] = await provider.create_data_key("d")
        async with LocalKeyProvider(wrong, keyring) as stale:
            with pytest.raises(EncryptionError, match="another master key"):
                await stale.create_data_key("z")

        # A keyring of the version before in which a worker with a wrong master key made a
        # key ("z"): its other keys' master key is taken, the wrong one is refused.
        async with LocalKeyProvider(wrong, tmp_path / "elsewhere.db") as elsewhere:
            await elsewhere.create_data_key("z")
            wrapped = await elsewhere._read(await elsewhere._open(), "z")
        await as_before(keyring_url)
        engine = create_async_engine(keyring_url)
        try:
            async with engine.begin() as conn:
                await conn.execute(
                    KEYS.insert().values(
                        user_id="z",
                        wrapped=wrapped[0],
                        master=wrapped[1],
                        created_at=datetime.now(UTC),
                    )
                )
        finally:
            await engine.dispose()
        async with LocalKeyProvider(wrong, keyring) as stale:
            with pytest.raises(EncryptionError, match="another master key"):
                await stale.get_data_key("z")
        async with LocalKeyProvider(master, keyring) as provider:
            assert await provider.get_data_key("d") == made["d"]
            with pytest.raises(EncryptionError, match="another master key"):
                await provider.get_data_key("z")  # (unreadable, as it was)
            assert await provider.create_data_key("e")


async def test_a_keyring_in_the_stores_own_database_is_refused(
    store_url: str, tmp_path: Path
) -> None:
    """The keyring must not be the data's database (a copy of the data would carry the keys
    that open it): it was taken silently. Now the provider refuses it (`InvalidInputError`,
    an `EncryptionError` as well) before it writes anything there, whatever URL names it."""
    keyring = make_url(store_url)
    if keyring.query.get("pgbouncer"):  # (the same database, not through PgBouncer)
        keyring = keyring.set(port=make_url(pg_admin_url()).port or 5432, query={})
    async with (
        LocalKeyProvider(secrets.token_bytes(32), keyring) as provider,
        SqlContextStore(store_url, encryption=provider) as store,
    ):
        with pytest.raises(InvalidInputError, match="keyring of its own") as caught:
            await _say(store, "c1", "u1", "hello")
        assert isinstance(caught.value, EncryptionError)
        for call in (lambda: provider.create_data_key("u1"), lambda: provider.get_data_key("u1")):
            with pytest.raises(InvalidInputError, match="database of an agentcontext store"):
                await call()

        def tables(sync: Any) -> set[str]:
            from sqlalchemy import inspect

            return set(inspect(sync).get_table_names())

        async with store.engine.connect() as conn:
            found = await conn.run_sync(tables)
        assert "chats" in found
        assert not {"agentcontext_data_keys", "agentcontext_keyring"} & found


async def test_a_store_opened_on_its_keyrings_database_is_refused_before_it_writes(
    backend: str, tmp_path: Path
) -> None:
    """A provider already in use (its keyring made) given to a store on the keyring's own
    database: the store refuses the database when it opens, before its tables are made there
    (the provider's own check ran once, when no store was there yet)."""
    with contextlib.ExitStack() as stack:
        if backend == "sqlite":
            keyring = f"sqlite+aiosqlite:///{tmp_path / 'keyring.db'}"
        else:
            keyring = stack.enter_context(fresh_database(backend, "ackeys"))
        async with LocalKeyProvider(secrets.token_bytes(32), keyring) as provider:
            data = f"sqlite+aiosqlite:///{tmp_path / 'data.db'}"
            async with SqlContextStore(data, encryption=provider) as elsewhere:
                await _say(elsewhere, "c1", "u1", "hello")
            store = SqlContextStore(keyring, encryption=provider)
            with pytest.raises(InvalidInputError, match="holds a keyring") as caught:
                await store.list_chats()
            assert isinstance(caught.value, EncryptionError)
            await store.close()
            assert await provider.get_data_key("u1") is not None  # the keyring still works

            def tables(sync: Any) -> set[str]:
                from sqlalchemy import inspect

                return set(inspect(sync).get_table_names())

            engine = create_async_engine(keyring)
            async with engine.connect() as conn:
                found = await conn.run_sync(tables)
            await engine.dispose()
            assert found == {"agentcontext_data_keys", "agentcontext_keyring"}


async def test_a_store_whose_opening_failed_keeps_no_connection(
    provider: LocalKeyProvider,
) -> None:
    """``async with SqlContextStore(url)`` refused when it opens (here: an encrypted database
    and no provider) runs no ``__aexit__``: the connections the attempt opened stayed open,
    one more for each new store a retrying service made. Now they are closed, and the store
    can be entered again."""
    import asyncpg

    from tests.conftest import _dsn, require_backend

    require_backend("postgres")
    with fresh_database("postgres", "acopenfail") as url:
        async with SqlContextStore(url, encryption=provider) as store:
            await store.create_chat("c1", user_id="u1", title="sealed")
            engine = ContextEngine(store=store, chat_id="c1", user_id="u1")
            engine.set(user("sealed text"))
            await engine.save()
        name = url.rsplit("/", 1)[1]

        async def connections() -> int:
            conn = await asyncpg.connect(_dsn(pg_admin_url()), timeout=5)
            try:
                return int(
                    await conn.fetchval(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = $1", name
                    )
                )
            finally:
                await conn.close()

        kept = []
        for _ in range(3):
            plain = SqlContextStore(url)
            kept.append(plain)  # (not collected: its pool would be)
            with pytest.raises(EncryptionError, match="encryption="):
                async with plain:
                    pass
            assert await connections() == 0
        again = kept[0]
        with pytest.raises(EncryptionError, match="encryption="):
            async with again:  # entered again: refused the same way, not "closed"
                pass
        for store in kept:
            await store.close()


async def test_exists_says_whether_a_keyring_was_made_and_makes_none(tmp_path: Path) -> None:
    path = tmp_path / "keys.db"
    async with LocalKeyProvider(secrets.token_bytes(32), path) as provider:
        assert not await provider.exists()
        assert not path.exists()  # (asking made no file)
        await provider.create_data_key("u1")
        assert await provider.exists()


@pytest.mark.parametrize(
    "keyring",
    [
        "postgresql+asyncpg://postgres@127.0.0.1:1/keys?bogus=1",
        "mysql+asyncmy://u@127.0.0.1:1/keys?bogus=1",
        "mysql+aiomysql://u@127.0.0.1:1/keys?sslmode=require",
    ],
)
def test_a_keyring_url_its_driver_cannot_take_is_refused_when_the_provider_is_made(
    keyring: str,
) -> None:
    """Before, the provider was made, and its first key failed with a raw ``TypeError``
    (``connect() got an unexpected keyword argument``)."""
    with pytest.raises(InvalidInputError, match="takes no argument"):
        LocalKeyProvider(secrets.token_bytes(32), keyring)
    # What the drivers take is accepted (nothing is connected to when the provider is made).
    for fine in ("postgresql+asyncpg://postgres@127.0.0.1:1/keys?ssl=require",
                 "mysql+asyncmy://u@127.0.0.1:1/keys?charset=utf8mb4"):  # fmt: skip
        LocalKeyProvider(secrets.token_bytes(32), fine)
