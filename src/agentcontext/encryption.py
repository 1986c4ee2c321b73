"""Keys for encryption at rest: the `KeyProvider` protocol and `LocalKeyProvider`.

A store opened with ``SqlContextStore(url, encryption=provider)`` encrypts what users wrote
(message contents, chat titles and metadata) with AES-256-GCM under one random *data key per
user*. The provider holds those keys **outside the database** — the database only names them —
so that destroying a user's key (``erase_user`` does) makes that user's rows unreadable in
every copy of the database: backups, replicas, old WAL.

`LocalKeyProvider` keeps the data keys in a *keyring* (a SQLite file or a database of its own),
each one wrapped (encrypted) under a *master key* that never touches a disk it does not have to:
read it from the environment (`LocalKeyProvider.from_env`) or a secret manager. A provider
backed by a KMS or Vault is one small class with the three methods of `KeyProvider` (see the
encryption page of the docs).

Needs the ``encryption`` extra (``pip install 'agentcontext[encryption]'``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import os
import secrets
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from sqlalchemy import (
    exists,
    func,
    inspect,
    literal,
    select,
    update,
)
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, InvalidRequestError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from agentcontext._drivers import is_connection_error, unknown_arguments
from agentcontext._keyring import CHECK, KEYS, METADATA, inexact_user_ids
from agentcontext.errors import (
    EncryptionError,
    InvalidInputError,
    InvalidTypeError,
    MissingExtraError,
    StoreUnavailableError,
)

__all__ = ["KeyProvider", "LocalKeyProvider", "key_fingerprint"]

KEY_BYTES = 32
"""AES-256: every master key and data key is 32 random bytes."""

KEY_RECHECK_SECONDS = 30.0
"""An unwrapped key held longer than this is read from the keyring again before it is given
out: a key another process destroyed (``erase_user``) is not given out for longer (with the
store's own half minute, `WRITE_RECHECK_SECONDS`, an erasure reaches every process within a
minute)."""

_WRAP_AAD = b"agentcontext-data-key\x00"
_CHECK_TEXT = b"agentcontext-keyring-master-key\x00"
_CHECK_ROW = "master"
_STORE_TABLE = "agentcontext_version"
"""A table every agentcontext store's database holds (``store/_db/schema.VERSION_TABLE``): a
keyring that finds it in its own database is in the data's database, which it must not be."""


@runtime_checkable
class KeyProvider(Protocol):
    """Where a store's data keys live: one random 32-byte key per user, never in the store's
    database. A store asks for a user's key when it first reads or writes that user's rows and
    keeps it in memory (bounded)."""

    async def get_data_key(self, user_id: str) -> bytes | None:
        """The data key of ``user_id``, or None when the user has none (never had one, or it
        was destroyed)."""
        ...

    async def create_data_key(self, user_id: str) -> bytes:
        """The data key of ``user_id``, made (32 random bytes) and kept if the user has none.
        Concurrent calls for one user must return the same key."""
        ...

    async def destroy_data_key(self, user_id: str) -> bool:
        """Destroy the data key of ``user_id`` for good; whether there was one."""
        ...

    # Optional: a provider that keeps keys in memory defines ``forget_cached_key(user_id) ->
    # None`` (not async); a store calls it when the key it holds may be stale (another
    # process may have erased the user and made a new key), so that the next ask reads
    # afresh. A provider that keeps its keys in a keyring it makes itself defines ``async
    # create_keyring() -> None``; a store calls it before it first marks a database as
    # encrypted, so that such a database always has its keyring. `LocalKeyProvider` has both.


def key_fingerprint(key: bytes) -> str:
    """A short, one-way name of a key (16 hex digits): tells keys apart without revealing them."""
    return hashlib.blake2b(key, digest_size=8, person=b"agentcontext-fp").hexdigest()


def _aesgcm(key: bytes) -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:  # pragma: no cover - the extra is installed in the tests
        raise MissingExtraError(
            "encryption needs the cryptography package: pip install 'agentcontext[encryption]'"
        ) from None
    return AESGCM(key)


