"""Chats for the viewer's tests and screenshots, written through the public API."""

from __future__ import annotations

from agentcontext import ContextEngine, SqlContextStore, assistant, assistant_text, persona, user
from agentcontext.messages import Message, ReasoningPart, TextPart, ToolPart
from agentcontext.snapshots import ContextSnapshot
from agentcontext.store.records import MessageRecord

USER = "alice"
OTHER = "mallory"
CHAT = "support-42"
HOSTILE = "hostile"
SECRET = "secret-chat"
LONG_RUN = 12
"""Turns on `main` after the fork: a linear run long enough to fold."""

REMINDER = "<system-reminder>Be brief.</system-reminder>"

HOSTILE_TEXTS = [
    "<script>window.__pwned = 1</script>",
    '<img src=x onerror="window.__pwned = 2">',
    '<a href="javascript:window.__pwned = 3">click me</a>',
    '<svg onload="window.__pwned = 4"><script>window.__pwned = 5</script></svg>',
    '"><iframe srcdoc="<script>parent.__pwned = 6</script>"></iframe>',
    "\u202eevil override\u202c and \u2067isolate\u2069",
    "</textarea></pre></title><style>body{display:none}</style>",
]
BIG = "A" * 1_000_000


async def seed(url: str) -> dict[str, str]:
    """Write the test chats; returns ids the tests look for."""
    ids: dict[str, str] = {}
    async with SqlContextStore(url) as store:
        context = ContextEngine(store=store, chat_id=CHAT, user_id=USER)
        context.set(persona("Ada", role="support agent for Orbit Books"))
        context.set(
            user("Where is my order #1042?", id="m-u0"),
            assistant_text("It ships today.", id="m-a0"),
        )
        await context.save()
        await context.resolve(record=True)
        text = "Can I change the address? " + REMINDER
        start = text.index(REMINDER)
        asked = Message(
            id="m-u1",
            role="user",
            parts=[TextPart(text=text)],
            metadata={"reminders": [{"start": start, "end": len(text), "part": 0}]},
        )
        answered = Message(
            id="m-a1",
            role="assistant",
            parts=[
                ReasoningPart(text="The order has not shipped; the address can change."),
                ToolPart(
                    tool_call_id="call-1",
                    tool_name="update_address",
                    input={"order": 1042, "city": "Lyon"},
                    state="output-available",
                    output={"ok": True},
                ),
                TextPart(text="Done: the new address is in Lyon."),
            ],
        )
        context.set(user(asked), assistant(answered))
        await context.save()
        await context.checkpoint("address-changed")
        await context.resolve(record=True)
        # A side branch from the first answer.
        await context.rewind("m-a0", name="refund")
        context.set(user("Actually, refund it.", id="r-u0"), assistant_text("Refunded.", id="r-a0"))
        await context.save()
        # Back on main: a long linear run (folded in the graph).
        await context.switch_branch("main")
        for index in range(LONG_RUN):
            context.set(
                user(f"Question {index}", id=f"run-u{index}"),
                assistant_text(f"Answer {index}", id=f"run-a{index}"),
            )
            await context.save()
        await context.resolve(record=True)
        # A compaction summary beside the branch, folding the run.
        summary = Message(
            id="c-1",
            role="system",
            parts=[TextPart(text="Summary: the customer asked twelve questions.")],
            metadata={
                "compaction": {
                    "folded": LONG_RUN * 2,
                    "through": f"run-a{LONG_RUN - 1}",
                    "previous": None,
                }
            },
        )
        await store.add_message(
            MessageRecord(
                id="c-1",
                chat_id=CHAT,
                parent_id=f"run-a{LONG_RUN - 1}",
                name="system",
                type="compaction",
                data=summary.model_dump(mode="json"),
            )
        )
        snap = ContextSnapshot(summary="files the agent read")
        snap.add_file("src/app.py", "print('hello')\n")
        snap.add_file("notes/<b>bold</b>.md", "<script>window.__pwned = 7</script>")
        stored = await context.snapshot(snap)
        ids["snapshot"] = stored.id or ""

        hostile = ContextEngine(store=store, chat_id=HOSTILE, user_id=USER)
        await store.upsert_chat(HOSTILE, user_id=USER, title="<script>window.__pwned = 8</script>")
        for index, bad in enumerate(HOSTILE_TEXTS):
            hostile.set(user(bad, id=f"h-u{index}"), assistant_text(bad, id=f"h-a{index}"))
            await hostile.save()
        big = Message(
            id="h-big",
            role="assistant",
            parts=[
                TextPart(text="B" * 200_000),
                ToolPart(
                    tool_call_id="call-big",
                    tool_name="read_file",
                    input={"path": "<script>window.__pwned = 9</script>"},
                    state="output-available",
                    output=BIG,
                ),
            ],
        )
        hostile.set(user("read the big file", id="h-ask"), assistant(big))
        await hostile.save()
        await hostile.resolve(record=True)

        secret = ContextEngine(store=store, chat_id=SECRET, user_id=OTHER)
        secret.set(user("the other user's secret", id="s-u0"))
        await secret.save()
    return ids
