"""The `agentcontext` command line (`agentcontext ...` or `python -m agentcontext ...`).

Commands: `demo`, `migrate`, `chats`, `show`, `branches`, `search`, `export`, `import`,
`delete`, `prune` and `mermaid`; run `agentcontext --help` for the list and
`agentcontext COMMAND --help` for each. See `docs/cli.md`. Tables and colours need the `cli`
extra (rich); without it the output is plain text.
"""

from __future__ import annotations

from agentcontext.cli._app import build_parser, main

__all__ = ["build_parser", "main"]
