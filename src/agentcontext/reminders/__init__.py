"""Reminders: conditional ``<system-reminder>`` text in the outgoing message.

A reminder is a fragment set on the engine like any other. It never reaches the system
prompt: when the engine resolves (or saves without a resolve first), every reminder whose
predicate holds is appended to the outgoing user message, or to the latest tool result
(``target="tool-output"``), as ``<system-reminder>…</system-reminder>``. The amended message is
what is sent and what is saved; the inserted ranges are kept in its ``metadata["reminders"]``
so an interface can hide them with `strip_reminders`:

```python
engine.set(
    reminder("Re-read the plan before you continue.", when=every_n_turns(5)),
    reminder("Try another approach.", when=tool_failed("bash", streak=3)),
    reminder("Welcome back!", when=elapsed(3600), once="welcome-back"),
)
```
"""

from __future__ import annotations

from agentcontext.reminders._core import (
    Predicate,
    Reminder,
    ReminderContext,
    ReminderTarget,
    ReminderText,
    is_reminder,
    part_ranges,
    reminder,
    strip_reminders,
)
from agentcontext.reminders._predicates import (
    after_turn,
    all_of,
    any_of,
    elapsed,
    every_n_turns,
    first_n_turns,
    first_turn,
    message_matches,
    not_,
    tokens_over,
    tool_failed,
    tool_failure_streak,
    total_tokens,
)

__all__ = [
    "Predicate",
    "Reminder",
    "ReminderContext",
    "ReminderTarget",
    "ReminderText",
    "after_turn",
    "all_of",
    "any_of",
    "elapsed",
    "every_n_turns",
    "first_n_turns",
    "first_turn",
    "is_reminder",
    "message_matches",
    "not_",
    "part_ranges",
    "reminder",
    "strip_reminders",
    "tokens_over",
    "tool_failed",
    "tool_failure_streak",
    "total_tokens",
]
