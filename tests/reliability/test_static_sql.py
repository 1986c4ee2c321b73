"""A static check: SQL is never built by formatting strings from arguments.

Every value is a bound parameter; identifiers come from a fixed set (the schema). The check
walks the syntax tree of every module of the package and fails on any call that sends SQL
(``text``, ``exec_driver_sql``, ``execute``, ``literal_column``, cursor ``execute``) whose SQL
argument is an f-string with placeholders, a ``%`` or ``+`` expression, or a ``.format()``
call — the shapes through which an argument could reach the SQL text.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "agentcontext"
MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"
SQL_CALLS = {"text", "exec_driver_sql", "execute", "executemany", "literal_column", "op"}


def _is_dynamic(node: ast.AST) -> bool:
    if isinstance(node, ast.JoinedStr):
        return any(isinstance(value, ast.FormattedValue) for value in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mod, ast.Add)):
        return _mentions_string(node)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr == "format" and _mentions_string(node.func.value)
    return False


def _mentions_string(node: ast.AST) -> bool:
    return any(
        isinstance(child, (ast.Constant, ast.JoinedStr))
        and (not isinstance(child, ast.Constant) or isinstance(child.value, str))
        for child in ast.walk(node)
    )


def violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = (
            node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        )
        if name not in SQL_CALLS or not node.args:
            continue
        if _is_dynamic(node.args[0]):
            found.append(f"{path.name}:{node.lineno}: {name}() gets SQL built from values")
    return found


def python_files() -> list[Path]:
    return sorted([*PACKAGE.rglob("*.py"), *MIGRATIONS.rglob("*.py")])


@pytest.mark.parametrize("path", python_files(), ids=lambda p: str(p.relative_to(p.parents[2])))
def test_no_sql_is_built_from_values(path: Path) -> None:
    assert violations(path) == []


def test_the_check_catches_formatted_sql(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "def f(conn, name, table):\n"
        "    conn.execute(text(f'SELECT * FROM chats WHERE id = {name}'))\n"
        "    conn.exec_driver_sql('DELETE FROM %s' % table)\n"
        "    conn.execute(text('SELECT ' + name))\n"
        "    conn.execute(text('SELECT {}'.format(name)))\n"
        "    conn.execute(text('SELECT * FROM chats WHERE id = :id'), {'id': name})\n"
    )
    assert len(violations(bad)) == 4
