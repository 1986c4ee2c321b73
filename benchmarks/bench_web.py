"""Web viewer benchmark: the chat page of a big chat against a fresh engine's resolve.

    python benchmarks/bench_web.py [--pg-url postgresql+asyncpg://postgres@127.0.0.1/postgres]
                                   [--skip-postgres] [--runs 9] [--messages 10000]
                                   [--branches 50]

For each backend (an SQLite file, and a scratch PostgreSQL database created and dropped here)
it writes one chat of ``--messages`` messages (about 400 characters each) with ``--branches``
branches: the active one is the longest chain, the others fork from it at spread-out points
and carry their own messages. Then it times, as medians of ``--runs`` runs after a warm-up:

- **chat page**: ``GET /chat?id=...`` answered by the viewer's ASGI app in this process (the
  request goes through routing, the security middleware, the store reads, the server-side
  tree layout and the SVG and HTML rendering; no socket);
- **fresh resolve**: ``ContextEngine(store=..., chat_id=..., user_id=...).resolve()`` on a new
  engine, which loads and decodes the active branch.

Target: chat page / fresh resolve <= 3.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import conversation, median_time, message_data, ms, ratio

from agentcontext import ContextEngine
from agentcontext.store import MessageRecord, SqlContextStore
from agentcontext.web import create_app

DEFAULT_PG = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
CHAT = "bench-web"
USER = "bench"
TARGET = 3.0


async def build_chat(store: SqlContextStore, messages: int, branches: int) -> int:
    """The chat: a main chain and ``branches - 1`` side branches; returns the main length."""
    texts = conversation(messages, seed=7)
    side = branches - 1
    per_side = max(2, messages // (branches * 5)) if side else 0
    main_len = messages - side * per_side
    await store.create_chat(CHAT, user_id=USER, title="a long support chat")
    records: list[MessageRecord] = []
    main_ids: list[str] = []
    parent: str | None = None
    for index in range(main_len):
        mid, role, body = texts[index]
        records.append(
            MessageRecord(
                id=mid,
                chat_id=CHAT,
                parent_id=parent,
                name=role,
                data=message_data(mid, role, body),
            )
        )
        main_ids.append(mid)
        parent = mid
    heads: list[str] = []
    at = main_len
    for branch in range(side):
        fork = (branch + 1) * main_len // (side + 1) - 1
        parent = main_ids[fork]
        for step in range(per_side):
            mid, _role, body = texts[at]
            role = "user" if (fork + 1 + step) % 2 == 0 else "assistant"
            records.append(
                MessageRecord(
                    id=mid,
                    chat_id=CHAT,
                    parent_id=parent,
                    name=role,
                    data=message_data(mid, role, body),
                )
            )
            parent = mid
            at += 1
        heads.append(parent)
    for start in range(0, len(records), 1000):
        await store.add_messages(records[start : start + 1000])
    main = await store.get_active_branch(CHAT)
    assert main is not None
    assert await store.update_branch_head(main.id, main_ids[-1], None)
    for number, head in enumerate(heads):
        await store.create_branch(CHAT, f"side-{number + 1}", head_message_id=head)
    for number in range(5):
        await store.create_checkpoint(CHAT, f"point-{number}", main_ids[(number + 1) * 1500])
    return main_len


async def asgi_get(app: Any, path: str, query: str) -> tuple[int, int]:
    """One GET through the ASGI app; returns the status and the body size."""
    status = 0
    size = 0
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, size
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            size += len(message.get("body", b""))

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    await app(scope, receive, send)
    return status, size


async def bench_backend(name: str, url: str, args: argparse.Namespace) -> tuple[float, float]:
    async with SqlContextStore(url) as store:
        main_len = await build_chat(store, args.messages, args.branches)
        graph = await store.get_graph(CHAT)
        app = create_app(store)
        status, size = await asgi_get(app, "/chat", f"id={CHAT}")
        assert status == 200, status

        async def page() -> None:
            got, _ = await asgi_get(app, "/chat", f"id={CHAT}")
            assert got == 200

        async def resolve() -> None:
            result = await ContextEngine(store=store, chat_id=CHAT, user_id=USER).resolve()
            assert len(result.messages) == main_len

        page_time = await median_time(page, args.runs)
        resolve_time = await median_time(resolve, args.runs)
    print(
        f"{name}: {len(graph.nodes)} messages, {len(graph.branches)} branches, active chain "
        f"{main_len}; page {size / 1024:,.0f} KiB"
    )
    print(f"  chat page      {ms(page_time)}")
    print(f"  fresh resolve  {ms(resolve_time)}")
    verdict = "ok" if page_time <= TARGET * resolve_time else "OVER TARGET"
    print(f"  ratio          {ratio(page_time, resolve_time)} (target <= {TARGET:g}x: {verdict})")
    return page_time, resolve_time


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="admin URL to create a scratch DB")
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--branches", type=int, default=50)
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        await bench_backend("sqlite", f"sqlite+aiosqlite:///{Path(tmp) / 'web.db'}", args)
    if not args.skip_postgres:
        admin = make_url(args.pg_url)
        dsn = admin.set(drivername="postgresql").render_as_string(hide_password=False)
        db = f"acbench_{uuid.uuid4().hex[:8]}"
        conn = await asyncpg.connect(dsn)
        await conn.execute(f'CREATE DATABASE "{db}"')
        try:
            url = admin.set(database=db).render_as_string(hide_password=False)
            await bench_backend("postgresql", url, args)
        finally:
            await conn.execute(f'DROP DATABASE "{db}" WITH (FORCE)')
            await conn.close()


if __name__ == "__main__":
    asyncio.run(main())