def _check_key(key: object, what: str) -> bytes:
    if not isinstance(key, (bytes, bytearray)):
        raise InvalidTypeError(f"{what} must be {KEY_BYTES} bytes, got {type(key).__name__}")
    if len(key) != KEY_BYTES:
        raise InvalidInputError(
            f"{what} must be {KEY_BYTES} bytes (AES-256), got {len(key)}; make one with "
            "secrets.token_bytes(32)"
        )
    return bytes(key)


def _check_user(user_id: object) -> str:
    if not isinstance(user_id, str) or not user_id:
        raise InvalidInputError("a data key belongs to a user: user_id must be a non-empty str")
    return user_id


class KeyringUnavailableError(EncryptionError, StoreUnavailableError):
    """The keyring's database cannot be reached: an `EncryptionError` (no key can be had),
    and a `StoreUnavailableError` (try again once it is up; the command line exits 5)."""


class KeyringInStoreError(EncryptionError, InvalidInputError):
    """The keyring is in the database of a store (a copy of the data would carry the keys that
    open it): an `InvalidInputError`, and an `EncryptionError` so that a store passes it on
    as it is."""


@dataclass(frozen=True, slots=True)
class _Master:
    """A master key with what is derived from it (replaced whole by `rotate`, so that a
    task of another thread never pairs one key's cipher with another's check value)."""

    aead: Any
    fingerprint: str
    check: str

    @classmethod
    def of(cls, key: bytes) -> _Master:
        check = hmac.new(key, _CHECK_TEXT, hashlib.sha256).hexdigest()
        return cls(_aesgcm(key), key_fingerprint(key), check)


