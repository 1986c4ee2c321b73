"""The documentation site builds with ``mkdocs build --strict`` (broken links, missing pages,
API references that no longer resolve, and warnings all fail it), and the README's figures
come from the benchmark pages."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# reST roles that Markdown renders as raw text (":meth:`ContextEngine.save`").
REST_ROLE = re.compile(r":(?:py:)?(?:meth|class|func|attr|exc|data|mod|obj|const|ref):(?:`|<code>)")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built once with ``mkdocs build --strict``."""
    site = tmp_path_factory.mktemp("docs") / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return site


def test_the_docs_site_builds_strictly(site: Path) -> None:
    built = {p.relative_to(site).as_posix() for p in site.rglob("index.html")}
    for page in ("benchmarks/index.html", "reliability/index.html", "reference/engine/index.html"):
        assert page in built
    # The API reference is generated from docstrings, not left empty.
    engine_page = (site / "reference/engine/index.html").read_text(encoding="utf-8")
    assert "ContextEngine" in engine_page and "resolve" in engine_page


def test_no_page_shows_a_raw_rest_role(site: Path) -> None:
    """Docstrings use one style (Markdown backticks): no reST role is left in the HTML."""
    leftovers = {}
    for page in sorted(site.rglob("*.html")):
        found = REST_ROLE.findall(page.read_text(encoding="utf-8"))
        if found:
            leftovers[page.relative_to(site).as_posix()] = len(found)
    assert leftovers == {}
    # The check itself finds a role where there is one.
    assert REST_ROLE.search("see :meth:`ContextEngine.save`")
    assert REST_ROLE.search("<p>see :class:<code>Chat</code></p>")


def test_no_page_shows_a_literal_block_marker_or_a_raw_rest_table(site: Path) -> None:
    """Docstrings are Markdown: a reST literal block (``Example::``) renders as a literal
    ``::``, and a reST table as lines of ``====``."""
    found = {}
    marker = re.compile(r"::</p>|::\s*</p>|(?:^|>)=====+ =====+")
    for page in sorted(site.rglob("*.html")):
        hits = marker.findall(page.read_text(encoding="utf-8"))
        if hits:
            found[page.relative_to(site).as_posix()] = hits[:3]
    assert found == {}
    # And in the sources, where the reference pages come from.
    sources = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "src").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\S::\s*$", line) or re.match(r"\s*=====+ =====+\s*$", line)
    ]
    assert sources == []


def test_the_production_page_covers_operations(site: Path) -> None:
    html = (site / "production/index.html").read_text(encoding="utf-8")
    for topic in (
        "pool_size",
        "PgBouncer",
        "agentcontext migrate upgrade",
        "OpenTelemetry",
        "prune",
    ):
        assert topic in html, topic


def test_every_docs_page_is_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    listed = set(re.findall(r":\s*([\w/-]+\.md)\s*$", nav, re.MULTILINE))
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert pages == listed, f"not in nav: {pages - listed}; missing: {listed - pages}"


def test_a_broken_anchor_fails_the_strict_build() -> None:
    """mkdocs reports links to missing headings only when told to; strict makes it fatal."""
    import yaml

    class _Loader(yaml.SafeLoader):
        pass

    _Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *_: None)
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_Loader)
    assert config["strict"] is True
    assert config["validation"]["anchors"] in ("warn", "error")
    assert config["validation"]["unrecognized_links"] in ("warn", "error")
