"""The top-level exports: one literal table, equal to the typed imports, working without source.

`agentcontext/__init__.py` lists its public names twice: as imports (the eager errors and the
`TYPE_CHECKING` block, which is what the type checker reads) and as the literal `_EXPORTS`
table the lazy `__getattr__` uses at run time. These tests keep the two equal, check that each
name resolves to the module the table names, and that the package imports from bytecode alone.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import agentcontext

INIT = Path(agentcontext.__file__)
PACKAGE = INIT.parent


def _tree() -> ast.Module:
    return ast.parse(INIT.read_text(encoding="utf-8"))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _reexports(nodes: list[ast.stmt]) -> dict[str, str]:
    """`from agentcontext.x import Name as Name` statements among `nodes`: {Name: module}."""
    found: dict[str, str] = {}
    for node in nodes:
        if not isinstance(node, ast.ImportFrom):
            continue
        module = node.module or ""
        if node.level or not module.startswith("agentcontext."):
            continue
        for alias in node.names:
            assert alias.asname == alias.name, (
                f"`from {module} import {alias.name}` must be written `{alias.name} as "
                f"{alias.name}` to be a public re-export"
            )
            assert alias.name not in found, f"{alias.name} is imported twice"
            found[alias.name] = module
    return found


def _eager_imports() -> dict[str, str]:
    return _reexports(_tree().body)


def _typed_imports() -> dict[str, str]:
    blocks = [
        node for node in _tree().body if isinstance(node, ast.If) and _is_type_checking(node.test)
    ]
    assert len(blocks) == 1, "one `if TYPE_CHECKING:` block lists the lazy names"
    return _reexports(blocks[0].body)


def test_the_table_is_a_literal_in_the_source() -> None:
    """Written out in the file, so nothing has to read the source to build it."""
    assigned = [
        node
        for node in _tree().body
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and node.target.id == "_EXPORTS"
    ]
    assert len(assigned) == 1
    assert assigned[0].value is not None
    assert ast.literal_eval(assigned[0].value) == agentcontext._EXPORTS


def test_only_the_errors_are_imported_eagerly() -> None:
    eager = _eager_imports()
    assert eager, "the errors are imported eagerly"
    assert set(eager.values()) == {"agentcontext.errors"}


def test_the_table_equals_the_typed_and_the_eager_imports() -> None:
    eager, typed = _eager_imports(), _typed_imports()
    assert set(eager).isdisjoint(typed)
    assert agentcontext._EXPORTS == {**eager, **typed}


def test_all_and_dir_list_the_table() -> None:
    assert agentcontext.__all__ == ["__version__", *sorted(agentcontext._EXPORTS)]
    assert len(agentcontext.__all__) == len(set(agentcontext.__all__))
    assert set(agentcontext.__all__) <= set(dir(agentcontext))


def test_every_name_resolves_to_what_its_module_holds() -> None:
    for name, module_name in agentcontext._EXPORTS.items():
        value = getattr(agentcontext, name)
        module = importlib.import_module(module_name)
        assert getattr(module, name) is value, f"{name} is not {module_name}.{name}"
        # Defined in that module, or re-exported by it (listed in its `__all__`).
        defined_in = getattr(value, "__module__", None)
        public = getattr(module, "__all__", ())
        assert defined_in == module_name or name in public, (name, module_name, defined_in)


def test_star_import_gives_every_public_name() -> None:
    namespace: dict[str, object] = {}
    exec("from agentcontext import *", namespace)
    names = {name for name in namespace if name != "__builtins__"}
    assert names == set(agentcontext.__all__)
    for name in agentcontext._EXPORTS:
        assert namespace[name] is getattr(agentcontext, name)


def test_public_subpackages_are_attributes() -> None:
    for name in agentcontext._MODULES:
        assert getattr(agentcontext, name) is importlib.import_module(f"agentcontext.{name}")


BYTECODE_ONLY = """
    import json, sys
    import agentcontext

    for name in agentcontext.__all__:
        getattr(agentcontext, name)
    for name in sorted(agentcontext._MODULES):
        getattr(agentcontext, name)
    namespace = {}
    exec("from agentcontext import *", namespace)
    print(json.dumps({
        "all": agentcontext.__all__,
        "star": sorted(n for n in namespace if n != "__builtins__"),
        "dir": dir(agentcontext),
        "files": sorted(
            m.__file__ for name, m in sys.modules.items()
            if name.split(".")[0] == "agentcontext" and getattr(m, "__file__", None)
        ),
    }))
"""


def test_the_package_imports_from_bytecode_alone(tmp_path: Path) -> None:
    """A copy compiled with `compileall -b` and stripped of its .py files still works."""
    root = tmp_path / "bytecode"
    shutil.copytree(PACKAGE, root / "agentcontext", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "compileall", "-b", "-q", str(root / "agentcontext")],
        check=True,
        capture_output=True,
        timeout=300,
    )
    for source in (root / "agentcontext").rglob("*.py"):
        source.unlink()
    assert not list(root.rglob("*.py"))
    assert (root / "agentcontext" / "__init__.pyc").is_file()

    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(BYTECODE_ONLY)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["all"] == agentcontext.__all__
    assert seen["star"] == sorted(agentcontext.__all__)
    assert set(seen["all"]) <= set(seen["dir"])
    # Every module came from the stripped copy, none from the checkout.
    assert seen["files"]
    for file in seen["files"]:
        assert file.startswith(str(root)), file
        assert file.endswith(".pyc"), file
