"""The fleet-scale benchmark (``benchmarks/fleet_scale.py``, issue 12) at toy scale.

20 simulated agents for 24 s, pushing two ticks at a time, against a real ``fleetwatch server``
on PostgreSQL with every background job on, and the real Prometheus scraping the same values
beside it (left out only where the binary is missing and FLEETWATCH_REQUIRE_TOOLS is not set).
It checks what the benchmark promises, never a duration: every offered row stored, the database
holding exactly the acknowledged rows, the exporter pages saying what the agents push, the
injected Xid 79 evicting its node and nothing else evicted, every figure of the report present.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

BENCHMARK = REPO / "benchmarks" / "fleet_scale.py"


def _prometheus_args() -> list[str]:
    if shutil.which("prometheus") or Path("/usr/bin/prometheus").exists():
        return []
    if os.environ.get("FLEETWATCH_REQUIRE_TOOLS") == "1":
        pytest.fail("prometheus not found: run scripts/ensure-debs.sh (make test does)")
    return ["--no-prometheus"]


def test_fleet_scale_benchmark_smoke(
    postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "scale.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETWATCH_SERVER_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    command = [sys.executable, str(BENCHMARK), "--database-url", postgres_url]
    # A 5 s tick and a 10 s push (two ticks a push, as 10 s and 20 s were) fit more pushes into a
    # shorter window; the Xid probe comes at 8 s. The scraper starts at half the window and stops
    # 10 s before its end: 24 s, a scrape every 2 s, gives the two scrapes at 12 and 14 s.
    # Each second of the window, and of the grace (the load generator waits it out in full), is
    # a second of this test; 5 s of grace still covers pushes in flight (p99 about 0.3 s).
    command += ["--nodes", "20", "--duration", "24", "--tick", "5", "--push-interval", "10"]
    command += ["--grace", "5", "--progress", "10"]
    command += ["--metrics-every", "2"]  # two default-page scrapes: the first's server side
    command += ["--json-out", str(out), *_prometheus_args()]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(out.read_text())

    load = results["load"]
    assert load["offered_rows"] > 0
    assert load["on_time_rows"] == load["offered_rows"], load
    assert load["errors"] == 0, load["error_samples"]
    assert results["fleetwatch"]["samples_rows"] == load["acked_rows_total"]
    assert results["checks"]["page_vs_push_disagreements"] == []
    assert load["probes"], "no Xid 79 was injected"
    assert all(p["evicted_after_s"] is not None for p in load["probes"]), load["probes"]
    assert results["fleetwatch"]["evictions_of_other_nodes"] == 0
    if "--no-prometheus" not in command:
        assert results["prometheus"]["rows_in_window"] > 0
    # 160 GPUs fit one shard of the shipped config's size: the shard scraped is the whole fleet.
    assert results["metrics"]["shard"]["shards"] == 1, results["metrics"]["shard"]
    assert results["metrics"]["shard"]["available"], results["metrics"]["shard"]
    # The server's own account of building the first page, read off the second.
    pages = results["metrics"]["page"]
    assert len(pages) >= 2, pages
    assert {"server_s", "server_cpu_s"} <= pages[0].keys(), pages[0]
    # PostgreSQL's CPU split by whom its processes worked for: the server's sessions name
    # their role (one process here: "all").
    by = results["window"]["postgres_cpu_s_by"]
    assert by.get("fleetwatch all", 0) > 0, by
    assert "PostgreSQL CPU seconds in the window by process name: " in done.stdout

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    from scale_report import TARGET_ROWS

    table = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    for figure in TARGET_ROWS:
        row = next((line for line in table if line.startswith(f"| {figure} |")), None)
        assert row is not None, f"report lacks {figure!r}:\n{done.stdout}"
        assert row.rstrip().endswith(("| met |", "| **not met** |", "| not measured |")), row
