"""The viewer reads a page's worth: a branch pages by keyset, the chat page by its outline."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from starlette.testclient import TestClient

from agentcontext.store import SqlContextStore
from agentcontext.web import create_app
from agentcontext.web._app import TRANSCRIPT_PAGE
from tests.cli.helpers import sqlite_url
from tests.helpers import chain

COUNT = 2 * TRANSCRIPT_PAGE + 37


async def _long_chat(url: str) -> list[str]:
    async with SqlContextStore(url) as store:
        await store.create_chat("long", user_id="u", title="long")
        main = await store.get_active_branch("long")
        assert main is not None
        records = chain("long", COUNT, prefix="p")
        await store.append_messages(main.id, records, expected_head=None)
        await store.fork_branch("long", "main", head_message_id=records[10].id, activate=False)
        return [record.id for record in records]


def test_a_branch_pages_from_the_newest_to_the_root(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "long.db")
    ids = asyncio.run(_long_chat(url))
    seen: list[str] = []
    numbers: list[int] = []
    with TestClient(create_app(url), base_url="http://localhost") as client:
        link = "/branch?chat=long&name=main"
        first = True
        while link:
            page = client.get(link)
            assert page.status_code == 200
            if first:
                assert f"{COUNT} messages, root first" in page.text
                first = False
            found = re.findall(r'<section class="message" data-id="([^"]+)"', page.text)
            seen[:0] = found
            numbers[:0] = [int(n) for n in re.findall(r"#(\d+) \u00b7", page.text)]
            older = re.search(r'<a rel="next" href="([^"]+)">older</a>', page.text)
            link = older.group(1).replace("&amp;", "&") if older else ""
        assert seen == ids
        assert numbers == list(range(1, COUNT + 1))
        missing = client.get("/branch?chat=long&name=main&end=nope")
        assert missing.status_code == 404


def test_the_chat_page_folds_what_the_store_folded(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "long.db")
    ids = asyncio.run(_long_chat(url))
    with TestClient(create_app(url), base_url="http://localhost") as client:
        page = client.get("/chat?id=long").text
        assert f"{COUNT} messages" in page
        folds = re.findall(r"\u22ef (\d+) messages folded", page)
        assert sorted(int(n) for n in folds) == [9, COUNT - 12]  # 1-9, 11 to the head
        opened = client.get(f"/chat?id=long&open={ids[1]}").text
        assert len(re.findall(r"\u22ef (\d+) messages folded", opened)) == 1
        assert f'data-id="{ids[5]}"' in opened
