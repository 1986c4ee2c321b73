"""`agentcontext migrate`: upgrade, downgrade, current and check, with the packaged migrations.

Alembic is imported when a migrate action runs, not when the command line starts.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError

from agentcontext.cli._common import EXIT_OK, Env, new_file_removed_on_error
from agentcontext.errors import (
    EncryptionError,
    InvalidInputError,
    SchemaOutdatedError,
)
from agentcontext.store import SqlContextStore
from agentcontext.store import admin as m

__all__ = ["register"]

_EMPTY = "empty"


def register(commands: Any) -> None:
    """Add ``migrate`` and its actions to the command parsers."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "migrate",
        help="upgrade, downgrade or check the database schema",
        description="Manage the agentcontext schema of the database at --url with the "
        "migrations packaged with this version of agentcontext.",
    )
    schema = argparse.ArgumentParser(add_help=False)
    schema.add_argument(
        "--schema",
        metavar="NAME",
        default=argparse.SUPPRESS,  # given before the command, or $AGENTCONTEXT_SCHEMA
        help="a tenant's schema (PostgreSQL) or database (MariaDB/MySQL), created by upgrade "
        "when missing; default: $AGENTCONTEXT_SCHEMA, else the URL's own",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = actions.add_parser(
        "upgrade",
        parents=[schema],
        help="upgrade the schema (to the newest revision by default)",
        description="Upgrade the schema to REVISION (default: head, the newest). Creates the "
        "tables in an empty database. Safe to run while other processes start.",
    )
    up.add_argument("revision", nargs="?", default="head", metavar="REVISION")
    up.set_defaults(handler=_upgrade)
    down = actions.add_parser(
        "downgrade",
        parents=[schema],
        help="downgrade the schema to a revision ('base' removes it)",
        description="Downgrade the schema to REVISION: a revision id, a relative step such "
        "as -1, or 'base' to drop every agentcontext table (and its data).",
    )
    down.add_argument("revision", metavar="REVISION")
    down.set_defaults(handler=_downgrade)
    current = actions.add_parser(
        "current",
        parents=[schema],
        help="print the database's revision, or 'empty'",
        description="Print the revision the database is at, or 'empty' when it has no "
        "agentcontext schema. Never changes the database.",
    )
    current.set_defaults(handler=_current)
    check = actions.add_parser(
        "check",
        parents=[schema],
        help="exit 0 if the schema is up to date, 4 (with the command to run) if not",
        description="Exit 0 when the database is at the newest revision. Otherwise print the "
        "command that upgrades it and exit 4. Never changes the database.",
    )
    check.set_defaults(handler=_check)
    encrypt = actions.add_parser(
        "encrypt",
        parents=[schema],
        help="encrypt an existing plain database in place (resumable)",
        description="Seal every chat title, chat metadata and message of the database that is "
        "still plain, under each user's data key in the keyring (made when missing), chat by "
        "chat in short transactions. Run it again after an interruption: it finishes the job "
        "and changes nothing that is sealed. Other processes may keep writing meanwhile (with "
        "the same key provider).",
    )
    encrypt.add_argument(
        "--keyring",
        default=argparse.SUPPRESS,  # (given before the command name, or $AGENTCONTEXT_KEYRING)
        metavar="K",
        help="the keyring: a SQLite file path or a database URL (not the data's database; "
        "made when missing); else $AGENTCONTEXT_KEYRING",
    )
    encrypt.add_argument(
        "--key-env",
        default=argparse.SUPPRESS,
        metavar="NAME",
        help="the environment variable holding the base64 master key "
        "(default: AGENTCONTEXT_MASTER_KEY)",
    )
    encrypt.set_defaults(handler=_encrypt)


# --- helpers ------------------------------------------------------------------------------------


@asynccontextmanager
async def _engine_of(env: Env) -> AsyncIterator[SqlContextStore]:
    """A store used only for its engine (never initialised, so nothing is migrated), in the
    command's schema (checked by the store)."""
    store = env.make_store(migrate=False)
    with new_file_removed_on_error(env.url):
        try:
            yield store
        except (SQLAlchemyError, OSError, TimeoutError) as exc:
            raise store.db.translate(exc) from exc
        finally:
            await store.close()


async def _revision(store: SqlContextStore, schema: str | None = None) -> str | None:
    async with store.engine.connect() as conn:
        revision: str | None = await conn.run_sync(m.current_revision, schema)
    return revision


def _require_database(env: Env) -> None:
    missing = env.missing_database()
    if missing is not None:
        raise missing


def _known(revision: str) -> bool:
    from alembic.script import ScriptDirectory
    from alembic.util.exc import CommandError

    try:
        return ScriptDirectory.from_config(m.make_config()).get_revision(revision) is not None
    except CommandError:
        return False


def _label(revision: str | None) -> str:
    if revision is None:
        return _EMPTY
    return f"{revision} (head)" if revision == m.head_revision() else revision


def _newer(env: Env, revision: str) -> SchemaOutdatedError:
    return SchemaOutdatedError(
        f"the database at {env.where} is at revision {revision}, which this version of "
        "agentcontext does not know: it was migrated by a newer version. Upgrade agentcontext."
    )


async def _run(store: SqlContextStore, step: Callable[[Connection], None]) -> None:
    from alembic.util.exc import CommandError

    try:
        await m.run_in_write_transaction(store.engine, step)
    except CommandError as exc:
        raise InvalidInputError(f"migration refused: {exc}") from None


# --- actions ------------------------------------------------------------------------------------


async def _current(args: argparse.Namespace, env: Env) -> int:
    async with _engine_of(env) as store:
        revision = None if env.missing_database() else await _revision(store, env.schema)
    if env.out.rich:
        env.out.line(_label(revision), style="bold")
    else:
        env.out.line(revision or _EMPTY)
    return EXIT_OK


async def _check(args: argparse.Namespace, env: Env) -> int:
    head = m.head_revision()
    async with _engine_of(env) as store:
        _require_database(env)
        revision = await _revision(store, env.schema)
    if revision == head:
        env.out.line(f"up to date: {env.where} is at revision {head} (head)", style="green")
        return EXIT_OK
    if revision is not None and not _known(revision):
        raise _newer(env, revision)
    state = "has no agentcontext schema" if revision is None else f"is at revision {revision}"
    raise SchemaOutdatedError(
        f"the database at {env.where} {state}; this version of agentcontext needs "
        f"revision {head}. Upgrade it with: "
        f"{env.command('migrate', 'upgrade')}"
    )


async def _upgrade(args: argparse.Namespace, env: Env) -> int:
    target: str = args.revision
    async with _engine_of(env) as store:
        before = await _revision(store, env.schema)
        if before is not None and not _known(before):
            raise _newer(env, before)

        def step(connection: Connection) -> None:
            m.upgrade_in_transaction(connection, target, env.schema)

        await _run(store, step)
        after = await _revision(store, env.schema)
    if before == after:
        env.out.line(f"{env.where} is already at revision {_label(after)}")
    else:
        env.out.line(
            f"upgraded {env.where} from {_label(before)} to {_label(after)}", style="green"
        )
    return EXIT_OK


async def _encrypt(args: argparse.Namespace, env: Env) -> int:
    from agentcontext.encryption import LocalKeyProvider

    await env.make_store(migrate=False).close()  # the URL and the schema checked first
    _require_database(env)
    if env.keyring is None:
        raise InvalidInputError(
            "migrate encrypt needs the keyring to keep the data keys in: --keyring K (a SQLite "
            "file path or a database URL other than the data's), or $AGENTCONTEXT_KEYRING"
        )
    provider = LocalKeyProvider.from_env(env.key_env, keyring=env.keyring)
    async with provider:
        if not await provider.exists():
            await _refuse_encrypted(env, provider.keyring_url)
            await provider.create_keyring()  # (made even if there is nothing to seal)
        store = env.make_store(migrate=False, encryption=provider)
        async with store:
            with env.out.progress("encrypting chats") as progress:
                report = await m.encrypt_in_place(store, progress)
    env.out.line(
        f"encrypted {env.where}: {report.chats} chat(s), {report.messages} message(s), "
        f"{report.snapshots} snapshot(s) and {report.records} resolve record(s) sealed now; "
        "every chat is sealed",
        style="green",
    )
    return EXIT_OK


async def _refuse_encrypted(env: Env, keyring: str) -> None:
    """A keyring not made yet is for a plain database: one whose data is sealed already was
    encrypted with another keyring, whose keys a new one cannot have (it would be made for
    nothing, and every chat reported sealed)."""
    plain = env.make_store(migrate=False)
    try:
        await plain.initialize()  # refuses a database marked encrypted, or whose newest
        return  # message is sealed
    except EncryptionError:
        pass
    finally:
        await plain.close()
    # Marked as encrypted by a store that sealed nothing (it holds no chat): nothing is lost
    # with a new keyring.
    async with env.make_store(migrate=False, encryption=_NoKeys()) as look:
        if not await look.list_chats(limit=1):
            return
    raise InvalidInputError(
        f"{env.where} holds encrypted data already, and there is no keyring at {keyring}: "
        "it was encrypted with another keyring. Give migrate encrypt the keyring (and the "
        "master key) its data was written with, to seal what is still plain"
    )


class _NoKeys:
    """A key provider that holds no key and makes none: for a look at whether a database
    holds chats (a sealed one is listed as damaged), without a keyring."""

    async def get_data_key(self, user_id: str) -> bytes | None:
        return None

    async def create_data_key(self, user_id: str) -> bytes:
        raise EncryptionError("migrate encrypt: no key is made while looking at the database")

    async def destroy_data_key(self, user_id: str) -> bool:
        return False


async def _downgrade(args: argparse.Namespace, env: Env) -> int:
    target: str = args.revision
    async with _engine_of(env) as store:
        _require_database(env)
        before = await _revision(store, env.schema)
        if before is not None and not _known(before):
            raise _newer(env, before)

        def step(connection: Connection) -> None:
            m.downgrade_in_transaction(connection, target, env.schema)

        await _run(store, step)
        after = await _revision(store, env.schema)
    if before == after:
        env.out.line(f"{env.where} is already at revision {_label(after)}")
    else:
        env.out.line(
            f"downgraded {env.where} from {_label(before)} to {_label(after)}", style="green"
        )
    return EXIT_OK
