"""Context snapshots: a record of what an agent saw (files, URLs, snippets, command output).

Modelled on the ``git-internal`` crate's ``ContextSnapshot``. Every item points at its
content by SHA-256 (``blob``); the store keeps each distinct content once, however many
snapshots or chats use it. A snapshot is built in memory, then stored with
``await context.snapshot(snapshot)``; a stored snapshot is immutable:

```python
snap = ContextSnapshot(selection=SelectionStrategy.EXPLICIT, summary="files for the fix")
snap.add_file("src/app.py", source_text)
snap.add_command("pytest -q", output)
stored = await context.snapshot(snap)          # attached to the chat and its head
context.set(snapshot_fragment(stored, content="preview"))
```
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from agentcontext import _validate as v
from agentcontext.errors import InvalidInputError, InvalidTypeError, SnapshotError
from agentcontext.fragments import ContextFragment

__all__ = [
    "PREVIEW_LENGTH",
    "ContentMode",
    "ContextItem",
    "ContextItemKind",
    "ContextSnapshot",
    "SelectionStrategy",
    "blob_hash",
    "snapshot_fragment",
]

PREVIEW_LENGTH = 500
"""Longest preview of an item, in characters."""


class ContextItemKind(StrEnum):
    """What an item's content is."""

    FILE = "file"
    URL = "url"
    SNIPPET = "snippet"
    COMMAND = "command"
    IMAGE = "image"
    OTHER = "other"


class SelectionStrategy(StrEnum):
    """How the items were chosen: by a person or rule (explicit) or by a ranking (heuristic).

    With a token budget, `snapshot_fragment` drops heuristic items before
    explicit ones.
    """

    EXPLICIT = "explicit"
    HEURISTIC = "heuristic"


def blob_hash(content: bytes) -> str:
    """The address of some content: its SHA-256 as 64 lowercase hex characters."""
    if not isinstance(content, (bytes, bytearray, memoryview)):
        raise InvalidTypeError(f"blob content must be bytes, got {v.type_name(content)}")
    return hashlib.sha256(bytes(content)).hexdigest()


def _text_preview(content: bytes) -> str | None:
    """The first 500 characters of UTF-8 text; None for binary content."""
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if "\x00" in text:
        return None
    return text[:PREVIEW_LENGTH]


