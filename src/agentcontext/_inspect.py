"""What ``ContextEngine.inspect`` returns, and how it is put together.

The models are public (re-exported by `agentcontext.engine`); `build_inspect` takes what the
engine rendered and what it holds (its conversation, the pending messages) and reads the stored
chain and the chat's graph.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from pydantic import BaseModel

from agentcontext._conversation import Conversation
from agentcontext.estimate import Estimate
from agentcontext.fragments import ContextFragment
from agentcontext.messages import Message
from agentcontext.store.records import Graph, MessageRecord, utcnow

__all__ = ["InspectFragments", "InspectMeta", "InspectResult", "InspectStore", "build_inspect"]


class InspectFragments(BaseModel):
    """The fragments of an `InspectResult`, as JSON-able data."""

    context: list[dict[str, Any]]
    """System-prompt fragments (lazy data materialised)."""
    pending: list[dict[str, Any]]
    """Message fragments waiting for ``save()``."""
    persisted: list[MessageRecord]
    """The stored messages of the branch, root first."""


class InspectMeta(BaseModel):
    """Where and when an `InspectResult` was taken."""

    chat_id: str
    branch: str
    timestamp: datetime


class InspectResult(BaseModel):
    """Everything about an engine's context, JSON-serialisable (``model_dump(mode="json")``)."""

    estimate: Estimate | None
    rendered: str
    fragments: InspectFragments
    graph: Graph
    meta: InspectMeta


class InspectStore(Protocol):
    """What inspect reads of a store (every `EngineStore` does it)."""

    async def get_message_chain(
        self, head_id: str, *, after: str | None = None
    ) -> list[MessageRecord]: ...
    async def get_graph(self, chat_id: str) -> Graph: ...


def fragment_json(fragment: ContextFragment) -> dict[str, Any]:
    """A JSON-able view of a context fragment (for inspect)."""

    def plain(value: Any, depth: int = 0) -> Any:
        if depth > 64:
            return "…"
        if isinstance(value, ContextFragment):
            return {"name": value.name, "data": plain(value.data, depth + 1)}
        if isinstance(value, Mapping):
            return {str(k): plain(item, depth + 1) for k, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(item, depth + 1) for item in value]
        if value is None or isinstance(value, (str, int, float, bool)):
            return value
        return repr(value)

    data = fragment.codec.decode() if fragment.codec is not None else fragment.data
    out: dict[str, Any] = {"name": fragment.name, "type": fragment.type, "data": plain(data)}
    if fragment.id is not None:
        out["id"] = fragment.id
    return out


async def build_inspect(
    store: InspectStore,
    conv: Conversation,
    estimate: Estimate | None,
    rendered: str,
    *,
    fragments: Sequence[ContextFragment],
    pending: Sequence[Message],
) -> InspectResult:
    """The picture of an engine: ``fragments`` as rendered into ``rendered``, the ``pending``
    messages, the stored chain of ``conv``'s branch (read through its head) and the chat's
    graph."""
    assert conv.branch is not None
    chain, chat_id = conv.chain, conv.chat_id
    pending_json = [
        {"id": message.id, "name": message.role, "message": message.model_dump(mode="json")}
        for message in pending
    ]
    persisted: list[MessageRecord] = (
        [] if chain.head is None else await store.get_message_chain(chain.head)
    )
    graph = await store.get_graph(chat_id)
    return InspectResult(
        estimate=estimate,
        rendered=rendered,
        fragments=InspectFragments(
            context=[fragment_json(fragment) for fragment in fragments],
            pending=pending_json,
            persisted=persisted,
        ),
        graph=graph,
        meta=InspectMeta(chat_id=chat_id, branch=conv.branch.name, timestamp=utcnow()),
    )
