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


def test_a_missing_extra_says_what_to_install() -> None:
    program = """
import sys
for name in ("pydantic_ai", "langchain_core", "agents"):
    sys.modules[name] = None  # as if it were not installed
from agentcontext import MissingExtraError
for module, extra in (("pydantic_ai", "pydantic-ai"), ("langchain", "langchain"),
                      ("openai_agents", "openai-agents")):
    try:
        __import__(f"agentcontext.integrations.{module}")
    except MissingExtraError as exc:
        assert isinstance(exc, ModuleNotFoundError)
        assert f"pip install 'agentcontext[{extra}]'" in str(exc), exc
        print("ok", module)
"""
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == [
        "ok pydantic_ai",
        "ok langchain",
        "ok openai_agents",
    ]
