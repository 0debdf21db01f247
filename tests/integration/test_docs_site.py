"""The documentation site (mkdocs.yml) builds with ``--strict`` and needs nothing from the internet.

Two checks. The built HTML and CSS name no resource on another host, and the JavaScript only the
two that Material's bundle loads on conditions this site never meets. Then Chromium opens pages
served from 127.0.0.1, every other host resolving to nothing and proxied to nowhere, as on an
air-gapped cluster, and its network log must show no request the page made to anywhere else
(the browser's own update and account checks are not the page's, and are told apart by their
initiator).
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.conftest import require_tool
from tests.integration.live import free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# A tag's attributes that make the browser fetch something.
FETCHING = {
    "script": "src", "link": "href", "img": "src", "iframe": "src", "source": "src",
    "video": "src", "audio": "src", "embed": "src", "object": "data", "track": "src",
}  # fmt: skip
REMOTE = re.compile(r"^(?:https?:)?//", re.IGNORECASE)
CSS_REMOTE = re.compile(r"""(?:url\(\s*['"]?|@import\s+['"])((?:https?:)?//[^'")\s]+)""", re.I)
CDN = re.compile(
    r"https?://(?:fonts\.googleapis\.com|fonts\.gstatic\.com|unpkg\.com|cdn\.jsdelivr\.net"
    r"|cdnjs\.cloudflare\.com|ajax\.googleapis\.com|[\w.-]*\bcdn\b[\w.-]*)[^\s'\"`)]*"
)
# Material's bundle loads these only for a `pre.mermaid` block (this site renders none: its
# Mermaid source shows as code) and for a browser without ResizeObserver (none still supported).
MATERIAL_CONDITIONAL = ("https://unpkg.com/mermaid@", "https://unpkg.com/resize-observer-polyfill")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out


class _Fetches(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.mermaid = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        url = values.get(FETCHING.get(tag, ""))
        if url:
            self.urls.append(url)
        self.urls += CSS_REMOTE.findall(values.get("style") or "")
        if tag == "pre" and "mermaid" in (values.get("class") or "").split():
            self.mermaid = True


def test_docs_site_references_no_other_host(site: Path) -> None:
    remote: list[str] = []
    mermaid_pages = []
    for page in sorted(site.rglob("*.html")):
        parser = _Fetches()
        parser.feed(page.read_text(encoding="utf-8"))
        remote += [f"{page.name}: {url}" for url in parser.urls if REMOTE.match(url)]
        if parser.mermaid:
            mermaid_pages.append(page.name)
    for sheet in site.rglob("*.css"):
        remote += [f"{sheet.name}: {url}" for url in CSS_REMOTE.findall(sheet.read_text())]
    assert remote == []
    assert mermaid_pages == []  # else Material's bundle would fetch mermaid from unpkg.com
    scripts = [p for p in site.rglob("*.js") if p.suffix == ".js"]
    assert scripts
    cdn = {url for script in scripts for url in CDN.findall(script.read_text(encoding="utf-8"))}
    assert {url for url in cdn if not url.startswith(MATERIAL_CONDITIONAL)} == set()


def test_docs_site_has_generated_references_and_pages_from_outside_docs(site: Path) -> None:
    from fleetwatch.cli import main

    cli = (site / "cli.html").read_text(encoding="utf-8")
    assert "Sentinel.UNSET" not in cli
    for name in main.commands:
        assert f'id="fleetwatch-{name}"' in cli, name
    rest = (site / "rest-api-reference.html").read_text(encoding="utf-8")
    assert "POST /v1/ingest" in rest and 'id="schema-batch"' in rest
    benchmarks = (site / "benchmarks.html").read_text(encoding="utf-8")
    assert "Test suite (issue 35)" in benchmarks
    home = (site / "index.html").read_text(encoding="utf-8")
    assert 'src="images/fleet-page.png"' in home and 'href="helm-chart.html"' in home
    runbooks = REPO / "docs" / "runbooks"
    for page in runbooks.glob("*.md") if runbooks.is_dir() else []:
        assert f'href="runbooks/{page.stem}.html"' in home, page.name  # in the navigation


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture()
def served(site: Path) -> Iterator[str]:
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)


def _page_requests(net_log: Path) -> list[tuple[str, str]]:
    """(url, initiator) of every request the network log shows."""
    log = json.loads(net_log.read_text(encoding="utf-8"))
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return [
        (event["params"]["url"], str(event["params"].get("initiator")))
        for event in log["events"]
        if event["type"] == start and "url" in event.get("params", {})
    ]


@pytest.mark.parametrize("page", ["index.html", "rest-api-reference.html"])
def test_docs_site_renders_offline_in_chromium(served: str, page: str, tmp_path: Path) -> None:
    chromium = require_tool("chromium")
    net_log = tmp_path / "net.json"
    done = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path}/p",
         "--no-first-run", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
         f"--proxy-server=http://127.0.0.1:{free_port()}",  # nothing listens there
         f"--log-net-log={net_log}", "--virtual-time-budget=10000",
         "--dump-dom", f"{served}/{page}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    dom = done.stdout
    # Material's script ran: it wraps every table and adds a copy button to every code block.
    assert "md-typeset__scrollwrap" in dom and 'class="js' in dom, dom[:3000]
    requests = _page_requests(net_log)
    mine = [url for url, initiator in requests if initiator == served]
    assert any("/assets/javascripts/bundle." in url for url in mine), requests
    elsewhere = [url for url in mine if not url.startswith(served + "/")]
    assert elsewhere == []
