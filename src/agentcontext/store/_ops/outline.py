"""A chat's linear runs, found once per chat version and kept for the viewer's next page.

An outline is defined by one walk of the chat, the graph shape (`agentcontext._shape`) that
the text views and the viewer draw by too: a message is *kept* (drawn) when it is a root, a
compaction, the parent of a compaction, marked (a branch head, a checkpoint, the selected
message), or when it has no child or several; every other message has exactly one child and
belongs to the linear run that ends at a kept message. Finding the runs needs every message's
id, parent and type: a read and a walk that grow with the chat.

The marks change from page to page (the selected message, the runs opened), the structure
does not. So `Runs` holds the runs for no marks at all, the *structural* runs, and `Runs.outline`
cuts them at the marks of one page: a page's cost grows with the runs and the marks, not with
the messages. The store's `OutlineMemory` (``store._memory``) keeps the `Runs` of the chats
last shown, keyed by the chat's identity and version (every change to a chat's messages,
branches or checkpoints moves its version).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Collection, Iterable

from agentcontext._shape import find_runs, kept_messages, run_folds
from agentcontext.store.records import Fold

__all__ = ["Runs"]

_BYTES_PER_MESSAGE = 240
"""Estimated bytes a message costs in `Runs` (its id, a dictionary slot, a list slot)."""


class Runs:
    """A chat's structural runs: the kept messages, and every other message in the run (root
    to leaf order) that ends above a kept one."""

    __slots__ = ("_below", "_members", "_starts", "_where", "count", "kept")

    def __init__(
        self, count: int, kept: list[str], members: list[str], starts: list[int], below: list[str]
    ) -> None:
        self.count = count
        """How many messages the chat holds."""
        self.kept = kept
        """The structurally kept messages."""
        self._members = members  # every run's messages, run after run
        self._starts = starts  # where each run begins in _members
        self._below = below  # the kept message under each run (its last message's child)
        self._where = dict(zip(members, range(len(members)), strict=True))

    @classmethod
    def build(cls, nodes: Iterable[tuple[str, str | None, str]]) -> Runs:
        """The runs of a chat from every message's ``(id, parent_id, type)``, in any order
        (the graph shape's `kept_messages` and `find_runs`, with no marks)."""
        parent_of, kept = kept_messages(nodes)
        return cls(len(parent_of), *find_runs(parent_of, kept))

    @property
    def size(self) -> int:
        """An estimate of the bytes held."""
        return (self.count + 1) * _BYTES_PER_MESSAGE

    def outline(
        self, marked: Collection[str], *, fold: int, opened: Collection[str] = ()
    ) -> tuple[list[str], list[Fold]]:
        """The ids to draw and the runs to fold once ``marked`` messages are kept as well:
        exactly what one walk of the chat with those marks applied gives."""
        members, starts = self._members, self._starts
        cuts: dict[int, list[int]] = {}
        for node_id in marked:
            at = self._where.get(node_id)
            if at is not None:
                cuts.setdefault(bisect_right(starts, at) - 1, []).append(at)
        shown = list(self.kept)
        folds: list[Fold] = []
        for run, start in enumerate(starts):
            end = starts[run + 1] if run + 1 < len(starts) else len(members)
            low = start
            for cut in [*sorted(cuts.get(run, ())), end]:
                if cut > low:
                    first, last, count = members[low], members[cut - 1], cut - low
                    if run_folds(count, fold) and first not in opened:
                        child = members[cut] if cut < end else self._below[run]
                        shown.extend((first, last))
                        folds.append(
                            Fold(first_id=first, last_id=last, count=count, child_id=child)
                        )
                    else:
                        shown.extend(members[low:cut])
                if cut < end:
                    shown.append(members[cut])
                low = cut + 1
        folds.sort(key=lambda f: f.first_id)
        return shown, folds
