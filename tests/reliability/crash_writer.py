"""A writer for the crash test: saves turns in a loop until it is killed.

Run as a subprocess::

    python tests/reliability/crash_writer.py URL CHAT_PREFIX RUN SEED [--chats N]

It opens the chats ``CHAT_PREFIX-0`` … ``CHAT_PREFIX-{N-1}`` with new engines, so it carries on
from the stored heads, then loops over random actions on random chats: turns of two to four
messages in one save (a user message, tool-calling assistant messages, a final answer),
streaming turns (``begin_turn`` / ``complete_turn``), rewinds, checkpoints, restores, ``btw``,
branch switches and edits of the last turn (a resent message id: a fork with messages).

Every message of a turn says which turn it belongs to: ``turn <marker> part <k>/<K>``, so a
checker can tell whole turns from partial ones on any chain. Markers are unique per run
(``RUN.n``; streaming turns ``RUN.n.s``); the first turn of a run on chat ``i`` is
``RUN.0.c<i>`` and is saved before anything else, after the placeholder of an interrupted
streaming turn (if the head is one) was completed. Once every chat has its first turn the
writer prints ``ready RUN``. It writes nothing else: the database is the truth.

``python tests/reliability/crash_writer.py --serve`` imports everything once, then forks
writers on request (see :func:`serve`), so a test can start one every few milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import sys
import time
import traceback

from agentcontext import (
    ContextEngine,
    ContextFragment,
    Message,
    SqlContextStore,
    TextPart,
    ToolPart,
    assistant,
    assistant_text,
    user,
)
from agentcontext.fragments import new_message_id

USER_ID = "crash-user"
CHECKPOINTS = ("cp-a", "cp-b", "cp-c")
MARKER = re.compile(r"turn (?P<turn>\S+) part (?P<part>\d+)/(?P<parts>\d+)")


def marker_text(turn: str, part: int, parts: int) -> str:
    return f"turn {turn} part {part}/{parts}"


def parse_marker(text: str) -> tuple[str, int, int] | None:
    """``(turn, part, parts)`` of a message text, or None when it carries no marker."""
    found = MARKER.fullmatch(text)
    if found is None:
        return None
    return found["turn"], int(found["part"]), int(found["parts"])


def chat_ids(prefix: str, count: int) -> list[str]:
    return [f"{prefix}-{i}" for i in range(count)]


def first_turn(run: int, chat_index: int) -> str:
    """The marker of a run's first turn on a chat."""
    return f"{run}.0.c{chat_index}"


def turn_messages(turn: str, parts: int) -> list[ContextFragment]:
    """A whole turn: a user message, tool-calling assistant messages, a final answer."""
    out = [user(marker_text(turn, 1, parts))]
    for part in range(2, parts):
        call = Message(
            id=new_message_id(),
            role="assistant",
            parts=[
                TextPart(text=marker_text(turn, part, parts)),
                ToolPart(
                    tool_call_id=f"call-{turn}-{part}",
                    tool_name="lookup",
                    input={"query": turn, "part": part},
                    state="output-available",
                    output={"rows": [part, parts]},
                ),
            ],
        )
        out.append(assistant(call))
    out.append(assistant_text(marker_text(turn, parts, parts)))
    return out


