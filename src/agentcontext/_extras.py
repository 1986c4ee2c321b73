"""Optional dependencies: a missing extra is a `MissingExtraError` that says what to install."""

from __future__ import annotations

import importlib.util

from agentcontext.errors import MissingExtraError

__all__ = ["require_extra"]


def require_extra(module: str, extra: str, feature: str) -> None:
    """Raise `MissingExtraError` when ``module`` cannot be imported, naming the extra to install.

    The module is looked up, not imported, so calling this at import time keeps the
    framework's own import lazy.

    Args:
        module: The top-level module needed (``"pydantic_ai"``).
        extra: The agentcontext extra that installs it (``"pydantic-ai"``).
        feature: What needs it, for the message (``"agentcontext.integrations.pydantic_ai"``).
    """
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise MissingExtraError(
            f"{feature} needs the {module!r} package, which is not installed: "
            f"pip install 'agentcontext[{extra}]'",
            name=module,
        )
