"""The `agentcontext` command line (`agentcontext ...` or `python -m agentcontext ...`).

Commands: `demo`, `migrate`, `chats`, `show`, `branches`, `search`, `export`, `import`,
`delete`, `prune` and `mermaid`; run `agentcontext --help` for the list and
`agentcontext COMMAND --help` for each. See `docs/cli.md`. Tables and colours need the `cli`
extra (rich); without it the output is plain text.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

__all__ = ["build_parser", "main"]

_EXIT_INTERRUPTED = 130
"""`_app.EXIT_INTERRUPTED`, known before `_app` is imported (that import may be interrupted)."""


def main(argv: list[str] | None = None) -> int:
    """Run the command line; the exit code (see ``agentcontext --help``). Ctrl-C while the
    command line is still starting (most of a second, importing its modules) is one line and
    exit 130, as it is later."""
    try:
        from agentcontext.cli._app import main as run

        return run(argv)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return _EXIT_INTERRUPTED


def build_parser() -> argparse.ArgumentParser:
    """The command line's argument parser."""
    from agentcontext.cli._app import build_parser as build

    return build()
