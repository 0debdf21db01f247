"""What the infiniband collector costs a node: CPU per collection and memory.

Builds a ``/sys/class/infiniband``-shaped tree of 8 adapters x 1 port by copying one device of the
real H100 node's tree (``../shared/fixtures/infiniband/gpud__sys-class-infiniband-h100_tree.tar``:
46 counter and hw_counter files per port), then runs the collector back to back ``--iterations``
times in this process and reports the CPU time (user + system, ``time.process_time``) of each
collection, what that is as a share of one core at a 10 s interval, the staged JSON per
collection, and the resident memory before and after (growth would be a leak).

The files sit on an ordinary file system, not sysfs: the driver's own cost of answering a read
(mlx5 asks the firmware for hw_counters, cached for ``lifespan`` ms) is not in these figures.

    .venv/bin/python benchmarks/ib_collector.py [--iterations 2000] [--devices 8]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from fleetwatch.agent.batching import tick_body  # noqa: E402
from fleetwatch.agent.collectors.infiniband import InfinibandCollector  # noqa: E402
from fleetwatch.agent.loop import build_batch  # noqa: E402
from fleetwatch.telemetry import NodeInfo  # noqa: E402

FIXTURE = REPO.parent / "shared/fixtures/infiniband/gpud__sys-class-infiniband-h100_tree.tar"
INNER = "components/accelerator/nvidia/infiniband/class/testdata/sys-class-infiniband-h100.0"


def build_tree(dest: Path, devices: int) -> Path:
    """``devices`` copies of the H100 tree's mlx5_0 under ``dest/infiniband``."""
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(dest / "h100", filter="data")
    source = dest / "h100" / INNER / "mlx5_0"
    root = dest / "infiniband"
    for i in range(devices):
        shutil.copytree(source, root / f"mlx5_{i}")
    return root


def status_kib(field: str) -> int:
    """``VmRSS`` (resident now) or ``VmHWM`` (its peak) of this process, from /proc."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--interval", type=float, default=10.0, help="for the CPU share")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = parser.parse_args(argv)
    if args.smoke:
        args.iterations = 20
    if not FIXTURE.is_file():
        sys.exit(f"needs the H100 tree at {FIXTURE}")
    with tempfile.TemporaryDirectory() as tmp:
        root = build_tree(Path(tmp), args.devices)
        collector = InfinibandCollector(root)
        node = NodeInfo(name="bench-node", interval_s=args.interval)
        t0 = datetime(2026, 12, 1, tzinfo=UTC)
        collector.collect(t0)  # imports and first-touch caches out of the measurement
        rss_before = status_kib("VmRSS")
        costs: list[float] = []
        for i in range(args.iterations):
            started = time.process_time()
            collection = collector.collect(t0 + timedelta(seconds=i))
            costs.append(time.process_time() - started)
        rss_after = status_kib("VmRSS")
        body = tick_body(build_batch(node, collection, "staged"))
    ports = len(collection.ports)
    counters = sum(len(p.counters or {}) + len(p.hw_counters or {}) for p in collection.ports)
    mean = statistics.fmean(costs)
    cuts = statistics.quantiles(costs, n=100)
    result = {
        "devices": args.devices,
        "ports": ports,
        "counter_files_per_collection": counters,
        "iterations": args.iterations,
        "cpu_ms_per_collection": {
            "mean": round(mean * 1000, 3),
            "p50": round(cuts[49] * 1000, 3),
            "p99": round(cuts[98] * 1000, 3),
        },
        f"cpu_pct_of_a_core_at_{args.interval:g}s": round(mean / args.interval * 100, 4),
        "staged_json_bytes_per_collection": len(body),
        "rss_kib": {"before": rss_before, "after": rss_after, "peak": status_kib("VmHWM")},
        "python": sys.version.split()[0],
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
