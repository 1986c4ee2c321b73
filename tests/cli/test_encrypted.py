"""The command line on an encrypted database: ``--keyring`` and ``--key-env`` (or
``$AGENTCONTEXT_KEYRING``) give its commands the key provider; without them every command is
refused with one line saying so, and nothing is written in the clear."""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
from pathlib import Path

from agentcontext import ContextEngine, LocalKeyProvider, SqlContextStore, assistant_text, user
from tests.cli.helpers import clean_env, run_cli, sqlite_url

PLANT = "zebracorn" + secrets.token_hex(3)


async def _fill(url: str, master: bytes, keyring: Path) -> None:
    async with (
        LocalKeyProvider(master, keyring) as provider,
        SqlContextStore(url, encryption=provider) as store,
    ):
        other = ContextEngine(store=store, chat_id="c0", user_id="bob")
        other.set(user("bob's own words"))
        await other.save()
        await store.create_chat("c1", user_id="alice", title="alice's chat")
        engine = ContextEngine(store=store, chat_id="c1", user_id="alice")
        engine.set(user(f"tell me about {PLANT}"), assistant_text("a sealed answer"))
        await engine.save()


def test_commands_on_an_encrypted_database_need_its_keyring(tmp_path: Path) -> None:
    master, keyring = secrets.token_bytes(32), tmp_path / "keyring.db"
    url = sqlite_url(tmp_path / "data.db")
    asyncio.run(_fill(url, master, keyring))
    env = {**clean_env(), "MY_MASTER_KEY": base64.b64encode(master).decode()}
    keys = ("--keyring", str(keyring), "--key-env", "MY_MASTER_KEY")

    # Without the keyring: one line saying what to pass, never a traceback.
    refused = run_cli("--url", url, "chats", cwd=tmp_path, env=env)
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: ") and "--keyring" in refused.stderr
    assert "Traceback" not in refused.stderr

    listed = run_cli("--url", url, *keys, "chats", cwd=tmp_path, env=env)
    assert listed.returncode == 0, listed.stderr
    assert "alice's chat" in listed.stdout
    shown = run_cli("--url", url, "show", "c1", *keys, cwd=tmp_path, env=env)  # after it, too
    assert shown.returncode == 0, shown.stderr
    assert PLANT in shown.stdout
    found = run_cli("--url", url, *keys, "search", "c1", PLANT, cwd=tmp_path, env=env)
    assert found.returncode == 0, found.stderr
    assert PLANT in found.stdout

    # The keyring from the environment; an export, then an import as another chat.
    env_keyring = {**env, "AGENTCONTEXT_KEYRING": str(keyring), "AGENTCONTEXT_MASTER_KEY": env["MY_MASTER_KEY"]}  # fmt: skip
    export = tmp_path / "c1.json"
    exported = run_cli(
        "--url", url, "export", "c1", "-o", str(export), cwd=tmp_path, env=env_keyring
    )
    assert exported.returncode == 0, exported.stderr
    assert json.loads(export.read_text())["chat"]["id"] == "c1"
    deleted = run_cli("--url", url, "delete", "c1", cwd=tmp_path, env=env_keyring)
    assert deleted.returncode == 0, deleted.stderr
    refused = run_cli("--url", url, "import", str(export), cwd=tmp_path, env=env)
    assert refused.returncode == 1 and "--keyring" in refused.stderr
    imported = run_cli("--url", url, "import", str(export), cwd=tmp_path, env=env_keyring)
    assert imported.returncode == 0, imported.stderr
    raw = b"".join(path.read_bytes() for path in tmp_path.glob("data.db*"))
    assert PLANT.encode() not in raw, "text in the clear in the encrypted database"

    # A wrong master key is an error too, with nothing read.
    wrong = {**env, "MY_MASTER_KEY": base64.b64encode(secrets.token_bytes(32)).decode()}
    failed = run_cli("--url", url, *keys, "show", "c1", cwd=tmp_path, env=wrong)
    assert failed.returncode == 1 and "master key" in failed.stderr
    assert PLANT not in failed.stdout


def test_a_keyring_path_that_names_no_file_is_refused(tmp_path: Path) -> None:
    """A mistyped keyring would be a new, empty one: every chat unreadable, or an import
    sealed under keys the real keyring does not have. The command line makes no keyring."""
    master, keyring = secrets.token_bytes(32), tmp_path / "keyring.db"
    url = sqlite_url(tmp_path / "data.db")
    asyncio.run(_fill(url, master, keyring))
    env = {**clean_env(), "AGENTCONTEXT_MASTER_KEY": base64.b64encode(master).decode()}
    typo = tmp_path / "keyrnig.db"
    for command in (["chats"], ["show", "c1"], ["search", "c1", "sealed"]):
        refused = run_cli("--url", url, "--keyring", str(typo), *command, cwd=tmp_path, env=env)
        assert refused.returncode == 3, refused.stderr
        assert "no keyring at" in refused.stderr
        assert not typo.exists()