class ContextItem(BaseModel):
    """One thing the agent saw.

    Attributes:
        kind: file, url, snippet, command, image or other.
        path: A human-readable locator: a repository path, a URL, a command line, a label.
        blob: SHA-256 of the full content (None only while a snapshot is being drafted).
        preview: At most 500 characters of the content; None for binary content.
        media_type: The content's media type (``text/plain; charset=utf-8`` for text).
        size: The content's size in bytes.
        selection: Overrides the snapshot's selection strategy for this item.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: ContextItemKind
    path: str
    blob: str | None = None
    preview: str | None = None
    media_type: str = "application/octet-stream"
    size: int = 0
    selection: SelectionStrategy | None = None


class ContextSnapshot(BaseModel):
    """A point-in-time record of the context an agent observed.

    Build it with the ``add_*`` helpers (they keep the content in memory until the snapshot
    is stored). Once stored it carries ``id``, ``chat_id``, ``message_id`` (the head it was
    attached to) and ``created_at``, and it is frozen: adding to it raises
    `SnapshotError`.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    selection: SelectionStrategy = SelectionStrategy.EXPLICIT
    summary: str | None = None
    items: list[ContextItem] = Field(default_factory=list)
    id: str | None = None
    chat_id: str | None = None
    message_id: str | None = None
    created_at: datetime | None = None

    _contents: dict[str, tuple[bytes, str]] = PrivateAttr(default_factory=dict)

    @property
    def stored(self) -> bool:
        """Whether this snapshot was stored (and so is immutable)."""
        return self.id is not None

    @property
    def contents(self) -> dict[str, tuple[bytes, str]]:
        """Content held in memory, by blob hash: ``(bytes, media_type)``."""
        return dict(self._contents)

    def __setattr__(self, name: str, value: Any) -> None:
        if not name.startswith("_") and getattr(self, "id", None) is not None:
            raise SnapshotError(
                f"snapshot {self.id!r} is stored and cannot change; build a new ContextSnapshot"
            )
        super().__setattr__(name, value)

    # --- adding items -----------------------------------------------------------------------

    def add(
        self,
        kind: ContextItemKind | str,
        path: str,
        content: str | bytes,
        *,
        media_type: str | None = None,
        selection: SelectionStrategy | str | None = None,
    ) -> ContextItem:
        """Add an item of any kind; returns it. Text is stored as UTF-8."""
        if self.stored:
            raise SnapshotError(
                f"snapshot {self.id!r} is stored and cannot change; build a new ContextSnapshot"
            )
        try:
            item_kind = ContextItemKind(kind)
        except ValueError:
            raise InvalidInputError(
                f"kind must be one of {[k.value for k in ContextItemKind]}, got {kind!r}"
            ) from None
        v.check_text(path, "path")
        if isinstance(content, str):
            # Stored as bytes, so NUL is fine (the item just gets no preview); the text must
            # still encode to UTF-8.
            v.check_unicode(content, "content")
            data = content.encode("utf-8")
            default_type = "text/plain; charset=utf-8"
        elif isinstance(content, (bytes, bytearray, memoryview)):
            data = bytes(content)
            default_type = "application/octet-stream"
        else:
            raise InvalidTypeError(f"content must be str or bytes, got {v.type_name(content)}")
        kind_type = media_type if media_type is not None else default_type
        v.check_id(kind_type, "media_type")
        strategy = None if selection is None else SelectionStrategy(selection)
        digest = blob_hash(data)
        preview = None if item_kind is ContextItemKind.IMAGE else _text_preview(data)
        item = ContextItem(
            kind=item_kind,
            path=path,
            blob=digest,
            preview=preview,
            media_type=kind_type,
            size=len(data),
            selection=strategy,
        )
        self._contents[digest] = (data, kind_type)
        self.items = [*self.items, item]
        return item

    def add_file(
        self, path: str, content: str | bytes, *, media_type: str | None = None
    ) -> ContextItem:
        """A file the agent read: its path and content."""
        return self.add(ContextItemKind.FILE, path, content, media_type=media_type)

    def add_url(
        self, url: str, content: str | bytes, *, media_type: str | None = None
    ) -> ContextItem:
        """A web page: its URL and the content the caller fetched (nothing is fetched here)."""
        return self.add(ContextItemKind.URL, url, content, media_type=media_type)

    def add_snippet(self, label: str, text: str) -> ContextItem:
        """A piece of text with a label (design notes, a quoted passage)."""
        return self.add(ContextItemKind.SNIPPET, label, text)

    def add_command(self, command: str, output: str | bytes) -> ContextItem:
        """A command line and its output."""
        return self.add(ContextItemKind.COMMAND, command, output)

    def add_image(self, path: str, data: bytes, media_type: str) -> ContextItem:
        """An image: bytes and media type (``image/png``, …); it has no preview."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidTypeError(f"image data must be bytes, got {v.type_name(data)}")
        return self.add(ContextItemKind.IMAGE, path, data, media_type=media_type)

    def add_other(
        self, path: str, content: str | bytes, *, media_type: str | None = None
    ) -> ContextItem:
        """Anything else."""
        return self.add(ContextItemKind.OTHER, path, content, media_type=media_type)

    def effective_selection(self, item: ContextItem) -> SelectionStrategy:
        """The item's own selection strategy, or the snapshot's."""
        return item.selection or self.selection

    def content_of(self, item: ContextItem) -> bytes | None:
        """The item's content if it is held in memory."""
        if item.blob is None or item.blob not in self._contents:
            return None
        return self._contents[item.blob][0]

    def freeze(
        self, *, id: str, chat_id: str, message_id: str | None, created_at: datetime
    ) -> ContextSnapshot:
        """A stored copy carrying its identity (used by the store)."""
        frozen = ContextSnapshot(
            selection=self.selection,
            summary=self.summary,
            items=list(self.items),
            id=id,
            chat_id=chat_id,
            message_id=message_id,
            created_at=created_at,
        )
        frozen._contents.update(self._contents)
        return frozen


ContentMode = Literal["preview", "full"]


def _item_text(item: ContextItem, content: bytes | None, mode: ContentMode) -> str | None:
    """What the prompt shows of an item: its preview, or its whole text; None if binary."""
    if mode == "preview" or content is None:
        return item.preview
    if item.kind is ContextItemKind.IMAGE or _text_preview(content) is None:
        return None
    return content.decode("utf-8")


