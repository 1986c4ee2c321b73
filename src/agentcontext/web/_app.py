"""The viewer's ASGI application: read-only pages over the store API."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, MutableMapping
from contextlib import asynccontextmanager
from importlib import resources
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from agentcontext._shape import DEFAULT_FOLD
from agentcontext.errors import (
    ContextError,
    InvalidInputError,
    MissingExtraError,
    NotFoundError,
    SchemaOutdatedError,
    StoreClosedError,
    StoreError,
    StoreUnavailableError,
)
from agentcontext.messages import Message, ReasoningPart, TextPart
from agentcontext.store.base import ContextStore
from agentcontext.store.records import Chat, ChatInfo, GraphOutline, ResolveRecord
from agentcontext.web._html import (
    esc,
    href,
    json_html,
    page,
    preview_text,
    snippet_html,
    table,
    text_html,
    when,
)
from agentcontext.web._layout import layout_graph, render_svg
from agentcontext.web._render import message_body, message_panel

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

__all__ = ["CSP", "LOOPBACK_HOSTS", "create_app", "host_allowed"]

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
"""Host names the viewer always answers (every ``127.x.x.x`` address too)."""

_UNREADABLE = (StoreUnavailableError, StoreClosedError, SchemaOutdatedError)
"""Store errors that mean the database cannot be read at all (503), not a damaged row."""

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
"""The Content-Security-Policy of every response: the viewer's own script and styles only."""

SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]

PAGE_SIZE = 50
MAX_ID_LENGTH = 255
MAX_OPENED = 50
"""At most this many runs are opened on one page (each opened run is drawn whole)."""
TRANSCRIPT_PAGE = 200
MAX_PAGE = 1_000_000
_META = re.compile(r"[+-]?\d+")

ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


class _NotFound(Exception):
    """A page for something that does not exist (or that ``--user`` hides)."""


class _BadRequest(Exception):
    """A request missing a parameter or with one the viewer cannot use."""


def _host_name(header: str) -> str:
    """The name of a ``Host`` header, without its port and brackets, lower-cased."""
    host = header.strip().lower()
    if host.startswith("["):  # [::1]:8000
        return host[1 : host.find("]")] if "]" in host else host
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def host_allowed(header: str | None, allowed: frozenset[str]) -> bool:
    """Whether a request's ``Host`` header names this viewer.

    Loopback names (`LOOPBACK_HOSTS`, any ``127.x.x.x``) and the names in ``allowed`` are
    accepted; anything else (a DNS-rebinding domain that points at 127.0.0.1, say) is not.
    """
    if not header:
        return False
    name = _host_name(header)
    if name in LOOPBACK_HOSTS or name in allowed:
        return True
    parts = name.split(".")
    return len(parts) == 4 and parts[0] == "127" and all(p.isdigit() for p in parts)


_REFUSED = (
    b"<!doctype html><meta charset=utf-8><title>Host not allowed</title>"
    b"<h1>Host not allowed</h1><p>This viewer only answers requests addressed to it by a "
    b"loopback name (localhost, 127.0.0.1, [::1]) or by a name given with "
    b"<code>agentcontext serve --host</code> or <code>--allow-host</code>. Open it at its "
    b"own address.</p>"
)


def _secure(app: ASGIApp, hosts: frozenset[str] | None = None) -> ASGIApp:
    """Wrap an ASGI app so every HTTP response carries the security headers, and (with
    ``hosts``) requests whose ``Host`` header is not allowed get a 421 without reaching it."""

    async def wrapped(
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return

        async def send_secure(message: Any) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in SECURITY_HEADERS}
                headers = [h for h in message.get("headers", []) if h[0].lower() not in names]
                message = {**message, "headers": [*headers, *SECURITY_HEADERS]}
            await send(message)

        if hosts is not None:
            host = next(
                (v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"host"), None
            )
            if not host_allowed(host, hosts):
                await send_secure(
                    {
                        "type": "http.response.start",
                        "status": 421,
                        "headers": [
                            (b"content-type", b"text/html; charset=utf-8"),
                            (b"content-length", str(len(_REFUSED)).encode()),
                        ],
                    }
                )
                await send_secure({"type": "http.response.body", "body": _REFUSED})
                return
        await app(scope, receive, send_secure)

    return wrapped


