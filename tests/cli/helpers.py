"""Running the command line (in-process or as a subprocess), and building data for it with the
Python API.

`run_cli` calls `main(argv)` in this process, with the working directory, environment and
standard streams of a fresh process, so most tests cost no interpreter start-up;
`run_cli_subprocess` runs `python -m agentcontext` for the few tests where a real process
proves more (entry point, pipes, terminals, exit on signals).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from agentcontext import ContextEngine, SqlContextStore, assistant_text, user

ANSI = "\x1b["


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment without anything that changes the CLI's URL, schema or colours."""
    unset = {"AGENTCONTEXT_URL", "AGENTCONTEXT_SCHEMA", "FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE"}
    env = {key: value for key, value in os.environ.items() if key not in unset}
    env["COLUMNS"] = "200"
    env.update(extra or {})
    return env


_IN_PROCESS = threading.Lock()


def run_cli(
    *args: str,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``main(ARGS)`` in this process as if run in ``cwd`` with ``env``, output captured.

    It runs in a thread of its own (so it works from async tests too: `main` starts its own
    event loop), with the working directory, the environment and the standard streams
    swapped for the call and restored after.
    """
    from agentcontext.cli import main

    out, err = io.StringIO(), io.StringIO()
    result: list[int] = []
    failure: list[BaseException] = []

    def call() -> None:
        try:
            result.append(main(list(args)))
        except BaseException as exc:  # surfaced in the test below
            failure.append(exc)

    with _IN_PROCESS:
        saved_env, saved_cwd = dict(os.environ), os.getcwd()
        saved_streams = sys.stdin, sys.stdout, sys.stderr
        os.environ.clear()
        os.environ.update(clean_env(env))
        os.chdir(cwd)
        sys.stdin, sys.stdout, sys.stderr = io.StringIO(stdin or ""), out, err
        try:
            worker = threading.Thread(target=call, name="agentcontext-cli")
            worker.start()
            worker.join(timeout)
            assert not worker.is_alive(), f"agentcontext {' '.join(args)} did not finish"
        finally:
            sys.stdin, sys.stdout, sys.stderr = saved_streams
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)
    if failure:
        raise failure[0]
    return subprocess.CompletedProcess(
        ["agentcontext", *args], result[0], out.getvalue(), err.getvalue()
    )


def run_cli_subprocess(
    *args: str,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``python -m agentcontext ARGS`` in ``cwd``, output captured (so not a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "agentcontext", *args],
        cwd=cwd,
        env=clean_env(env),
        input=stdin,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=timeout,
        check=False,
    )


def sqlite_url(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


def tsv(stdout: str) -> list[dict[str, str]]:
    """Rows of a plain-mode table (a header line, then tab-separated rows)."""
    lines = [line for line in stdout.splitlines() if line]
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:]]


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single ``error: ...`` line on stderr (asserting there is exactly one)."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


async def save_turns(
    context: ContextEngine, turns: Sequence[tuple[str, str]], *, prefix: str
) -> list[str]:
    """Save (question, answer) turns with ids ``{prefix}u{i}`` / ``{prefix}a{i}``; the heads."""
    heads = []
    for index, (question, answer) in enumerate(turns):
        context.set(
            user(question, id=f"{prefix}u{index}"), assistant_text(answer, id=f"{prefix}a{index}")
        )
        saved = await context.save()
        assert saved.head_message_id is not None
        heads.append(saved.head_message_id)
    return heads


async def build_branched_chat(url: str, chat_id: str = "trip", user_id: str = "alice") -> None:
    """A chat with a rewind (branch ``main-v2``, active) and a checkpoint ``planned``."""
    async with SqlContextStore(url) as store:
        context = ContextEngine(store=store, chat_id=chat_id, user_id=user_id)
        heads = await save_turns(
            context,
            [
                ("Plan a trip to Lisbon", "Three days: Alfama, Belem, Sintra."),
                ("Add a food tour", "Day two now ends with a food tour in Mouraria."),
            ],
            prefix=f"{chat_id}-",
        )
        await context.checkpoint("planned")
        await context.rewind(heads[0])
        await save_turns(
            context,
            [("Make it Porto instead", "Porto: Ribeira, port cellars.")],
            prefix=f"{chat_id}-p",
        )
        await context.update_chat(title="Trip planning")
