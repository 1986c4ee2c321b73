"""A user program passing each adapter's output to the real SDK clients type-checks under
``mypy --strict`` (and a wrong value does not, so the check is real)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from mypy import api

PROGRAM = """
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI

from agentcontext import Message, ResolveResult


async def ask(result: ResolveResult) -> list[Message]:
    openai = AsyncOpenAI()
    chat = await openai.chat.completions.create(model="gpt-4o", messages=result.to_openai())
    response = await openai.responses.create(
        model="gpt-4o", instructions=result.system_prompt, input=result.to_openai_responses()
    )
    anthropic = AsyncAnthropic()
    reply = await anthropic.messages.create(
        model="claude-sonnet-4-5", max_tokens=1024, **result.to_anthropic(cache=True)
    )
    return [Message.from_openai(chat), Message.from_openai(response), Message.from_anthropic(reply)]
"""

WRONG = """
from typing import Any

from openai import AsyncOpenAI


async def ask(messages: list[dict[str, Any]]) -> None:
    await AsyncOpenAI().chat.completions.create(model="gpt-4o", messages=messages)
"""


def mypy_strict(tmp_path: Path, source: str) -> tuple[str, int]:
    program = tmp_path / "program.py"
    program.write_text(textwrap.dedent(source), encoding="utf-8")
    out, err, status = api.run(
        [
            "--strict",
            "--no-error-summary",
            "--cache-dir",
            str(tmp_path / ".mypy_cache"),
            "--python-version",
            "3.11",
            str(program),
        ]
    )
    return out + err, status


def test_a_user_program_passes_the_adapters_to_the_sdks_under_strict(tmp_path: Path) -> None:
    report, status = mypy_strict(tmp_path, PROGRAM)
    assert status == 0, report
    report, status = mypy_strict(tmp_path, WRONG)
    assert status == 1 and "arg-type" in report, report
