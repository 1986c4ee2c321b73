"""``python -m agentcontext``: the command line."""

from __future__ import annotations

import sys

from agentcontext.cli import main

if __name__ == "__main__":
    sys.exit(main())
