"""Web viewer benchmark: what one page costs on a small chat and on a very long one.

    python benchmarks/bench_web.py [--pg-url postgresql+asyncpg://postgres@127.0.0.1/postgres]
                                   [--skip-postgres] [--runs 7] [--sizes 1000,100000]
                                   [--branches 50]

For each backend (an SQLite file, and a scratch PostgreSQL database created and dropped here)
and each size it writes one chat of that many messages (about 400 characters each) with
``--branches`` branches: the active one is the longest chain, the others fork from it at
spread-out points and carry their own messages, and five checkpoints sit on the main chain.
Then, through the viewer's ASGI app in this process (routing, the host check, the security
headers, the store reads, the layout, the HTML; no socket), it measures per request:

- **chat page** ``GET /chat?id=...`` (the graph, folded: the store keeps the chat's runs
  between pages, found once per chat version);
- **chat page, runs found** the same page on a store opened with ``cache_bytes=0``, which keeps
  nothing between pages: the cost of the first page after any change to the chat (every
  message's id, parent and type read and walked);
- **graph** ``GET /graph?id=...`` (the SVG alone, what the page's script reloads);
- **branch, newest page** ``GET /branch?chat=...&name=main`` (200 messages, keyset paging);
- **branch, an old page** ``GET /branch?...&end=<a message in the first tenth>``;

as the median time of ``--runs`` runs after a warm-up, and the peak of memory allocated
during one request (``tracemalloc``, in a separate pass so it does not slow the timings).

Target: a page of the 100 000-message chat costs about what it costs on the 1 000-message
one (the last column is the ratio, large chat over small).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tempfile
import tracemalloc
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import conversation, median_time, message_data, ms, ratio

from agentcontext.store import MessageRecord, SqlContextStore
from agentcontext.web import create_app

DEFAULT_PG = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
CHAT = "bench-web"
USER = "bench"


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
        at = (number + 1) * len(main_ids) // 6
        await store.create_checkpoint(CHAT, f"point-{number}", main_ids[at])
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


async def peak_memory(fn: Callable[[], Awaitable[Any]]) -> int:
    """Peak bytes allocated while ``fn`` runs (after a warm-up call)."""
    await fn()
    gc.collect()
    tracemalloc.start()
    try:
        await fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak


async def measure(url: str, size: int, args: argparse.Namespace) -> dict[str, tuple[float, int]]:
    """Time and peak memory of each page on a chat of ``size`` messages."""
    async with SqlContextStore(url) as store:
        main_len = await build_chat(store, size, args.branches)
        main = await store.get_branch(CHAT, "main")
        assert main is not None
        assert main.head_message_id is not None
        # A message in the first tenth of the main chain, reached page by page as a reader
        # clicking "older" would.
        end, remaining = main.head_message_id, main_len - main_len // 10
        while remaining > 0:
            chunk = await store.chain_page(CHAT, end, limit=min(remaining, 5_000))
            end = chunk.messages[0].id
            remaining -= len(chunk.messages)
        old_end = end
        app = create_app(store)
        pages = {
            "chat page": ("/chat", f"id={CHAT}"),
            "graph": ("/graph", f"id={CHAT}"),
            "branch, newest page": ("/branch", f"chat={CHAT}&name=main"),
            "branch, an old page": ("/branch", f"chat={CHAT}&name=main&end={old_end}"),
        }
        out: dict[str, tuple[float, int]] = {}
        async with SqlContextStore(url, cache_bytes=0) as forgetful:
            apps = dict.fromkeys(pages, app)
            pages["chat page, runs found"] = pages["chat page"]
            apps["chat page, runs found"] = create_app(forgetful)
            for label, (path, query) in pages.items():

                async def get(path: str = path, query: str = query, app: Any = apps[label]) -> None:
                    status, _ = await asgi_get(app, path, query)
                    assert status == 200, (path, status)

                out[label] = (await median_time(get, args.runs), await peak_memory(get))
    return out


async def bench_backend(name: str, url_of: Callable[[int], Any], args: argparse.Namespace) -> None:
    sizes = [int(size) for size in args.sizes.split(",")]
    results: dict[int, dict[str, tuple[float, int]]] = {}
    for size in sizes:
        async with url_of(size) as url:
            results[size] = await measure(url, size, args)
    small, large = sizes[0], sizes[-1]
    print(f"{name}: {small:,} vs {large:,} messages ({args.branches} branches)")
    print(
        f"  {'page':<22}{'time ' + f'{small:,}':>12}{'time ' + f'{large:,}':>14}"
        f"{'memory ' + f'{small:,}':>16}{'memory ' + f'{large:,}':>18}{'ratio (time)':>14}"
    )
    for label in results[small]:
        t0, m0 = results[small][label]
        t1, m1 = results[large][label]
        print(
            f"  {label:<22}{ms(t0):>12}{ms(t1):>14}{m0 / 2**20:>14.1f} MB{m1 / 2**20:>16.1f} MB"
            f"{ratio(t1, t0):>14}"
        )


@asynccontextmanager
async def sqlite_url(size: int) -> AsyncIterator[str]:
    with tempfile.TemporaryDirectory() as tmp:
        yield f"sqlite+aiosqlite:///{Path(tmp) / f'web-{size}.db'}"


def postgres_url(admin_url: str) -> Callable[[int], Any]:
    @asynccontextmanager
    async def scratch(size: int) -> AsyncIterator[str]:
        admin = make_url(admin_url)
        dsn = admin.set(drivername="postgresql").render_as_string(hide_password=False)
        db = f"acbench_{uuid.uuid4().hex[:8]}"
        conn = await asyncpg.connect(dsn)
        await conn.execute(f'CREATE DATABASE "{db}"')
        try:
            yield admin.set(database=db).render_as_string(hide_password=False)
        finally:
            await conn.execute(f'DROP DATABASE "{db}" WITH (FORCE)')
            await conn.close()

    return scratch


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="admin URL to create a scratch DB")
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument("--sizes", default="1000,100000", help="chat sizes, small first")
    parser.add_argument("--branches", type=int, default=50)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    await bench_backend("sqlite", sqlite_url, args)
    if not args.skip_postgres:
        await bench_backend("postgresql", postgres_url(args.pg_url), args)


if __name__ == "__main__":
    asyncio.run(main())
