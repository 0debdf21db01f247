"""`fleetwatch demo` (what `make demo` runs): real agent processes of a simulated fleet push to
the real server, and the printed tokens read and write it."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.integration.live import free_port


def test_demo_prints_tokens_and_serves_a_live_fleet(tmp_path: Path) -> None:
    port = free_port()
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
            "60",
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
        assert all(n["state"] == "up" and n["gpu_count"] == 8 for n in nodes["data"])  # type: ignore[attr-defined]
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
    finally:
        demo.terminate()
        demo.communicate(timeout=20)
