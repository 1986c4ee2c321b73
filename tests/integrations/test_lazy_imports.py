"""The library imports no SDK or framework until one of their functions is called."""

from __future__ import annotations

import subprocess
import sys

FRAMEWORKS = ["openai", "anthropic", "agents", "pydantic_ai", "langchain_core"]

PROGRAM = f"""
import sys
import agentcontext
import agentcontext.adapters
import agentcontext.integrations.langchain
import agentcontext.integrations.openai_agents
import agentcontext.integrations.pydantic_ai
import agentcontext.usage
loaded = [name for name in {FRAMEWORKS!r} if name in sys.modules]
print(",".join(loaded))
"""


def test_importing_the_library_and_its_integrations_loads_no_framework() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == ""
