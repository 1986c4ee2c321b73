"""`agentcontext demo`: the main job of the library, end to end, offline, in a few seconds."""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from agentcontext.cli._common import (
    EXIT_OK,
    KEY_ENV_DEFAULT,
    Env,
    hidden_url,
    new_file_removed_on_error,
)
from agentcontext.engine import ContextEngine
from agentcontext.estimate import Estimate
from agentcontext.fragments import (
    ContextFragment,
    assistant_text,
    example,
    glossary,
    guardrail,
    hint,
    persona,
    role,
    style_guide,
    user,
    workflow,
)
from agentcontext.renderers import (
    ContextRenderer,
    MarkdownRenderer,
    TomlRenderer,
    ToonRenderer,
    XmlRenderer,
)
from agentcontext.store import SqlContextStore
from agentcontext.views import visualize_graph

__all__ = ["DEMO_CHAT", "DEMO_FILE", "DEMO_MODEL", "DEMO_URL", "explore_commands", "register"]

DEMO_FILE = "agentcontext-demo.db"
DEMO_URL = f"sqlite+aiosqlite:///{DEMO_FILE}"
DEMO_CHAT = "demo"
DEMO_USER = "demo-user"
DEMO_MODEL = "gpt-4o"

FORMATS: tuple[tuple[str, ContextRenderer, str], ...] = (
    ("XML", XmlRenderer(), "xml"),
    ("Markdown", MarkdownRenderer(), "markdown"),
    ("TOML", TomlRenderer(), "toml"),
    ("TOON", ToonRenderer(), "text"),
)


def register(commands: Any) -> None:
    """Add ``demo`` to the command parsers."""
    demo = commands.add_parser(
        "demo",
        help="run a scripted support chat and show the graph, prompts and estimate",
        description=f"Create the chat '{DEMO_CHAT}' (recreated on every run) with a realistic "
        "system prompt, save scripted turns (no network), rewind, checkpoint, restore and "
        "fork with btw; then print the graph, the system prompt in XML, Markdown, TOML and "
        f"TOON with its token count, and a token and cost estimate for {DEMO_MODEL}. "
        f"Writes to --url if given, else to its own SQLite file {DEMO_FILE} in the current "
        "directory, never to AGENTCONTEXT_URL or the other commands' default "
        "(agentcontext.db); into a PostgreSQL schema or a MariaDB/MySQL database only with "
        "--schema (AGENTCONTEXT_SCHEMA "
        "is not used either). It ends with the commands that open what it stored, the "
        "web viewer (agentcontext serve) and the documentation.",
    )
    demo.set_defaults(handler=_demo)


def system_prompt() -> list[ContextFragment]:
    """The system prompt of a bookshop's support assistant."""
    return [
        persona(
            "Ada",
            role="customer support agent for Orbit Books",
            objective="solve the customer's problem in as few messages as possible",
            tone="friendly and precise",
        ),
        role("You answer questions about orders, shipping and returns for Orbit Books."),
        hint("Keep answers under three sentences unless the customer asks for detail."),
        hint("Quote order numbers exactly as the customer wrote them."),
        guardrail(
            "Never reveal another customer's order or address.",
            reason="privacy law and customer trust",
            action="Ask the customer to sign in and confirm the order's e-mail address.",
        ),
        workflow(
            "Refund request",
            [
                "Find the order",
                "Check it was placed within 30 days",
                "Confirm the amount with the customer",
                "Issue the refund to the original payment method",
            ],
            triggers=["refund", "money back", "cancel my order"],
        ),
        glossary(
            {
                "ETA": "estimated time of arrival",
                "RMA": "return merchandise authorization, needed before any return",
                "hub": "the regional depot an order leaves on its last day of transit",
            }
        ),
        example(
            "Where is my order #1042?",
            "Order #1042 left our warehouse on Monday; DHL expects to deliver it on Thursday.",
            note="Always give the carrier and the ETA.",
        ),
        style_guide("plain words", never="jargon without explaining it", always="say what's next"),
    ]


