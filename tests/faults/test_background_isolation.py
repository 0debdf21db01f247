"""Fault: what one node sends cannot stop the fleet's background jobs (issue 10, item 1).

A real ``fleetwatch server`` on PostgreSQL, background jobs on short intervals. A node with the
longest name, GPU UUID and cluster label ingest accepts (253, 124 and 256 characters; no serial)
reports once and falls silent; another node reports a fatal Xid 79. Before the fix the first
node's alert key (270 characters) overflowed its column and every alert pass failed from then
on, so the Xid 79 drained its node but never paged. Now both alerts fire, both nodes get an
eviction, no background job counts a failure, and the server log holds no traceback.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import _truncate
from tests.factories import make_batch, make_gpu, make_sample
from tests.faults.waiting import wait_for as _wait_for
from tests.integration.live import create_token, live_server

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

LONG_NODE = "n" + "x" * 252
LONG_UUID = "GPU-" + "a" * 120
LONG_CLUSTER = "c" * 256
JOBS = ("assessment", "planner", "alerts", "lifecycle", "rollups", "stragglers", "webhooks")


def _long_node() -> dict[str, Any]:
    gpu = make_gpu(LONG_NODE, 0, uuid=LONG_UUID, serial=None, pci_bus_id="ffff:ff:1f.7")
    batch = make_batch(LONG_NODE, gpus=0, interval_s=1.0, labels={"cluster": LONG_CLUSTER})
    batch["gpus"] = [gpu]
    batch["samples"] = [make_sample(LONG_UUID, datetime.now(UTC) - timedelta(seconds=1))]
    return batch


def _xid79(node: str) -> dict[str, Any]:
    batch = make_batch(node, gpus=2, interval_s=30.0)
    pci = batch["gpus"][0]["pci_bus_id"]
    batch["events"] = [{"kind": "xid", "ts": datetime.now(UTC).isoformat(), "xid": 79,
                        "pci_bus_id": pci, "message": f"NVRM: Xid (PCI:{pci}): 79, GPU has "
                        "fallen off the bus."}]  # fmt: skip
    return batch


def _say(line: str) -> None:
    """What the test checked, on stdout (pytest -s shows it; the CI log keeps it)."""
    sys.stdout.write(line + "\n")


def _series(client: httpx.Client, name: str) -> dict[str, float]:
    """``{job: value}`` of a counter labelled by job, from /metrics."""
    out = {}
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(f'{name}{{job="'):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('"')[1]] = float(value)
    return out


def test_a_longest_name_node_falling_silent_leaves_alerting_working(
    migrated_postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = migrated_postgres_url
    _truncate(url)
    for name, value in {
        "ASSESS_INTERVAL_S": "0.5", "PLANNER_INTERVAL_S": "0.5", "ALERT_INTERVAL_S": "0.5",
        "LIFECYCLE_INTERVAL_S": "0.5", "ROLLUP_INTERVAL_S": "0.5", "STRAGGLER_INTERVAL_S": "0.5",
        "WEBHOOK_DELIVERY_INTERVAL_S": "0.5", "REFIT_INTERVAL_S": "0", "DRAIN_BUDGET_PCT": "100",
    }.items():  # fmt: skip
        monkeypatch.setenv(f"FLEETWATCH_SERVER_{name}", value)
    agent, read = create_token(url, "agent"), create_token(url, "read")
    with (
        live_server(url, tmp_path) as server,
        server.client(agent) as push,
        server.client(read) as reader,
    ):
        for batch in (_long_node(), _xid79("node-b")):
            response = push.post("/v1/ingest", json=batch)
            assert response.status_code == 200, response.text
        _say(f"ingested: a node named {len(LONG_NODE)} characters (GPU UUID {len(LONG_UUID)}, "
             f"label {len(LONG_CLUSTER)}, no serial), then silent; node-b with Xid 79")  # fmt: skip

        def firing() -> dict[str, dict[str, Any]] | None:
            alerts = reader.get("/v1/alerts", params={"state": "firing"}).json()["data"]
            by_key = {a["dedup_key"]: a for a in alerts}
            xid = [a for a in alerts if a["node"] == "node-b" and a["kind"] == "xid"]
            unreachable = by_key.get(f"node:{LONG_NODE}:unreachable")
            return {"xid": xid[0], "unreachable": unreachable} if xid and unreachable else None

        found = _wait_for("both alerts firing", firing)
        assert found["unreachable"]["cluster"] == LONG_CLUSTER
        assert found["xid"]["severity"] == "fatal"
        _say(f"GET /v1/alerts: firing {found['xid']['dedup_key']} (fatal) and the "
              f"{len(found['unreachable']['dedup_key'])}-character unreachable key")  # fmt: skip

        def evicted() -> set[str] | None:
            nodes = {e["node"] for e in reader.get("/v1/evictions").json()["data"]}
            return nodes if {"node-b", LONG_NODE} <= nodes else None

        nodes = _wait_for("evictions for both nodes", evicted)
        _say(f"GET /v1/evictions: {len(nodes)} nodes, node-b and the long-named node")

        # The lifetime job stores the serial-less GPU under its UUID at node/slot (266
        # characters): once it has, every job has run over these rows at least once.
        def lifetime() -> dict[str, Any] | None:
            found = reader.get("/v1/lifetimes", params={"serial": LONG_UUID}).json()["data"]
            return found[0] if found else None

        stint = _wait_for("the long GPU's lifetime", lifetime)
        assert stint["location"] == f"{LONG_NODE}/ffff:ff:1f.7"
        _say(f"GET /v1/lifetimes: the GPU's stint at a {len(stint['location'])}-character location")
        items = _series(reader, "fleetwatch_background_item_errors_total")
        passes = _series(reader, "fleetwatch_background_job_failures_total")
        assert set(JOBS) <= set(items), f"every job exposes its item errors: {sorted(items)}"
        assert all(v == 0 for v in items.values()), items
        assert all(v == 0 for v in passes.values()), passes
        _say(f"/metrics: 0 item errors and 0 failed passes in {len(passes)} jobs")
    log = server.log.read_text()
    assert "Traceback" not in log, log[-5000:]
    # Both an isolated item and a failed pass are logged as "background job <name> ...".
    assert [line for line in log.splitlines() if "background job" in line] == []
    _say(f"server log: {len(log.splitlines())} lines, no traceback, no background job failure")
