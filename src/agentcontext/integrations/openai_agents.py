"""The OpenAI Agents SDK's ``Session`` over an agentcontext chat.

`AgentContextSession` stores each conversation item the SDK hands it (``TResponseInputItem``)
as one message node on the chat's active branch, so the history is the same graph that
``ContextEngine`` branches, searches, snapshots and exports. The item itself is kept in the
message's ``metadata["openai_item"]`` and given back verbatim; the message's parts hold its
meaning for everything else (user and assistant text, reasoning, tool calls: a
``function_call`` is stored as an unfinished call and its ``function_call_output`` as the
finished call, so ``resolve().to_openai()`` sends each call once).

The graph keeps its promises: ``pop_item()`` moves the head back to the parent (a new branch
at the parent, as ``rewind`` does) instead of deleting the node, and ``clear_session()``
starts an empty branch with the history kept on the old one.

For example:

```python
async with SqlContextStore("sqlite+aiosqlite:///agents.db") as store:
    session = AgentContextSession("chat-1", store=store, user_id="user-1")
    result = await Runner.run(agent, "Hello!", session=session)
```
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from agentcontext._extras import require_extra
from agentcontext.adapters.responses import items_to_parts, to_openai_responses
from agentcontext.adapters.shared import new_id, parse_arguments
from agentcontext.engine import ContextEngine
from agentcontext.errors import InvalidInputError, InvalidTypeError
from agentcontext.fragments import message as message_fragment
from agentcontext.messages import DataPart, Message, Part, Role, TextPart, ToolPart
from agentcontext.store.base import ContextStore

if TYPE_CHECKING:
    from agents.items import TResponseInputItem
    from agents.memory.session_settings import SessionSettings

__all__ = ["ITEM_KEY", "AgentContextSession", "item_to_message"]

require_extra("agents", "openai-agents", "agentcontext.integrations.openai_agents")

ITEM_KEY = "openai_item"
"""The key of ``Message.metadata`` that holds the SDK item a message was stored from."""

_ROLES: dict[str, Role] = {"user": "user", "system": "system", "developer": "system"}


def _text_parts(content: Any) -> list[Part]:
    if isinstance(content, str):
        return [TextPart(text=content)]
    parts: list[Part] = []
    for item in content or []:
        if isinstance(item, dict) and isinstance(item.get("text"), str):
            parts.append(TextPart(text=item["text"]))
    return parts


def item_to_message(item: Any, calls: dict[str, ToolPart] | None = None) -> Message:
    """One SDK conversation item as a message node (the item kept in its metadata).

    Args:
        item: A ``TResponseInputItem`` (a dict), or an SDK output item (dumped as the SDK
            does).
        calls: The unfinished tool calls seen so far, by call id: a
            ``function_call_output`` becomes the finished call with its name and input.

    Returns:
        A user or system message for role messages of those roles; otherwise an assistant
        message (text, reasoning, a tool call); items of other kinds keep their content in
        a ``DataPart`` named ``"openai_item"``.
    """
    dump = getattr(item, "model_dump", None)
    if callable(dump):  # an SDK output item: its input form, as the SDK's to_input_item()
        item = dump(exclude_unset=True, mode="json")
    if not isinstance(item, dict):
        raise InvalidTypeError(f"a session item must be a dict, got {type(item).__name__}")
    kept = copy.deepcopy(item)
    metadata = {ITEM_KEY: kept}
    kind = item.get("type")
    role = item.get("role")
    if role in _ROLES and kind in (None, "message"):
        parts = _text_parts(item.get("content"))
        return Message(id=new_id(), role=_ROLES[role], parts=parts, metadata=metadata)
    if kind == "function_call_output":
        call_id = str(item.get("call_id"))
        call = (calls or {}).get(call_id)
        finished = ToolPart(
            tool_call_id=call_id,
            tool_name=call.tool_name if call is not None else "unknown",
            input=call.input if call is not None else None,
            state="output-available",
            output=parse_arguments(item.get("output")),
        )
        return Message(id=new_id(), role="assistant", parts=[finished], metadata=metadata)
    if kind in ("message", "function_call", "reasoning") or role == "assistant":
        parts = items_to_parts([item])
    else:
        parts = [DataPart(name=ITEM_KEY, data=kept)]
    return Message(id=new_id(), role="assistant", parts=parts, metadata=metadata)


def _items_of(message: Message) -> list[Any]:
    item = (message.metadata or {}).get(ITEM_KEY)
    if item is not None:
        return [copy.deepcopy(item)]
    return list(to_openai_responses([message]))  # a message stored by other means


class AgentContextSession:
    """The OpenAI Agents SDK ``Session`` protocol over a chat's active branch.

    Args:
        session_id: The chat id (created on first use).
        store: The store that holds the chat. Give ``engine`` instead to share one.
        user_id: The chat's owner (default ``"agents"``).
        engine: An existing engine for the chat (then ``store`` and ``user_id`` are not
            needed).
        session_settings: The SDK's ``SessionSettings`` (e.g. a default ``limit``).

    Pass it as ``Runner.run(agent, input, session=session)``. Items are stored one message
    node each; see the module docs.
    """

    def __init__(
        self,
        session_id: str | None = None,
        *,
        store: ContextStore | None = None,
        user_id: str = "agents",
        engine: ContextEngine | None = None,
        session_settings: SessionSettings | None = None,
    ) -> None:
        if engine is None:
            if store is None or session_id is None:
                raise InvalidInputError(
                    "AgentContextSession needs session_id and store=..., or engine=..."
                )
            engine = ContextEngine(store=store, chat_id=session_id, user_id=user_id)
        elif session_id is not None and session_id != engine.chat_id:
            raise InvalidInputError(
                f"session_id {session_id!r} is not the engine's chat {engine.chat_id!r}; "
                "leave session_id out when passing engine="
            )
        self.engine = engine
        self.session_id: str = engine.chat_id
        self.session_settings = session_settings

    async def _messages(self) -> list[Message]:
        return await self.engine.get_messages()

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The items of the active branch, oldest first (the latest ``limit`` of them).

        Args:
            limit: At most this many items, the most recent ones; all when None (or the
                ``limit`` of ``session_settings`` when it has one).

        Returns:
            The items as they were added (messages stored by other means are mapped with
            `agentcontext.adapters.to_openai_responses`).
        """
        if limit is None and self.session_settings is not None:
            limit = getattr(self.session_settings, "limit", None)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise InvalidTypeError(f"limit must be an int or None, got {type(limit).__name__}")
        items: list[Any] = []
        for message in await self._messages():
            items.extend(_items_of(message))
        if limit is not None:
            items = items[-limit:] if limit > 0 else []
        return items

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append items to the active branch, one message node each, in one atomic save.

        Args:
            items: The items the SDK hands over (input items and what the run generated).
        """
        if not items:
            return
        calls: dict[str, ToolPart] = {}
        for message in await self._messages():
            for part in message.parts:
                if isinstance(part, ToolPart):
                    calls[part.tool_call_id] = part
        messages: list[Message] = []
        for item in items:
            stored = item_to_message(item, calls)
            for part in stored.parts:
                if isinstance(part, ToolPart) and part.state == "input-available":
                    calls[part.tool_call_id] = part
            messages.append(stored)
        self.engine.set(*(message_fragment(m) for m in messages))
        await self.engine.save()

    async def pop_item(self) -> TResponseInputItem | None:
        """Move the head back one node and return the item it held (None when empty).

        Nothing is deleted: the branch moves to a new branch at the parent (the old head
        stays reachable on the previous branch), or to an empty branch when the popped item
        was the first.
        """
        messages = await self._messages()
        if not messages:
            return None
        last = messages[-1]
        if len(messages) > 1:
            await self.engine.rewind(messages[-2].id)
        else:
            await self._empty_branch()
        items = _items_of(last)
        result: TResponseInputItem | None = items[-1] if items else None
        return result

    async def clear_session(self) -> None:
        """Start an empty branch and make it active; the history stays on the old branch."""
        if await self._messages():
            await self._empty_branch()

    async def _empty_branch(self) -> None:
        engine = self.engine
        branch = engine.branch
        if branch is None:
            await engine.initialize()
            branch = engine.branch
        assert branch is not None
        info = await engine.store.fork_branch(
            engine.chat_id, branch, head_message_id=None, activate=False
        )
        await engine.switch_branch(info.name)
