"""The fleet page in a real browser: a `fleetwatch server` process, rendered by headless Chromium.

Chromium follows ``/?token=...``'s 303, keeps the HttpOnly cookie and renders ``/`` with it, as a
person's browser does; the DOM must hold the fleet, the map must draw each node in its state's
colour (the DOM Chromium built from the inline SVG, so the page's CSP let it through), the node
page must render the same way, and the screenshots must not be blank. With
``FLEETWATCH_SCREENSHOTS=<dir>`` the screenshots are kept there.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from fleetwatch.charts.fleet_map import FILL
from tests.conftest import require_tool
from tests.factories import make_batch
from tests.integration.live import LiveServer, create_token, fleetwatch, live_server

pytestmark = pytest.mark.slow


def _chromium(*args: str, profile: Path) -> subprocess.CompletedProcess[str]:
    chromium = require_tool("chromium")
    return subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--user-data-dir={profile}", "--window-size=1280,1000", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _seed(url: str, agent_token: str) -> None:
    import httpx

    xid = make_batch("gpu-node-017", gpus=4, ticks=3, labels={"rack": "r12"})
    ts = (datetime.now(UTC) - timedelta(minutes=2)).isoformat()
    bus = xid["gpus"][2]["pci_bus_id"]
    message = f"NVRM: Xid (PCI:{bus}): 79, GPU has fallen off the bus."
    xid["events"] = [{"kind": "xid", "ts": ts, "xid": 79, "pci_bus_id": bus, "message": message}]
    batches = [xid, make_batch("gpu-node-018", gpus=4, ticks=3, labels={"rack": "r13"})]
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {agent_token}"}) as push:
        for batch in batches:
            assert push.post("/v1/ingest", json=batch).status_code == 200


def test_fleet_page_renders_in_headless_chromium(tmp_path: Path) -> None:
    require_tool("chromium")
    database_url = f"sqlite:///{tmp_path / 'fleet.db'}"
    fleetwatch("db", "upgrade", "--database-url", database_url)
    agent, reader = create_token(database_url, "agent"), create_token(database_url, "read")
    with live_server(database_url, tmp_path) as server:
        _seed(server.url, agent)
        page = f"{server.url}/?token={reader}"
        _wait_for_state(server, reader, "gpu-node-017", "out")

        dom = _chromium("--dump-dom", page, profile=tmp_path / "profile-dom")
        assert dom.returncode == 0, dom.stderr
        html = dom.stdout
        assert "gpu-node-017" in html and "gpu-node-018" in html, html[:2000]
        assert "Risk" in html and "r12" in html
        assert "Sign in" not in html  # the cookie carried the token across the redirect
        assert '<td class="num bad">79</td>' in html  # the fatal Xid, listed

        _assert_tile(dom.stdout, "gpu-node-017", "out")  # Xid 79 took a GPU out
        _assert_tile(dom.stdout, "gpu-node-018", "healthy")
        assert '<a href="/nodes/gpu-node-017">' in dom.stdout

        png = tmp_path / "fleet.png"
        shot = _chromium(f"--screenshot={png}", page, profile=tmp_path / "profile-shot")
        assert shot.returncode == 0, shot.stderr
        assert png.is_file(), shot.stderr

        node = f"{server.url}/nodes/gpu-node-017?token={reader}"
        node_dom = _chromium("--dump-dom", node, profile=tmp_path / "profile-node")
        assert node_dom.returncode == 0, node_dom.stderr
        assert re.search(r'<svg [^>]*class="state" data-state="out"', node_dom.stdout)
        assert "Xid 79" in node_dom.stdout and "<summary>evidence" in node_dom.stdout
        node_png = tmp_path / "node.png"
        shot = _chromium(f"--screenshot={node_png}", node, profile=tmp_path / "profile-node-shot")
        assert shot.returncode == 0 and node_png.is_file(), shot.stderr
    _assert_not_blank(png)
    _assert_not_blank(node_png)
    keep = os.environ.get("FLEETWATCH_SCREENSHOTS")
    if keep:
        for shot_png in (png, node_png):
            shutil.copy(shot_png, Path(keep) / shot_png.name)


def _wait_for_state(server: LiveServer, token: str, node: str, state: str) -> None:
    """Until the page's map shows ``node`` in ``state`` (the assessment judges pushes in the
    background); fails after a generous minute."""
    deadline = time.monotonic() + 60
    with server.client(token) as client:
        while True:
            html = client.get("/").text
            if re.search(rf'data-state="{state}" data-node="{node}"', html):
                return
            assert time.monotonic() < deadline, html[:3000]
            time.sleep(0.2)


def _assert_tile(html: str, node: str, state: str) -> None:
    tile = re.search(rf'<rect [^>]*data-node="{node}"[^>]*>', html)
    assert tile, html[:3000]
    assert f'data-state="{state}"' in tile.group(0), tile.group(0)
    assert f'fill="{FILL[state]}"' in tile.group(0), tile.group(0)


def _assert_not_blank(png: Path) -> None:
    try:
        from PIL import Image, ImageStat
    except ImportError:  # no Pillow: a blank page compresses to a few kB at this size
        assert png.stat().st_size > 20_000, png.stat().st_size
        return
    with Image.open(png) as image:
        assert image.size == (1280, 1000)
        stddev = ImageStat.Stat(image.convert("L")).stddev[0]
        colours = len(image.convert("RGB").getcolors(maxcolors=1 << 16) or ())
    assert stddev > 10.0 and colours > 8, (stddev, colours)