class LocalKeyProvider:
    """Data keys in a keyring of their own, each wrapped under ``master_key`` (AES-256-GCM,
    bound to its user).

    ``keyring`` is the path of a SQLite file or a SQLAlchemy async URL (``sqlite+aiosqlite://``,
    ``postgresql+asyncpg://``, ``mysql+asyncmy://``) of a database that is *not* the store's:
    a copy of the store's database must not carry the keys that open it. Back the keyring up
    apart from the data (see the encryption page of the docs). A destroyed key leaves a
    tombstone (its user and when), so an erased user is told apart from a wrong keyring. The
    keyring keeps a check value of its master key: a provider with another one (a wrong one, or
    the one before a `rotate` in another process) reads and makes no key (`EncryptionError`),
    and a keyring in a store's database is refused (`InvalidInputError`).

    Unwrapped keys are kept in memory, at most ``cache_size`` of them (least recently used
    first out). Use it as an async context manager, or call `aclose`.

    One provider serves stores of every event loop of the process (an ``asyncio.run()`` per
    job, a loop per thread): a connection of a server's driver belongs to the loop it was
    opened in, so the keyring is reached through an engine of each loop's own.
    """

    def __init__(
        self,
        master_key: bytes,
        keyring: str | os.PathLike[str] | URL,
        *,
        cache_size: int = 10_000,
    ) -> None:
        self._m = _Master.of(_check_key(master_key, "master_key"))
        self._verified: tuple[str, float] | None = None  # (check value, when), see `_verify`
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
            raise InvalidInputError("cache_size must be a positive int")
        self._cache_size = cache_size
        self._cache: OrderedDict[str, tuple[bytes, float]] = OrderedDict()
        self._url = _keyring_url(keyring)
        self._spare: AsyncEngine | None = _keyring_engine(self._url)  # (no I/O yet)
        self._engines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Keyring] = (
            weakref.WeakKeyDictionary()
        )
        self._handing = threading.Lock()
        self._ready = False

    @classmethod
    def from_env(
        cls,
        name: str = "AGENTCONTEXT_MASTER_KEY",
        *,
        keyring: str | os.PathLike[str] | URL,
        cache_size: int = 10_000,
    ) -> LocalKeyProvider:
        """A provider whose master key is the base64 text of the environment variable
        ``name`` (make one with ``python -c "import base64, secrets;
        print(base64.b64encode(secrets.token_bytes(32)).decode())"``)."""
        text = os.environ.get(name)
        if not text:
            raise EncryptionError(
                f"the environment variable {name} holding the master key is not set; set it to "
                "the base64 text of the 32-byte master key the keyring was made with"
            )
        try:
            key = base64.b64decode(text.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise EncryptionError(
                f"the environment variable {name} is not base64 text; it must hold the base64 "
                "text of a 32-byte master key"
            ) from None
        if len(key) != KEY_BYTES:
            raise EncryptionError(
                f"the environment variable {name} holds a {len(key)}-byte key; the master key "
                f"is {KEY_BYTES} bytes"
            )
        return cls(key, keyring, cache_size=cache_size)

    @property
    def keyring_url(self) -> str:
        """The keyring's URL (password hidden)."""
        return self._url.render_as_string(hide_password=True)

    async def exists(self) -> bool:
        """Whether the keyring has been made (its tables are there). Nothing is made: a tool
        that must not start a new keyring (a mistyped path or URL would be an empty one, and
        every user's key missing) asks this first."""
        # Connecting to a file database makes the file: one that was not there before and
        # is empty after is taken away again.
        database = self._url.database
        file = Path(database) if database and not database.startswith(":") else None
        there = file is not None and file.exists()
        try:
            return await self._has_tables(self._keyring().engine, quiet=False)
        except (OSError, SQLAlchemyError) as exc:
            if is_connection_error(exc):  # (a server that cannot be reached, say)
                raise self._failed(exc) from exc
            return False  # (a database that is not there: no keyring)
        finally:
            if file is not None and not there and file.is_file() and not file.stat().st_size:
                await self.aclose()  # (its connection first)
                file.unlink(missing_ok=True)

    async def create_keyring(self) -> None:
        """Make the keyring (its tables) if it is not there yet: `exists` is true after it.
        A store calls it before it first marks a database as encrypted, so that an encrypted
        database always has its keyring, even before any user has a key."""
        await self._open()

    async def get_data_key(self, user_id: str) -> bytes | None:
        """The data key of ``user_id``, or None (never made, or destroyed)."""
        user_id = _check_user(user_id)
        found = self._cache.get(user_id)
        if found is not None and time.monotonic() - found[1] <= KEY_RECHECK_SECONDS:
            self._cache.move_to_end(user_id)
            return found[0]
        engine = await self._open()
        await self._verify(engine)
        row = await self._read(engine, user_id)
        if row is None or row[0] is None:
            return None
        return self._remember(user_id, self._unwrap(user_id, row[0], row[1]))

    def forget_cached_key(self, user_id: str) -> None:
        """Drop the unwrapped key of ``user_id`` from memory: the next ask reads the keyring
        (a store calls it when a key it was given is not the one a value names, or has been
        held for long: another process may have erased the user and made a new key)."""
        self._cache.pop(user_id, None)

    async def create_data_key(self, user_id: str) -> bytes:
        """The data key of ``user_id``, made and kept if it has none (a destroyed key is
        replaced by a new one: data sealed under the old key stays unreadable). Refused with
        an `EncryptionError` when this provider's master key is not the keyring's (a wrong
        one, or the one before a `rotate` in another process): no key is ever written that
        the keyring's master key does not open."""
        user_id = _check_user(user_id)
        existing = await self.get_data_key(user_id)
        if existing is not None:
            return existing
        engine = await self._open()
        for _ in range(3):
            master = self._m
            wrote = await self._write_key(engine, user_id, master)
            row = await self._read(engine, user_id)
            if row is not None and row[0] is not None:
                return self._remember(user_id, self._unwrap(user_id, row[0], row[1]))
            if wrote:  # pragma: no cover - destroyed at the same moment
                raise EncryptionError(
                    f"the data key of user {user_id!r} was destroyed while it was being made",
                    key_id=user_id,
                )
            # Nothing written: the keyring's master key is not (or no longer) this one, or it
            # has no check value yet (a keyring restored from a backup of an older version).
            await self._verify(engine, force=True)
        raise EncryptionError(  # pragma: no cover - the keyring's master changing under us
            f"the data key of user {user_id!r} could not be made: the master key of the keyring "
            f"{self.keyring_url} kept changing (rotated meanwhile); try again",
            key_id=user_id,
        )

    async def destroy_data_key(self, user_id: str) -> bool:
        """Destroy the data key of ``user_id`` (a tombstone stays); whether there was one.
        (Needs no master key: a worker with a wrong one still erases.)"""
        user_id = _check_user(user_id)
        engine = await self._open()
        self._cache.pop(user_id, None)
        try:
            async with engine.begin() as conn:
                result = await conn.execute(
                    update(KEYS)
                    .where(KEYS.c.user_id == user_id, KEYS.c.wrapped.is_not(None))
                    .values(wrapped=None, master=None, destroyed_at=datetime.now(UTC))
                )
        except (SQLAlchemyError, OSError) as exc:
            raise self._failed(exc) from exc
        self._cache.pop(user_id, None)
        return bool(result.rowcount)

    async def destroyed_at(self, user_id: str) -> datetime | None:
        """When the data key of ``user_id`` was destroyed, or None (it was not)."""
        engine = await self._open()
        row = await self._read(engine, _check_user(user_id))
        return None if row is None else row[2]

    async def rotate(self, new_master_key: bytes) -> int:
        """Wrap every data key under ``new_master_key`` instead (one transaction; no message
        is rewritten) and use it from now on; returns how many keys were wrapped again. Keep
        the old master key until the keyring's backups are taken again.

        The keyring's check value of its master key is replaced in the same transaction:
        from then on every other provider still holding the old master key (another worker)
        refuses to read or make keys, with an `EncryptionError` saying to restart it with the
        new master key; none makes a key wrapped under the old one."""
        new = _Master.of(_check_key(new_master_key, "new_master_key"))
        # The rotation runs to its end in a task of its own: a caller cancelled (a timeout)
        # once its transaction may have committed must not leave the keyring under the new
        # master key and this provider under the old one. Calling again with the same key
        # after a cancellation wraps the keys again under it and returns the same count.
        task = asyncio.ensure_future(self._rotate(new))
        task.add_done_callback(_retrieved)
        return await asyncio.shield(task)

    async def _rotate(self, new: _Master) -> int:
        engine = await self._open()
        async with self._keyring().rotating:  # (a retry waits for the rotation it retries)
            return await self._rotate_now(engine, new)

    async def _rotate_now(self, engine: AsyncEngine, new: _Master) -> int:
        try:
            async with engine.connect() as conn:
                found = (
                    await conn.execute(select(CHECK.c.value).where(CHECK.c.name == _CHECK_ROW))
                ).scalar_one_or_none()
                if found is not None and hmac.compare_digest(str(found), new.check):
                    # Rotated to this key already (a call whose caller stopped waiting, whose
                    # event loop ended before it could say so): the same call once more.
                    self._m, self._verified = new, (new.check, time.monotonic())
                    wrapped = select(func.count()).where(
                        KEYS.c.wrapped.is_not(None), KEYS.c.master == new.fingerprint
                    )
                    return int((await conn.execute(wrapped)).scalar_one())
        except (SQLAlchemyError, OSError) as exc:
            raise self._failed(exc) from exc
        old = await self._verify(engine, force=True)
        count = 0
        try:
            async with engine.begin() as conn:
                # The check value first: it locks out the writers of new keys (they read it,
                # locking, in the statement that writes) until this transaction ends, so no
                # key is made under the old master key that this one does not wrap again.
                moved = await conn.execute(
                    update(CHECK)
                    .where(CHECK.c.name == _CHECK_ROW, CHECK.c.value == old.check)
                    .values(value=new.check, master=new.fingerprint, updated_at=datetime.now(UTC))
                )
                if moved.rowcount != 1:
                    raise self._another_master(None, old, rotated_meanwhile=True)
                rows = (
                    await conn.execute(
                        select(KEYS.c.user_id, KEYS.c.wrapped, KEYS.c.master).where(
                            KEYS.c.wrapped.is_not(None)
                        )
                    )
                ).all()
                for user_id, wrapped, master in rows:
                    key = self._unwrap(user_id, wrapped, master, old)
                    result = await conn.execute(
                        update(KEYS)
                        .where(KEYS.c.user_id == user_id, KEYS.c.wrapped.is_not(None))
                        .values(wrapped=self._wrap(user_id, key, new), master=new.fingerprint)
                    )
                    count += bool(result.rowcount)  # (not one destroyed meanwhile)
        except (SQLAlchemyError, OSError) as exc:
            raise self._failed(exc) from exc
        self._m = new
        self._verified = (new.check, time.monotonic())
        return count

    async def aclose(self) -> None:
        """Close the keyring's connections and forget the unwrapped keys. Those opened in
        another event loop than this one cannot be closed from here: they are dropped, and
        closed as they are collected."""
        self._cache.clear()
        loop = asyncio.get_running_loop()
        with self._handing:
            keyrings, spare = list(self._engines.items()), self._spare
            self._engines.clear()
            self._spare, self._ready, self._verified = None, False, None
        if spare is not None:
            await spare.dispose()
        for owner, keyring in keyrings:
            await keyring.engine.dispose(close=owner is loop)

    async def __aenter__(self) -> LocalKeyProvider:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"LocalKeyProvider(keyring={self.keyring_url!r})"

    # --- inside ----------------------------------------------------------------------------

    async def _open(self) -> AsyncEngine:
        keyring = self._keyring()
        if self._ready:
            return keyring.engine
        async with keyring.lock:
            if not self._ready:
                await self._refuse_a_store(keyring.engine)
                for attempt in range(5):
                    try:
                        async with keyring.engine.begin() as conn:
                            await conn.run_sync(METADATA.create_all)
                        break
                    except (SQLAlchemyError, OSError) as exc:
                        # Made meanwhile by another process, or a thread with a loop of its
                        # own ("already exists"): the tables are there all the same, or the
                        # other one is still making them (made again, each if missing).
                        if await self._has_tables(keyring.engine):
                            break
                        if attempt == 4:
                            raise self._failed(exc) from exc
                        await asyncio.sleep(0.05 * (attempt + 1))
                await self._exact_user_ids(keyring.engine)
                self._ready = True
        return keyring.engine

    async def _exact_user_ids(self, engine: AsyncEngine) -> None:
        """Make an older MariaDB/MySQL keyring's user ids compare exactly (`_keyring`), or
        refuse it: there ``erase_user("ALICE")`` would destroy the key of ``"alice"``."""
        try:
            async with engine.connect() as conn:
                statement = await conn.run_sync(inexact_user_ids)
        except (SQLAlchemyError, OSError) as exc:
            raise self._failed(exc) from exc
        if statement is None:
            return
        try:
            async with engine.begin() as conn:
                await conn.exec_driver_sql(statement)
        except (SQLAlchemyError, OSError) as exc:
            if is_connection_error(exc):
                raise self._failed(exc) from exc
            raise EncryptionError(
                f"the keyring {self.keyring_url} compares user ids without case, accents or "
                "trailing spaces (made by an earlier version), and could not be changed: "
                f"{str(getattr(exc, 'orig', None) or exc).splitlines()[0]}. Run this once "
                f"with a role that may alter its table, then try again: {statement}"
            ) from exc

    async def _has_tables(self, engine: AsyncEngine, *, quiet: bool = True) -> bool:
        """Whether the keyring's tables are there (not when the database cannot be used,
        unless ``quiet`` is false: then its error is raised)."""

        def found(sync: Any) -> bool:
            inspector = inspect(sync)
            return all(inspector.has_table(table.name) for table in (KEYS, CHECK))

        try:
            async with engine.connect() as conn:
                return bool(await conn.run_sync(found))
        except (SQLAlchemyError, OSError):
            if not quiet:
                raise
            return False

    async def _refuse_a_store(self, engine: AsyncEngine) -> None:
        """Refuse a keyring in a store's database (a copy of the data must not carry the keys
        that open it), before anything is written to it."""

        def holds_a_store(sync: Any) -> bool:
            # (The database's default schema: a PostgreSQL store kept in another schema of the
            # keyring's database is not seen.)
            return bool(inspect(sync).has_table(_STORE_TABLE))

        try:
            async with engine.connect() as conn:
                holds = await conn.run_sync(holds_a_store)
        except (SQLAlchemyError, OSError) as exc:
            raise self._failed(exc) from exc
        if holds:
            raise KeyringInStoreError(
                f"the keyring {self.keyring_url} is in the database of an agentcontext store "
                f"(it holds the table {_STORE_TABLE}): a copy of the data would carry the keys "
                "that open it. Give the provider a keyring of its own: another SQLite file, or "
                "a database URL other than the store's"
            )

    async def _verify(self, engine: AsyncEngine, *, force: bool = False) -> _Master:
        """This provider's master key, once the keyring's check value says it is the
        keyring's (an `EncryptionError` otherwise). Checked again after `KEY_RECHECK_SECONDS`
        (a `rotate` in another process is noticed by then; a key is never written under a
        master key that is not the keyring's in any case). A keyring without a check value (new,
        or made by a version before it) is given this one's if its keys open with it."""
        master, done = self._m, self._verified
        if (
            not force
            and done is not None
            and done[0] == master.check
            and time.monotonic() - done[1] <= KEY_RECHECK_SECONDS
        ):
            return master
        for _ in range(3):
            master, asked = self._m, time.monotonic()
            try:
                async with engine.connect() as conn:
                    row = (
                        await conn.execute(
                            select(CHECK.c.value, CHECK.c.master).where(CHECK.c.name == _CHECK_ROW)
                        )
                    ).first()
            except (SQLAlchemyError, OSError) as exc:
                raise self._failed(exc) from exc
            if row is None:
                await self._claim(engine, master)
                continue
            if not hmac.compare_digest(str(row[0]).encode(), master.check.encode()):
                if self._m is not master:
                    continue  # (this provider's own `rotate` ended meanwhile)
                self._verified = None
                raise self._another_master(row[1], master)
            self._verified = (master.check, asked)
            return master
        raise EncryptionError(  # pragma: no cover - its check value changing all along
            f"the check value of the master key in the keyring {self.keyring_url} (its table "
            f"{CHECK.name}) kept changing or could not be written: check that the table is "
            "writable and that no process rotates the master key over and over, then try again"
        )

    async def _claim(self, engine: AsyncEngine, master: _Master) -> None:
        """Write the check value of ``master`` into a keyring that has none, if its keys are
        wrapped under ``master`` (most of them: a keyring of a version before the check may
        hold a few keys a worker with a wrong master key made, which stay unreadable)."""
        try:
            async with engine.connect() as conn:
                counts: dict[str | None, int] = {
                    fingerprint: int(n)
                    for fingerprint, n in (
                        await conn.execute(
                            select(KEYS.c.master, func.count())
                            .where(KEYS.c.wrapped.is_not(None))
                            .group_by(KEYS.c.master)
                        )
                    ).all()
                }
                mine = counts.pop(master.fingerprint, 0)
                if counts and mine <= sum(counts.values()):
                    raise self._another_master(max(counts, key=counts.__getitem__), master)
                if mine:  # (one of them opens: the fingerprint is no accident)
                    sample = (
                        await conn.execute(
                            select(KEYS.c.user_id, KEYS.c.wrapped, KEYS.c.master)
                            .where(
                                KEYS.c.master == master.fingerprint,
                                KEYS.c.wrapped.is_not(None),
                            )
                            .limit(1)
                        )
                    ).first()
                    if sample is not None:
                        self._unwrap(sample[0], sample[1], sample[2], master)
            async with engine.begin() as conn:
                await conn.execute(
                    CHECK.insert().values(
                        name=_CHECK_ROW,
                        value=master.check,
                        master=master.fingerprint,
                        updated_at=datetime.now(UTC),
                    )
                )
        except IntegrityError:
            pass  # written meanwhile by another provider: read it again
        except (SQLAlchemyError, OSError) as exc:
            raise self._failed(exc) from exc

    async def _write_key(self, engine: AsyncEngine, user_id: str, master: _Master) -> bool:
        """Write a new data key of ``user_id`` wrapped under ``master``, in a statement that
        writes it only while the keyring's check value is ``master``'s (read with a share
        lock, which `rotate`'s update of it waits for, and which waits for that update);
        whether one was written (False: the master key is not the keyring's, or the user has
        a key, made by another provider first)."""
        now = datetime.now(UTC)
        wrapped = self._wrap(user_id, secrets.token_bytes(KEY_BYTES), master)
        is_mine = (CHECK.c.name == _CHECK_ROW, CHECK.c.value == master.check)
        # The row inserted first, each statement its own transaction: an UPDATE that finds no
        # row, then an INSERT, in one transaction deadlocks two users' first keys on MariaDB
        # and MySQL (each holds a gap lock the other's insert waits for).
        try:
            try:
                async with engine.begin() as conn:
                    source = (
                        select(
                            literal(user_id, KEYS.c.user_id.type),
                            literal(wrapped, KEYS.c.wrapped.type),
                            literal(master.fingerprint, KEYS.c.master.type),
                            literal(now, KEYS.c.created_at.type),
                        )
                        .where(*is_mine)
                        .with_for_update(read=True)
                    )
                    columns = ["user_id", "wrapped", "master", "created_at"]  # (not destroyed)
                    result = await conn.execute(KEYS.insert().from_select(columns, source))
            except IntegrityError:
                # A row is there: a destroyed key's tombstone (replaced by the new key), or a
                # key another process made first (kept: theirs is used).
                async with engine.begin() as conn:
                    mine = select(CHECK.c.name).where(*is_mine).with_for_update(read=True)
                    result = await conn.execute(
                        update(KEYS)
                        .where(
                            KEYS.c.user_id == user_id,
                            KEYS.c.wrapped.is_(None),
                            exists(mine),
                        )
                        .values(
                            wrapped=wrapped,
                            master=master.fingerprint,
                            created_at=now,
                            destroyed_at=None,
                        )
                    )
        except (SQLAlchemyError, OSError) as exc:
            raise self._failed(exc) from exc
        return bool(result.rowcount)

    def _keyring(self) -> _Keyring:
        """The keyring's engine of the running event loop (made on its first use there)."""
        loop = asyncio.get_running_loop()
        found = self._engines.get(loop)
        if found is None:
            with self._handing:
                found = self._engines.get(loop)
                if found is None:
                    engine, self._spare = self._spare or _keyring_engine(self._url), None
                    found = self._engines[loop] = _Keyring(engine, asyncio.Lock())
        return found

    async def _read(self, engine: AsyncEngine, user_id: str) -> Any:
        try:
            async with engine.connect() as conn:
                return (
                    await conn.execute(
                        select(KEYS.c.wrapped, KEYS.c.master, KEYS.c.destroyed_at).where(
                            KEYS.c.user_id == user_id
                        )
                    )
                ).first()
        except (SQLAlchemyError, OSError) as exc:
            raise self._failed(exc) from exc

    def _wrap(self, user_id: str, key: bytes, master: _Master) -> bytes:
        nonce = secrets.token_bytes(12)
        return nonce + bytes(master.aead.encrypt(nonce, key, _WRAP_AAD + user_id.encode()))

    def _unwrap(
        self, user_id: str, wrapped: bytes, fingerprint: str | None, master: _Master | None = None
    ) -> bytes:
        from cryptography.exceptions import InvalidTag

        master = master or self._m
        try:
            return bytes(
                master.aead.decrypt(wrapped[:12], wrapped[12:], _WRAP_AAD + user_id.encode())
            )
        except (InvalidTag, ValueError):
            if fingerprint is not None and fingerprint != master.fingerprint:
                self._verified = None  # (the keyring's check value is read again next time)
                raise self._another_master(fingerprint, master, key_id=user_id) from None
            raise EncryptionError(
                f"the data key of user {user_id!r} in the keyring {self.keyring_url} does not "
                "open with this master key: the keyring was altered or the master key is wrong",
                key_id=user_id,
            ) from None

    def _another_master(
        self,
        theirs: str | None,
        master: _Master,
        *,
        key_id: str | None = None,
        rotated_meanwhile: bool = False,
    ) -> EncryptionError:
        named = f"fingerprint {theirs}, " if theirs else ""
        if key_id is not None:  # (one key: in a keyring of a version before the check value,
            # a key a worker with a wrong master key made; or the keyring rotated meanwhile)
            what = (
                f"the data key of user {key_id!r} in the keyring {self.keyring_url} is wrapped "
                f"under another master key ({named}this provider's is {master.fingerprint})"
            )
        else:
            what = (
                f"the keyring {self.keyring_url} was made (or last rotated) with another master "
                f"key ({named}this provider's is {master.fingerprint})"
                + (": it was rotated meanwhile by another process" if rotated_meanwhile else "")
                + ": no data key is read or made with this one"
            )
        return EncryptionError(
            what + ". Give the provider the master key the keyring was made or last rotated "
            "with; after provider.rotate() in another process, restart this worker with the "
            "new master key",
            key_id=key_id,
        )

    def _remember(self, user_id: str, key: bytes) -> bytes:
        self._cache[user_id] = (key, time.monotonic())
        self._cache.move_to_end(user_id)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return key

    def _failed(self, exc: BaseException) -> EncryptionError:
        unreachable = is_connection_error(exc)
        return (KeyringUnavailableError if unreachable else EncryptionError)(
            f"the keyring {self.keyring_url} cannot be used: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}"
        )


@dataclass(frozen=True, slots=True)
class _Keyring:
    """The keyring's engine in one event loop, the lock of its table's creation there, and
    the lock that has this provider's rotations of that loop run one at a time."""

    engine: AsyncEngine
    lock: asyncio.Lock
    rotating: asyncio.Lock = field(default_factory=asyncio.Lock)


def _retrieved(task: asyncio.Future[Any]) -> None:
    """A task's outcome taken, so that one whose caller stopped waiting is not reported."""
    if not task.cancelled():
        task.exception()


def _keyring_engine(url: URL) -> AsyncEngine:
    """The keyring's engine (made without connecting): a URL whose driver is missing, or
    whose query the driver cannot take, is refused here, naming what to change."""
    shown = url.render_as_string(hide_password=True)
    try:
        engine = create_async_engine(url)
        unknown, _, _ = unknown_arguments(engine, {})
        if unknown:
            raise TypeError(f"the driver takes no argument {', '.join(map(repr, unknown))}")
        return engine
    except ImportError as exc:
        raise MissingExtraError(
            f"the keyring {shown} needs a driver that is not installed ({exc}); install it, "
            "or keep the keyring in a SQLite file (a path)"
        ) from None
    except (TypeError, ValueError, ArgumentError, InvalidRequestError) as exc:
        raise InvalidInputError(
            f"cannot open the keyring {shown}: {str(exc).rstrip('. ')}. Use an async driver "
            "(sqlite+aiosqlite://, postgresql+asyncpg://, mysql+asyncmy://) and check the "
            "URL's query parameters"
        ) from None


def _keyring_url(keyring: object) -> URL:
    if isinstance(keyring, URL):
        return keyring
    if isinstance(keyring, os.PathLike):
        keyring = os.fspath(keyring)
    if not isinstance(keyring, str) or not keyring:
        raise InvalidTypeError(
            "keyring must be the path of a SQLite file or a database URL, got "
            f"{type(keyring).__name__}"
        )
    if "://" in keyring:
        try:
            return make_url(keyring)
        except ArgumentError as exc:
            raise InvalidInputError(f"cannot parse the keyring URL: {exc}") from None
    return URL.create("sqlite+aiosqlite", database=str(Path(keyring).expanduser()))
