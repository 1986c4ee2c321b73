"""The viewer answers only its own host names, and every response carries its headers."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from agentcontext.web import CSP, create_app
from agentcontext.web._app import host_allowed
from tests.cli.helpers import sqlite_url
from tests.web.seed import CHAT, USER, seed


@pytest.mark.parametrize(
    "host",
    ["localhost", "localhost:8000", "127.0.0.1:8000", "127.8.9.10", "[::1]:8000", "LOCALHOST."],
)
def test_loopback_names_are_allowed(host: str) -> None:
    assert host_allowed(host, frozenset())


@pytest.mark.parametrize(
    "host",
    [
        None,
        "",
        "attacker.example",
        "127.0.0.1.attacker.example",
        "localhost.attacker.example",
        "10.0.0.1",
        "[::2]:80",
        "0.0.0.0",
    ],
)
def test_other_names_are_refused(host: str | None) -> None:
    assert not host_allowed(host, frozenset())


def test_a_name_given_to_serve_is_allowed() -> None:
    assert host_allowed("viewer.lan:8000", frozenset({"viewer.lan"}))
    assert not host_allowed("other.lan:8000", frozenset({"viewer.lan"}))


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = sqlite_url(tmp_path / "viewer.db")
    asyncio.run(seed(url))
    return url


def test_a_rebinding_request_gets_421_with_the_security_headers(url: str) -> None:
    with TestClient(create_app(url), base_url="http://attacker.example") as client:
        response = client.get(f"/chat?id={CHAT}")
        assert response.status_code == 421
        assert response.headers["content-security-policy"] == CSP
        assert response.headers["x-frame-options"] == "DENY"
        assert CHAT not in response.text
    with TestClient(
        create_app(url, allowed_hosts=["viewer.lan"]), base_url="http://viewer.lan"
    ) as c:
        assert c.get(f"/chat?id={CHAT}").status_code == 200


def _damage_chat(path: Path, chat_id: str) -> None:
    with sqlite3.connect(path) as db:
        db.execute("UPDATE chats SET metadata = ? WHERE id = ?", ("{not json", chat_id))


def test_a_damaged_chat_row_is_shown_as_such_and_the_others_still_list(
    url: str, tmp_path: Path
) -> None:
    _damage_chat(tmp_path / "viewer.db", CHAT)
    with TestClient(
        create_app(url), base_url="http://localhost", raise_server_exceptions=False
    ) as client:
        listing = client.get("/")
        assert listing.status_code == 200
        assert listing.headers["content-security-policy"] == CSP
        assert "damaged row" in listing.text
        assert listing.text.count('href="/chat?id=') >= 1  # the other chats are listed
        page = client.get(f"/chat?id={CHAT}")
        assert page.status_code == 500
        assert page.headers["content-security-policy"] == CSP
        assert "Damaged data" in page.text
        user_page = client.get(f"/?user={USER}")
        assert user_page.status_code == 200 and "damaged row" in user_page.text