class Writer:
    def __init__(self, store: SqlContextStore, prefix: str, chats: int, run: int, seed: int):
        self.store = store
        self.run = run
        self.rng = random.Random(seed)
        self.engines = [
            ContextEngine(store=store, chat_id=chat_id, user_id=USER_ID)
            for chat_id in chat_ids(prefix, chats)
        ]
        self.turns = 0

    def next_turn(self, suffix: str = "") -> str:
        self.turns += 1
        return f"{self.run}.{self.turns}{suffix}"

    async def start(self) -> None:
        """Carry on from each stored head: finish an interrupted streaming turn, then save
        the run's first turn."""
        for index, engine in enumerate(self.engines):
            messages = await engine.get_messages()
            head = engine.head_message_id
            if head is not None and (not messages or messages[-1].id != head):
                # The head is an empty placeholder (get_messages leaves it out): a streaming
                # turn was cut between begin_turn and complete_turn.
                found = parse_marker(messages[-1].text) if messages else None
                if found is None or found[1:] != (1, 2):
                    raise RuntimeError(f"head {head!r} follows no streaming turn start")
                await engine.complete_turn(assistant_text(marker_text(found[0], 2, 2)))
            engine.set(*turn_messages(first_turn(self.run, index), self.rng.choice((2, 3))))
            await engine.save()
        # One write(2) of the whole line: a pipe takes it whole, so a SIGKILL cannot leave
        # "ready R" without its newline for the server's next reply to run into (print()
        # writes the text and the newline apart when Python's output is unbuffered).
        os.write(sys.stdout.fileno(), f"ready {self.run}\n".encode())

    async def step(self) -> None:
        engine = self.rng.choice(self.engines)
        if engine.branch is not None and len(engine.branch) > 60:
            await engine.switch_branch("main")  # keep fork names (X-vN-vM…) short
        action = self.rng.choices(
            ("turn", "stream", "rewind", "checkpoint", "restore", "btw", "switch", "edit"),
            weights=(8, 3, 2, 1, 1, 1, 1, 1),
        )[0]
        if action == "turn":
            engine.set(*turn_messages(self.next_turn(), self.rng.choice((2, 3, 4))))
            await engine.save()
        elif action == "stream":
            turn = self.next_turn(".s")
            await engine.begin_turn(user(marker_text(turn, 1, 2)))
            await asyncio.sleep(self.rng.uniform(0, 0.01))  # the model streams its answer
            await engine.complete_turn(assistant_text(marker_text(turn, 2, 2)))
        elif action == "rewind":
            # To the end of an earlier turn, as a retry does.
            ends = [m.id for m in await engine.get_messages() if _ends_turn(m)]
            if len(ends) > 1:
                await engine.rewind(self.rng.choice(ends[:-1]))
        elif action == "checkpoint":
            await engine.checkpoint(self.rng.choice(CHECKPOINTS))
        elif action == "restore":
            checkpoints = await self.store.list_checkpoints(engine.chat_id)
            if checkpoints:
                await engine.restore(self.rng.choice(checkpoints).name)
        elif action == "btw":
            await engine.btw()
        elif action == "switch":
            branches = await self.store.list_branches(engine.chat_id)
            await engine.switch_branch(self.rng.choice(branches).name)
        else:  # edit: resend the last turn with its first message's id -> a fork with messages
            messages = await engine.get_messages()
            starts = [m for m in messages if (found := parse_marker(m.text)) and found[1] == 1]
            if starts:
                turn, parts = self.next_turn(), self.rng.choice((2, 3))
                fragments = turn_messages(turn, parts)
                fragments[0] = user(marker_text(turn, 1, parts), id=starts[-1].id)
                engine.set(*fragments)
                await engine.save()


def _ends_turn(message: Message) -> bool:
    found = parse_marker(message.text)
    return found is not None and found[1] == found[2]


async def main(args: argparse.Namespace) -> None:
    async with SqlContextStore(args.url) as store:
        writer = Writer(store, args.prefix, args.chats, args.run, args.seed)
        await writer.start()
        deadline = time.monotonic() + args.max_seconds
        while time.monotonic() < deadline:
            await writer.step()


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("prefix")
    parser.add_argument("run", type=int)
    parser.add_argument("seed", type=int)
    parser.add_argument("--chats", type=int, default=3)
    parser.add_argument(
        "--max-seconds", type=float, default=120.0, help="stop by itself after this long"
    )
    return parser.parse_args(argv)


# --- serve mode: writers forked from one process that has imported everything ---------------


def _reply(line: str) -> None:
    # One write(2), as the writers' "ready" lines: lines on the shared pipe never interleave.
    os.write(sys.stdout.fileno(), (line + "\n").encode())


def _writer_child(argv: list[str], stderr_path: str) -> None:
    """In a forked child: run one writer, never return."""
    code = 1
    try:
        err = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(err, 2)
        os.close(err)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        asyncio.run(main(parse_args(argv)))
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    """Start and kill writers on request, one JSON command a line on stdin.

    ``{"op": "start", "run": R, "argv": [...], "stderr": PATH}`` forks a writer (a new process
    with the arguments of the command line, its stderr in PATH) and answers ``started R PID``;
    ``{"op": "kill", "run": R}`` sends it SIGKILL, reaps it and answers ``killed R STATUS``
    (``signal N``, or ``exit N`` when it had stopped by itself). Writers print ``ready R`` on
    the same stdout. At the end of stdin the remaining writers are killed.

    Forking from a process that has imported everything (and runs no thread and no event loop)
    starts a writer in a few milliseconds instead of the better part of a second.
    """
    children: dict[int, int] = {}
    for line in sys.stdin:
        command = json.loads(line)
        run = int(command["run"])
        if command["op"] == "start":
            pid = os.fork()
            if pid == 0:
                _writer_child(command["argv"], command["stderr"])
            children[run] = pid
            _reply(f"started {run} {pid}")
        elif command["op"] == "kill":
            pid = children.pop(run)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            if os.WIFSIGNALED(status):
                _reply(f"killed {run} signal {os.WTERMSIG(status)}")
            else:
                _reply(f"killed {run} exit {os.WEXITSTATUS(status)}")
    for pid in children.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        asyncio.run(main(parse_args(sys.argv[1:])))