class _Demo:
    """The scripted conversation, step by step, each step described on one line.

    The lines are printed once the conversation is stored, so a closed pipe never leaves a
    half-built demo chat behind.
    """

    def __init__(self, context: ContextEngine) -> None:
        self.context = context
        self.steps: list[str] = []

    def say(self, text: str) -> None:
        self.steps.append(f"{len(self.steps) + 1:>2}. {text}")

    async def turn(self, key: str, question: str, answer: str) -> str:
        self.context.set(
            user(question, id=f"demo-u{key}"), assistant_text(answer, id=f"demo-a{key}")
        )
        saved = await self.context.save()
        self.say(f"[{self.context.branch}] user: {question!r} -> assistant replied")
        assert saved.head_message_id is not None
        return saved.head_message_id

    async def run(self) -> None:
        c = self.context
        c.set(*system_prompt())
        self.say(f"system prompt: {', '.join(f.name for f in c.fragments)}")
        first = await self.turn(
            "1",
            "Hi! Where is my order #1042?",
            "Order #1042 left our warehouse yesterday with DHL; the ETA is Thursday.",
        )
        await self.turn(
            "2",
            "Can I still change the delivery address?",
            "Yes, until it leaves the regional hub tonight. What is the new address?",
        )
        point = await c.checkpoint("address-asked")
        self.say(f"checkpoint {point.name!r} at {point.message_id}")
        await self.turn(
            "3",
            "Actually, I would rather cancel and get my money back.",
            "Done: the order is within 30 days, so $42.50 goes back to your card in 3-5 days.",
        )
        branch = await c.rewind(first)
        self.say(f"rewind to {first}: new branch {branch.name} (main is untouched)")
        await self.turn(
            "4",
            "Does DHL deliver on Saturdays?",
            "In most cities, yes; your ETA stays Thursday either way.",
        )
        await c.switch_branch("main")
        branch = await c.restore(point.name)
        self.say(f"switch to main, restore {point.name!r}: new branch {branch.name}")
        await self.turn(
            "5",
            "Please send it to 12 Harbour Street, Leith.",
            "Updated: order #1042 now goes to 12 Harbour Street, Leith, still by Thursday.",
        )
        home = c.branch or "main"
        side = await c.btw()
        self.say(f"btw: side branch {side.name} forked at the head; still on {c.branch}")
        await c.switch_branch(side.name)
        await self.turn(
            "6", "By the way, do you sell gift cards?", "We do, from $10 to $200, sent by e-mail."
        )
        await c.switch_branch(home)
        self.say(f"switch back to {home}")


async def _estimates(context: ContextEngine) -> list[tuple[str, str, str, Estimate]]:
    out = []
    for name, renderer, lexer in FORMATS:
        rendered = renderer.render(context.fragments)
        out.append((name, lexer, rendered, await context.estimate(DEMO_MODEL, renderer=renderer)))
    return out


def _money(value: float | None) -> str:
    return "unknown" if value is None else f"${value:.6f}"


EXCERPT_LINES = 8
"""Lines shown of the Markdown, TOML and TOON prompts (the XML one is shown whole)."""

DOCS_URL = "https://agentcontext.readthedocs.io"


def _prefix(url: str, schema: str | None) -> str:
    """``agentcontext --url URL [--schema NAME]`` (password hidden)."""
    where = "" if schema is None else f" --schema {shlex.quote(schema)}"
    return f"agentcontext --url {shlex.quote(hidden_url(url))}{where}"


def explore_commands(url: str, schema: str | None = None) -> list[str]:
    """The commands that open what the demo stored at `url` (in `schema`; password hidden)."""
    prefix = _prefix(url, schema)
    return [
        f"{prefix} show {DEMO_CHAT}",
        f"{prefix} show {DEMO_CHAT} --full",
        f"{prefix} branches {DEMO_CHAT}",
        f"{prefix} search {DEMO_CHAT} DHL",
    ]


