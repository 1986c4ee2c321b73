"""The viewer driven in headless Chromium, on SQLite and PostgreSQL."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.web.conftest import Server
from tests.web.seed import CHAT, HOSTILE, HOSTILE_TEXTS, LONG_RUN, OTHER, SECRET, USER

pytestmark = pytest.mark.usefixtures("browser")


def _wait(driver: Any, css: str) -> Any:
    from selenium.webdriver.support.wait import WebDriverWait

    return WebDriverWait(driver, 30).until(lambda d: d.find_element("css selector", css))


def _wait_gone(driver: Any, css: str) -> None:
    from selenium.webdriver.support.wait import WebDriverWait

    WebDriverWait(driver, 30).until(lambda d: d.find_elements("css selector", css) == [])


def _console_errors(driver: Any) -> list[dict[str, Any]]:
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def _open(driver: Any, url: str, shot: Path | None = None) -> None:
    driver.get_log("browser")  # drop what earlier pages logged
    driver.get(url)
    driver.find_element("css selector", "main")
    if shot is not None:
        driver.save_screenshot(str(shot))
    errors = _console_errors(driver)
    assert errors == [], f"console errors on {url}: {errors}"


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def _pwned(driver: Any) -> Any:
    return driver.execute_script("return window.__pwned === undefined ? null : window.__pwned;")


def test_every_page_loads_without_console_errors(browser: Any, viewer: Server, shots: Path) -> None:
    d = browser
    _open(d, viewer.url("/"), shots / "chats.png")
    assert CHAT in d.find_element("css selector", "table.grid").text

    _open(d, viewer.url(f"/?user={USER}&q=address"), shots / "search.png")
    marks = d.find_elements("css selector", "table.search mark")
    assert marks and all(m.text.lower() == "address" for m in marks)

    _open(d, viewer.url(f"/chat?id={CHAT}"), shots / "chat.png")
    _open(d, viewer.url(f"/chat?id={CHAT}&m=m-u1"), shots / "chat-selected.png")
    _open(d, viewer.url(f"/message?chat={CHAT}&id=m-a1"), shots / "message.png")
    tool = d.find_element("css selector", ".part-tool").text
    assert "update_address" in tool and "Lyon" in tool
    assert d.find_element("css selector", ".part-reasoning summary").text.endswith("characters")

    _open(d, viewer.url(f"/branch?chat={CHAT}&name=main"), shots / "branch.png")
    turns = d.find_elements("css selector", ".turn")
    assert len(turns) == 4 + 2 * LONG_RUN

    _open(d, viewer.url(f"/snapshots?chat={CHAT}"), shots / "snapshots.png")
    assert "src/app.py" in d.find_element("css selector", "section.snapshot").text

    _open(d, viewer.url(f"/records?chat={CHAT}"), shots / "records.png")
    links = d.find_elements("css selector", "main table a")
    assert len(links) == 3
    links[0].click()  # the newest record: a diff against the one before
    d.find_element("css selector", "pre.prompt")
    added = [s.text for s in d.find_elements("css selector", "pre.diff span.add")]
    assert any("Question 0" in line for line in added)
    assert not [s for s in d.find_elements("css selector", "pre.diff span.del") if "Ada" in s.text]
    d.save_screenshot(str(shots / "record.png"))
    assert _console_errors(d) == []
    assert sorted(p.name for p in shots.iterdir()) == sorted(
        [
            "chats.png",
            "search.png",
            "chat.png",
            "chat-selected.png",
            "message.png",
            "branch.png",
            "snapshots.png",
            "records.png",
            "record.png",
        ]
    )


def test_graph_shows_branches_checkpoints_compactions_and_folds(
    browser: Any, viewer: Server
) -> None:
    d = browser
    _open(d, viewer.url(f"/chat?id={CHAT}"))
    badges = {
        b.get_attribute("data-branch"): "active" in (b.get_attribute("class") or "")
        for b in d.find_elements("css selector", "svg.graph .badge")
    }
    assert badges == {"main": True, "refund": False}
    assert "address-changed" in d.find_element("css selector", "svg.graph .checkpoint").text
    compaction = d.find_element("css selector", "svg.graph a.compaction")
    assert compaction.get_attribute("data-id") == "c-1"
    assert "compaction" in compaction.text
    folds = d.find_elements("css selector", "svg.graph a.fold")
    assert len(folds) == 1
    # run-u0 .. run-a10 fold; run-a11 is main's head and stays visible.
    assert f"{2 * LONG_RUN - 1} messages folded" in folds[0].text
    drawn = {
        a.get_attribute("data-id") for a in d.find_elements("css selector", "svg.graph a[data-id]")
    }
    assert {"m-u0", "m-a0", "m-u1", "m-a1", "r-u0", "r-a0", f"run-a{LONG_RUN - 1}", "c-1"} <= drawn
    assert "run-u3" not in drawn
    # The active path is drawn as such; the side branch is not.
    active = {
        a.get_attribute("data-id")
        for a in d.find_elements("css selector", "svg.graph a.msg.active")
    }
    assert "m-a1" in active and "r-u0" not in active


def test_folding_and_selection_work_without_reload(browser: Any, viewer: Server) -> None:
    d = browser
    _open(d, viewer.url(f"/chat?id={CHAT}"))
    d.execute_script("window.__samePage = true;")
    d.find_element("css selector", "svg.graph a.fold").click()
    node = _wait(d, 'svg.graph a[data-id="run-u3"]')
    assert d.find_elements("css selector", "svg.graph a.fold") == []
    assert "open=run-u0" in d.current_url
    # Select a message of the opened run: its content shows in the panel.
    node.click()
    panel = _wait(d, '#message-panel section.message[data-id="run-u3"]')
    assert "Question 3" in panel.text
    assert "selected" in (node.get_attribute("class") or "")
    assert "m=run-u3" in d.current_url
    # Fold it again.
    d.find_element("css selector", "a.unfold").click()
    _wait(d, "svg.graph a.fold")
    _wait_gone(d, 'svg.graph a[data-id="run-u5"]')
    assert d.execute_script("return window.__samePage === true;")
    # A message with a reminder: the reminder is marked.
    d.find_element("css selector", 'svg.graph a[data-id="m-u1"]').click()
    mark = _wait(d, "#message-panel mark.reminder")
    assert "<system-reminder>Be brief.</system-reminder>" in mark.text
    assert _console_errors(d) == []


def test_hostile_content_executes_nothing(browser: Any, viewer: Server, shots: Path) -> None:
    d = browser
    pages = [
        "/",
        f"/chat?id={HOSTILE}",
        f"/chat?id={HOSTILE}&m=h-a1",
        f"/branch?chat={HOSTILE}&name=main",
        f"/message?chat={HOSTILE}&id=h-big",
        f"/snapshots?chat={CHAT}",
        f"/records?chat={HOSTILE}",
        f"/?user={USER}&q=pwned",
    ]
    for index, path in enumerate(pages):
        _open(d, viewer.url(path), shots / f"hostile-{index}.png")
        assert _pwned(d) is None, path
        main = d.find_element("css selector", "main")
        for tag in ("script", "iframe", "img", "style", "textarea", "foreignObject"):
            assert main.find_elements("css selector", tag) == [], (path, tag)
        assert main.find_elements("css selector", "a[href^='javascript']") == []
        assert main.find_elements("css selector", "[onerror], [onload]") == []
    _open(d, viewer.url(f"/branch?chat={HOSTILE}&name=main"))
    text = d.find_element("css selector", "main").text
    for bad in HOSTILE_TEXTS[:5]:
        assert bad in text
    # Bidirectional overrides show as visible markers, not as reordered text.
    markers = {m.text for m in d.find_elements("css selector", "main .ctl")}
    assert {"U+202E", "U+2067"} <= markers
    # The 1 MB tool output is there, whole, as text.
    _open(d, viewer.url(f"/message?chat={HOSTILE}&id=h-big"))
    size = d.execute_script(
        "return Math.max(...Array.from(document.querySelectorAll('pre')).map(p => p.textContent.length));"
    )
    assert size >= 1_000_000
    _open(d, viewer.url(f"/chat?id={HOSTILE}"))
    assert d.title.startswith("<script>window.__pwned = 8</script>")
    assert d.find_element("css selector", "h1").text == "<script>window.__pwned = 8</script>"


def test_user_restriction_hides_other_users(
    browser: Any, seeded: tuple[str, dict[str, str]], serve_viewer: Any
) -> None:
    url, _ = seeded
    base = serve_viewer(url, user=USER)
    d = browser
    _open(d, base + "/")
    listed = d.find_element("css selector", "table.grid").text
    assert CHAT in listed and SECRET not in listed
    # Asking for another user's chats or searching them shows nothing of theirs.
    _open(d, base + f"/?user={OTHER}&q=secret")
    assert SECRET not in d.find_element("css selector", "main").text
    for path in (
        f"/chat?id={SECRET}",
        f"/graph?id={SECRET}",
        f"/branch?chat={SECRET}&name=main",
        f"/snapshots?chat={SECRET}",
        f"/records?chat={SECRET}",
        f"/message?chat={SECRET}&id=s-u0",
        f"/message?chat={CHAT}&id=s-u0",
    ):
        assert _status(base + path) == 404, path
    assert _status(base + f"/chat?id={quote(CHAT)}") == 200
    # Without the restriction the other chat is there.
    open_base = serve_viewer(url)
    assert _status(open_base + f"/chat?id={SECRET}") == 200
