"""`import agentcontext` stays light: heavy optional modules load only when used."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import agentcontext

HEAVY = ("alembic", "rich", "pygments", "genai_prices", "tiktoken")


def _loaded_after(statement: str) -> dict[str, list[str]]:
    code = (
        f"import sys, json\n{statement}\n"
        f"print(json.dumps({{'heavy': [m for m in {HEAVY!r} if m in sys.modules],"
        " 'ours': sorted(m for m in sys.modules if m.startswith('agentcontext'))}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    loaded: dict[str, list[str]] = json.loads(done.stdout)
    return loaded


def test_import_loads_only_the_package_and_its_errors() -> None:
    loaded = _loaded_after("import agentcontext")
    assert loaded["heavy"] == []
    assert loaded["ours"] == ["agentcontext", "agentcontext.errors"]


def test_a_submodule_attribute_works_in_a_fresh_process() -> None:
    loaded = _loaded_after("import agentcontext; agentcontext.store.SqlContextStore")
    assert "agentcontext.store.sql" in loaded["ours"]
    assert loaded["heavy"] == []


@pytest.mark.parametrize(
    "statement",
    [
        "from agentcontext import *",
        "from agentcontext import ContextEngine, SqlContextStore, Estimate, estimate_context",
        "import agentcontext.store, agentcontext.engine, agentcontext.estimate",
    ],
)
def test_no_heavy_module_until_used(statement: str) -> None:
    loaded = _loaded_after(statement)
    assert loaded["heavy"] == []
    assert "agentcontext.engine" in loaded["ours"] or "agentcontext.store" in loaded["ours"]


def test_the_cli_parser_needs_no_rich_or_alembic() -> None:
    """Building the command line (and its --help) imports neither rich nor Alembic."""
    loaded = _loaded_after("from agentcontext.cli import build_parser; build_parser()")
    assert "rich" not in loaded["heavy"]
    assert "alembic" not in loaded["heavy"]


def test_every_public_name_resolves_lazily_to_its_home() -> None:
    import importlib

    for name in agentcontext.__all__:
        value = getattr(agentcontext, name)
        if name == "__version__":
            assert isinstance(value, str)
            continue
        home = agentcontext._EXPORTS[name]
        assert getattr(importlib.import_module(home), name) is value
    assert set(agentcontext.__all__) <= set(dir(agentcontext))
    # Submodules stay reachable as attributes after a plain `import agentcontext`.
    assert agentcontext.store.SqlContextStore is agentcontext.SqlContextStore
    assert agentcontext.renderers.XmlRenderer is agentcontext.XmlRenderer
    assert agentcontext.views.visualize_graph is agentcontext.visualize_graph
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = agentcontext.nope  # type: ignore[attr-defined]
