"""Sealing: what users wrote, encrypted at rest under their own data key.

A store has one sealer, on its dialect object (``dialect.sealer``): `PLAIN` when the store has
no key provider, a `KeyedSealer` when it has one. The codec (`_rows.codec`) hands it every value
it writes or reads of message contents, chat titles and chat metadata, so encryption has one
place where rows are prepared and cannot be skipped by one writer.

A sealed value is the text ``acenc1.<key id>.<key fingerprint>.<nonce and ciphertext, hex>``
(a JSON string in a JSON column), or, for blobs and where a JSON column keeps bytes (SQLite,
`Dialect.binary_sealed_json`: half the size, nothing to decode), the bytes
``\x00acenc1.<key id>.<key fingerprint>.<nonce and ciphertext>``. The cipher is AES-256-GCM
under the data key of the chat's owner, the key named by its user id (base64url) and the key's
fingerprint, its associated data the table, the chat and the row id — a value copied to
another row, or altered, does not open (`CorruptDataError` naming the row), and a value sealed
under a destroyed key is an `EncryptionError` naming it, never text of another chat.

Keys come from the provider (an ``await``), rows are prepared in a unit of work (no ``await``):
a unit that needs a key the sealer does not hold raises `KeyNeeded`; the store's `Database`
then fetches the keys (making them, for a write) and runs the unit again. Units are run again
after a lost race already, so nothing of the first run remains.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any

from agentcontext.errors import EncryptionError
from agentcontext.store._rows.terms import forget_search_key

__all__ = [
    "PLAIN",
    "SEALED_FORMAT",
    "is_sealed",
    "is_sealed_json",
    "KeyNeeded",
    "KeyNotHeld",
    "KeyedSealer",
    "PlainSealer",
    "Sealer",
    "forget_key_everywhere",
]

PREFIX = "acenc1."
SEALED_FORMAT = "acenc1 aes-256-gcm"
"""What an encrypted store records as the database's ``sealing`` setting: its values' format."""
_BLOB_PREFIX = b"\x00" + PREFIX.encode()
"""A sealed blob's first bytes (NUL first: text content never starts so)."""
_JSON_PREFIX = '"' + PREFIX
_JSON_PREFIX_BYTES = _JSON_PREFIX.encode()
_PREFIX_BYTES = PREFIX.encode()
_NONCE = 12
WRITE_RECHECK_SECONDS = 30.0
"""A key held longer than this is asked for again before it seals anything: another process
may have destroyed it (``erase_user``); the provider then makes the user a new one."""
_RECHECK_SECONDS = 1.0
_JUST_ASKED_SECONDS = 0.25
"""A provider's "no key, and none destroyed" is asked for again, afresh, unless it was a moment
ago (no older than this), before the store concludes that the provider is not the data's
(another worker may have just made the user's first key)."""
"""A key found missing (or another than a value names) is asked for again after this long:
another process may have made it meanwhile."""


class KeyNeeded(Exception):
    """A unit of work needs data keys the sealer does not hold: fetch them, run it again."""

    def __init__(
        self, user_ids: Iterable[str], *, create: bool, wanted: int = 0, fresh: bool = False
    ) -> None:
        self.user_ids = frozenset(user_ids)
        self.create = create
        self.fresh = fresh
        """The keys held are stale (aged, or not the ones a value names): a provider that
        keeps keys in memory is told to read them again (`forget_cached_key`)."""
        self.wanted = max(wanted, len(self.user_ids))
        """How many keys the unit needs at once, those held included (kept when loading)."""
        super().__init__(f"data keys needed for {sorted(self.user_ids)!r}")


class KeyNotHeld(EncryptionError):
    """A row is sealed under a data key the provider does not hold (destroyed when its user
    was erased, or replaced): that row cannot be read, and every other row still can."""


