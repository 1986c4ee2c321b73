"""agentcontext: typed prompt fragments and a branching conversation graph for LLM agents."""

from __future__ import annotations

from agentcontext.errors import *  # noqa: F403  (replaced by explicit imports below)
