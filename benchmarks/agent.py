"""The agent's footprint on a GPU node, and how fast a fatal Xid reaches the server.

Runs a real agent process for an 8-GPU node whose NVML is the hand-written fake
(``fleetwatch.testing.FakePynvml``, 8 x H100 snapshot) with every NVML call made to cost
``--call-cost-us`` of busy CPU (real NVML calls cost tens of microseconds), plus the kernel-log
collector following a file. It pushes to a real server process over loopback.

Measured from /proc: the agent's CPU (user + system) as a percentage of one core over a steady
window, at a 10 s and a 1 s interval, and its resident memory. Then Xid lines are appended to the
followed log and the time until each appears in the server's ``GET /v1/events`` is measured.

    .venv/bin/python benchmarks/agent.py [--window 60] [--xids 20] [--smoke]

``--smoke`` (the test suite's): the 1 s interval alone, a 1 s window, 2 Xid lines.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.integration.live import create_token, live_server  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")

RUNNER = """
import sys, threading, signal
from datetime import UTC, datetime
from pathlib import Path
from fleetwatch.agent.collectors.kernel_log import KernelLogCollector
from fleetwatch.agent.collectors.nvml import NvmlCollector
from fleetwatch.agent.factory import build_agent, utc_clock
from fleetwatch.agent.kmsg import open_kernel_log
from fleetwatch.agent.nvml import Nvml
from fleetwatch.config import load_agent_settings
from fleetwatch.testing import FakePynvml
import logging
logging.basicConfig(level=logging.WARNING)

url, token, interval, spool, log, snapshot, cost = sys.argv[1:8]
settings = load_agent_settings(server_url=url, token=token, interval_s=float(interval),
    push_interval_s=0, spool_dir=Path(spool), node_name="bench-node")
fake = FakePynvml.from_json(snapshot, call_cost_us=float(cost))
collectors = [NvmlCollector(Nvml(lib=fake)),
    KernelLogCollector(open_kernel_log(log, Path(spool)), clock=utc_clock)]
agent = build_agent(settings, collectors=collectors)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
agent.run(stop)
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def wait_pushed(read: httpx.Client, since: datetime, timeout: float = 60.0) -> None:
    """Until the agent has pushed a batch newer than ``since``: its kernel-log collector then
    follows the log, from where it ended when the agent started."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        node = read.get("/v1/nodes/bench-node")
        if node.status_code == 200 and datetime.fromisoformat(node.json()["last_seen"]) > since:
            return
        time.sleep(0.1)
    raise RuntimeError(f"the agent pushed nothing in {timeout:.0f} s")


def run_agent(
    url: str, token: str, interval: float, work: Path, cost: float
) -> subprocess.Popen[bytes]:
    work.mkdir(parents=True, exist_ok=True)
    log = work / "kern.log"
    log.touch()
    snapshot = REPO / "tests/fixtures/nvml/h100_8x.json"
    with (work / "agent.err").open("wb") as errors:  # the child keeps its own copy
        return subprocess.Popen(
            [
                sys.executable,
                "-c",
                RUNNER,
                url,
                token,
                str(interval),
                str(work / "spool"),
                str(log),
                str(snapshot),
                str(cost),
            ],
            stdout=subprocess.DEVNULL,
            stderr=errors,
        )


def footprint(
    url: str, token: str, interval: float, work: Path, window: float, cost: float, settle: float
) -> dict[str, float]:
    agent = run_agent(url, token, interval, work, cost)
    try:
        time.sleep(max(settle, 2 * interval))  # start-up (imports, NVML open) is not steady state
        before, started = cpu_seconds(agent.pid), time.monotonic()
        peak = 0.0
        while time.monotonic() - started < window:
            time.sleep(1)
            peak = max(peak, rss_mb(agent.pid))
        used = cpu_seconds(agent.pid) - before
        elapsed = time.monotonic() - started
        print(
            f"  interval {interval:>4} s: {100 * used / elapsed:.2f}% of a core, RSS {peak:.0f} MB",
            file=sys.stderr,
        )
        return {"interval_s": interval, "cpu_pct": 100 * used / elapsed, "rss_mb": peak}
    finally:
        agent.terminate()
        agent.wait(timeout=20)


def xid_latency(
    url: str, agent_token: str, read_token: str, work: Path, count: int, cost: float
) -> list[float]:
    started = datetime.now(UTC)
    agent = run_agent(url, agent_token, 10.0, work, cost)
    log = work / "kern.log"
    latencies = []
    try:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {read_token}"}) as read:
            wait_pushed(read, started)
            for i in range(count):
                pid = 50_000 + i
                with log.open("a") as f:
                    f.write(
                        f"[{1000 + i}.000000] NVRM: Xid (PCI:0000:18:00): 79, pid={pid}, "
                        "name=bench, GPU has fallen off the bus.\n"
                    )
                written = time.perf_counter()
                while time.perf_counter() - written < 10:
                    events = read.get("/v1/events", params={"xid": 79, "limit": 5}).json()["data"]
                    if any(e["pid"] == pid for e in events):
                        latencies.append(time.perf_counter() - written)
                        break
                    time.sleep(0.01)
                else:
                    latencies.append(float("inf"))
                time.sleep(0.5)
        print(
            f"  Xid line -> server event: median {statistics.median(latencies) * 1000:.0f} ms, "
            f"max {max(latencies) * 1000:.0f} ms over {count}",
            file=sys.stderr,
        )
        return latencies
    finally:
        agent.terminate()
        agent.wait(timeout=20)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--window", type=float, default=60.0, help="Seconds of steady state")
    parser.add_argument("--xids", type=int, default=20)
    parser.add_argument("--call-cost-us", type=float, default=50.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--smoke", action="store_true", help="seconds, for the test suite")
    args = parser.parse_args(argv)
    intervals, settle = (10.0, 1.0), 5.0
    if args.smoke:
        args.window, args.xids, intervals, settle = 1.0, 2, (1.0,), 2.0
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        url_db = f"sqlite:///{tmp / 'server.db'}"
        agent_token, read_token = create_token(url_db, "agent"), create_token(url_db, "read")
        with live_server(url_db, tmp) as server:
            print(
                f"agent footprint (8 GPUs, fake NVML, {args.call_cost_us:.0f} µs per NVML call):",
                file=sys.stderr,
            )
            rows = [
                footprint(
                    server.url,
                    agent_token,
                    interval,
                    tmp / f"fp{interval}",
                    args.window,
                    args.call_cost_us,
                    settle,
                )
                for interval in intervals
            ]
            latencies = xid_latency(
                server.url, agent_token, read_token, tmp / "xid", args.xids, args.call_cost_us
            )
    print("\n| agent interval | CPU (% of one core) | peak RSS (MB) |")
    print("|---:|---:|---:|")
    for row in rows:
        print(f"| {row['interval_s']:.0f} s | {row['cpu_pct']:.2f} | {row['rss_mb']:.0f} |")
    ordered = sorted(latencies)
    p90 = ordered[int(0.9 * (len(ordered) - 1))]
    print(
        f"\nXid line -> server event ({len(latencies)} lines): median "
        f"{statistics.median(latencies) * 1000:.0f} ms, p90 {p90 * 1000:.0f} ms, "
        f"max {max(latencies) * 1000:.0f} ms"
    )
    if args.json:
        args.json.write_text(json.dumps({"footprint": rows, "xid_latency_s": latencies}, indent=2))
    if args.smoke and (max(latencies) == float("inf") or not all(r["rss_mb"] for r in rows)):
        sys.exit("smoke: an Xid line never reached the server, or the agent had no memory")


if __name__ == "__main__":
    main()
