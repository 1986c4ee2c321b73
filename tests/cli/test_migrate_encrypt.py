"""`agentcontext migrate encrypt`: an existing plain database encrypted in place, resumable.

The command is killed (SIGKILL) part way through, then run again: it finishes, a third run
seals nothing, the planted text is gone from the raw database, every chat reads as before
and search finds what it found when the database was plain.
"""

from __future__ import annotations

import asyncio
import base64
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentcontext import ContextEngine, EncryptionError, LocalKeyProvider, SqlContextStore
from agentcontext.snapshots import ContextSnapshot
from agentcontext.store import MessageRecord
from tests.cli.helpers import clean_env, run_cli, sqlite_url
from tests.conftest import fresh_database, require_backend

PLANT = "zqvplain" + secrets.token_hex(4)
CHATS = 120


async def _fill(url: str) -> dict[str, list[str]]:
    """Plain chats of three users; each chat's texts."""
    texts: dict[str, list[str]] = {}
    async with SqlContextStore(url) as store:
        for n in range(CHATS):
            chat = f"chat-{n:04d}"
            await store.create_chat(
                chat, user_id=f"user-{n % 3}", title=f"title {PLANT}", metadata={"n": n}
            )
            records, parent = [], None
            for i in range(20):
                message_id = f"{chat}-{i}"
                body = f"message {i} of {chat} {PLANT if i % 5 == 0 else 'plain words'}"
                role = "user" if i % 2 == 0 else "assistant"
                data = {"id": message_id, "role": role, "parts": [{"type": "text", "text": body}]}
                records.append(
                    MessageRecord(
                        id=message_id, chat_id=chat, parent_id=parent, name=role, data=data
                    )
                )
                parent = message_id
            branch = await store.get_active_branch(chat)
            assert branch is not None
            assert (await store.append_messages(branch.id, records, expected_head=None)).ok
            texts[chat] = [r.data["parts"][0]["text"] for r in records]
            if n % 10 == 0:  # a context snapshot and a resolve record, sealed with the chat
                engine = ContextEngine(store=store, chat_id=chat, user_id=f"user-{n % 3}")
                draft = ContextSnapshot(summary=f"saw {PLANT}")
                draft.add_file(f"{chat}.txt", f"file of {chat} {PLANT}")
                await engine.snapshot(draft)
                await engine.resolve(record=True)
    return texts


@pytest.fixture(params=["sqlite", "postgres", "mariadb"])
def plain_url(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    if request.param == "sqlite":
        yield sqlite_url(tmp_path / "plain.db")
    else:
        require_backend(request.param)
        with fresh_database(request.param, "acenc") as url:
            yield url


def _command(url: str, keyring: Path) -> list[str]:
    return [
        sys.executable, "-m", "agentcontext", "--url", url, "migrate", "encrypt",
        "--keyring", str(keyring), "--key-env", "TEST_MASTER_KEY",
    ]  # fmt: skip


def test_migrate_encrypt_survives_a_kill_and_finishes(plain_url: str, tmp_path: Path) -> None:
    texts = asyncio.run(_fill(plain_url))
    plain_hits = asyncio.run(_hits(plain_url, None))
    master = secrets.token_bytes(32)
    keyring = tmp_path / "keyring.db"
    env = clean_env({"TEST_MASTER_KEY": base64.b64encode(master).decode()})

    # Killed once some chats are sealed (the progress line says how far it is).
    process = subprocess.Popen(
        _command(plain_url, keyring), env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, cwd=tmp_path,
    )  # fmt: skip
    assert process.stderr is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line or line.startswith("encrypting chats: "):
            break
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL

    again = run_cli(
        "--url", plain_url, "migrate", "encrypt", "--keyring", str(keyring),
        "--key-env", "TEST_MASTER_KEY", cwd=tmp_path,
        env={"TEST_MASTER_KEY": base64.b64encode(master).decode()},
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    sealed_now = int(again.stdout.split(": ")[1].split(" chat")[0])
    assert 0 < sealed_now < CHATS  # the killed run had sealed some, not all
    third = run_cli(
        "--url", plain_url, "migrate", "encrypt", "--keyring", str(keyring),
        "--key-env", "TEST_MASTER_KEY", cwd=tmp_path,
        env={"TEST_MASTER_KEY": base64.b64encode(master).decode()},
    )  # fmt: skip
    assert third.returncode == 0 and "0 chat(s), 0 message(s)" in third.stdout

    asyncio.run(_check_sealed(plain_url, master, keyring, texts, plain_hits))
    if plain_url.startswith("sqlite"):
        raw = b"".join(p.read_bytes() for p in tmp_path.glob("plain.db*"))
        assert PLANT.encode() not in raw or _only_in_free_pages(tmp_path / "plain.db")


async def _hits(url: str, provider: LocalKeyProvider | None) -> list[str]:
    async with SqlContextStore(url, encryption=provider) as store:
        return [h.message.id for h in await store.search_messages("chat-0003", PLANT)]


async def _check_sealed(
    url: str, master: bytes, keyring: Path, texts: dict[str, list[str]], plain_hits: list[str]
) -> None:
    async with LocalKeyProvider(master, keyring) as provider:
        async with SqlContextStore(url, encryption=provider) as store:
            for chat, expected in texts.items():
                got = [r.data["parts"][0]["text"] for r in await store.get_messages(chat)]
                assert got == expected, chat
            user_hits = await store.search_user_messages("user-0", PLANT, limit=500)
            assert len(user_hits) == 4 * CHATS // 3
            assert {c.title for c in await store.list_chats()} == {f"title {PLANT}"}
            for n in range(0, CHATS, 10):
                chat = f"chat-{n:04d}"
                (listed,) = await store.list_snapshots(chat)
                assert listed.id is not None and listed.summary == f"saw {PLANT}"
                snapshot = await store.get_snapshot(listed.id, with_content=True)
                assert snapshot is not None
                assert (
                    next(iter(snapshot.contents.values()))[0] == f"file of {chat} {PLANT}".encode()
                )
                engine = ContextEngine(store=store, chat_id=chat, user_id=f"user-{n % 3}")
                (record,) = await store.list_resolve_records(chat)
                replayed = await engine.replay(record.id)
                assert [m.id for m in replayed.messages][-1] == f"{chat}-19"
        assert await _hits(url, provider) == plain_hits and plain_hits
    with pytest.raises(EncryptionError, match="encrypted"):
        async with SqlContextStore(url) as plain:  # refused at open: no text in the clear
            await plain.get_messages("chat-0001")


def _only_in_free_pages(path: Path) -> bool:
    """SQLite leaves old page contents in free pages until they are reused: after a VACUUM
    the plain text is gone for good (the docs say to VACUUM after `migrate encrypt`)."""
    import sqlite3

    connection = sqlite3.connect(path)
    try:
        connection.execute("VACUUM")
    finally:
        connection.close()
    raw = b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))
    return PLANT.encode() not in raw


def test_migrate_encrypt_needs_the_master_key(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "data.db")
    asyncio.run(_fill_one(url))
    result = run_cli(
        "--url", url, "migrate", "encrypt", "--keyring", str(tmp_path / "k.db"),
        "--key-env", "NO_SUCH_KEY_VARIABLE", cwd=tmp_path, env={},
    )  # fmt: skip
    assert result.returncode != 0
    assert "NO_SUCH_KEY_VARIABLE" in result.stderr
    assert os.environ.get("NO_SUCH_KEY_VARIABLE") is None


async def _fill_one(url: str) -> None:
    async with SqlContextStore(url) as store:
        await store.create_chat("c1", user_id="u1", title="t")