class PlainSealer:
    """No encryption: values are stored as given. A sealed value met on the way up means the
    database is encrypted and the store was opened without its key provider."""

    encrypted = False
    whole = False

    def seal_json(self, text: str, user_id: str, table: str, chat_id: str, row_id: str) -> str:
        return text

    def refuse_plain(self, table: str, chat_id: str, row_id: str) -> None:
        return None

    def seal_text(
        self, text: str | None, user_id: str, table: str, chat_id: str, row_id: str
    ) -> str | None:
        return text

    def open_json(self, raw: Any, table: str, chat_id: str, row_id: str) -> Any:
        if is_sealed_json(raw):
            raise _no_provider(table, row_id)
        return raw

    def open_value(self, value: Any, table: str, chat_id: str, row_id: str) -> Any:
        if isinstance(value, str) and value.startswith(PREFIX):
            raise _no_provider(table, row_id)
        return value

    open_text = open_value

    def open_chain(self, ids: list[str], raws: list[Any], table: str, chat_id: str) -> list[Any]:
        for row_id, raw in zip(ids, raws, strict=True):
            if raw and raw[:1] in (b'"', b"\x00"):  # a JSON string or bytes: maybe sealed
                self.open_json(raw, table, chat_id, row_id)
        return raws

    def search_key(self, user_id: str) -> bytes | None:
        return None

    def never_held(self, user_id: str) -> bool:
        return False

    def confirm_never_held(self, user_id: str) -> None:
        return None

    def pinned(self) -> contextlib.AbstractContextManager[Callable[[KeyNeeded], None]]:
        return contextlib.nullcontext(lambda need: None)

    def blob_address(self, user_id: str, digest: str, *, write: bool) -> str:
        return digest

    def blob_digest(self, user_id: str, address: str) -> str:
        return address

    def seal_bytes(self, data: bytes, user_id: str, address: str) -> bytes:
        return data

    def open_bytes(self, raw: bytes, address: str) -> bytes:
        if raw[:8] == _BLOB_PREFIX:
            raise _no_provider("blobs", address)
        return raw

    def require(self, user_ids: Iterable[str]) -> None:
        return None

    async def load(self, need: KeyNeeded) -> None:  # pragma: no cover - never raised
        return None

    async def ensure(self, user_ids: Iterable[str]) -> None:
        return None

    async def destroy(self, user_id: str) -> bool:
        return False

    def note_owner(self, chat_id: str, user_id: str) -> None:
        return None

    def owner_hint(self, chat_id: str) -> str | None:
        return None

    def forget(self, user_id: str) -> None:
        return None

    def erasing(self, user_id: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    async def create_keyring(self) -> None:
        return None


PLAIN = PlainSealer()


def _no_provider(table: str, row_id: str) -> EncryptionError:
    return EncryptionError(
        f"the database holds encrypted data (table {table.split('.')[0]}, row {row_id!r}) and "
        "this store has no key provider: open it with SqlContextStore(url, encryption=<the key "
        "provider the data was written with>) (on the command line: --keyring K --key-env NAME)"
    )


@dataclass(slots=True)
class _Key:
    aead: Any
    fingerprint: str
    search_key: bytes
    addresses: Any
    """AES-256 in ECB mode under a key of its own: a blob's SHA-256 (two random-looking blocks)
    to its address in the user's namespace and back."""


@dataclass(slots=True)
class _Entry:
    key: _Key | None
    loaded_at: float
    never: bool = False
    """No key, and the provider says it never destroyed one (``destroyed_at``): not the
    keyring the user's rows were written with."""
    fresh: bool = False
    """Asked for afresh (`KeyNeeded.fresh`: the provider told to read it again), and not yet
    relied on to say the provider is not the data's (`confirm_never_held`)."""


_sealers: weakref.WeakSet[KeyedSealer] = weakref.WeakSet()
_erasing: dict[tuple[int, str], int] = {}
_erasing_lock = threading.Lock()
"""Users being erased in this process (`KeyedSealer.erasing`), by key provider (its ``id``),
with how many erasures of each are running."""


def forget_key_everywhere(user_id: str) -> None:
    """Drop ``user_id``'s key from every sealer of this process (after its erasure)."""
    for sealer in list(_sealers):
        sealer.forget(user_id)


class KeyedSealer:
    """AES-256-GCM under each user's data key from ``provider`` (a `KeyProvider`), at most
    ``cache_keys`` of them held in memory."""

    encrypted = True

    def __init__(
        self, provider: Any, cache_keys: int = 10_000, *, binary_json: bool = False
    ) -> None:
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._aesgcm = AESGCM
        self._invalid_tag = InvalidTag
        self._headers: dict[bytes, tuple[str, str]] = {}
        self._owners: dict[str, str] = {}
        self.provider = provider
        self.binary_json = binary_json
        """Whether JSON columns take a sealed value as bytes (`Dialect.binary_sealed_json`)."""
        self._cache_keys = cache_keys
        self._pinned = 0
        """How many keys the calls running now need at once (`pinned`): the store keeps at
        least that many, so that concurrent calls over many users do not evict each other's."""
        self._keys: OrderedDict[str, _Entry] = OrderedDict()
        self.whole = False
        """Whether every value of the database is sealed (its ``sealing`` setting says so):
        a value in the clear is then a `CorruptDataError`, never text shown as the user's.
        Until then (a database `migrate encrypt` has not finished) plain values read as they
        are."""
        self.holds_sealed: Callable[[str], Awaitable[bool]] | None = None
        """Set by the store: whether its database holds chats of a user sealed (asked
        before a user's first key is made: `_made_key`)."""
        _sealers.add(self)

    # --- keys ------------------------------------------------------------------------------

    def _entry(self, user_id: str) -> _Entry | None:
        entry = self._keys.get(user_id)
        if entry is not None:
            self._keys.move_to_end(user_id)
        return entry

    @contextlib.contextmanager
    def erasing(self, user_id: str) -> Iterator[None]:
        """While ``erase_user`` runs: nothing of ``user_id`` is sealed (no key made or used)
        by any store of the process that has this store's key provider, so no chat of theirs
        saved meanwhile there outlives their key unreadable."""
        held = (id(self.provider), user_id)
        with _erasing_lock:  # (stores of other threads' event loops share it)
            _erasing[held] = _erasing.get(held, 0) + 1
        try:
            yield
        finally:
            with _erasing_lock:
                _erasing[held] -= 1
                if not _erasing[held]:
                    del _erasing[held]

    def _refuse_erasing(self, user_id: str) -> None:
        if (id(self.provider), user_id) in _erasing:
            raise EncryptionError(
                f"user {user_id!r} is being erased (erase_user is running in this process): "
                "nothing of theirs can be written until it returns, and their chats are deleted",
                key_id=user_id,
            )

    def _writing_key(self, user_id: str) -> _Key:
        self._refuse_erasing(user_id)
        entry = self._entry(user_id)
        if (
            entry is None
            or entry.key is None
            or time.monotonic() - entry.loaded_at > WRITE_RECHECK_SECONDS
        ):
            # (Held that long: asked for again, so that a key another process destroyed
            # since, erasing the user, seals nothing more.)
            raise KeyNeeded((user_id,), create=True, fresh=entry is not None)
        return entry.key

    def require(self, user_ids: Iterable[str]) -> None:
        """Raise `KeyNeeded` for those of ``user_ids`` whose key is not held (reads of many
        users' rows ask for all their keys at once)."""
        wanted = set(user_ids)
        missing = {u for u in wanted if u not in self._keys}
        if missing:
            for user_id in wanted - missing:
                self._keys.move_to_end(user_id)  # (needed: the last to be dropped)
            raise KeyNeeded(missing, create=False, wanted=len(wanted))

    @contextlib.contextmanager
    def pinned(self) -> Iterator[Callable[[KeyNeeded], None]]:
        """While a call runs: the keys its units said they need at once (each `KeyNeeded`
        given to the function yielded) are kept on top of what other calls need."""
        held = 0

        def need(wanted: KeyNeeded) -> None:
            nonlocal held
            if wanted.wanted > held:
                self._pinned += wanted.wanted - held
                held = wanted.wanted

        try:
            yield need
        finally:
            self._pinned -= held

    def never_held(self, user_id: str) -> bool:
        """Whether the provider has no key of ``user_id`` and says it destroyed none (as last
        asked): rows of theirs sealed under a key would then not be this provider's data
        (`confirm_never_held` before saying so)."""
        entry = self._keys.get(user_id)
        return entry is not None and entry.key is None and entry.never

    def confirm_never_held(self, user_id: str) -> None:
        """Before a call says the provider is not the data's (`never_held`, and sealed rows of
        the user found): `KeyNeeded` to ask the provider afresh, unless this call just did
        (another worker may have made the user's first key since the provider was asked)."""
        entry = self._keys.get(user_id)
        if entry is not None:
            _ask_again_unless_just_asked(entry, user_id)

    def search_key(self, user_id: str) -> bytes | None:
        """The key of ``user_id``'s search terms, or None when the user has no data key (so
        nothing of theirs is stored)."""
        entry = self._entry(user_id)
        if entry is None or (entry.key is None and _stale(entry)):
            raise KeyNeeded((user_id,), create=False, fresh=entry is not None)
        return None if entry.key is None else entry.key.search_key

    async def ensure(self, user_ids: Iterable[str]) -> None:
        """Hold the keys of ``user_ids`` (made if they have none): for rows prepared before
        their unit of work runs."""
        now = time.monotonic()
        for user_id in user_ids:
            self._refuse_erasing(user_id)
        missing = [
            u
            for u in user_ids
            if (e := self._keys.get(u)) is None
            or e.key is None
            or now - e.loaded_at > WRITE_RECHECK_SECONDS / 2  # (not stale before it is used)
        ]
        if missing:
            await self.load(KeyNeeded(missing, create=True))

    async def load(self, need: KeyNeeded) -> None:
        """Fetch (or, for a write, make) the keys ``need`` names."""
        for user_id in sorted(need.user_ids):
            if need.fresh:
                self._forget_at_provider(user_id)
            try:
                if need.create:
                    raw = await self._made_key(user_id)
                else:
                    raw = await self.provider.get_data_key(user_id)
            except EncryptionError:
                raise
            except Exception as exc:  # a provider's own failure: name it, keep its cause
                raise EncryptionError(
                    f"the key provider {type(self.provider).__name__} failed for the data key "
                    f"of user {user_id!r}: {type(exc).__name__}: {exc}",
                    key_id=user_id,
                ) from exc
            if raw is None and need.create:
                raise EncryptionError(
                    f"the key provider {type(self.provider).__name__} returned None from "
                    f"create_data_key for user {user_id!r}: it must return the user's data key "
                    "(32 random bytes, made if the user has none)",
                    key_id=user_id,
                )
            key = None if raw is None else self._key(user_id, raw)
            never = False
            destroyed_at = getattr(self.provider, "destroyed_at", None)
            if key is None and not need.create and destroyed_at is not None:
                try:
                    never = await destroyed_at(user_id) is None
                except Exception:  # (only a better message is lost)
                    never = False
            self._keys[user_id] = _Entry(key, time.monotonic(), never, need.fresh)
            self._keys.move_to_end(user_id)
        # The keys just loaded stay, however many (a list of more users' chats than the cache
        # holds needs them all at once: evicting some would make it ask again for ever).
        while len(self._keys) > max(self._cache_keys, need.wanted, self._pinned):
            self._keys.popitem(last=False)

    async def _made_key(self, user_id: str) -> object:
        """The provider's key of ``user_id``, made if it has none: unless it never had one
        (nor destroyed one) and the database holds their chats sealed all the same. The
        keyring is then not the data's (an older backup of it): a new key would hide their
        earlier chats, and the right keyring restored later, the chats sealed meanwhile."""
        provider, holds_sealed = self.provider, self.holds_sealed
        if holds_sealed is None:
            return await provider.create_data_key(user_id)
        if (raw := await provider.get_data_key(user_id)) is not None:
            return raw
        destroyed_at = getattr(provider, "destroyed_at", None)
        if (destroyed_at is None or await destroyed_at(user_id) is None) and await holds_sealed(
            user_id
        ):
            self._forget_at_provider(user_id)  # (another worker may have just made it)
            if (raw := await provider.get_data_key(user_id)) is None:
                why = (
                    "that the key provider never held (it has no key of that user, and "
                    "destroyed none): it is not the keyring the data was written with"
                    if destroyed_at is not None
                    else "that the key provider does not hold (it cannot say whether it "
                    "destroyed one: it has no destroyed_at)"
                )
                raise EncryptionError(
                    f"the chats of user {user_id!r} are sealed under a data key {why}, and a "
                    "new key would hide those chats. Give the store the provider (the keyring) "
                    "the data was written with; if the user was erased and the chats came back "
                    "from a backup, delete them first (erase_user)",
                    key_id=user_id,
                )
            return raw
        return await provider.create_data_key(user_id)

    def _key(self, user_id: str, raw: object) -> _Key:
        if not isinstance(raw, (bytes, bytearray)) or len(raw) != 32:
            raise EncryptionError(
                f"the key provider gave the data key of user {user_id!r} as something other "
                "than 32 bytes; a data key is 32 random bytes",
                key_id=user_id,
            )
        raw = bytes(raw)
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        address_key = blake2b(raw, digest_size=32, person=b"agentcontext-bk").digest()
        return _Key(
            aead=self._aesgcm(raw),
            fingerprint=blake2b(raw, digest_size=6, person=b"agentcontext-fp").hexdigest(),
            search_key=blake2b(raw, digest_size=32, person=b"agentcontext-sk").digest(),
            addresses=Cipher(algorithms.AES(address_key), modes.ECB()),
        )

    async def destroy(self, user_id: str) -> bool:
        """Destroy the data key of ``user_id`` at the provider and in every sealer of this
        process; whether there was one."""
        try:
            destroyed = bool(await self.provider.destroy_data_key(user_id))
        except EncryptionError:
            raise
        except Exception as exc:
            raise EncryptionError(
                f"the key provider {type(self.provider).__name__} failed to destroy the data "
                f"key of user {user_id!r}: {type(exc).__name__}: {exc}; the user's rows are "
                "deleted, erase the user again to destroy the key",
                key_id=user_id,
            ) from exc
        finally:
            forget_key_everywhere(user_id)
        return destroyed

    def blob_address(self, user_id: str, digest: str, *, write: bool) -> str:
        """Where ``user_id``'s copy of the blob with SHA-256 ``digest`` is stored: the digest
        enciphered under the user's address key (64 hex characters, like a digest). Blobs are
        kept once per user, and their addresses say nothing of their contents to a reader of
        the database."""
        if write:
            key = self._writing_key(user_id)
        else:
            key = self._reading_key(user_id, "blobs", "", digest)
        encryptor = key.addresses.encryptor()
        return str((encryptor.update(bytes.fromhex(digest)) + encryptor.finalize()).hex())

    def blob_digest(self, user_id: str, address: str) -> str:
        """The SHA-256 of the blob stored at ``address`` in ``user_id``'s namespace."""
        decryptor = self._reading_key(user_id, "blobs", "", address).addresses.decryptor()
        return str((decryptor.update(bytes.fromhex(address)) + decryptor.finalize()).hex())

    def seal_bytes(self, data: bytes, user_id: str, address: str) -> bytes:
        """A blob's content sealed under ``user_id``'s key, bound to its address."""
        return self._seal_binary(data, user_id, _aad("blobs", "", address))

    def open_bytes(self, raw: bytes, address: str) -> bytes:
        """A stored blob's content opened (a plain one, stored before `migrate encrypt`,
        as it is)."""
        if raw[:8] != _BLOB_PREFIX:
            self.refuse_plain("blobs", "", address)
            return raw
        return self._open_binary(raw, "blobs", "", address)

    def note_owner(self, chat_id: str, user_id: str) -> None:
        """``user_id`` owns ``chat_id``, as a row just read or written says (a search's hint)."""
        if self._owners.get(chat_id) != user_id:
            if len(self._owners) >= 100_000:
                self._owners.clear()
            self._owners[chat_id] = user_id

    def owner_hint(self, chat_id: str) -> str | None:
        """The owner of ``chat_id`` as last seen (the caller checks it when it matters)."""
        return self._owners.get(chat_id)

    def forget(self, user_id: str) -> None:
        """Drop the key of ``user_id`` (it was destroyed), here and in the provider's memory."""
        entry = self._keys.pop(user_id, None)
        if entry is not None and entry.key is not None:
            forget_search_key(entry.key.search_key)
        self._forget_at_provider(user_id)

    async def create_keyring(self) -> None:
        """Have the provider make its keyring if it keeps one and has not made it yet (the
        optional ``create_keyring`` of a `KeyProvider`): before a database is first marked as
        encrypted, so that an encrypted database always has its keyring, even one that holds
        no key yet (the command line never makes a keyring)."""
        create = getattr(self.provider, "create_keyring", None)
        if callable(create):
            try:
                await create()
            except EncryptionError:
                raise
            except Exception as exc:  # a provider's own failure: name it, keep its cause
                raise EncryptionError(
                    f"the key provider {type(self.provider).__name__} failed to make its "
                    f"keyring: {type(exc).__name__}: {exc}"
                ) from exc

    def _forget_at_provider(self, user_id: str) -> None:
        """Have a provider that keeps keys in memory read ``user_id``'s again when next asked
        (the optional ``forget_cached_key`` of a `KeyProvider`)."""
        forget = getattr(self.provider, "forget_cached_key", None)
        if callable(forget):
            forget(user_id)

    # --- values ----------------------------------------------------------------------------

    def seal_text(
        self, text: str | None, user_id: str, table: str, chat_id: str, row_id: str
    ) -> str | None:
        """``text`` sealed for its row (None stays None)."""
        if text is None:
            return None
        key = self._writing_key(user_id)
        nonce = _nonce()
        sealed = key.aead.encrypt(nonce, text.encode(), _aad(table, chat_id, row_id))
        # Hex, not base64: twice the size of the ciphertext, but it decodes four times as fast
        # (a chain of 10 000 messages is read at about the speed of a plain one).
        return f"{PREFIX}{_b64(user_id.encode())}.{key.fingerprint}.{(nonce + sealed).hex()}"

    def seal_json(
        self, text: str, user_id: str, table: str, chat_id: str, row_id: str
    ) -> str | bytes:
        """The JSON text of a value, sealed for its row: a JSON string, or bytes where the
        database keeps them in a JSON column."""
        if self.binary_json:
            return self._seal_binary(text.encode(), user_id, _aad(table, chat_id, row_id))
        return f'"{self.seal_text(text, user_id, table, chat_id, row_id)}"'

    def open_json(self, raw: Any, table: str, chat_id: str, row_id: str) -> Any:
        """A JSON column's raw text (bytes) opened: the JSON text of the value."""
        if isinstance(raw, bytes):
            if raw[:8] == _JSON_PREFIX_BYTES:
                return self._open(raw[1:-1], table, chat_id, row_id)
            if raw[:8] == _BLOB_PREFIX:
                return self._open_binary(raw, table, chat_id, row_id)
        elif isinstance(raw, str) and raw[:8] == _JSON_PREFIX:
            return self._open(raw.strip()[1:-1].encode("ascii", "replace"), table, chat_id, row_id)
        if raw is not None:
            self.refuse_plain(table, chat_id, row_id)
        return raw  # a plain value: written before `migrate encrypt` reached it

    def open_value(self, value: Any, table: str, chat_id: str, row_id: str) -> Any:
        """A decoded JSON column's value opened (the sealed text is a JSON string)."""
        if isinstance(value, str) and value.startswith(PREFIX):
            from agentcontext._validate import loads

            return loads(self._open(value.encode("ascii", "replace"), table, chat_id, row_id))
        if value is not None:
            self.refuse_plain(table, chat_id, row_id)
        return value

    def open_text(self, value: Any, table: str, chat_id: str, row_id: str) -> Any:
        """A text column's value opened."""
        if isinstance(value, str) and value.startswith(PREFIX):
            opened = self._open(value.encode("ascii", "replace"), table, chat_id, row_id)
            return opened.decode()
        if value is not None:
            self.refuse_plain(table, chat_id, row_id)
        return value

    def refuse_plain(self, table: str, chat_id: str, row_id: str) -> None:
        """A value of a row found in the clear: a `CorruptDataError` once the whole database
        is sealed (`whole`)."""
        if self.whole:
            raise _corrupt(
                table,
                chat_id,
                row_id,
                "it holds a value in the clear in an encrypted database (a store without a key "
                "provider wrote it, which `agentcontext migrate encrypt` seals, or it was "
                "altered)",
            )

    def open_chain(self, ids: list[str], raws: list[Any], table: str, chat_id: str) -> list[Any]:
        """`open_json` of the rows of one chat at once (a chain load): the first value sealed
        under a key is opened the long way (its header parsed, its key checked); the values
        after it with the same header are decrypted directly."""
        out: list[Any] = []
        append = out.append
        a2b = binascii.a2b_hex
        aad = f"agentcontext\x00{table}\x00{chat_id}\x00".encode()
        failed = (self._invalid_tag, ValueError, binascii.Error)
        lead = b"\x01"  # the header of the values decrypted directly (none yet)
        start, binary = 0, False
        decrypt: Any = None
        for row_id, raw in zip(ids, raws, strict=True):
            if raw.__class__ is bytes and raw.startswith(lead):
                try:
                    if binary:
                        view = memoryview(raw)
                        append(
                            decrypt(
                                view[start : start + _NONCE],
                                view[start + _NONCE :],
                                aad + row_id.encode(),
                            )
                        )
                    else:
                        blob = a2b(memoryview(raw)[start:-1])
                        append(decrypt(blob[:_NONCE], blob[_NONCE:], aad + row_id.encode()))
                    continue
                except failed:
                    pass  # opened the long way below, which names the row
            append(self.open_json(raw, table, chat_id, row_id))
            if not isinstance(raw, bytes):
                continue
            if raw[:8] == _JSON_PREFIX_BYTES:
                cut = raw.rfind(b".")
                lead, start, binary = raw[: cut + 1], cut + 1, False
                decrypt = self._decrypt_for(raw[1:cut])
            elif raw[:8] == _BLOB_PREFIX:
                user_id, _, start = self._binary_header(raw, table, chat_id, row_id)
                lead, binary = raw[:start], True
                decrypt = self._decrypt_of(user_id)
        return out

    def _decrypt_for(self, header: bytes) -> Any:
        """The decrypt method of the key a header names (checked by a successful `_open`)."""
        return self._decrypt_of(self._headers[header][0])

    def _decrypt_of(self, user_id: str) -> Any:
        """The decrypt method of ``user_id``'s key (held: a value of theirs just opened)."""
        entry = self._keys[user_id]
        assert entry.key is not None
        return entry.key.aead.decrypt

    def _seal_binary(self, data: bytes, user_id: str, aad: bytes) -> bytes:
        """``data`` sealed under ``user_id``'s key, as bytes."""
        key = self._writing_key(user_id)
        nonce = _nonce()
        sealed = key.aead.encrypt(nonce, data, aad)
        header = f"{_b64(user_id.encode())}.{key.fingerprint}.".encode()
        return bytes(_BLOB_PREFIX + header + nonce + sealed)

    def _open_binary(self, raw: bytes, table: str, chat_id: str, row_id: str) -> bytes:
        """The plaintext of a value sealed as bytes (``\\x00acenc1.<key id>.<fingerprint>.``
        and the nonce and ciphertext)."""
        user_id, fingerprint, start = self._binary_header(raw, table, chat_id, row_id)
        key = self._reading_key(user_id, table, chat_id, row_id, fingerprint)
        return self._decrypt(key, raw[start:], table, chat_id, row_id)

    def _binary_header(
        self, raw: bytes, table: str, chat_id: str, row_id: str
    ) -> tuple[str, str, int]:
        """The user and key fingerprint a value sealed as bytes names, and where its nonce
        starts."""
        first = raw.find(b".", 8)
        second = raw.find(b".", first + 1) if first > 0 else -1
        if second < 0:
            raise _corrupt(table, chat_id, row_id, "its sealed value is malformed")
        header = raw[:second]
        named = self._headers.get(header)
        if named is None:
            try:
                user_id = _unb64(raw[8:first].decode("ascii")).decode()
                named = (user_id, raw[first + 1 : second].decode("ascii"))
            except (ValueError, UnicodeDecodeError, binascii.Error):
                raise _corrupt(table, chat_id, row_id, "its sealed value is malformed") from None
            if len(self._headers) >= 4096:
                self._headers.clear()
            self._headers[header] = named
        return named[0], named[1], second + 1

    def _open(self, sealed: bytes, table: str, chat_id: str, row_id: str) -> bytes:
        """The plaintext of a sealed value (``acenc1.<key id>.<fingerprint>.<payload>``)."""
        cut = sealed.rfind(b".")
        header = sealed[:cut]
        named = self._headers.get(header)
        if named is None:
            named = self._header(header, table, chat_id, row_id)
        user_id, fingerprint = named
        key = self._reading_key(user_id, table, chat_id, row_id, fingerprint)
        try:
            blob = binascii.a2b_hex(sealed[cut + 1 :])
        except (ValueError, binascii.Error):
            blob = b""  # does not open: named below
        return self._decrypt(key, blob, table, chat_id, row_id)

    def _decrypt(self, key: _Key, blob: bytes, table: str, chat_id: str, row_id: str) -> bytes:
        """The plaintext of a nonce and ciphertext sealed for the row (`CorruptDataError`
        naming the row when it does not open)."""
        try:
            opened: bytes = key.aead.decrypt(
                blob[:_NONCE], blob[_NONCE:], _aad(table, chat_id, row_id)
            )
        except (self._invalid_tag, ValueError):
            raise _corrupt(
                table,
                chat_id,
                row_id,
                "its sealed value does not open for this row (altered, or copied from another row)",
            ) from None
        return opened

    def _reading_key(
        self, user_id: str, table: str, chat_id: str, row_id: str, fingerprint: str | None = None
    ) -> _Key:
        """The key of ``user_id`` for reading a row sealed under the key ``fingerprint`` names
        (`KeyNeeded` when it is not held, `EncryptionError` when the provider has no such
        key)."""
        entry = self._keys.get(user_id)
        if entry is None:
            raise KeyNeeded((user_id,), create=False)
        key = entry.key
        if key is None or (fingerprint is not None and key.fingerprint != fingerprint):
            if _stale(entry):
                raise KeyNeeded((user_id,), create=False, fresh=True)
            state = "was destroyed (the user was erased)" if key is None else "was replaced"
            where = f"of chat {chat_id!r} " if chat_id else ""
            if key is None and entry.never:
                _ask_again_unless_just_asked(entry, user_id)
                raise EncryptionError(
                    f"row {row_id!r} {where}(table {table.split('.')[0]}) is sealed under a "
                    f"data key of user {user_id!r} that the key provider never held (it has "
                    "no key of that user, and destroyed none): it is not the keyring the data "
                    "was written with. Give the store the provider (the keyring) the data was "
                    "written with",
                    key_id=user_id,
                )
            raise KeyNotHeld(
                f"row {row_id!r} {where}(table {table.split('.')[0]}) is sealed under a data "
                f"key of user {user_id!r}"
                + ("" if fingerprint is None else f" (fingerprint {fingerprint})")
                + f" that the key provider does not hold: it {state}, or the provider is not "
                "the one the data was written with. The text cannot be read",
                key_id=user_id,
            )
        return key

    def _header(self, header: bytes, table: str, chat_id: str, row_id: str) -> tuple[str, str]:
        """The user and key fingerprint a sealed value's header names (remembered)."""
        parts = header.split(b".")
        try:
            if len(parts) != 3 or parts[0] + b"." != _PREFIX_BYTES:
                raise ValueError
            named = (_unb64(parts[1].decode("ascii")).decode(), parts[2].decode("ascii"))
        except (ValueError, UnicodeDecodeError, binascii.Error):
            raise _corrupt(table, chat_id, row_id, "its sealed value is malformed") from None
        if len(self._headers) >= 4096:
            self._headers.clear()
        self._headers[header] = named
        return named


Sealer = PlainSealer | KeyedSealer


def is_sealed(value: Any) -> bool:
    """Whether a text column's value is a sealed value (never shown as text)."""
    return isinstance(value, str) and value.startswith(PREFIX)


def is_sealed_json(raw: Any) -> bool:
    """Whether a JSON column's raw value (or its text) is a sealed value."""
    if isinstance(raw, bytes):
        return raw[:8] in (_JSON_PREFIX_BYTES, _BLOB_PREFIX)
    return isinstance(raw, str) and raw[:8] == _JSON_PREFIX


def _stale(entry: _Entry) -> bool:
    return time.monotonic() - entry.loaded_at > _RECHECK_SECONDS


def _ask_again_unless_just_asked(entry: _Entry, user_id: str) -> None:
    """`KeyNeeded` (fresh) for a provider's answer about ``user_id`` unless it was read afresh
    a moment ago and not relied on yet (then it is, once: the call that asked takes it)."""
    if not entry.fresh or time.monotonic() - entry.loaded_at > _JUST_ASKED_SECONDS:
        raise KeyNeeded((user_id,), create=False, fresh=True)
    entry.fresh = False


def _aad(table: str, chat_id: str, row_id: str) -> bytes:
    return f"agentcontext\x00{table}\x00{chat_id}\x00{row_id}".encode()


def _nonce() -> bytes:
    import os

    return os.urandom(_NONCE)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _corrupt(table: str, chat_id: str, row_id: str, reason: str) -> Exception:
    from agentcontext.store._rows.decode import corrupt

    return corrupt(table.split(".")[0], row_id, chat_id, reason)
