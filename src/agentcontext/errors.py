"""The exceptions agentcontext raises.

Every error the library raises derives from `ContextError`, so one ``except ContextError``
catches them all. Errors about bad arguments also derive from the matching built-in
(``ValueError`` or ``TypeError``), so code that already catches those keeps working.
No raw driver exception (sqlite3, asyncpg, SQLAlchemy) escapes a public method for a condition
the library can name.
"""

from __future__ import annotations

__all__ = [
    "BranchExistsError",
    "BranchNotFoundError",
    "ChatBusyError",
    "ChatExistsError",
    "ChatNotFoundError",
    "ChatOwnershipError",
    "CheckpointNotFoundError",
    "ContextError",
    "EmptyConversationError",
    "EncryptionError",
    "FragmentLoadError",
    "HeadConflictError",
    "InvalidGraphError",
    "InvalidInputError",
    "InvalidTypeError",
    "MessageNotFoundError",
    "MissingExtraError",
    "ContextWindowError",
    "CorruptDataError",
    "ModelNotFoundError",
    "NotFoundError",
    "SchemaOutdatedError",
    "SerializationError",
    "SnapshotError",
    "StoreClosedError",
    "StoreError",
    "StoreUnavailableError",
]


class ContextError(Exception):
    """Root of every error raised by agentcontext."""


# --- bad input -------------------------------------------------------------------------------


class InvalidInputError(ContextError, ValueError):
    """An argument has the right type but a value the library cannot accept.

    The message names the argument and says what a valid value looks like.
    """


class InvalidTypeError(InvalidInputError, TypeError):
    """An argument has the wrong type. The message names the argument and the expected type."""


class SerializationError(InvalidInputError):
    """A value cannot be stored as JSON or converted to or from a serialized fragment.

    Raised for NaN or infinite floats, non-string dict keys, NUL characters, lone surrogates,
    values nested too deeply, self-containing values, objects JSON cannot represent, and
    serialized fragments of an unknown type.
    """


# --- lookups ---------------------------------------------------------------------------------


class NotFoundError(ContextError, LookupError):
    """Something the call needs does not exist."""


class ChatNotFoundError(NotFoundError):
    """The chat does not exist (or belongs to another user where a user id was given)."""


class MessageNotFoundError(NotFoundError):
    """The message does not exist in this chat."""


class BranchNotFoundError(NotFoundError):
    """The branch does not exist in this chat."""


class CheckpointNotFoundError(NotFoundError):
    """The checkpoint does not exist in this chat."""


# --- conflicts and graph rules ---------------------------------------------------------------


class ChatExistsError(ContextError):
    """A chat with this id already exists; use ``upsert_chat`` to reuse it."""


class BranchExistsError(ContextError):
    """A branch with this name already exists in the chat."""


class ChatOwnershipError(ContextError):
    """The chat belongs to another user."""


class InvalidGraphError(ContextError):
    """The operation would break the message graph, or the stored graph is inconsistent.

    Raised for a message that would be its own parent, a parent in another chat, a change of
    parent that would create a cycle, and a stored chain that loops or is broken.
    """


class HeadConflictError(ContextError):
    """Other writers kept moving the branch head; the save gave up after bounded retries.

    Nothing was written. Retry the save, or reduce the number of concurrent writers per chat.
    """


class EmptyConversationError(ContextError):
    """The operation needs at least one saved message on the branch."""


class FragmentLoadError(ContextError):
    """Loading lazy fragment data failed.

    ``path`` names the fragment (``parent.child``); the original exception is chained as
    ``__cause__``.
    """

    def __init__(self, message: str, *, path: str = "") -> None:
        super().__init__(message)
        self.path = path


class ModelNotFoundError(ContextError, LookupError):
    """No price or context-limit data is known for this model id; register it first."""


class ContextWindowError(ContextError):
    """A request cannot fit the context window even with every droppable message left out.

    The message gives the numbers: what must be sent (the system prompt, pinned messages and
    the newest user turn) and what the window allows.
    """

    def __init__(self, message: str, *, required: int = 0, allowed: int = 0) -> None:
        super().__init__(message)
        self.required = required
        """Tokens the request needs at the least."""
        self.allowed = allowed
        """Tokens the window allows (the limit minus the reserved output)."""


class SnapshotError(ContextError):
    """A context snapshot cannot be changed or stored as asked (for example, it is frozen)."""


# --- the database ----------------------------------------------------------------------------


class MissingExtraError(ContextError, ModuleNotFoundError):
    """An optional dependency is not installed; the message gives the ``pip install`` line.

    A ``ModuleNotFoundError`` too, so code that already catches that keeps working.
    """


class StoreError(ContextError):
    """The database reported an error the library has no more specific name for."""


class StoreUnavailableError(StoreError):
    """The database cannot be reached, or kept refusing the call over locks other transactions
    held. The message shows the URL with its password hidden.

    ``contended`` tells the two apart.
    """

    contended: bool = False
    """True when the server refused the call because other transactions held what it needed
    (a row lock waited for past ``innodb_lock_wait_timeout``, deadlocks broken by rolling the
    call back) and the store had already run it again as often as it does (up to 8 times):
    nothing was written, and ``save()`` does not run it again itself. False when the database
    could not be reached or the connection dropped (then ``save()`` tries again a few times
    before raising, and finds a write whose commit it never heard of)."""


class StoreClosedError(StoreError):
    """The store was closed; create a new one."""


class ChatBusyError(StoreError):
    """A write waited too long for a chat held by an uncommitted transaction of this process
    (``store.using()`` or ``store.begin()``); nothing was written. Commit or roll back that
    transaction, or give the store a longer ``lock_timeout``."""


class CorruptDataError(StoreError):
    """A stored row cannot be decoded: it was damaged or written outside agentcontext.

    The message names the table, the chat and the row's id and says what is wrong; the
    attributes carry the same.
    """

    def __init__(
        self,
        message: str,
        *,
        table: str | None = None,
        chat_id: str | None = None,
        row_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.table = table
        """The table of the damaged row (``messages``, ``chats``, ...)."""
        self.chat_id = chat_id
        """The chat the row belongs to, when known."""
        self.row_id = row_id
        """The id of the damaged row (a message id, a chat id, ...), when known."""


class EncryptionError(StoreError):
    """Encrypted data cannot be read or written: the store has no key provider for an
    encrypted database, the master key is missing or wrong, or the data key of the user who
    owns the data was destroyed (the user was erased). Ciphertext is never returned as text.

    ``key_id`` names the data key concerned, when there is one.
    """

    def __init__(self, message: str, *, key_id: str | None = None) -> None:
        super().__init__(message)
        self.key_id = key_id
        """The data key concerned (its user id), when known."""


class SchemaOutdatedError(StoreError):
    """The database schema is not at the revision this version of agentcontext needs.

    The message gives the exact command that upgrades it.
    """


class ReminderError(ContextError):
    """A reminder or one of its predicates was built with a bad argument, or a reminder's
    predicate or text function raised (chained as ``__cause__``) or returned the wrong type."""


__all__ += ["ReminderError"]