async def _demo(args: argparse.Namespace, env: Env) -> int:
    url = env.url if env.url_explicit else DEMO_URL
    schema = env.schema if env.schema_explicit else None  # never $AGENTCONTEXT_SCHEMA
    # An encrypted database's keyring only from --keyring (never $AGENTCONTEXT_KEYRING).
    keyring: str | None = args.keyring
    with new_file_removed_on_error(url):
        if keyring is None:
            return await _run(env, url, schema, None)
        from agentcontext.encryption import LocalKeyProvider

        key_env = args.key_env or KEY_ENV_DEFAULT
        async with LocalKeyProvider.from_env(key_env, keyring=keyring) as provider:
            return await _run(env, url, schema, provider)


async def _run(env: Env, url: str, schema: str | None, provider: Any) -> int:
    out = env.out
    async with SqlContextStore(url, schema=schema, encryption=provider) as store:
        await store.delete_chat(DEMO_CHAT)
        context = ContextEngine(
            store=store, chat_id=DEMO_CHAT, user_id=DEMO_USER, metadata={"source": "demo"}
        )
        where = "" if schema is None else f" (schema {schema})"
        header = f"agentcontext demo: chat {DEMO_CHAT!r} in {store.url}{where}"
        demo = _Demo(context)
        await demo.run()
        await context.update_chat(title="Order #1042: address change")
        graph = await store.get_graph(DEMO_CHAT)
        resolved = await context.resolve()
        estimates = await _estimates(context)

    out.line(header, style="bold")
    for step in demo.steps:
        out.line(step)

    out.heading("Conversation graph")
    out.graph_tree(visualize_graph(graph))
    out.line()
    out.line(
        f"active branch {context.branch}: {len(resolved.messages)} messages sent to the model",
        style="dim",
    )
    # The prompt in full once (XML, what the model reads by default); the other formats as
    # their first lines, so the four can be compared without four copies of the prompt.
    for index, (name, lexer, rendered, estimate) in enumerate(estimates):
        out.heading(f"System prompt as {name} ({estimate.system_prompt_tokens} tokens)")
        if index == 0:
            out.code(rendered, lexer)
            continue
        lines = rendered.split("\n")
        out.code("\n".join(lines[:EXCERPT_LINES]), lexer)
        if len(lines) > EXCERPT_LINES:
            out.line(f"… {len(lines) - EXCERPT_LINES} more lines", style="dim")

    out.heading(f"Prompt size per format for {DEMO_MODEL}")
    out.table(
        ["format", "system prompt tokens", "input tokens", "input cost"],
        [
            [name, str(e.system_prompt_tokens), str(e.input_tokens), _money(e.cost)]
            for name, _, _, e in estimates
        ],
        numeric=("system prompt tokens", "input tokens", "input cost"),
    )
    xml = estimates[0][3]
    out.heading(f"Estimate for {xml.model_id} (XML prompt, offline)")
    tokenizer = xml.tokenizer + (" (approximation)" if xml.approximate else "")
    limit = "unknown" if xml.context_limit is None else f"{xml.context_limit:,}"
    rate = xml.input_price_per_mtok
    price = "unknown" if rate is None else f"${rate:.2f}/Mtok"
    out.pairs(
        [
            ("model", f"{xml.model_id} ({xml.provider or 'unknown provider'})"),
            ("tokenizer", tokenizer),
            ("system prompt", f"{xml.system_prompt_tokens} tokens"),
            ("messages", f"{sum(m.tokens for m in xml.messages)} tokens in {len(xml.messages)}"),
            ("framing", f"{xml.overhead_tokens} tokens"),
            ("input tokens", str(xml.input_tokens)),
            ("context window", f"{limit} ({'exceeded' if xml.exceeds_context else 'fits'})"),
            ("input cost", f"{_money(xml.cost)} at {price} ({xml.price_source})"),
        ]
    )
    where = "" if env.url_explicit else " (from this directory)"
    out.heading(f"Explore what the demo stored{where}")
    for command in explore_commands(url, schema):
        out.line(command)
    out.line()
    out.line("See the graph, every message and the branches in your browser:", style="bold")
    out.line(f"{_prefix(url, schema)} serve")
    out.line()
    out.line(f"Documentation: {DOCS_URL} (the docs/ folder of the source)", style="dim")
    return EXIT_OK