def _budgeted(
    snapshot: ContextSnapshot,
    entries: list[tuple[ContextItem, str | None]],
    budget: int | None,
    count: Callable[[str], int],
) -> list[tuple[ContextItem, str | None]]:
    """Drop items, heuristic ones first (the last first), until the texts fit ``budget``."""
    if budget is None:
        return entries
    sizes = [count(f"{item.path}\n{text or ''}") for item, text in entries]
    keep = [True] * len(entries)
    total = sum(sizes)
    for strategy in (SelectionStrategy.HEURISTIC, SelectionStrategy.EXPLICIT):
        for index in reversed(range(len(entries))):
            if total <= budget:
                break
            if keep[index] and snapshot.effective_selection(entries[index][0]) is strategy:
                keep[index] = False
                total -= sizes[index]
    return [entry for entry, kept in zip(entries, keep, strict=True) if kept]


def _fragment_data(
    snapshot: ContextSnapshot, entries: list[tuple[ContextItem, str | None]]
) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for item, text in entries:
        entry: dict[str, Any] = {"kind": item.kind.value, "path": item.path}
        if text is not None:
            entry["content"] = text
        else:
            entry["binary"] = f"{item.media_type}, {item.size} bytes"
        items.append(entry)
    data: dict[str, Any] = {"selection": snapshot.selection.value}
    if snapshot.summary is not None:
        data["summary"] = snapshot.summary
    data["items"] = items
    return data


def snapshot_fragment(
    snapshot: ContextSnapshot,
    *,
    content: ContentMode = "preview",
    budget: int | None = None,
    count_tokens: Callable[[str], int] | None = None,
    name: str = "context_snapshot",
) -> ContextFragment:
    """A system-prompt fragment listing a snapshot's items.

    Args:
        snapshot: A snapshot, stored or not.
        content: ``"preview"`` (each item's first 500 characters) or ``"full"`` (the whole
            text). Binary items (images) show their media type and size instead.
        budget: At most this many tokens of item text; items are dropped to fit, heuristic
            ones before explicit ones, the last ones first.
        count_tokens: How to count tokens for the budget (default:
            `agentcontext.approximate_tokens`).
        name: The fragment's name (its tag in XML).

    When ``content="full"`` and the snapshot does not hold its contents in memory (a stored
    snapshot listed without them), the fragment loads them lazily from the engine's store
    when the engine resolves.
    """
    if not isinstance(snapshot, ContextSnapshot):
        raise InvalidTypeError(
            f"snapshot_fragment takes a ContextSnapshot, got {v.type_name(snapshot)}"
        )
    if content not in ("preview", "full"):
        raise InvalidInputError(f"content must be 'preview' or 'full', got {content!r}")
    v.check_optional_int(budget, "budget", minimum=0)
    v.check_id(name, "name")
    if count_tokens is None:
        from agentcontext.estimate import approximate_tokens

        count_tokens = approximate_tokens
    counter = count_tokens

    def build(contents: Mapping[str, bytes]) -> dict[str, Any]:
        entries = [
            (item, _item_text(item, contents.get(item.blob or ""), content))
            for item in snapshot.items
        ]
        return _fragment_data(snapshot, _budgeted(snapshot, entries, budget, counter))

    held = {digest: data for digest, (data, _media) in snapshot.contents.items()}
    missing = (
        {item.blob for item in snapshot.items if item.blob and item.blob not in held}
        if content == "full"
        else set()
    )
    if not missing:
        return ContextFragment(name=name, data=build(held))

    async def load(context: Any) -> dict[str, Any]:
        engine = getattr(context, "engine", None)
        store = getattr(engine, "store", None)
        chat_id = snapshot.chat_id or getattr(engine, "chat_id", None)
        if store is None:
            raise SnapshotError(
                "this snapshot's contents are not in memory; resolve it through a "
                "ContextEngine, or load it with store.get_snapshot(id, with_content=True)"
            )
        loaded = dict(held)
        for digest in sorted(missing):
            data = await store.read_blob(digest, chat_id=chat_id)
            if data is None:
                raise SnapshotError(f"blob {digest} of the snapshot is missing from the store")
            loaded[digest] = data
        return build(loaded)

    return ContextFragment(name=name, data=load)
