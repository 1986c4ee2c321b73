"""Integrations with agent frameworks, one module per framework.

* `agentcontext.integrations.openai_agents`: `AgentContextSession`, the OpenAI Agents SDK's
  ``Session`` over a chat's active branch (extra ``openai-agents``).
* `agentcontext.integrations.pydantic_ai`: pydantic-ai ``ModelMessage`` converters and a
  history processor (extra ``pydantic-ai``).
* `agentcontext.integrations.langchain`: langchain-core message converters (extra
  ``langchain``).

Each module imports its framework only when used; ``import agentcontext`` imports none.
"""