def test_migrate_encrypt_and_demo_take_the_keyring_before_the_command_too(
    tmp_path: Path,
) -> None:
    master = secrets.token_bytes(32)
    env = {**clean_env(), "AGENTCONTEXT_MASTER_KEY": base64.b64encode(master).decode()}
    url = sqlite_url(tmp_path / "plain.db")
    keyring = tmp_path / "keys.db"
    made = run_cli("--url", url, "demo", cwd=tmp_path, env=env)
    assert made.returncode == 0, made.stderr
    encrypted = run_cli(
        "--url", url, "--keyring", str(keyring), "migrate", "encrypt", cwd=tmp_path, env=env
    )
    assert encrypted.returncode == 0, encrypted.stderr
    assert "every chat is sealed" in encrypted.stdout
    # The demo again, on the database it encrypted: with the keyring it runs, without it not.
    again = run_cli("--url", url, "demo", "--keyring", str(keyring), cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stderr
    refused = run_cli("--url", url, "demo", cwd=tmp_path, env=env)
    assert refused.returncode == 1 and "--keyring" in refused.stderr
    missing = run_cli("--url", url, "migrate", "encrypt", cwd=tmp_path, env=env)
    assert missing.returncode == 2 and "--keyring" in missing.stderr


def test_a_keyring_url_of_a_database_without_a_keyring_is_refused(tmp_path: Path) -> None:
    """A keyring URL naming the wrong (an empty) database: the provider would make a new
    keyring there, and an import would seal the chat under a key no worker has."""
    from sqlalchemy import make_url

    from tests.conftest import fresh_database, require_backend

    require_backend("postgres")
    master, keyring = secrets.token_bytes(32), tmp_path / "keyring.db"
    url = sqlite_url(tmp_path / "data.db")
    asyncio.run(_fill(url, master, keyring))
    env = {**clean_env(), "AGENTCONTEXT_MASTER_KEY": base64.b64encode(master).decode()}
    export = tmp_path / "c1.json"
    keys = ("--keyring", str(keyring))
    assert run_cli("--url", url, *keys, "export", "c1", "-o", str(export), cwd=tmp_path, env=env).returncode == 0  # fmt: skip
    assert run_cli("--url", url, *keys, "delete", "c1", cwd=tmp_path, env=env).returncode == 0
    with fresh_database("postgres", "acemptykeys") as empty:
        for command in (["chats"], ["import", str(export)]):
            refused = run_cli("--url", url, "--keyring", empty, *command, cwd=tmp_path, env=env)
            assert refused.returncode == 3, refused.stderr
            assert "no keyring at" in refused.stderr
            assert (
                make_url(empty).password is None or make_url(empty).password not in refused.stderr
            )

        async def tables() -> list[str]:
            from sqlalchemy import inspect
            from sqlalchemy.ext.asyncio import create_async_engine

            engine = create_async_engine(empty)
            try:
                async with engine.connect() as conn:
                    return await conn.run_sync(lambda sync: inspect(sync).get_table_names())
            finally:
                await engine.dispose()

        assert asyncio.run(tables()) == []  # no keyring was made there


def test_migrate_encrypt_with_a_new_keyring_on_an_encrypted_database_is_refused(
    tmp_path: Path,
) -> None:
    """The database was encrypted with another keyring: a new one would be made for nothing
    (its keys open none of the data), and the command said every chat was sealed."""
    master, keyring = secrets.token_bytes(32), tmp_path / "keyring.db"
    url = sqlite_url(tmp_path / "data.db")
    asyncio.run(_fill(url, master, keyring))
    env = {**clean_env(), "AGENTCONTEXT_MASTER_KEY": base64.b64encode(master).decode()}
    other = tmp_path / "other-keyring.db"
    refused = run_cli("--url", url, "migrate", "encrypt", "--keyring", str(other), cwd=tmp_path, env=env)  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert "encrypted data already" in refused.stderr
    assert not other.exists()
    again = run_cli("--url", url, "migrate", "encrypt", "--keyring", str(keyring), cwd=tmp_path, env=env)  # fmt: skip
    assert again.returncode == 0, again.stderr


def test_a_keyring_server_that_cannot_be_reached_exits_5(tmp_path: Path) -> None:
    """A keyring on a server that does not answer is the database that cannot be reached
    (exit 5), not a keyring that was never made (exit 3) nor a generic error (exit 1)."""
    import socket

    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    master = secrets.token_bytes(32)
    url = sqlite_url(tmp_path / "data.db")
    asyncio.run(_fill(url, master, tmp_path / "keyring.db"))
    env = {**clean_env(), "AGENTCONTEXT_MASTER_KEY": base64.b64encode(master).decode()}
    for keyring in (
        f"postgresql+asyncpg://postgres@127.0.0.1:{port}/keys",
        f"mysql+asyncmy://root@127.0.0.1:{port}/keys",
    ):
        refused = run_cli("--url", url, "--keyring", keyring, "chats", cwd=tmp_path, env=env)
        assert refused.returncode == 5, refused.stderr
        assert "cannot be used" in refused.stderr and "Traceback" not in refused.stderr


class _KeysWithoutKeyring:
    """A provider with the three methods of `KeyProvider` only (no ``create_keyring``): what
    a store opened with before it made the keyring of a database it marked as encrypted."""

    def __init__(self, provider: LocalKeyProvider) -> None:
        self.provider = provider

    async def get_data_key(self, user_id: str) -> bytes | None:
        return await self.provider.get_data_key(user_id)

    async def create_data_key(self, user_id: str) -> bytes:
        return await self.provider.create_data_key(user_id)

    async def destroy_data_key(self, user_id: str) -> bool:
        return await self.provider.destroy_data_key(user_id)


def test_an_encrypted_database_that_holds_no_chat_yet_has_its_keyring(tmp_path: Path) -> None:
    """An encrypted store that opens an empty database marks it as encrypted: it makes the
    keyring first, so the command line (which never makes one) works on it. And a database
    marked so without a keyring (as stores did before), holding no chat, is encrypted by
    `migrate encrypt` with a new keyring instead of being refused as encrypted elsewhere."""
    master = secrets.token_bytes(32)
    env = {**clean_env(), "AGENTCONTEXT_MASTER_KEY": base64.b64encode(master).decode()}

    async def open_empty(url: str, keyring: Path, *, hook: bool) -> bool:
        async with LocalKeyProvider(master, keyring) as provider:
            given = provider if hook else _KeysWithoutKeyring(provider)
            async with SqlContextStore(url, encryption=given):
                pass
            return await provider.exists()

    url, keyring = sqlite_url(tmp_path / "new.db"), tmp_path / "keyring.db"
    assert asyncio.run(open_empty(url, keyring, hook=True))
    listed = run_cli("--url", url, "--keyring", str(keyring), "chats", cwd=tmp_path, env=env)
    assert listed.returncode == 0, listed.stderr
    assert run_cli("--url", url, "chats", cwd=tmp_path, env=env).returncode == 1  # (encrypted)

    url, keyring = sqlite_url(tmp_path / "marked.db"), tmp_path / "later-keyring.db"
    assert not asyncio.run(open_empty(url, keyring, hook=False))
    keyring.unlink(missing_ok=True)
    encrypted = run_cli(
        "--url", url, "--keyring", str(keyring), "migrate", "encrypt", cwd=tmp_path, env=env
    )
    assert encrypted.returncode == 0, encrypted.stderr
    listed = run_cli("--url", url, "--keyring", str(keyring), "chats", cwd=tmp_path, env=env)
    assert listed.returncode == 0, listed.stderr


def test_delete_deletes_a_chat_whose_key_was_destroyed(tmp_path: Path) -> None:
    """A backup restored after its user was erased holds a chat no key opens: ``delete`` says
    it deleted it (it read the chat first, and failed with the key error)."""
    import shutil

    master, keyring = secrets.token_bytes(32), tmp_path / "keyring.db"
    url = sqlite_url(tmp_path / "data.db")
    asyncio.run(_fill(url, master, keyring))
    shutil.copy(tmp_path / "data.db", tmp_path / "backup.db")

    async def erase() -> None:
        async with (
            LocalKeyProvider(master, keyring) as provider,
            SqlContextStore(url, encryption=provider) as store,
        ):
            await store.erase_user("alice")

    asyncio.run(erase())
    shutil.copy(tmp_path / "backup.db", tmp_path / "data.db")
    env = {**clean_env(), "AGENTCONTEXT_MASTER_KEY": base64.b64encode(master).decode()}
    keys = ("--url", url, "--keyring", str(keyring))
    wrong = run_cli(*keys, "delete", "c1", "--user", "bob", cwd=tmp_path, env=env)
    assert wrong.returncode == 3 and "user 'bob' has no chat 'c1'" in wrong.stderr
    deleted = run_cli(*keys, "delete", "c1", "--user", "alice", cwd=tmp_path, env=env)
    assert deleted.returncode == 0, deleted.stderr
    assert "deleted chat c1 (it could not be read)" in deleted.stdout
    gone = run_cli(*keys, "delete", "c1", cwd=tmp_path, env=env)
    assert gone.returncode == 3 and "does not exist" in gone.stderr
    listed = run_cli(*keys, "chats", "--json", cwd=tmp_path, env=env)
    assert listed.returncode == 0, listed.stderr
    assert [chat["id"] for chat in json.loads(listed.stdout)] == ["c0"]
