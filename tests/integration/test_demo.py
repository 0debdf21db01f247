"""`fleetwatch demo` (what `make demo` runs): real agent processes of a simulated fleet push to
the real server, and the printed tokens read and write it."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from tests.integration.live import free_port


def test_demo_prints_tokens_and_serves_a_live_fleet(tmp_path: Path) -> None:
    port = free_port()
    started = datetime.now(UTC)
    demo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fleetwatch",
            "demo",
            "--data-dir",
            str(tmp_path / "demo"),
            "--port",
            str(port),
            "--nodes",
            "4",
            "--interval",
            "0.5",
            "--duration",
            "600",  # the test stops it once the story is over
            # The story waits out its maintenance window and then the repair, each this long
            # (at 10 s, 20 of this test's 55 s). 6 s still sees the node read 'maintenance'
            # well before the window closes (its agent stops within a second) and keeps both
            # downtimes above zero.
            "--story-window",
            "6",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert demo.stdout is not None
        banner = ""
        deadline = time.monotonic() + 120  # generous: CI has 2 shared cores
        while "Ctrl-C" not in banner and time.monotonic() < deadline:
            banner += demo.stdout.readline()
        read_token = re.search(r"^\s+read\s+(fwt_\S+)$", banner, re.M)
        agent_token = re.search(r"^\s+agent\s+(fwt_\S+)$", banner, re.M)
        assert read_token and agent_token, banner
        assert f"http://127.0.0.1:{port}/docs" in banner
        headers = {"Authorization": f"Bearer {read_token[1]}"}
        nodes: dict[str, object] = {}
        for _ in range(200):
            nodes = httpx.get(f"http://127.0.0.1:{port}/v1/nodes", headers=headers).json()
            if nodes.get("count") == 4:
                break
            time.sleep(0.2)
        assert nodes["count"] == 4
        # The story's maintenance window may already cover the last node.
        states = {n["name"]: n["state"] for n in nodes["data"]}  # type: ignore[attr-defined]
        assert states.pop("sim-node-003") in {"up", "maintenance"}, states
        assert set(states.values()) == {"up"}, states
        assert all(n["gpu_count"] == 8 for n in nodes["data"])  # type: ignore[attr-defined]
        gpu_pages = [
            httpx.get(
                f"http://127.0.0.1:{port}/metrics",
                params={"shard": i, "shards": 2},
                headers=headers,
            ).text
            for i in range(2)
        ]
        assert sum(p.count("fleetwatch_gpu_temperature_celsius{") for p in gpu_pages) == 32
        # Each simulated node's agent sends its 8 adapter ports with its GPUs (issue 13).
        ports = httpx.get(
            f"http://127.0.0.1:{port}/v1/nodes/sim-node-000/ports", headers=headers
        ).json()
        assert ports["count"] == 8, ports
        assert {p["link_layer"] for p in ports["data"]} <= {"InfiniBand", "Ethernet"}
        # Every node's agent wrote its ground truth-backed fleet and its own log.
        assert (tmp_path / "demo/sim/ground_truth.json").is_file()
        assert len(list((tmp_path / "demo/agents").glob("*/agent.log"))) == 4
        # The agent token can push, which is what the README's curl example shows.
        pushed = httpx.post(
            f"http://127.0.0.1:{port}/v1/ingest",
            headers={"Authorization": f"Bearer {agent_token[1]}"},
            json={"batch_id": "demo-curl-1", "node": {"name": "curl-node"}},
        )
        assert pushed.status_code == 200, pushed.text
        _assert_the_story(demo, port, headers, started)
    finally:
        demo.terminate()
        demo.communicate(timeout=20)


def _assert_the_story(
    demo: subprocess.Popen[str], port: int, headers: dict[str, str], started: datetime
) -> None:
    """Issue 14's story, played while the fleet runs: its outcomes as the API shows them."""
    assert demo.stdout is not None
    story: list[str] = []
    deadline = time.monotonic() + 600  # generous: CI has 2 shared cores
    while time.monotonic() < deadline:
        line = demo.stdout.readline()
        if line.startswith("[story]"):
            story.append(line)
            if line.startswith(("[story] done", "[story] stopped")):
                break
        elif not line and demo.poll() is not None:
            break
    told = "".join(story)
    assert "[story] done" in told, told
    base = f"http://127.0.0.1:{port}"
    # 1. the maintenance window, listed (ended) on the node whose agent was stopped
    windows = httpx.get(f"{base}/v1/maintenance", params={"state": "ended"}, headers=headers).json()
    assert [w["nodes"] for w in windows["data"]] == [["sim-node-003"]], windows
    assert "states while its agent was stopped: maintenance;" in told, told  # never unreachable
    kept = httpx.get(
        f"{base}/v1/evictions", params={"node": "sim-node-003"}, headers=headers
    ).json()["data"]
    assert "node_unreachable" not in {e["reason_kind"] for e in kept}, kept
    # 2. the job failed on the fatal Xid, attributed to hardware on the failing node
    job = httpx.get(f"{base}/v1/jobs/demo-train-1", headers=headers).json()
    assert job["outcome"] == "failed", job
    failing = job["hardware_failure"]["node"]
    assert failing in job["nodes"] and failing != "sim-node-003", job
    # 3. refused twice (no validation, then a failing one), then returned after a passing one
    assert told.count("-> 409") == 2 and "no validation newer than the eviction" in told, told
    assert "failed: nvml.remapped_rows on GPU 0" in told, told
    evictions = httpx.get(
        f"{base}/v1/evictions", params={"node": failing, "state": "returned"}, headers=headers
    ).json()["data"]
    assert [e["reason_kind"] for e in evictions] == ["rule"], evictions
    validations = httpx.get(f"{base}/v1/nodes/{failing}/validations", headers=headers).json()[
        "data"
    ]
    assert [v["passed"] for v in validations] == [True, False], validations
    # 4. the availability figures moved: planned downtime, a failure, a job lost to hardware
    figures = httpx.get(
        f"{base}/v1/availability", params={"since": started.isoformat()}, headers=headers
    ).json()
    assert figures["fleet"]["planned_down_h"] > 0, figures
    assert figures["fleet"]["unplanned_down_h"] > 0, figures
    assert figures["jobs"]["failed"] >= 1, figures
    assert figures["jobs"]["interrupted_by_hardware"] >= 1, figures
