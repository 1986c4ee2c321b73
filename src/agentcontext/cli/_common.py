"""What every command shares: the database URL and schema, opening the store, exit codes."""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from agentcontext.cli._output import Output
from agentcontext.errors import (
    ContextError,
    InvalidInputError,
    NotFoundError,
    SchemaOutdatedError,
    StoreUnavailableError,
)
from agentcontext.store import SqlContextStore
from agentcontext.store.admin import database_file

__all__ = [
    "DEFAULT_URL",
    "ENV_VAR",
    "EXIT_ERROR",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_OUTDATED",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "Env",
    "KEYRING_ENV_VAR",
    "KEY_ENV_DEFAULT",
    "Handler",
    "SCHEMA_ENV_VAR",
    "exit_code",
    "hidden_url",
    "new_file_removed_on_error",
    "open_store",
    "parse_url",
    "sqlite_file",
]

DEFAULT_URL = "sqlite+aiosqlite:///agentcontext.db"
ENV_VAR = "AGENTCONTEXT_URL"
SCHEMA_ENV_VAR = "AGENTCONTEXT_SCHEMA"
KEYRING_ENV_VAR = "AGENTCONTEXT_KEYRING"
KEY_ENV_DEFAULT = "AGENTCONTEXT_MASTER_KEY"

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_OUTDATED = 4
EXIT_UNAVAILABLE = 5


def exit_code(error: ContextError) -> int:
    """The exit code for an error (see the ``--help`` epilog)."""
    if isinstance(error, InvalidInputError):
        return EXIT_USAGE
    if isinstance(error, NotFoundError):
        return EXIT_NOT_FOUND
    if isinstance(error, SchemaOutdatedError):
        return EXIT_OUTDATED
    if isinstance(error, StoreUnavailableError):
        return EXIT_UNAVAILABLE
    return EXIT_ERROR


def parse_url(url: str) -> URL:
    """The parsed URL, or InvalidInputError (the text is not echoed: it may hold a password)."""
    try:
        return make_url(url)
    except ArgumentError:
        raise InvalidInputError(
            "cannot parse the database URL; expected e.g. sqlite+aiosqlite:///chat.db "
            "or postgresql+asyncpg://user@host/db"
        ) from None


def hidden_url(url: str) -> str:
    """The URL with its password replaced by ``***``."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparseable URL>"


def sqlite_file(url: str) -> Path | None:
    """The file a database URL names (SQLite), or None (another backend, in memory, a URI)."""
    return database_file(str(parse_url(url).render_as_string(hide_password=False)))


@dataclass(frozen=True)
class Env:
    """A command's surroundings: the database URL and schema, where they came from, and the
    output."""

    url: str
    url_explicit: bool
    """True when ``--url`` was given (so suggested commands must repeat it)."""
    out: Output
    schema: str | None = None
    """The tenant's PostgreSQL schema or MariaDB/MySQL database (``--schema``, else
    ``$AGENTCONTEXT_SCHEMA``), or None for the URL's own."""
    schema_explicit: bool = False
    """True when ``--schema`` was given (so suggested commands must repeat it)."""
    keyring: str | None = None
    """The keyring of an encrypted database (``--keyring``, else ``$AGENTCONTEXT_KEYRING``):
    the stores of the commands are opened with a `LocalKeyProvider` on it. None: no
    provider."""
    key_env: str = KEY_ENV_DEFAULT
    """The environment variable holding the base64 master key of ``keyring``."""

    @classmethod
    def from_args(
        cls,
        url: str | None,
        out: Output,
        schema: str | None = None,
        keyring: str | None = None,
        key_env: str | None = None,
    ) -> Env:
        url_explicit, schema_explicit = url is not None, schema is not None
        if url is None:
            url = os.environ.get(ENV_VAR) or DEFAULT_URL
        if schema is None:
            schema = os.environ.get(SCHEMA_ENV_VAR) or None
        if keyring is None:
            keyring = os.environ.get(KEYRING_ENV_VAR) or None
        return cls(
            url, url_explicit, out, schema, schema_explicit, keyring, key_env or KEY_ENV_DEFAULT
        )

    @property
    def shown_url(self) -> str:
        return hidden_url(self.url)

    @property
    def where(self) -> str:
        """The database, and the schema when there is one (password hidden)."""
        return self.shown_url + ("" if self.schema is None else f" (schema {self.schema})")

    def command(self, *words: str) -> str:
        """An ``agentcontext`` command line for this database (``--url`` and ``--schema`` only
        if they were given), each of ``words`` quoted for a POSIX shell: pasted as printed,
        it runs on exactly these words (a chat id ``"abc "`` is not the chat ``abc``)."""
        url = ""
        if self.url_explicit:
            # A URL with a password is never printed whole: a placeholder, not a command line
            # that would fail with '***' for a password.
            shown = self.shown_url
            url = f" --url {shlex.quote(shown)}" if shown == self.url else " --url <the same URL>"
        schema = ""
        if self.schema_explicit and self.schema is not None:
            schema = f" --schema {shlex.quote(self.schema)}"
        return "agentcontext" + url + schema + "".join(f" {shlex.quote(word)}" for word in words)

    def make_store(
        self, *, migrate: Literal["auto", False], encryption: Any = None
    ) -> SqlContextStore:
        """The store at the URL, in the schema (not opened yet). A schema the store refuses
        (SQLite has none; a system schema) is an InvalidInputError that says where it came
        from."""
        try:
            return SqlContextStore(
                self.url, migrate=migrate, schema=self.schema, encryption=encryption
            )
        except InvalidInputError as exc:
            if self.schema is None or self.schema_explicit or "schema" not in str(exc):
                raise
            raise InvalidInputError(
                f"{exc} (the schema {self.schema!r} comes from ${SCHEMA_ENV_VAR}: unset it, or "
                "set it to the schema of this database's tenant)"
            ) from None

    def missing_directory(self) -> NotFoundError | None:
        """An error when the URL names an SQLite file in a directory that does not exist
        (nothing can create the file there), else None."""
        path = sqlite_file(self.url)
        if path is None or path.parent.is_dir():
            return None
        return NotFoundError(
            f"the directory {path.parent} does not exist, so there is no database file "
            f"{path.name} in it; check the path in the URL, or create the directory first "
            f"(mkdir -p {shlex.quote(str(path.parent))})"
        )

    def missing_database(self) -> ContextError | None:
        """An error when the URL names an SQLite file that does not exist (reads never create
        one), or one in a directory that does not exist, else None."""
        missing = self.missing_directory()
        if missing is not None:
            return missing
        path = sqlite_file(self.url)
        if path is None or path.exists():
            return None
        return SchemaOutdatedError(
            f"no agentcontext database at {path} (the file does not exist); "
            f"create it with: {self.command('migrate', 'upgrade')}"
        )


