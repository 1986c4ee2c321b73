"""MariaDB's read replicas: log positions and consistency tokens from global transaction ids.

A MariaDB primary with its binary log on gives every transaction it commits a GTID,
``domain-server-sequence``. Within a replication domain the sequence numbers only grow, and a
replica applies a domain's transactions in their order: ``@@gtid_slave_pos`` names the last
one it applied. So the positions the store's read replicas compare (``_db.replicas``) are the
sequence numbers of the primary's domain: ``@@gtid_binlog_pos`` on the primary after a commit,
``@@gtid_slave_pos`` on a replica. A consistency token is the GTID itself (``"0-1-42"``), as
MariaDB writes it and ``MASTER_GTID_WAIT`` takes it.

MySQL's GTIDs are sets of server UUIDs and ranges, with no order between two of them: a store
on MySQL refuses ``read_replicas=`` when it opens (`check_primary`).
"""

from __future__ import annotations

import re

from sqlalchemy import Connection

from agentcontext import _validate as v
from agentcontext.errors import InvalidInputError, InvalidTypeError

__all__ = ["Domain", "check_primary", "format_token", "parse_token", "replay_position",
           "settle_token", "write_position"]  # fmt: skip

_GTID = re.compile(r"([0-9]{1,10})-([0-9]{1,10})-([0-9]{1,20})")  # (ASCII digits only)
_MAX_UINT32 = 2**32 - 1
_MAX_SEQUENCE = 2**64 - 1


class Domain:
    """The replication domain the store's primary writes in, and the server id of its last
    GTID there (for tokens): learned from the primary, shared by copies of the dialect."""

    __slots__ = ("domain", "server")

    def __init__(self) -> None:
        self.domain: int | None = None
        self.server = 0


def _positions(text: object) -> dict[int, tuple[int, int]]:
    """``"0-1-42,1-2-7"`` as ``{domain: (server, sequence)}`` (empty for ``""`` or NULL)."""
    found: dict[int, tuple[int, int]] = {}
    for item in str(text or "").split(","):
        match = _GTID.fullmatch(item.strip())
        if match is not None:
            domain, server, sequence = (int(part) for part in match.groups())
            found[domain] = (server, sequence)
    return found


def check_primary(conn: Connection) -> None:
    """At open, for a store with ``read_replicas=``: the primary is MariaDB with its binary
    log on, or `InvalidInputError` says what to change."""
    if not getattr(conn.dialect, "is_mariadb", False):
        raise InvalidInputError(
            "read_replicas= needs MariaDB: the store waits for a replica by MariaDB's global "
            "transaction ids, and MySQL's have no order to wait by. Drop read_replicas= (every "
            "read goes to the server of the URL)"
        )
    if not int(conn.exec_driver_sql("SELECT @@log_bin").scalar_one() or 0):
        raise InvalidInputError(
            "read_replicas= needs the primary's binary log, and this MariaDB server has it off "
            "(log_bin): replicas replicate from it and the store waits for them by its "
            "positions. Start the server with log_bin (and a server_id of its own), or drop "
            "read_replicas="
        )


def write_position(conn: Connection, domain: Domain) -> int | None:
    """After a commit on ``conn`` (the primary): the sequence number of the last transaction
    the primary logged in its domain; None when its binary log is off."""
    row = conn.exec_driver_sql("SELECT @@log_bin, @@gtid_domain_id, @@gtid_binlog_pos").one()
    if not int(row[0] or 0):
        return None
    domain.domain = int(row[1])
    found = _positions(row[2]).get(domain.domain)
    if found is None:
        return 0  # nothing logged in this domain yet
    domain.server = found[0]
    return found[1]


def replay_position(conn: Connection, domain: Domain) -> int | None:
    """How far the replica ``conn`` reaches has applied the primary's domain; None when it
    never applied anything (not a replica)."""
    found = _positions(conn.exec_driver_sql("SELECT @@gtid_slave_pos").scalar_one())
    if not found:
        return None
    if domain.domain is None:
        # Nothing written or waited for by this store yet: its reads need no position (and
        # none is guessed from a domain that may not be the primary's: positions are kept).
        return 0
    entry = found.get(domain.domain)
    return 0 if entry is None else entry[1]


_DOMAIN_SHIFT = 64
"""A token parsed before the store knew its primary's domain keeps its own domain above the
sequence number (plus one, so that domain 0 is kept too), until `settle_token`."""


def format_token(position: int, domain: Domain) -> str:
    """A sequence number of the primary's domain as a GTID (``"0-1-42"``)."""
    named, sequence = position >> _DOMAIN_SHIFT, position & _MAX_SEQUENCE
    return f"{named - 1 if named else domain.domain or 0}-{domain.server}-{sequence}"


def settle_token(position: int, domain: Domain, name: str = "after") -> int:
    """A token's position parsed before the primary's domain was known, checked against it
    now that it is (`parse_token`): its sequence number, or `InvalidInputError`."""
    named = position >> _DOMAIN_SHIFT
    if not named or domain.domain is None:
        return position
    if named - 1 != domain.domain:
        raise _other_domain(format_token(position, domain), named - 1, domain.domain, name)
    return position & _MAX_SEQUENCE


def _other_domain(token: str, named: int, primary: int, name: str) -> InvalidInputError:
    return InvalidInputError(
        f"{name}={token!r} names replication domain {named}, and this store's primary writes "
        f"in domain {primary}: it was not issued by this database. Pass "
        "SaveResult.consistency_token exactly as a save of this database returned it"
    )


def parse_token(token: object, domain: Domain, name: str = "after") -> int:
    """The sequence number of a GTID token, or `InvalidInputError` saying what to pass."""
    if not isinstance(token, str):
        raise InvalidTypeError(
            f"{name} must be a consistency token (a str from SaveResult.consistency_token), "
            f"got {v.type_name(token)}"
        )
    match = _GTID.fullmatch(token)
    numbers = [int(part) for part in match.groups()] if match is not None else []
    if (
        not numbers
        or numbers[0] > _MAX_UINT32
        or numbers[1] > _MAX_UINT32
        or numbers[2] > _MAX_SEQUENCE
    ):
        shown = token if len(token) <= 40 else token[:40] + "…"
        raise InvalidInputError(
            f"{name}={shown!r} is not a consistency token of a MariaDB store; pass "
            "SaveResult.consistency_token exactly as a save returned it (a GTID like '0-1-42')"
        )
    if domain.domain is None:  # (checked once the store knows it: `settle_token`)
        return ((numbers[0] + 1) << _DOMAIN_SHIFT) | numbers[2]
    if numbers[0] != domain.domain:
        raise _other_domain(token, numbers[0], domain.domain, name)
    return numbers[2]
