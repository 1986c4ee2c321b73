"""Helpers for the example tests: load an example file as a module, validate SDK requests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import ConfigDict, TypeAdapter

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DOCS = ROOT / "docs" / "integrations"


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` (the examples are scripts, not a package)."""
    module_name = f"agentcontext_example_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def _consume(value: Any) -> Any:
    """Walk a validated value, consuming pydantic's lazy iterators (which validates them)."""
    if isinstance(value, dict):
        return {key: _consume(item) for key, item in value.items()}
    if value is None or isinstance(value, (str, bytes, int, float, bool)):
        return value
    if hasattr(value, "__iter__"):
        return [_consume(item) for item in value]
    return value


def assert_valid(type_: Any, value: Any) -> None:
    """``value`` validates against the SDK's TypedDict ``type_``, with no unknown key and
    nothing coerced or dropped."""
    adapter: TypeAdapter[Any] = TypeAdapter(type_, config=ConfigDict(extra="forbid"))
    assert _consume(adapter.validate_python(value)) == value
