"""The tables of `LocalKeyProvider`'s keyring, and user ids compared exactly in them.

A keyring keeps one row per user (the wrapped data key, or the time it was destroyed), keyed by
the user id as the store writes it: byte for byte. On MariaDB and MySQL a text column compares
by its collation, and the server's default ones fold case, accents and trailing spaces: there
``erase_user("ALICE")`` would destroy the key of ``alice``. The user id column is made with the
server's binary collation that does not pad (as the store's own id columns are), and a keyring
made before that is changed to it when a provider first opens it (`inexact_user_ids`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Column, Connection, DateTime, LargeBinary, MetaData, String, Table, text
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

__all__ = ["CHECK", "KEYRING_TABLE", "KEYS", "METADATA", "inexact_user_ids"]

KEYRING_TABLE = "agentcontext_data_keys"
"""The keyring's table of wrapped data keys: a store refuses a database that holds it (the
keyring must not be in the data's database)."""

_USER_BYTES = 255


def _exact_collation(dialect: Dialect) -> str:
    """MariaDB's or MySQL's binary ``utf8mb4`` collation that does not pad."""
    return "utf8mb4_nopad_bin" if getattr(dialect, "is_mariadb", False) else "utf8mb4_0900_bin"


class _UserId(TypeDecorator[str]):
    """A user id, compared byte for byte on every database (MariaDB/MySQL: in the binary
    collation that does not pad; SQLite and PostgreSQL compare text that way already)."""

    impl = String(_USER_BYTES)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name in ("mysql", "mariadb"):
            from sqlalchemy.dialects import mysql

            collation = _exact_collation(dialect)
            exact = mysql.VARCHAR(_USER_BYTES, charset="utf8mb4", collation=collation)
            return dialect.type_descriptor(exact)
        return dialect.type_descriptor(String(_USER_BYTES))


METADATA = MetaData()
KEYS = Table(
    KEYRING_TABLE,
    METADATA,
    Column("user_id", _UserId(), primary_key=True),
    Column("wrapped", LargeBinary, nullable=True),
    Column("master", String(16), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("destroyed_at", DateTime(timezone=True), nullable=True),
)
"""One row per user: the data key wrapped under the master key (``master``: that key's
fingerprint), or none once destroyed (``destroyed_at``)."""
CHECK = Table(
    # The keyring's master key, as a check value (an HMAC of a constant under it) and a
    # fingerprint: a key is written only while the check value is this provider's, in the
    # statement that writes it, and `rotate` replaces it in the transaction that wraps the keys
    # again. A provider with a stale or wrong master key makes no key the others cannot open.
    "agentcontext_keyring",
    METADATA,
    Column("name", String(32), primary_key=True),
    Column("value", String(64), nullable=False),
    Column("master", String(16), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)


_EXACT = {
    collation: f"ALTER TABLE {KEYRING_TABLE} MODIFY user_id VARCHAR({_USER_BYTES}) "
    f"CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL"
    for collation in ("utf8mb4_nopad_bin", "utf8mb4_0900_bin")
}
"""The statement that makes an older keyring's user ids compare exactly, per collation."""


def inexact_user_ids(conn: Connection) -> str | None:
    """The statement that makes the keyring's user ids compare exactly on MariaDB/MySQL, in a
    keyring made before they did (its column in the server's default collation), or None when
    there is nothing to change (other databases; a column that is right). The change keeps
    every row: no two rows can differ only in what the old collation ignored."""
    dialect = conn.dialect
    if dialect.name not in ("mysql", "mariadb"):
        return None
    wanted = _exact_collation(dialect)
    found = conn.execute(
        text(
            "SELECT collation_name FROM information_schema.columns WHERE table_schema = "
            "DATABASE() AND table_name = :table AND column_name = 'user_id'"
        ),
        {"table": KEYRING_TABLE},
    ).scalar()
    return None if found is None or str(found) == wanted else _EXACT[wanted]
