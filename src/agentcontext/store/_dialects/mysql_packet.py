"""MariaDB's and MySQL's packet limit: a statement's size as the driver sends it, counted
before it is sent.

A statement is one packet of at most ``max_allowed_packet`` bytes (read on each connection:
`install_hooks`). The server does not answer a larger one with an error the store could
report: it drops the connection (error 1153 reaches the client as 2013, lost connection). So
the store counts what a statement will send and refuses one that does not fit, naming the
setting that would take it. What is sent is not the JSON of the messages but the statement
the driver writes: every parameter formatted in, a string in quotes with its backslashes,
quotes, NUL, CR, LF and Ctrl-Z escaped by one more byte each (asyncmy's and PyMySQL's
``escape_string``; with ``NO_BACKSLASH_ESCAPES`` only quotes are, doubled: no more bytes).
JSON writes a control character as ``\\u0001`` (6 bytes), which the driver sends as 7.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence

from sqlalchemy import Connection

from agentcontext.errors import InvalidInputError

__all__ = [
    "PACKET_MAX",
    "PACKET_NEEDED",
    "PACKET_NEEDED_SEALED",
    "check_packet",
    "check_statement",
    "literal_size",
    "packet_needed",
    "warn_small_packet",
]

_log = logging.getLogger("agentcontext")

_MIB = 2**20

PACKET_NEEDED = 128 * _MIB
"""The ``max_allowed_packet`` that takes any message up to the 16 MiB limit
(`MAX_MESSAGE_BYTES`, the UTF-8 size of its strings) in one statement: at worst its text is
of control characters, each 6 bytes of JSON (``\\u0001``) sent as 7 (the backslash escaped),
112 MiB, with room for the rest of the statement."""
PACKET_NEEDED_SEALED = 256 * _MIB
"""The same for an encrypted store: a message's sealed JSON (96 MiB at worst) is sent as
hexadecimal digits, twice its size."""
PACKET_MAX = 1024 * _MIB
"""The largest ``max_allowed_packet`` the servers take (1G)."""

_MARGIN = 64 * 1024
"""Room a statement needs besides its values when its SQL is not counted (SQLAlchemy's)."""
_SQL_MARGIN = 1024
"""Room a statement whose SQL is counted needs besides it and its values (the packet's
header; a placeholder's ``%s`` is counted, and replaced by the value)."""
_ROW_ROOM = 256
"""Room each row of a statement takes besides its values (its ``(..., ...)``, separators)."""
_ESCAPED = ("\\", "'", '"', "\x00", "\n", "\r", "\x1a")
"""The characters the drivers escape in a string literal, each with one more byte."""
_WORST = {False: 7, True: 12}
"""Bytes sent for a byte of text at worst (a control character: ``\\u0001``, 6 bytes of JSON):
the backslash escaped in a plain store, the JSON's sealed bytes in hex in an encrypted one."""


def packet_needed(encrypted: bool) -> int:
    """The ``max_allowed_packet`` a store needs for its largest message (`PACKET_NEEDED`)."""
    return PACKET_NEEDED_SEALED if encrypted else PACKET_NEEDED


def literal_size(value: object) -> int:
    """The bytes ``value`` takes in a statement when the driver formats it in (at most)."""
    if isinstance(value, str):
        size = len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))
        return size + 2 + sum(map(value.count, _ESCAPED))
    if isinstance(value, (bytes, bytearray)):
        return 2 * len(value) + 9  # _binary'...', every byte escaped at worst
    if value is None:
        return 4  # NULL
    return len(str(value).encode("utf-8", "surrogatepass")) + 2  # numbers, times in quotes


def _most(value: object) -> int:
    """An upper bound of `literal_size` that reads no string: a character is at most 4 bytes
    of UTF-8, and an escaped one 2 (a number, a time or NULL: at most 28)."""
    if isinstance(value, str):
        return 4 * len(value) + 2
    if isinstance(value, (bytes, bytearray)):
        return 2 * len(value) + 9
    return 64


