"""The store interface, `ContextStore`: the union of the capability protocols.

Every method's signature and docstring is written once, on the capability it belongs to
(``agentcontext.store.protocols``: `ChatReader`, `TurnWriter`, `BranchKeeper`,
`RecordKeeper`, `ChatAdmin`, `Searcher`, `Pages`, `Retention`, `Transfer`,
`ConsistencyTokens`), where `ContextStore` joins them; this module names it for imports.
"""

from __future__ import annotations

from agentcontext.store.protocols import ContextStore, outline_of

__all__ = ["ContextStore", "outline_of"]
