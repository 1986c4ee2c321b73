"""A local, read-only web viewer of chats, branches, snapshots and recorded resolves.

Needs the ``web`` extra (``pip install 'agentcontext[web]'``): Starlette, served by uvicorn.
Run it with ``agentcontext serve`` or build the app with `create_app`.
"""

from __future__ import annotations

from agentcontext.web._app import CSP, create_app

__all__ = ["CSP", "create_app"]
