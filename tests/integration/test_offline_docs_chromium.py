"""``/docs`` and ``/redoc`` render in headless Chromium with every network but loopback blocked.

A `fleetwatch server` process serves the pages; Chromium resolves no host name and sends
everything that is not 127.0.0.1 to a proxy port where nothing listens, as on an air-gapped
cluster. The DOM must then hold the operations that Swagger UI and ReDoc build with JavaScript
from ``/openapi.json``: a page whose scripts came from a CDN stays an empty ``<div>``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import require_tool
from tests.integration.live import fleetwatch, free_port, live_server

pytestmark = pytest.mark.slow


def _offline_dom(url: str, profile: Path) -> str:
    chromium = require_tool("chromium")
    dead_proxy = f"127.0.0.1:{free_port()}"  # nothing listens: every proxied request fails
    done = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
         "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
         f"--proxy-server=http://{dead_proxy}", "--proxy-bypass-list=127.0.0.1",
         "--virtual-time-budget=15000",  # let the scripts fetch the spec and render
         "--dump-dom", url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_docs_and_redoc_render_without_internet(tmp_path: Path) -> None:
    require_tool("chromium")
    database_url = f"sqlite:///{tmp_path / 'docs.db'}"
    fleetwatch("db", "upgrade", "--database-url", database_url)
    with live_server(database_url, tmp_path) as server:
        swagger = _offline_dom(f"{server.url}/docs", tmp_path / "profile-docs")
        redoc = _offline_dom(f"{server.url}/redoc", tmp_path / "profile-redoc")
    # Swagger UI: one "opblock" per operation, the ingest endpoint among them.
    operations = swagger.count('class="opblock opblock-')
    assert operations >= 20, swagger[:3000]
    assert "/v1/ingest" in swagger
    # ReDoc: operations' summaries and paths, which only its script can put in the page.
    assert "Liveness: the process answers" in redoc and "/v1/ingest" in redoc, redoc[:3000]
    assert "Liveness: the process answers" in swagger
