"""The code on docs/reminders.md runs, block after block, and its assertions hold."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reminders.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def python_blocks() -> list[str]:
    text = PAGE.read_text(encoding="utf-8")
    return [body for language, body in FENCE.findall(text) if language == "python"]


async def test_every_python_block_of_the_reminders_page_runs() -> None:
    blocks = python_blocks()
    assert len(blocks) >= 10
    namespace: dict[str, object] = {"__name__": "docs_reminders"}
    for index, block in enumerate(blocks):
        code = compile(
            block, f"{PAGE.name}[block {index}]", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        )
        result = eval(code, namespace)
        if inspect.iscoroutine(result):
            await result


def test_the_page_shows_every_predicate() -> None:
    text = PAGE.read_text(encoding="utf-8")
    code = "\n".join(python_blocks())
    for name in (
        "every_n_turns(",
        "first_turn(",
        "first_n_turns(",
        "after_turn(",
        "tokens_over(",
        "tool_failed(",
        "elapsed(",
        "message_matches(",
        "all_of(",
        "any_of(",
        "not_(",
        "once=",
        'target="tool-output"',
        "strip_reminders(",
    ):
        assert name in code, name
    assert "reminders.md" in (PAGE.parents[1] / "mkdocs.yml").read_text(encoding="utf-8")
    assert text.startswith("# Reminders")