Handler = Callable[[argparse.Namespace, Env], Coroutine[Any, Any, int]]

_SIDECARS = ("", "-journal", "-wal", "-shm")


@contextmanager
def new_file_removed_on_error(url: str) -> Iterator[None]:
    """Remove the SQLite file (and its journal files) a failed command created.

    A command that fails must not leave a new, empty or half-migrated database behind; a file
    that existed before the command is never touched.
    """
    path = sqlite_file(url)
    if path is None or path.exists():
        yield
        return
    try:
        yield
    except BaseException:
        for suffix in _SIDECARS:
            leftover = path.with_name(path.name + suffix)
            with suppress(OSError):
                leftover.unlink(missing_ok=True)
        raise


@asynccontextmanager
async def open_store(
    env: Env, *, write: bool = False, check: Callable[[], None] | None = None
) -> AsyncIterator[SqlContextStore]:
    """The store at the command's URL, in its schema.

    Reading commands never change the schema: an outdated database raises
    SchemaOutdatedError, and a missing SQLite file is not created. Writing commands migrate
    an empty or outdated database to the newest revision first, as the library does. `check`
    runs once the URL is known to be valid and before the database is opened (or created).
    With a keyring (an encrypted database), the store has a `LocalKeyProvider` on it.
    """
    provider = None
    if env.keyring is not None:  # an encrypted database: its key provider
        from agentcontext.encryption import LocalKeyProvider

        provider = LocalKeyProvider.from_env(env.key_env, keyring=env.keyring)
        if not await provider.exists():
            # (A mistyped path or URL would be a new, empty keyring: every chat unreadable,
            # or an import sealed under keys the real keyring does not have.)
            await provider.aclose()
            raise NotFoundError(
                f"there is no keyring at {provider.keyring_url}: check the path or URL (the "
                "command line never makes a keyring; migrate encrypt, or the library, makes one)"
            )
    try:
        # (The URL and the schema are checked here.)
        store = env.make_store(migrate="auto" if write else False, encryption=provider)
        with new_file_removed_on_error(env.url):
            try:
                if check is not None:
                    check()
                missing = env.missing_directory() if write else env.missing_database()
                if missing is not None:
                    raise missing
                await store.initialize()
                yield store
            finally:
                await store.close()
    finally:
        if provider is not None:
            await provider.aclose()
