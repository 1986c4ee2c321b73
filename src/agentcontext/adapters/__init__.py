"""Provider adapters: a resolved conversation as the request shapes of the OpenAI and
Anthropic SDKs, and their replies back as `Message` objects.

Each function is also reachable from the objects users already hold:
``ResolveResult.to_openai()`` / ``to_openai_responses()`` / ``to_anthropic(cache=...)`` and
``Message.from_openai(...)`` / ``Message.from_anthropic(...)``. The SDKs are not imported at
run time; their types are used for type checking only.
"""

from __future__ import annotations

from agentcontext.adapters.anthropic import AnthropicRequest, from_anthropic, to_anthropic
from agentcontext.adapters.openai import from_openai, to_openai
from agentcontext.adapters.responses import from_openai_responses, to_openai_responses

__all__ = [
    "AnthropicRequest",
    "from_anthropic",
    "from_openai",
    "from_openai_responses",
    "to_anthropic",
    "to_openai",
    "to_openai_responses",
]