def _count(number: int, noun: str) -> str:
    """``1 checkpoint``, ``2 branches``, ``0 compactions``."""
    plural = noun + ("es" if noun.endswith(("ch", "sh", "s", "x")) else "s")
    return f"{number} {noun if number == 1 else plural}"


def _meta_filter(text: str) -> tuple[str, str | int | bool]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise _BadRequest(f"a metadata filter must look like key=value, got {text!r}")
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return key, value[1:-1]
    if value.lower() in ("true", "false"):
        return key, value.lower() == "true"
    if _META.fullmatch(value):
        if len(value.lstrip("+-")) > 19:  # (int() of 4 301 digits or more raises, too)
            raise _BadRequest(f"metadata filter value of {key!r} must fit in 64 bits")
        return key, int(value)
    return key, value


def _int(request: Request, name: str, default: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _BadRequest(f"{name} must be a whole number, got {raw!r}") from None
    if not 1 <= value <= MAX_PAGE:
        raise _BadRequest(f"{name} must be between 1 and {MAX_PAGE}")
    return value


def _required(request: Request, name: str) -> str:
    value = request.query_params.get(name)
    if not value:
        raise _BadRequest(f"the page needs the query parameter {name!r}")
    return value


class _Viewer:
    """The pages, sharing the store and the ``--user`` restriction."""

    def __init__(self, store: ContextStore | None, user: str | None) -> None:
        self.store_or_none = store
        self.user = user

    @property
    def store(self) -> ContextStore:
        if self.store_or_none is None:
            raise ContextError("the viewer's store is not open yet")
        return self.store_or_none

    async def chat(self, chat_id: str) -> Chat:
        chat = await self.store.get_chat(chat_id)
        if chat is None or (self.user is not None and chat.user_id != self.user):
            raise _NotFound(f"there is no chat {chat_id!r}")
        return chat

    def chat_crumbs(
        self, chat: Chat, *more: tuple[str, str | None]
    ) -> list[tuple[str, str | None]]:
        return [
            ("chats", "/"),
            (preview_text(chat.title or chat.id, 40), href("/chat", {"id": chat.id})),
            *more,
        ]

    # --- chats ------------------------------------------------------------------------------

    async def _list_chats(
        self, user: str | None, metadata: dict[str, Any] | None, offset: int
    ) -> list[ChatInfo]:
        """A page of chats (one more than shown). The store lists a chat row it cannot decode
        with ``ChatInfo.damaged`` set, so one damaged chat never hides the others."""
        return list(
            await self.store.list_chats(
                user_id=user, metadata=metadata, limit=PAGE_SIZE + 1, offset=offset
            )
        )

    async def chats(self, request: Request) -> str:
        params = request.query_params
        user = self.user if self.user is not None else (params.get("user") or None)
        metas = [m for m in params.getlist("meta") if m]
        metadata = dict(_meta_filter(m) for m in metas) or None
        page_no = _int(request, "page", 1)
        query = params.get("q", "").strip()
        chats = await self._list_chats(user, metadata, (page_no - 1) * PAGE_SIZE)
        more = len(chats) > PAGE_SIZE
        chats = chats[:PAGE_SIZE]
        user_field = (
            f'<label>user<input name="user" value="{esc(user or "")}" '
            'placeholder="all users"></label>'
            if self.user is None
            else f'<span class="tag">user {esc(self.user)}</span>'
        )
        form = (
            '<form class="filters" method="get" action="/">'
            f"{user_field}"
            f'<label>metadata<input name="meta" value="{esc(metas[0] if metas else "")}" '
            'placeholder="key=value"></label>'
            f'<label>search messages<input name="q" value="{esc(query)}" '
            'placeholder="words to find"></label>'
            '<button type="submit">Apply</button></form>'
        )
        body = f"<h1>Chats</h1>{form}"
        if query:
            body += await self._search(user, query)
        rows = [
            [
                f'<a href="{href("/chat", {"id": c.id})}">{text_html(c.id)}</a>',
                esc(c.user_id),
                text_html(c.title or ""),
                str(c.message_count),
                str(c.branch_count),
                when(c.updated_at),
            ]
            if c.damaged is None
            else [
                f'{text_html(c.id)} <span class="tag failed">damaged row</span>',
                esc(c.user_id),
                f'<span class="muted">{text_html(preview_text(c.damaged, 160))}</span>',
                str(c.message_count),
                str(c.branch_count),
                "",
            ]
            for c in chats
        ]
        body += table(["chat", "user", "title", "messages", "branches", "last activity"], rows)
        if not rows:
            body += '<p class="muted">No chats match.</p>'
        base: list[tuple[str, Any]] = [("user", user if self.user is None else None)]
        base += [("meta", m) for m in metas]
        base.append(("q", query))
        pager = []
        if page_no > 1:
            pager.append(
                f'<a rel="prev" href="{href("/", [*base, ("page", page_no - 1)])}">previous</a>'
            )
        pager.append(f"<span>page {page_no}</span>")
        if more:
            pager.append(
                f'<a rel="next" href="{href("/", [*base, ("page", page_no + 1)])}">next</a>'
            )
        body += f'<div class="pager">{"".join(pager)}</div>'
        return page("Chats", body, crumbs=[("chats", None)])

    async def _search(self, user: str | None, query: str) -> str:
        if user is None:
            return (
                '<p class="notice">Search looks through one user\'s chats: enter a user to '
                "search.</p>"
            )
        hits = await self.store.search_user_messages(user, query, limit=50)
        rows = [
            [
                f'<a href="{href("/chat", {"id": h.chat_id})}">{text_html(h.chat_id)}</a>',
                f'<a href="{href("/chat", {"id": h.chat_id, "m": h.message.id})}">'
                f"{text_html(h.message.id)}</a>",
                esc(h.message.name),
                f'<span class="snippet">{snippet_html(h.snippet)}</span>',
            ]
            for h in hits
        ]
        out = f"<h2>Search: {len(rows)} match{'es' if len(rows) != 1 else ''}</h2>"
        return out + table(["chat", "message", "role", "snippet"], rows, css="grid search")

    # --- a chat -----------------------------------------------------------------------------

    async def chat_page(self, request: Request) -> str:
        chat = await self.chat(_required(request, "id"))
        opened = [o for o in request.query_params.getlist("open") if o]
        selected = request.query_params.get("m") or None
        graph = await self._outline(chat, opened, selected)
        layout = layout_graph(graph, opened=opened, selected=selected)
        svg = render_svg(layout, chat_id=chat.id, opened=opened, selected=selected)
        closers = ""
        if opened:
            closers = await self._closers(chat, opened, selected)
        snapshots = await self.store.list_snapshots(chat.id)
        records = await self.store.list_resolve_records(chat.id)
        panel = '<p class="muted">Select a message in the graph to see its full content.</p>'
        if selected is not None:
            panel = await self.message_fragment(chat, selected)
        compactions = sum(1 for n in graph.nodes if n.type == "compaction")
        counts = " \u00b7 ".join(
            _count(number, noun)
            for number, noun in (
                (graph.message_count, "message"),
                (len(graph.branches), "branch"),
                (len(graph.checkpoints), "checkpoint"),
                (compactions, "compaction"),
            )
        )
        branch_rows = [
            [
                f'<a href="{href("/branch", {"chat": chat.id, "name": b.name})}">'
                f"{text_html(b.name)}</a>"
                + (' <span class="tag active">active</span>' if b.is_active else ""),
                (
                    f'<a href="{href("/chat", {"id": chat.id, "m": b.head_message_id})}">'
                    f"{text_html(b.head_message_id)}</a>"
                    if b.head_message_id
                    else '<span class="muted">empty</span>'
                ),
                str(b.message_count),
                when(b.created_at),
            ]
            for b in graph.branches
        ]
        point_rows = [
            [
                text_html(p.name),
                f'<a href="{href("/chat", {"id": chat.id, "m": p.message_id})}">'
                f"{text_html(p.message_id)}</a>",
                when(p.created_at),
            ]
            for p in graph.checkpoints
        ]
        body = (
            f"<h1>{text_html(chat.title or chat.id)}</h1>"
            f'<p class="muted">chat <code>{text_html(chat.id)}</code> \u00b7 user '
            f"<code>{text_html(chat.user_id)}</code> \u00b7 {counts} \u00b7 last activity "
            f"{when(chat.updated_at)}</p>"
            f'<p><a href="{href("/snapshots", {"chat": chat.id})}">snapshots ({len(snapshots)})</a>'
            f' \u00b7 <a href="{href("/records", {"chat": chat.id})}">recorded resolves '
            f"({len(records)})</a></p>"
        )
        if chat.metadata:
            body += f"<details><summary>metadata</summary>{json_html(chat.metadata)}</details>"
        body += (
            '<div class="chat-layout">'
            f'<div class="graph-box" data-chat="{esc(chat.id)}">'
            f'<div class="graph-holder">{closers}{svg}</div></div>'
            f'<aside class="panel" id="message-panel">{panel}</aside></div>'
            "<h2>Branches</h2>"
            + table(["branch", "head", "messages", "created"], branch_rows)
            + "<h2>Checkpoints</h2>"
            + (
                table(["checkpoint", "message", "created"], point_rows)
                if point_rows
                else '<p class="muted">none</p>'
            )
        )
        return page(chat.title or chat.id, body, crumbs=self.chat_crumbs(chat))

    async def _outline(self, chat: Chat, opened: list[str], selected: str | None) -> GraphOutline:
        """The chat's graph with long runs folded, read for what the page draws only."""
        valid = [o for o in opened if len(o) <= MAX_ID_LENGTH][:MAX_OPENED]
        keep = [selected] if selected is not None and len(selected) <= MAX_ID_LENGTH else []
        return await self.store.graph_outline(chat.id, fold=DEFAULT_FOLD, keep=keep, opened=valid)

    async def _closers(self, chat: Chat, opened: list[str], selected: str | None) -> str:
        links = []
        for run in opened:
            rest = [("open", o) for o in opened if o != run]
            link = href("/chat", [("id", chat.id), *rest, ("m", selected)])
            links.append(
                f'<a class="unfold" href="{link}" data-close="{esc(run)}">'
                f"fold the run from {text_html(preview_text(run, 24))} again</a>"
            )
        return '<div class="opened">' + " \u00b7 ".join(links) + "</div>"

    async def graph_fragment(self, request: Request) -> str:
        chat = await self.chat(_required(request, "id"))
        opened = [o for o in request.query_params.getlist("open") if o]
        selected = request.query_params.get("m") or None
        graph = await self._outline(chat, opened, selected)
        layout = layout_graph(graph, opened=opened, selected=selected)
        svg = render_svg(layout, chat_id=chat.id, opened=opened, selected=selected)
        closers = await self._closers(chat, opened, selected) if opened else ""
        return closers + svg

    async def message_fragment(self, chat: Chat, message_id: str) -> str:
        record = await self.store.get_message(message_id)
        if record is None or record.chat_id != chat.id:
            return (
                f'<p class="notice">There is no message {text_html(message_id)} in this chat.</p>'
            )
        links = (
            f'<p><a href="{href("/message", {"chat": chat.id, "id": record.id})}">'
            "open on its own page</a></p>"
        )
        return message_panel(record, links=links)

    async def message_page(self, request: Request) -> tuple[str, bool]:
        chat = await self.chat(_required(request, "chat"))
        message_id = _required(request, "id")
        record = await self.store.get_message(message_id)
        if record is None or record.chat_id != chat.id:
            raise _NotFound(f"there is no message {message_id!r} in this chat")
        if request.query_params.get("fragment"):
            return await self.message_fragment(chat, message_id), True
        links = (
            f'<p><a href="{href("/chat", {"id": chat.id, "m": record.id})}">'
            "show in the graph</a></p>"
        )
        body = message_panel(record, links=links)
        crumbs = self.chat_crumbs(chat, (preview_text(record.id, 30), None))
        return page(f"message {record.id}", body, crumbs=crumbs), False

    async def branch_page(self, request: Request) -> str:
        """One page of a branch's transcript, the newest page first.

        Keyset paging: a page is the ``TRANSCRIPT_PAGE`` messages of the chain ending at
        ``end`` (the branch head by default), read by one query that walks up from it, so a
        page costs the same however long the branch is; "older" ends at the parent of the
        page's first message.
        """
        chat = await self.chat(_required(request, "chat"))
        name = _required(request, "name")
        branch = await self.store.get_branch(chat.id, name)
        if branch is None:
            raise _NotFound(f"chat {chat.id!r} has no branch {name!r}")
        end = request.query_params.get("end") or branch.head_message_id
        if end is None:
            chunk = None
        else:
            chunk = await self.store.chain_page(chat.id, end, limit=TRANSCRIPT_PAGE)
            if not chunk.messages:
                raise _NotFound(f"there is no message {end!r} in this chat")
        turns = []
        for record, number in zip(
            chunk.messages if chunk else [], chunk.depths if chunk else [], strict=True
        ):
            css = "compaction" if record.type == "compaction" else esc(record.name)
            link = href("/chat", {"id": chat.id, "m": record.id})
            turns.append(
                f'<div class="turn {css}"><div class="muted">#{number} \u00b7 '
                f'<a href="{link}">in the graph</a></div>{message_panel(record)}</div>'
            )
        base = {"chat": chat.id, "name": name}
        pager = []
        if chunk is not None and end != branch.head_message_id:
            pager.append(f'<a rel="first" href="{href("/branch", base)}">newest</a>')
        if chunk is not None and chunk.messages:
            first, last = chunk.depths[0], chunk.depths[-1]
            pager.append(f"<span>messages {first}\u2013{last}</span>")
            if chunk.older:
                older = {**base, "end": chunk.messages[0].parent_id}
                pager.append(f'<a rel="next" href="{href("/branch", older)}">older</a>')
        active = ' <span class="tag active">active</span>' if branch.is_active else ""
        total = chunk.depths[-1] if chunk and end == branch.head_message_id else None
        summary = (
            f"{_count(total, 'message')}, root first, the newest page first"
            if total is not None
            else "root first"
        )
        body = (
            f"<h1>Branch {text_html(branch.name)}{active}</h1>"
            f'<p class="muted">{summary}</p>'
            f'<div class="pager">{"".join(pager)}</div>'
            + ("".join(turns) or '<p class="muted">This branch is empty.</p>')
            + f'<div class="pager">{"".join(pager)}</div>'
        )
        crumbs = self.chat_crumbs(chat, (f"branch {preview_text(name, 30)}", None))
        return page(f"branch {name}", body, crumbs=crumbs)

    # --- snapshots and records --------------------------------------------------------------

    async def snapshots_page(self, request: Request) -> str:
        chat = await self.chat(_required(request, "chat"))
        snapshots = await self.store.list_snapshots(chat.id)
        parts = []
        for snap in snapshots:
            items = [
                [
                    esc(item.kind.value),
                    text_html(item.path),
                    esc(item.media_type),
                    str(item.size),
                    f"<pre>{text_html(item.preview)}</pre>"
                    if item.preview is not None
                    else '<span class="muted">no preview</span>',
                ]
                for item in snap.items
            ]
            at = (
                f'<a href="{href("/chat", {"id": chat.id, "m": snap.message_id})}">'
                f"{text_html(snap.message_id)}</a>"
                if snap.message_id
                else "no message"
            )
            parts.append(
                f'<section class="snapshot"><h2>Snapshot {text_html(snap.id or "")}</h2>'
                f'<p class="muted">{when(snap.created_at)} \u00b7 at {at} \u00b7 selection '
                f"{esc(snap.selection.value)} \u00b7 {len(snap.items)} items</p>"
                + (f"<pre>{text_html(snap.summary)}</pre>" if snap.summary else "")
                + table(["kind", "path", "media type", "bytes", "preview"], items)
                + "</section>"
            )
        body = "<h1>Snapshots</h1>" + (
            "".join(parts) or '<p class="muted">This chat has no snapshots.</p>'
        )
        return page("snapshots", body, crumbs=self.chat_crumbs(chat, ("snapshots", None)))

    async def records_page(self, request: Request) -> str:
        chat = await self.chat(_required(request, "chat"))
        records = await self.store.list_resolve_records(chat.id)
        rows = [
            [
                f'<a href="{href("/record", {"chat": chat.id, "id": r.id})}">{text_html(r.id)}</a>',
                when(r.created_at),
                text_html(r.branch_name or ""),
                text_html(r.head_message_id or ""),
                esc(r.renderer),
                str(len(r.message_ids)),
            ]
            for r in records
        ]
        body = "<h1>Recorded resolves</h1>" + (
            table(["record", "created", "branch", "head", "renderer", "messages"], rows)
            if rows
            else '<p class="muted">No resolve was recorded for this chat '
            "(call resolve(record=True)).</p>"
        )
        return page("records", body, crumbs=self.chat_crumbs(chat, ("recorded resolves", None)))

    async def _record_content(self, record: ResolveRecord) -> tuple[str, list[Message | None]]:
        prompt_bytes = await self.store.read_blob(record.prompt_blob, chat_id=record.chat_id)
        prompt = "" if prompt_bytes is None else prompt_bytes.decode("utf-8", "replace")
        messages: list[Message | None] = []
        for blob in record.message_blobs:
            data = await self.store.read_blob(blob, chat_id=record.chat_id)
            try:
                messages.append(None if data is None else Message.model_validate_json(data))
            except ValidationError:
                messages.append(None)
        return prompt, messages

    @staticmethod
    def _as_lines(prompt: str, messages: list[Message | None]) -> list[str]:
        lines = ["=== system prompt ===", *prompt.splitlines()]
        for index, message in enumerate(messages):
            if message is None:
                lines.append(f"=== message {index + 1}: unreadable ===")
                continue
            lines.append(f"=== message {index + 1}: {message.role} {message.id} ===")
            for part in message.parts:
                if isinstance(part, TextPart | ReasoningPart):
                    lines.extend(f"{part.type}: {line}" for line in part.text.splitlines())
                else:
                    dumped = json.dumps(part.model_dump(mode="json"), ensure_ascii=False)
                    lines.append(f"{part.type}: {dumped}")
        return lines

    async def record_page(self, request: Request) -> str:
        chat = await self.chat(_required(request, "chat"))
        record_id = _required(request, "id")
        record = await self.store.get_resolve_record(record_id)
        if record is None or record.chat_id != chat.id:
            raise _NotFound(f"chat {chat.id!r} has no resolve record {record_id!r}")
        prompt, messages = await self._record_content(record)
        records = await self.store.list_resolve_records(chat.id)
        ids = [r.id for r in records]
        previous = (
            records[ids.index(record.id) + 1] if ids.index(record.id) + 1 < len(ids) else None
        )
        sent = []
        for index, message in enumerate(messages):
            if message is None:
                sent.append(
                    f'<div class="turn"><p class="notice">message {index + 1} is missing '
                    "or unreadable</p></div>"
                )
                continue
            sent.append(
                f'<div class="turn {esc(message.role)}"><div><span class="role '
                f'{esc(message.role)}">{esc(message.role)}</span> '
                f"<code>{text_html(message.id)}</code></div>{message_body(message)}</div>"
            )
        if previous is None:
            diff = '<p class="muted">This is the first recorded resolve of the chat.</p>'
        else:
            old_prompt, old_messages = await self._record_content(previous)
            diff_lines = list(
                difflib.unified_diff(
                    self._as_lines(old_prompt, old_messages),
                    self._as_lines(prompt, messages),
                    fromfile=f"record {previous.id}",
                    tofile=f"record {record.id}",
                    lineterm="",
                    n=2,
                )
            )
            spans = []
            for line in diff_lines:
                css = "ctx"
                if line.startswith("@@"):
                    css = "hunk"
                elif line.startswith("+"):
                    css = "add"
                elif line.startswith("-"):
                    css = "del"
                spans.append(f'<span class="{css}">{text_html(line) or " "}</span>')
            link = href("/record", {"chat": chat.id, "id": previous.id})
            diff = (
                f'<p>Against the previous record <a href="{link}">{text_html(previous.id)}</a>'
                f" ({when(previous.created_at)}):</p>"
                + (
                    f'<pre class="diff">{"".join(spans)}</pre>'
                    if spans
                    else '<p class="muted">Nothing changed.</p>'
                )
            )
        body = (
            f"<h1>Recorded resolve {text_html(record.id)}</h1>"
            f'<p class="muted">{when(record.created_at)} \u00b7 branch '
            f"{text_html(record.branch_name or '')} \u00b7 head "
            f"{text_html(record.head_message_id or '')} \u00b7 renderer {esc(record.renderer)}</p>"
            f"<h2>Changes</h2>{diff}"
            f'<h2>System prompt</h2><pre class="prompt">{text_html(prompt)}</pre>'
            f"<h2>Messages sent ({len(messages)})</h2>{''.join(sent)}"
        )
        crumbs = self.chat_crumbs(
            chat,
            ("recorded resolves", href("/records", {"chat": chat.id})),
            (preview_text(record.id, 30), None),
        )
        return page(f"record {record.id}", body, crumbs=crumbs)


def _static(name: str) -> bytes:
    return resources.files("agentcontext.web").joinpath("static", name).read_bytes()


def create_app(
    store: ContextStore | str,
    *,
    user: str | None = None,
    allowed_hosts: Collection[str] = (),
) -> Starlette:
    """The viewer as a Starlette application.

    Every response, error pages included, carries the security headers (`CSP`, no framing,
    no sniffing, no referrer, no caching). A request whose ``Host`` header is not a loopback
    name (``localhost``, ``127.x.x.x``, ``::1``) nor one of ``allowed_hosts`` is answered
    421 without reaching the pages: a page on a DNS-rebinding domain that resolves to this
    machine cannot read the chats. A row the store cannot read shows as damaged (on the chat
    list, the others still list; on its own page, a 500 page saying what is wrong).

    Args:
        store: A store to read (opened and closed by the caller, on the server's event loop)
            or a database URL (the app opens it on startup, without migrating, and closes it).
        user: Show only this user's chats; every other chat answers 404.
        allowed_hosts: More host names to answer (the name or address the server listens
            on, when that is not a loopback one).

    Returns:
        The ASGI application (serve it with uvicorn).

    Raises:
        ContextError: Starlette is not installed (install the ``web`` extra).
    """
    try:
        from starlette.applications import Starlette
        from starlette.responses import HTMLResponse, Response
        from starlette.routing import Route
    except ImportError:  # pragma: no cover - depends on the environment
        raise MissingExtraError(
            "the web viewer needs Starlette and uvicorn, which are not installed: "
            "pip install 'agentcontext[web]'",
            name="starlette",
        ) from None

    viewer = _Viewer(store if isinstance(store, ContextStore) else None, user)

    def handle(
        render: Callable[[Request], Awaitable[str]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                return HTMLResponse(await render(request))
            except (_NotFound, NotFoundError) as exc:
                return _error(404, "Not found", exc)
            except _BadRequest as exc:
                return _error(400, "Bad request", exc)
            except _UNREADABLE as exc:  # the database is unreachable, closed or outdated
                return _error(503, "The database cannot be read", exc)
            except (StoreError, ValueError) as exc:  # a row the store cannot decode
                if isinstance(exc, InvalidInputError):
                    return _error(400, "Bad request", exc)
                return _error(500, "Damaged data", exc)
            except ContextError as exc:
                return _error(400, "Error", exc)
            except Exception as exc:  # anything else: still a page, with its headers
                return _error(500, "Unexpected error", exc)

        return endpoint

    def _error(status: int, title: str, exc: Exception) -> Response:
        body = f"<h1>{esc(title)}</h1><p>{text_html(str(exc))}</p>"
        return HTMLResponse(page(title.lower(), body), status)

    async def message(request: Request) -> str:
        html, _ = await viewer.message_page(request)
        return html

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        types = {
            "viewer.js": "text/javascript; charset=utf-8",
            "viewer.css": "text/css; charset=utf-8",
        }
        if name not in types:
            return Response("not found", 404, media_type="text/plain")
        return Response(_static(name), media_type=types[name])

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if isinstance(store, str):
            from agentcontext.store import SqlContextStore

            opened = SqlContextStore(store, migrate=False)
            await opened.initialize()
            viewer.store_or_none = opened
            try:
                yield
            finally:
                viewer.store_or_none = None
                await opened.close()
        else:
            yield

    methods = ["GET", "HEAD"]
    routes = [
        Route("/", handle(viewer.chats), methods=methods),
        Route("/chat", handle(viewer.chat_page), methods=methods),
        Route("/graph", handle(viewer.graph_fragment), methods=methods),
        Route("/message", handle(message), methods=methods),
        Route("/branch", handle(viewer.branch_page), methods=methods),
        Route("/snapshots", handle(viewer.snapshots_page), methods=methods),
        Route("/records", handle(viewer.records_page), methods=methods),
        Route("/record", handle(viewer.record_page), methods=methods),
        Route("/static/{name}", static, methods=methods),
    ]
    hosts = frozenset(_host_name(host) for host in allowed_hosts if host)

    class _GuardedStarlette(Starlette):
        """Starlette with the host check and the headers outermost: even the 500 page of an
        unexpected error passes through them."""

        async def __call__(
            self,
            scope: MutableMapping[str, Any],
            receive: Callable[[], Awaitable[Any]],
            send: Callable[[Any], Awaitable[None]],
        ) -> None:
            await _secure(super().__call__, hosts)(scope, receive, send)

    return _GuardedStarlette(routes=routes, lifespan=lifespan)
