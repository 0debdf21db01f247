"""The node page and the fleet page's pictures: the map's tile of a node carries its state and
that state's fill, each tile and table links to the node's page, and the node page shows the
node's GPUs, verdicts with evidence, events, evictions and availability behind the same sign-in."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from tests.conftest import bearer
from tests.factories import make_batch
from tests.unit.server.conftest import Push
from tests.unit.server.routers.test_risk_api import _store_landmark_model, _store_model, _xid_batch

from fleetwatch.charts.fleet_map import FILL
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.repo.evictions import create_eviction


def _tile(html: str, node: str) -> str:
    match = re.search(rf'<rect [^>]*data-node="{re.escape(node)}"[^>]*>', html)
    assert match, html[:3000]
    return match.group(0)


def test_fleet_map_tiles_carry_each_nodes_state_and_link_to_its_page(
    client: TestClient, db: Database, tokens: dict[str, str], push: Push
) -> None:
    assert push(_xid_batch("node-a", 79)).status_code == 200  # a fatal Xid: out by rule
    assert push(make_batch("node-b", gpus=2, labels={"rack": "r1"})).status_code == 200
    assert push(make_batch("node-c", gpus=2, labels={"rack": "r1"})).status_code == 200
    with db.write() as conn:
        create_eviction(
            conn, node="node-c", state="acked", reason_kind="risk", reason="high risk",
            evidence={}, expected_saving_usd=None, dry_run=False, now=utcnow(),
        )  # fmt: skip
    client.app.state.assessor.run_once()  # type: ignore[attr-defined]
    html = client.get("/", headers=bearer(tokens["read"])).text
    for node, state in (("node-a", "out"), ("node-b", "healthy"), ("node-c", "draining")):
        tile = _tile(html, node)
        assert f'data-state="{state}"' in tile and f'fill="{FILL[state]}"' in tile, tile
        assert f'<a href="/nodes/{node}"><rect' in html
    assert re.search(r'data-state="out" data-count="1"', html)
    assert re.search(r'data-state="healthy" data-count="1"', html)
    # the trends and the risk distribution are drawn too
    assert 'class="chart trend-events"' in html and 'class="chart trend-availability"' in html
    assert re.search(r'data-band="out" data-count="1"', html)
    assert re.search(r'data-band="none" data-count="5"', html)  # unscored GPUs in service
    assert '<a class="node" href="/nodes/node-a">node-a</a>' in html  # the risk table links


def test_node_page_shows_gpus_verdicts_events_and_evictions(
    client: TestClient, db: Database, tokens: dict[str, str], push: Push
) -> None:
    assert push(_xid_batch("node-a", 79)).status_code == 200
    with db.write() as conn:
        create_eviction(
            conn, node="node-a", state="completed", reason_kind="rule", reason="Xid 79 <b>",
            evidence={}, expected_saving_usd=None, dry_run=False,
            now=utcnow() - timedelta(hours=3),
        )  # fmt: skip
    client.app.state.assessor.run_once()  # type: ignore[attr-defined]
    assert client.get("/nodes/node-a").status_code == 401  # same sign-in as the fleet page
    signed = client.get("/nodes/node-a", params={"token": tokens["read"]}, follow_redirects=False)
    assert signed.status_code == 303 and signed.headers["location"] == "/nodes/node-a"
    page = client.get("/nodes/node-a")
    assert page.status_code == 200, page.text
    assert page.headers["content-security-policy"].startswith("default-src 'none'")
    html = page.text
    assert re.search(r'<svg [^>]*class="state" data-state="out"', html)
    assert "Xid 79" in html and "<b>evidence" not in html
    assert "<summary>evidence" in html
    assert "Xid 79 &lt;b&gt;" in html  # the eviction's reason, escaped
    assert "<td>xid</td>" in html  # the event
    assert 'class="chart trend-availability"' in html
    assert "workload availability" in html
    missing = client.get("/nodes/nope")
    assert missing.status_code == 404 and "No node named nope" in missing.text


@pytest.mark.parametrize("part", ["aft", "landmark"])
def test_node_page_names_each_model_scored_gpus_drivers_and_marks_those_above_the_threshold(
    client: TestClient, db: Database, tokens: dict[str, str], push: Push, part: str
) -> None:
    if part == "aft":
        _store_model(db)  # a high SBE rate shortens life; these GPUs never report one
    else:
        _store_landmark_model(db)  # the first 30 days are riskier; these GPUs are new
    assert push(make_batch("node-a", gpus=2, ticks=3)).status_code == 200
    client.app.state.assessor.run_once()  # type: ignore[attr-defined]
    risk = client.get("/v1/risk", params={"horizon": "24h"}, headers=bearer(tokens["read"]))
    gpus = {g["uuid"]: g for g in risk.json()["gpus"]}
    client.get("/nodes/node-a", params={"token": tokens["read"]})
    state = client.app.state  # type: ignore[attr-defined]
    lowest = min(g["probability"] for g in gpus.values())
    seen = set()
    for threshold in (1.0, lowest):  # none above it, then every GPU at or above it
        state.settings = state.settings.model_copy(update={"notice_risk_threshold": threshold})
        html = client.get("/nodes/node-a").text
        rows = re.findall(r'<tr data-gpu="([^"]+)">(.*?)</tr>', html, flags=re.S)
        assert len(rows) == 2
        for uuid, row in rows:
            drivers = re.search(r'<div class="factors( warn)?"[^>]*>(.*?)</div>', row, flags=re.S)
            assert drivers, row
            api = gpus[uuid]
            assert api["factors"]
            assert api["model"] == part
            for factor in api["factors"]:  # the page shows what /v1/risk says drives the risk
                assert f"<code>{factor['name']}</code>" in drivers.group(2)
                if part == "aft":
                    assert factor["contribution"] is None
                    assert f"×{factor['hazard_ratio']:.2f}" in drivers.group(2)
                else:
                    assert factor["hazard_ratio"] is None
                    assert f"{factor['contribution']:+.2f} log-odds" in drivers.group(2)
            if part == "landmark":  # the GPU's youth is what drives it, upwards
                top = api["factors"][0]
                assert top["name"] == "age_days" and top["contribution"] > 0
            above = api["probability"] >= threshold
            assert (drivers.group(1) is not None) == above
            assert ("above the notice threshold" in drivers.group(2)) == above
            seen.add(above)
    assert seen == {True, False}
