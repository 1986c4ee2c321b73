"""The shape of the code, checked: what a reviewer of the architecture would look for.

- Only the dialect package (``store/_dialects/``) asks which database it runs on.
- No module imports a private module of another package (``agentcontext.store._x`` from
  outside ``agentcontext.store``); the root package's own private modules are shared.
- No import circles, counting imports inside functions too, but for one documented pair:
  ``Message.from_openai`` / ``ResolveResult.to_openai`` (the models' public methods) call the
  adapters, which build and read those models.
- The store's facade stays a facade, and the engine holds the public verbs.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "src" / "agentcontext"

ALLOWED_CIRCLES = [
    {
        "agentcontext.messages",
        "agentcontext.adapters.openai",
        "agentcontext.adapters.responses",
        "agentcontext.adapters.anthropic",
        "agentcontext.adapters.shared",
    }
]


def modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = ("agentcontext", *path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports(path: Path) -> list[str]:
    """Every agentcontext module or name imported anywhere in the file (functions too):
    ``from package import module`` names the module, ``from module import name`` the name."""
    known = modules()
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("agentcontext"):
            assert node.module is not None
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.append(full if full in known else f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            out.extend(a.name for a in node.names if a.name.startswith("agentcontext"))
    return out


def test_only_the_dialect_package_asks_which_database_it_runs_on() -> None:
    asking = re.compile(
        r"""is_sqlite|get_backend_name\(\)|(?:==|!=|\bin)\s*[("']*(?:sqlite|postgresql)["']"""
    )
    found = []
    for name, path in modules().items():
        if name.startswith("agentcontext.store._dialects"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if asking.search(line):
                found.append(f"{name}:{number}: {line.strip()}")
    assert found == []


def test_no_module_imports_a_private_module_of_another_package() -> None:
    known = modules()
    bad = []
    for name, path in known.items():
        for target in imports(path):
            segments = target.split(".")
            for index in range(2, len(segments)):
                if segments[index].startswith("_") and not segments[index].startswith("__"):
                    owner = ".".join(segments[:index])
                    if name != owner and not name.startswith(owner + "."):
                        bad.append(f"{name} imports {target}")
                    break
    assert bad == []


def test_no_import_circles_but_the_documented_one() -> None:
    known = modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for target in imports(path):
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                graph[name].add(target)
    circles = [component for component in strongly_connected(graph) if len(component) > 1]
    assert [set(c) for c in circles if set(c) not in ALLOWED_CIRCLES] == []


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            components.append(component)

    for node in graph:
        if node not in index:
            visit(node)
    return components


def test_the_store_facade_stays_thin() -> None:
    source = (ROOT / "store" / "sql.py").read_text()
    tree = ast.parse(source)
    facade = next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SqlContextStore"
    )
    loops = [
        node.lineno
        for method in facade.body
        if isinstance(method, ast.AsyncFunctionDef)
        for node in ast.walk(method)
        if isinstance(node, (ast.For, ast.While, ast.AsyncFor))
    ]
    assert loops == [], "a policy (a loop, a retry) belongs in a concern module"
    assert len(source.splitlines()) < 700


def test_the_engine_holds_the_public_verbs() -> None:
    """The engine's concerns (the pending queue, streaming turns, inspect, branches, ...) live
    in modules of their own; ``engine.py`` keeps the verbs, their docstrings and checks."""
    lines = (ROOT / "engine.py").read_text().splitlines()
    assert len(lines) <= 700


def test_the_top_level_exports_what_users_write() -> None:
    import agentcontext

    internals = {
        "AppendResult",
        "BranchState",
        "ChainRows",
        "ChatState",
        "EngineStore",
        "LazyResolver",
        "StoreOptions",
        "InspectFragments",
        "InspectMeta",
    }
    assert internals.isdisjoint(agentcontext.__all__)
    assert len(agentcontext.__all__) == len(set(agentcontext.__all__))


MAX_MODULE_LINES = 850


def test_no_module_grows_without_bound() -> None:
    """Modules stay small enough to read: a module past the bound is split by concern."""
    long = {
        name: count
        for name, path in modules().items()
        if (count := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_every_public_module_imports_first_in_a_fresh_interpreter() -> None:
    """`from agentcontext.web import create_app` in a new process failed with a circular
    import (the graph shape and the store imported each other as they loaded); whichever public
    module a program imports first must work."""
    import pkgutil
    import subprocess
    import sys

    import agentcontext

    names = [
        found.name
        for found in pkgutil.walk_packages(agentcontext.__path__, "agentcontext.")
        if not any(part.startswith("_") for part in found.name.split(".")[1:])
    ]
    assert "agentcontext.web" in names and "agentcontext.store" in names
    failed = {}
    for name in names:
        done = subprocess.run(
            [sys.executable, "-c", f"import {name}"], capture_output=True, text=True
        )
        if done.returncode:
            failed[name] = done.stderr.strip().splitlines()[-1]
    assert failed == {}
