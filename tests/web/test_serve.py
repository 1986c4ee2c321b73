"""``agentcontext serve``: the command, its defaults and ``--user``."""

from __future__ import annotations

import asyncio
import http.client
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from agentcontext.cli import main
from agentcontext.cli._serve import DEFAULT_HOST, is_loopback
from agentcontext.web import CSP
from tests.cli.helpers import clean_env, run_cli, sqlite_url
from tests.web.conftest import _free_port
from tests.web.seed import CHAT, SECRET, USER, seed


def test_loopback_is_the_default() -> None:
    assert DEFAULT_HOST == "127.0.0.1"
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2")
    assert not is_loopback("example.org")


def test_help_lists_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    for option in ("--host", "--port", "--user", "--url", "127.0.0.1"):
        assert option in out
    assert main(["serve", "--port", "70000"]) == 2


def test_a_missing_database_is_not_created(tmp_path: Path) -> None:
    result = run_cli("--url", sqlite_url(tmp_path / "none.db"), "serve", cwd=tmp_path)
    assert result.returncode == 4
    assert "migrate upgrade" in result.stderr
    assert not (tmp_path / "none.db").exists()


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return (
                response.status,
                response.headers["content-security-policy"],
                response.read().decode(),
            )
    except urllib.error.HTTPError as error:
        return error.code, error.headers["content-security-policy"], error.read().decode()


def test_serve_shows_only_the_given_users_chats(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "chats.db")
    asyncio.run(seed(url))
    port = _free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentcontext",
            "--url",
            url,
            "serve",
            "--port",
            str(port),
            "--user",
            USER,
        ],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                status, csp, body = _get(base + "/")
                break
            except (urllib.error.URLError, ConnectionError):
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"serve did not start: {process.communicate()}")
                time.sleep(0.2)
        assert status == 200 and csp == CSP
        assert CHAT in body and SECRET not in body
        assert _get(base + f"/chat?id={SECRET}")[0] == 404
        assert _get(base + f"/chat?id={CHAT}")[0] == 200
        # DNS rebinding: a page on another domain that resolves to 127.0.0.1 gets nothing.
        for host in ("rebind.attacker.example", f"rebind.attacker.example:{port}", "0.0.0.0"):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            connection.request("GET", f"/chat?id={CHAT}", headers={"Host": host})
            refused = connection.getresponse()
            text = refused.read().decode()
            connection.close()
            assert refused.status == 421, host
            assert refused.headers["content-security-policy"] == CSP
            assert CHAT not in text and "Host not allowed" in text
        assert _get(f"http://localhost:{port}/")[0] == 200
    finally:
        process.terminate()
        out, err = process.communicate(timeout=30)
    assert f"http://127.0.0.1:{port}/" in out
    assert "warning" not in err


def test_importing_the_library_loads_no_web_stack() -> None:
    code = (
        "import sys, agentcontext, agentcontext.cli, agentcontext.web; "
        "print(sorted(m for m in ('starlette', 'uvicorn', 'selenium') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
