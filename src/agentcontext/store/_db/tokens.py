"""Consistency tokens as PostgreSQL writes log positions: an LSN's text (``"0/16B3748"``).

The default form of a `Dialect`'s tokens (``Dialect.format_token`` / ``parse_token``); MariaDB
writes its own (``_dialects.mysql_replicas``).
"""

from __future__ import annotations

import re

from agentcontext import _validate as v
from agentcontext.errors import InvalidInputError, InvalidTypeError

__all__ = ["format_token", "parse_token"]

_TOKEN = re.compile(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})")


def format_token(position: int) -> str:
    """A WAL position as a consistency token (PostgreSQL's LSN text, ``"0/16B3748"``)."""
    return f"{position >> 32:X}/{position & 0xFFFFFFFF:X}"


def parse_token(token: object, name: str = "after") -> int:
    """The WAL position of a consistency token, or `InvalidInputError` saying what to pass."""
    if not isinstance(token, str):
        raise InvalidTypeError(
            f"{name} must be a consistency token (a str from SaveResult.consistency_token), "
            f"got {v.type_name(token)}"
        )
    match = _TOKEN.fullmatch(token)
    if match is None:
        shown = token if len(token) <= 40 else token[:40] + "…"
        raise InvalidInputError(
            f"{name}={shown!r} is not a consistency token; pass SaveResult.consistency_token "
            "exactly as a save returned it (like '0/16B3748')"
        )
    return (int(match.group(1), 16) << 32) | int(match.group(2), 16)
