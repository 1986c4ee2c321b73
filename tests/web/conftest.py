"""The viewer served by uvicorn on a free loopback port, and headless Chromium to drive it.

Chromium and chromedriver come from Debian (``apt-get install chromium chromium-driver``);
nothing is downloaded at run time. Without them the browser tests are skipped, except under
``CI=true``: then they fail.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IN_CI
from tests.web.seed import seed

CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def _chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def require_browser() -> tuple[str, str]:
    """The Chromium binary and chromedriver, or a skip (a failure under CI=true)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        reason = "selenium is not installed (pip install selenium)"
    else:
        binary = _chromium()
        if binary is None:
            reason = "Chromium is not installed (Debian packages chromium, chromium-driver)"
        elif not os.path.exists(CHROMEDRIVER):
            reason = f"chromedriver is not at {CHROMEDRIVER} (Debian package chromium-driver)"
        else:
            return binary, CHROMEDRIVER
    if IN_CI:
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    """A running viewer."""

    base: str
    ids: dict[str, str]

    def url(self, path: str) -> str:
        return self.base + path


@pytest.fixture
def serve_viewer() -> Iterator[Any]:
    """Start viewers (uvicorn in a thread each); stopped at the end of the test."""
    import uvicorn

    from agentcontext.web import create_app

    servers: list[tuple[Any, threading.Thread]] = []

    def start(url: str, *, user: str | None = None) -> str:
        port = _free_port()
        config = uvicorn.Config(
            create_app(url, user=user), host="127.0.0.1", port=port, log_level="warning"
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                pytest.fail("the viewer did not start")
            time.sleep(0.05)
        servers.append((server, thread))
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture
def seeded(store_url: str) -> tuple[str, dict[str, str]]:
    """The test chats written to a fresh database of the backend under test."""
    ids = asyncio.run(seed(store_url))
    return store_url, ids


@pytest.fixture
def viewer(seeded: tuple[str, dict[str, str]], serve_viewer: Any) -> Server:
    url, ids = seeded
    return Server(base=serve_viewer(url), ids=ids)


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """One headless Chromium for the session (the system chromedriver, no downloads)."""
    binary, driver_path = require_browser()
    os.environ.setdefault("SE_OFFLINE", "true")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(120)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where a test keeps its screenshots (kept as CI artefacts under the test's tmp path)."""
    path = tmp_path / "screenshots"
    path.mkdir()
    return path