def check_packet(
    conn: Connection, values: Sequence[object], *, rows: int, needed: int, sql: str = ""
) -> None:
    """Refuse (`InvalidInputError`, before anything is sent) a statement of ``rows`` rows
    whose parameters are ``values`` (and whose SQL, when given, is ``sql``) that the server
    would refuse for its size, naming the setting that would take it: ``needed`` is the one
    that takes any message (`packet_needed`)."""
    limit = conn.info.get("max_allowed_packet")
    if not isinstance(limit, int):
        return
    fixed = _SQL_MARGIN if sql else _MARGIN + _ROW_ROOM * rows
    if fixed + 4 * len(sql) + sum(map(_most, values)) <= limit:
        return  # however many bytes each character takes
    size = fixed + len(sql.encode("utf-8", "surrogatepass")) + sum(map(literal_size, values))
    if size > limit:
        raise _too_large(size, limit, rows, needed)


def check_statement(conn: Connection, statement: str, parameters: object) -> None:
    """`check_packet` for any statement the store runs (chat rows, blobs, ...), from its
    text and its parameters as SQLAlchemy hands them to the driver (``before_cursor_execute``):
    the statements of messages are counted beforehand, this catches every other one."""
    limit = conn.info.get("max_allowed_packet")
    if not isinstance(limit, int):
        return
    values = list(_parameter_values(parameters))
    if _SQL_MARGIN + 4 * len(statement) + sum(map(_most, values)) <= limit:
        return
    size = (
        _SQL_MARGIN
        + len(statement.encode("utf-8", "surrogatepass"))
        + sum(map(literal_size, values))
    )
    if size > limit:
        raise _too_large(size, limit, 1, PACKET_NEEDED, what="this statement takes")


def _parameter_values(parameters: object) -> Iterator[object]:
    """The values of a statement's parameters: a tuple or a mapping, or a list of them (a
    statement run for many rows, which the driver sends as one)."""
    if isinstance(parameters, Mapping):
        yield from parameters.values()
    elif isinstance(parameters, list):
        for row in parameters:
            yield from _parameter_values(row)
    elif isinstance(parameters, tuple):
        yield from parameters


def _too_large(
    size: int, limit: int, rows: int, needed: int, what: str | None = None
) -> InvalidInputError:
    setting = -(-size // _MIB)  # in MiB, rounded up: more than the limit
    several = rows > 1
    if what is None:
        what = f"these {rows} messages take" if several else "this message takes"
    if setting * _MIB > PACKET_MAX:
        todo = (
            "no setting of the server takes a statement that large (max_allowed_packet is at "
            "most 1G): "
            + (
                "save these messages a few at a time"
                if several
                else "split the message's text into several messages"
            )
        )
    else:
        todo = (
            f"raise max_allowed_packet to {setting * _MIB} ({setting}M) or more on the server "
            f"(SET GLOBAL max_allowed_packet = {setting * _MIB}, and [mysqld] "
            f"max_allowed_packet = {setting}M in its configuration)"
        )
        if needed > setting * _MIB:
            todo += (
                f", or to {needed} ({needed // _MIB}M) to store any message up to the 16 MiB limit"
            )
        if several:
            todo += ", or save these messages a few at a time"
    return InvalidInputError(
        f"{what} about {size} bytes in one statement as the driver sends it (JSON, whose "
        f"escapes the driver escapes again), more than the server allows (max_allowed_packet "
        f"= {limit}); nothing was written: {todo}"
    )


def warn_small_packet(packet: int, encrypted: bool) -> None:
    """Log once, when a store opens, that the server's ``max_allowed_packet`` is too small for
    some messages the store takes, and what to set."""
    needed = packet_needed(encrypted)
    if packet >= needed:
        return
    room = max(0, packet - _MARGIN)
    plain = room / (2 if encrypted else 1) / _MIB
    worst = room / _WORST[encrypted] / _MIB
    refused = f"{worst:.1f} MiB of text that JSON escapes (control characters)"
    if plain < 16:
        refused = f"{plain:.1f} MiB of text, or {refused}"
    _log.warning(
        "the MariaDB/MySQL server of this store allows statements of %d bytes "
        "(max_allowed_packet), and a message is sent in one statement: a message of more than "
        "about %s will be refused. "
        "Raise max_allowed_packet to %d (%dM) or more to store every message up to the 16 MiB "
        "limit: SET GLOBAL max_allowed_packet = %d, and in the server's configuration "
        "([mysqld] max_allowed_packet = %dM)",
        packet,
        refused,
        needed,
        needed // _MIB,
        needed,
        needed // _MIB,
    )
