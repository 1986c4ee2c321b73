"""The README's program and the Python snippets of the docs type-check under ``mypy --strict``.

* The README's first program is checked as it is, a whole module under ``--strict`` (it is
  what a new user copies first: ``rewind(saved.head_message_id)`` must type-check).
* Every other snippet of ``docs/*.md`` is an excerpt that uses names defined around it
  (``store``, ``context``, a model client). Each is checked as the body of an async function
  given ``store``, ``context`` and ``engine``, with ``agentcontext``'s public names imported:
  names the page leaves undefined and untyped helpers are allowed, but every call into the
  library must type-check. The integration pages quote their example programs verbatim
  (``tests/examples/test_docs.py``), so they are not checked here.

A wrong program fails the same check, so the check is real.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from mypy import api

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)

PREAMBLE = """\
from typing import Any
from agentcontext import *  # noqa: F403
from agentcontext.reminders import *  # noqa: F403
from agentcontext.store import *  # noqa: F403


async def _snippet(store: SqlContextStore, context: ContextEngine, engine: ContextEngine) -> None:
"""

LENIENT = [
    "--allow-untyped-defs",
    "--allow-incomplete-defs",
    "--allow-untyped-calls",
    "--allow-untyped-decorators",
    "--disable-error-code=name-defined",
    "--disable-error-code=no-any-return",
    "--disable-error-code=import-not-found",
    "--disable-error-code=empty-body",
]


def _blocks(path: Path) -> list[str]:
    return FENCE.findall(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One mypy cache for the module: the library is analysed once."""
    return tmp_path_factory.mktemp("mypy-cache")


def _mypy(tmp_path: Path, cache: Path, files: dict[str, str], *flags: str) -> tuple[str, int]:
    for name, source in files.items():
        (tmp_path / name).write_text(source, encoding="utf-8")
    out, err, status = api.run(
        [
            "--strict",
            *flags,
            "--no-error-summary",
            "--cache-dir",
            str(cache),
            "--python-version",
            "3.11",
            *(str(tmp_path / name) for name in files),
        ]
    )
    return out + err, status


def test_the_readme_program_passes_mypy_strict(tmp_path: Path, cache: Path) -> None:
    program = _blocks(ROOT / "README.md")[0]
    assert "rewind(saved.head_message_id)" in program
    report, status = _mypy(tmp_path, cache, {"readme.py": program})
    assert status == 0, report
    # The same program with a head that may be None does not pass: the check is real.
    wrong = program.replace(
        "saved = await context.save()", "saved = await context.save()\n        head = None"
    ).replace("rewind(saved.head_message_id)", "rewind(head)")
    report, status = _mypy(tmp_path, cache, {"readme_wrong.py": wrong})
    assert status == 1 and "arg-type" in report, report


def _doc_snippets() -> list[tuple[str, str]]:
    found = []
    for path in sorted((ROOT / "docs").glob("*.md")):
        for index, body in enumerate(_blocks(path)):
            found.append((f"{path.stem}-{index}", body))
    return found


def test_the_docs_snippets_type_check(tmp_path: Path, cache: Path) -> None:
    snippets = _doc_snippets()
    assert len(snippets) > 30
    files = {
        f"{re.sub(r'[^a-z0-9]', '_', name)}.py": PREAMBLE
        + textwrap.indent(textwrap.dedent(body), "    ")
        + "    pass\n"
        for name, body in snippets
    }
    report, status = _mypy(tmp_path, cache, files, *LENIENT)
    assert status == 0, report


def test_the_lenient_check_still_catches_wrong_calls(tmp_path: Path, cache: Path) -> None:
    wrong = {
        "wrong_argument.py": "await context.rewind(42)",
        "wrong_attribute.py": "saved = await context.save()\nsaved.head_message_id.nope()",
    }
    files = {name: PREAMBLE + textwrap.indent(body, "    ") + "\n" for name, body in wrong.items()}
    report, status = _mypy(tmp_path, cache, files, *LENIENT)
    assert status == 1, report
    assert "wrong_argument.py" in report and "wrong_attribute.py" in report, report
