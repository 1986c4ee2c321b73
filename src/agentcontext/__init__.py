"""agentcontext: typed prompt fragments and a branching conversation graph for LLM agents.

Build the system prompt from small fragments (``role``, ``hint``, ``guardrail``, …) rendered
as XML, Markdown, TOML or TOON, and keep the conversation as an immutable graph of messages
with branches and checkpoints in SQLite or PostgreSQL:

```python
async with SqlContextStore("sqlite+aiosqlite:///chat.db") as store:
    context = ContextEngine(store=store, chat_id="chat-001", user_id="user-001")
    context.set(role("You are a helpful assistant."), user("Hello!"))
    result = await context.resolve()
```

The names below are what users write; everything else stays in its package
(``agentcontext.store`` for records and store internals, ``agentcontext.adapters`` for the
provider mappings, ``agentcontext.integrations.<framework>``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The errors are cheap and needed by every caller. Everything else is imported on first use
# (module `__getattr__`), so `import agentcontext` stays light: SQLAlchemy's dialects, the
# pydantic models, the price tables, the tokenizer, Alembic and rich load only when a name
# that needs them is first read. The imports below are the one list of public names the type
# checker reads; `_EXPORTS` further down repeats them as a literal table for `__all__` and the
# lazy imports (a test keeps the two equal).
from agentcontext.errors import BranchExistsError as BranchExistsError
from agentcontext.errors import BranchNotFoundError as BranchNotFoundError
from agentcontext.errors import ChatBusyError as ChatBusyError
from agentcontext.errors import ChatExistsError as ChatExistsError
from agentcontext.errors import ChatNotFoundError as ChatNotFoundError
from agentcontext.errors import ChatOwnershipError as ChatOwnershipError
from agentcontext.errors import CheckpointNotFoundError as CheckpointNotFoundError
from agentcontext.errors import ContextError as ContextError
from agentcontext.errors import ContextWindowError as ContextWindowError
from agentcontext.errors import CorruptDataError as CorruptDataError
from agentcontext.errors import EmptyConversationError as EmptyConversationError
from agentcontext.errors import EncryptionError as EncryptionError
from agentcontext.errors import FragmentLoadError as FragmentLoadError
from agentcontext.errors import HeadConflictError as HeadConflictError
from agentcontext.errors import InvalidGraphError as InvalidGraphError
from agentcontext.errors import InvalidInputError as InvalidInputError
from agentcontext.errors import InvalidTypeError as InvalidTypeError
from agentcontext.errors import MessageNotFoundError as MessageNotFoundError
from agentcontext.errors import MissingExtraError as MissingExtraError
from agentcontext.errors import ModelNotFoundError as ModelNotFoundError
from agentcontext.errors import NotFoundError as NotFoundError
from agentcontext.errors import ReminderError as ReminderError
from agentcontext.errors import SchemaOutdatedError as SchemaOutdatedError
from agentcontext.errors import SerializationError as SerializationError
from agentcontext.errors import SnapshotError as SnapshotError
from agentcontext.errors import StoreClosedError as StoreClosedError
from agentcontext.errors import StoreError as StoreError
from agentcontext.errors import StoreUnavailableError as StoreUnavailableError

if TYPE_CHECKING:
    from agentcontext.encryption import KeyProvider as KeyProvider
    from agentcontext.encryption import LocalKeyProvider as LocalKeyProvider
    from agentcontext.engine import Compaction as Compaction
    from agentcontext.engine import ContextEngine as ContextEngine
    from agentcontext.engine import ContextWindow as ContextWindow
    from agentcontext.engine import InspectResult as InspectResult
    from agentcontext.engine import SaveResult as SaveResult
    from agentcontext.estimate import Estimate as Estimate
    from agentcontext.estimate import approximate_tokens as approximate_tokens
    from agentcontext.estimate import estimate_context as estimate_context
    from agentcontext.estimate import register_model as register_model
    from agentcontext.estimate import register_tokenizer as register_tokenizer
    from agentcontext.fragments import ContextFragment as ContextFragment
    from agentcontext.fragments import FragmentCodec as FragmentCodec
    from agentcontext.fragments import FragmentData as FragmentData
    from agentcontext.fragments import alias as alias
    from agentcontext.fragments import analogy as analogy
    from agentcontext.fragments import assistant as assistant
    from agentcontext.fragments import assistant_text as assistant_text
    from agentcontext.fragments import clarification as clarification
    from agentcontext.fragments import correction as correction
    from agentcontext.fragments import example as example
    from agentcontext.fragments import explain as explain
    from agentcontext.fragments import fragment as fragment
    from agentcontext.fragments import glossary as glossary
    from agentcontext.fragments import guardrail as guardrail
    from agentcontext.fragments import hint as hint
    from agentcontext.fragments import identity as identity
    from agentcontext.fragments import is_fragment as is_fragment
    from agentcontext.fragments import is_lazy_fragment as is_lazy_fragment
    from agentcontext.fragments import is_message_fragment as is_message_fragment
    from agentcontext.fragments import last_assistant_message as last_assistant_message
    from agentcontext.fragments import message as message
    from agentcontext.fragments import persona as persona
    from agentcontext.fragments import policy as policy
    from agentcontext.fragments import preference as preference
    from agentcontext.fragments import principle as principle
    from agentcontext.fragments import quirk as quirk
    from agentcontext.fragments import role as role
    from agentcontext.fragments import style_guide as style_guide
    from agentcontext.fragments import term as term
    from agentcontext.fragments import user as user
    from agentcontext.fragments import workflow as workflow
    from agentcontext.lazy import LoadContext as LoadContext
    from agentcontext.messages import DataPart as DataPart
    from agentcontext.messages import FilePart as FilePart
    from agentcontext.messages import Message as Message
    from agentcontext.messages import Part as Part
    from agentcontext.messages import ReasoningPart as ReasoningPart
    from agentcontext.messages import ResolveResult as ResolveResult
    from agentcontext.messages import TextPart as TextPart
    from agentcontext.messages import ToolPart as ToolPart
    from agentcontext.reminders import ReminderContext as ReminderContext
    from agentcontext.reminders import after_turn as after_turn
    from agentcontext.reminders import all_of as all_of
    from agentcontext.reminders import any_of as any_of
    from agentcontext.reminders import elapsed as elapsed
    from agentcontext.reminders import every_n_turns as every_n_turns
    from agentcontext.reminders import first_n_turns as first_n_turns
    from agentcontext.reminders import first_turn as first_turn
    from agentcontext.reminders import message_matches as message_matches
    from agentcontext.reminders import not_ as not_
    from agentcontext.reminders import reminder as reminder
    from agentcontext.reminders import strip_reminders as strip_reminders
    from agentcontext.reminders import tokens_over as tokens_over
    from agentcontext.reminders import tool_failed as tool_failed
    from agentcontext.renderers import ContextRenderer as ContextRenderer
    from agentcontext.renderers import MarkdownRenderer as MarkdownRenderer
    from agentcontext.renderers import TomlRenderer as TomlRenderer
    from agentcontext.renderers import ToonRenderer as ToonRenderer
    from agentcontext.renderers import XmlRenderer as XmlRenderer
    from agentcontext.serialized import FragmentRegistry as FragmentRegistry
    from agentcontext.serialized import from_fragment as from_fragment
    from agentcontext.serialized import to_fragment as to_fragment
    from agentcontext.snapshots import ContextItem as ContextItem
    from agentcontext.snapshots import ContextItemKind as ContextItemKind
    from agentcontext.snapshots import ContextSnapshot as ContextSnapshot
    from agentcontext.snapshots import SelectionStrategy as SelectionStrategy
    from agentcontext.snapshots import blob_hash as blob_hash
    from agentcontext.snapshots import snapshot_fragment as snapshot_fragment
    from agentcontext.store import Branch as Branch
    from agentcontext.store import BranchInfo as BranchInfo
    from agentcontext.store import ChainPage as ChainPage
    from agentcontext.store import Chat as Chat
    from agentcontext.store import ChatExport as ChatExport
    from agentcontext.store import ChatInfo as ChatInfo
    from agentcontext.store import ChatUpdate as ChatUpdate
    from agentcontext.store import Checkpoint as Checkpoint
    from agentcontext.store import ContextStore as ContextStore
    from agentcontext.store import ErasureReport as ErasureReport
    from agentcontext.store import Fold as Fold
    from agentcontext.store import Graph as Graph
    from agentcontext.store import GraphNode as GraphNode
    from agentcontext.store import GraphOutline as GraphOutline
    from agentcontext.store import InMemoryContextStore as InMemoryContextStore
    from agentcontext.store import MessageRecord as MessageRecord
    from agentcontext.store import PruneReport as PruneReport
    from agentcontext.store import PurgeReport as PurgeReport
    from agentcontext.store import ResolveRecord as ResolveRecord
    from agentcontext.store import SearchResult as SearchResult
    from agentcontext.store import SqlContextStore as SqlContextStore
    from agentcontext.views import graph_to_mermaid as graph_to_mermaid
    from agentcontext.views import visualize_graph as visualize_graph

__version__ = "0.1.0"

# Public subpackages and modules, reachable as attributes (`agentcontext.store.Chat`) after a
# plain `import agentcontext`, as when the package imported them eagerly.
_MODULES = frozenset(
    {
        "adapters",
        "encryption",
        "engine",
        "errors",
        "estimate",
        "fragments",
        "lazy",
        "messages",
        "renderers",
        "serialized",
        "snapshots",
        "store",
        "usage",
        "views",
    }
)

# Every public name and the module it lives in. A literal, not read from this file's source at
# import time: a bytecode-only install (a zipapp, a frozen bundle, `compileall -b` with the .py
# files removed) has no source to read.
_EXPORTS: dict[str, str] = {
    "BranchExistsError": "agentcontext.errors",
    "BranchNotFoundError": "agentcontext.errors",
    "ChatBusyError": "agentcontext.errors",
    "ChatExistsError": "agentcontext.errors",
    "ChatNotFoundError": "agentcontext.errors",
    "ChatOwnershipError": "agentcontext.errors",
    "CheckpointNotFoundError": "agentcontext.errors",
    "ContextError": "agentcontext.errors",
    "ContextWindowError": "agentcontext.errors",
    "CorruptDataError": "agentcontext.errors",
    "EncryptionError": "agentcontext.errors",
    "EmptyConversationError": "agentcontext.errors",
    "FragmentLoadError": "agentcontext.errors",
    "HeadConflictError": "agentcontext.errors",
    "InvalidGraphError": "agentcontext.errors",
    "InvalidInputError": "agentcontext.errors",
    "InvalidTypeError": "agentcontext.errors",
    "MessageNotFoundError": "agentcontext.errors",
    "MissingExtraError": "agentcontext.errors",
    "ModelNotFoundError": "agentcontext.errors",
    "NotFoundError": "agentcontext.errors",
    "ReminderError": "agentcontext.errors",
    "SchemaOutdatedError": "agentcontext.errors",
    "SerializationError": "agentcontext.errors",
    "SnapshotError": "agentcontext.errors",
    "StoreClosedError": "agentcontext.errors",
    "StoreError": "agentcontext.errors",
    "StoreUnavailableError": "agentcontext.errors",
    "Compaction": "agentcontext.engine",
    "ContextEngine": "agentcontext.engine",
    "ContextWindow": "agentcontext.engine",
    "InspectResult": "agentcontext.engine",
    "SaveResult": "agentcontext.engine",
    "KeyProvider": "agentcontext.encryption",
    "LocalKeyProvider": "agentcontext.encryption",
    "Estimate": "agentcontext.estimate",
    "approximate_tokens": "agentcontext.estimate",
    "estimate_context": "agentcontext.estimate",
    "register_model": "agentcontext.estimate",
    "register_tokenizer": "agentcontext.estimate",
    "ContextFragment": "agentcontext.fragments",
    "FragmentCodec": "agentcontext.fragments",
    "FragmentData": "agentcontext.fragments",
    "alias": "agentcontext.fragments",
    "analogy": "agentcontext.fragments",
    "assistant": "agentcontext.fragments",
    "assistant_text": "agentcontext.fragments",
    "clarification": "agentcontext.fragments",
    "correction": "agentcontext.fragments",
    "example": "agentcontext.fragments",
    "explain": "agentcontext.fragments",
    "fragment": "agentcontext.fragments",
    "glossary": "agentcontext.fragments",
    "guardrail": "agentcontext.fragments",
    "hint": "agentcontext.fragments",
    "identity": "agentcontext.fragments",
    "is_fragment": "agentcontext.fragments",
    "is_lazy_fragment": "agentcontext.fragments",
    "is_message_fragment": "agentcontext.fragments",
    "last_assistant_message": "agentcontext.fragments",
    "message": "agentcontext.fragments",
    "persona": "agentcontext.fragments",
    "policy": "agentcontext.fragments",
    "preference": "agentcontext.fragments",
    "principle": "agentcontext.fragments",
    "quirk": "agentcontext.fragments",
    "role": "agentcontext.fragments",
    "style_guide": "agentcontext.fragments",
    "term": "agentcontext.fragments",
    "user": "agentcontext.fragments",
    "workflow": "agentcontext.fragments",
    "LoadContext": "agentcontext.lazy",
    "DataPart": "agentcontext.messages",
    "FilePart": "agentcontext.messages",
    "Message": "agentcontext.messages",
    "Part": "agentcontext.messages",
    "ReasoningPart": "agentcontext.messages",
    "ResolveResult": "agentcontext.messages",
    "TextPart": "agentcontext.messages",
    "ToolPart": "agentcontext.messages",
    "ReminderContext": "agentcontext.reminders",
    "after_turn": "agentcontext.reminders",
    "all_of": "agentcontext.reminders",
    "any_of": "agentcontext.reminders",
    "elapsed": "agentcontext.reminders",
    "every_n_turns": "agentcontext.reminders",
    "first_n_turns": "agentcontext.reminders",
    "first_turn": "agentcontext.reminders",
    "message_matches": "agentcontext.reminders",
    "not_": "agentcontext.reminders",
    "reminder": "agentcontext.reminders",
    "strip_reminders": "agentcontext.reminders",
    "tokens_over": "agentcontext.reminders",
    "tool_failed": "agentcontext.reminders",
    "ContextRenderer": "agentcontext.renderers",
    "MarkdownRenderer": "agentcontext.renderers",
    "TomlRenderer": "agentcontext.renderers",
    "ToonRenderer": "agentcontext.renderers",
    "XmlRenderer": "agentcontext.renderers",
    "FragmentRegistry": "agentcontext.serialized",
    "from_fragment": "agentcontext.serialized",
    "to_fragment": "agentcontext.serialized",
    "ContextItem": "agentcontext.snapshots",
    "ContextItemKind": "agentcontext.snapshots",
    "ContextSnapshot": "agentcontext.snapshots",
    "SelectionStrategy": "agentcontext.snapshots",
    "blob_hash": "agentcontext.snapshots",
    "snapshot_fragment": "agentcontext.snapshots",
    "Branch": "agentcontext.store",
    "BranchInfo": "agentcontext.store",
    "ChainPage": "agentcontext.store",
    "Chat": "agentcontext.store",
    "ChatExport": "agentcontext.store",
    "ChatInfo": "agentcontext.store",
    "ChatUpdate": "agentcontext.store",
    "Checkpoint": "agentcontext.store",
    "ContextStore": "agentcontext.store",
    "ErasureReport": "agentcontext.store",
    "Fold": "agentcontext.store",
    "Graph": "agentcontext.store",
    "GraphNode": "agentcontext.store",
    "GraphOutline": "agentcontext.store",
    "InMemoryContextStore": "agentcontext.store",
    "MessageRecord": "agentcontext.store",
    "PruneReport": "agentcontext.store",
    "PurgeReport": "agentcontext.store",
    "ResolveRecord": "agentcontext.store",
    "SearchResult": "agentcontext.store",
    "SqlContextStore": "agentcontext.store",
    "graph_to_mermaid": "agentcontext.views",
    "visualize_graph": "agentcontext.views",
}


def __getattr__(name: str) -> Any:
    if name == "__all__":
        return ["__version__", *sorted(_EXPORTS)]
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
