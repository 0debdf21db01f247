"""Fifty real agent processes on one machine, each its own node with its own spool, against one
real server on loopback: every node and GPU arrives, nothing is rejected.

The agents push four collections at a time (``--push-interval 4`` at a 1 s interval), as a fleet
does by default: the server must judge their silence by the push interval, so no node shows as
unreachable between its pushes (three collection intervals are shorter than one push interval).
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.integration.live import create_token, fleetwatch, live_server, start_agent, stop_agents

AGENTS = 50
GPUS = 8
PUSH_INTERVAL_S = 4.0


@pytest.mark.slow
def test_fifty_agents_push_to_one_server(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    fleetwatch("db", "upgrade", "--database-url", url)
    fleetwatch(
        "sim",
        "init",
        "--nodes",
        str(AGENTS),
        "--gpus",
        str(GPUS),
        "--seed",
        "5",
        "--speed",
        "1",
        "--out",
        str(tmp_path / "sim"),
    )
    spec = tmp_path / "sim" / "fleet.json"
    agent_token, read_token = create_token(url, "agent"), create_token(url, "read")
    with live_server(url, tmp_path) as server:
        from fleetwatch.sim.spec import FleetSpec

        loaded = FleetSpec.load(spec)
        names = [loaded.node_name(i) for i in range(loaded.nodes)]
        agents = [
            start_agent(
                name,
                server.url,
                agent_token,
                tmp_path / "agents",
                "--collectors",
                "sim",
                "--sim-spec",
                str(spec),
                push_interval_s=PUSH_INTERVAL_S,
            )
            for name in names
        ]
        read = httpx.Client(
            base_url=server.url,
            headers={"Authorization": f"Bearer {read_token}"},
            timeout=60.0,  # fifty agents and the server share the machine
        )
        try:
            # Waits for a read that finds every node up at once: on a loaded machine an agent
            # may miss a push now and then, but a server judging silence by the collection
            # interval (3 s here) rather than the push interval would never show all fifty up.
            deadline = time.monotonic() + 300
            nodes: list[dict[str, object]] = []
            while time.monotonic() < deadline:
                nodes = read.get("/v1/nodes").json()["data"]
                if (
                    len(nodes) == AGENTS
                    and all(n["gpu_count"] >= GPUS - 1 for n in nodes)
                    and all(n["state"] == "up" for n in nodes)
                ):
                    break
                time.sleep(1)
            gpus = read.get("/v1/gpus").json()
            metrics = read.get("/metrics").text
        finally:
            read.close()
            logs = list(stop_agents(agents).values())
    assert sorted(n["name"] for n in nodes) == sorted(names)
    assert all(n["state"] == "up" for n in nodes)
    assert all(n["interval_s"] == PUSH_INTERVAL_S for n in nodes)
    # A simulated GPU may already have failed (it then leaves); nearly all report.
    assert len(gpus) >= AGENTS * GPUS * 0.95
    assert all(g["latest"] is not None for g in gpus)
    assert 'fleetwatch_ingest_batches_total{outcome="rejected"}' not in metrics or (
        'fleetwatch_ingest_batches_total{outcome="rejected"} 0.0' in metrics
    )
    assert not any("rejected batch" in log for log in logs)
    assert all((tmp_path / "agents" / name / "spool" / "spool.db").is_file() for name in names)
