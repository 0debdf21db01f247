"""Issue 12's urgent lane at fleet scale: a fatal Xid judged, planned, alerted for one node.

On PostgreSQL, a template database (``background_scale.py``'s seed, reused while its parameters
match) of ``--nodes`` nodes x 8 GPUs with ``--minutes`` of samples every 10 s, a day of Xid noise
and ``--hourly-hours`` of rollups, cloned for each run. Then:

1. in this process, on the objects ``server/background.py`` builds, wall and CPU seconds of
   the whole-fleet passes (assessment, planner, alerts: a first pass of a fresh leader, then one
   after 30 s more samples) and of the urgent lane's for one node (targeted assessment,
   ``EvictionPlanner.run_for``, ``Alerter.run_for``) after a fatal Xid stored on it, over
   ``--targeted`` nodes;
2. through a real ``fleetwatch server`` (uvicorn, every background job on, product timers): a
   batch with a fatal Xid 79 pushed to ``/v1/ingest`` for a node of the fleet, timed until its
   eviction shows at ``GET /v1/evictions?node=``, ``--probes`` times, one every ``--gap-s`` s
   (so that probes land anywhere in the 30 s assessment cycle), with this branch's code and,
   with ``--baseline-src DIR`` (a ``src`` tree of the code before the lane, e.g. from ``git
   archive``), with that code, over ``--baseline-probes`` probes. The server's CPU seconds over
   the probes come from /proc.

No agents push meanwhile (the fleet is idle apart from the probes), so the server's timers run
the whole-fleet passes on unchanging data; its nodes are kept from turning unreachable with
``FLEETWATCH_SERVER_UNREACHABLE_AFTER_INTERVALS`` (the seeded samples are minutes old). Each
clone has its ``gpu_hourly`` emptied and its rollups marked as done up to the newest sample: the
covariate query over 100,000 GPUs' rollups takes many minutes on this machine, and a server
computes it once per rollup pass, not per assessment (``Assessor._covariates``); the passes here
are measured without it, and the risk model scores without covariates.

    .venv/bin/python benchmarks/urgent_lane.py [--nodes 12500] [--minutes 2] [--hourly-hours 2]
        [--targeted 5] [--probes 20] [--gap-s 7] [--baseline-src /tmp/base/src]
        [--baseline-probes 10] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry
from sqlalchemy import delete, insert, select
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent))

import background_scale as bg  # noqa: E402
from serverproc import create_token, running_server  # noqa: E402

from fleetwatch.config import ServerSettings  # noqa: E402
from fleetwatch.server.background import BackgroundJobs  # noqa: E402
from fleetwatch.server.db.secret_box import SecretBox  # noqa: E402
from fleetwatch.server.db.session import Database, make_engine  # noqa: E402
from fleetwatch.server.db.tables import (  # noqa: E402
    events,
    evictions,
    gpu_hourly,
    gpus,
    nodes,
)
from fleetwatch.server.repo.sample_reader import newest_block_id  # noqa: E402
from fleetwatch.server.runtime.metric_families import ServerMetrics  # noqa: E402
from fleetwatch.server.runtime.state import save_state  # noqa: E402


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)  # noqa: T201


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def _fatal_xid(db: Database, node: str, at: datetime) -> None:
    """A fatal Xid 79 on the node's GPU 3, stored as ingest stores it."""
    with db.write() as conn:
        gpu = conn.execute(
            select(gpus.c.uuid, gpus.c.node_id, gpus.c.pci_bus_id)
            .join(nodes, nodes.c.id == gpus.c.node_id)
            .where(nodes.c.name == node, gpus.c.index == 3)
        ).one()
        conn.execute(
            insert(events).values(
                node_id=gpu.node_id, gpu_uuid=gpu.uuid, pci_bus_id=gpu.pci_bus_id, kind="xid",
                xid=79, ts=at, received_at=at, message="NVRM: Xid 79, GPU has fallen off the bus",
            )
        )  # fmt: skip


def _clone(admin_url: str, seed_name: str, name: str, run_url: str) -> None:
    """A fresh copy of the template, without rollups (see the module docstring)."""
    bg._clone(admin_url, seed_name, name)
    settings = ServerSettings(database_url=run_url, _env_file=None)  # type: ignore[call-arg]
    db = Database(make_engine(settings))
    with db.write() as conn:
        conn.execute(delete(gpu_hourly))
        newest = newest_block_id(conn)
        save_state(conn, "rollups", {"after_id": newest, "passes": 1}, datetime.now(UTC))
    db.dispose()


def in_process(
    run_url: str, base: datetime, minutes: int, targeted: int, nodes_n: int
) -> dict[str, Any]:
    settings = ServerSettings(database_url=run_url, background_jobs=False, _env_file=None)  # type: ignore[call-arg]
    db = Database(make_engine(settings))
    jobs = BackgroundJobs(
        db,
        settings,
        metrics=ServerMetrics(CollectorRegistry()),
        secrets=SecretBox([]),
        heard_since=base - timedelta(hours=1),
    )
    rows: list[dict[str, Any]] = []

    def whole(label: str, now: datetime) -> None:
        for name, step in (
            ("assessment", lambda: jobs.assessor.run_once(now)),
            ("planner", lambda: jobs.planner.run_once(now)),
            ("alerts", lambda: jobs.alerter.run_once(now)),
        ):
            row = {"phase": label, **bg._timed(name, step)}
            _log(f"  {label:8s} {name:10s} wall {row['wall_s']:7.2f} s  cpu {row['cpu_s']:7.2f} s")
            rows.append(row)

    _log("whole-fleet passes ...")
    whole("first", base + timedelta(seconds=1))
    bg.add_ticks(db, base=base, seconds=30, minutes=minutes)
    whole("steady", base + timedelta(seconds=31))
    _log(f"urgent lane, {targeted} nodes one at a time ...")
    evicted = 0
    for i in range(targeted):
        node = f"gpu-{(1000 + 997 * i) % nodes_n:05d}"
        now = base + timedelta(seconds=32 + i)
        _fatal_xid(db, node, now - timedelta(seconds=1))
        for name, step in (
            ("assessment", lambda n=node, t=now: jobs.assessor.run_nodes({n}, t)),
            ("planner", lambda n=node, t=now: jobs.planner.run_for({n}, t)),
            ("alerts", lambda n=node, t=now: jobs.alerter.run_for({n}, t)),
        ):
            row = {"phase": "urgent", "node": node, **bg._timed(name, step)}
            _log(f"  urgent   {name:10s} wall {row['wall_s']:7.2f} s  cpu {row['cpu_s']:7.2f} s")
            rows.append(row)
        with db.read() as conn:
            evicted += bool(
                conn.execute(select(evictions.c.id).where(evictions.c.node == node)).first()
            )
    db.dispose()
    return {"passes": rows, "targeted_evicted": evicted, "targeted": targeted}


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _fatal_batch(n: int, probe: str) -> dict[str, Any]:
    now = datetime.now(UTC)
    batch = bg._node_batch(n, now).model_dump(mode="json", exclude_none=True)
    batch["batch_id"] = f"urgent-{probe}-{n}-{now.timestamp()}"
    gpu = batch["gpus"][3]
    batch["events"] = [
        {"kind": "xid", "ts": (now - timedelta(milliseconds=50)).isoformat(), "xid": 79,
         "uuid": gpu["uuid"], "pci_bus_id": gpu["pci_bus_id"],
         "message": f"NVRM: Xid (PCI:{gpu['pci_bus_id']}): 79, GPU has fallen off the bus"}
    ]  # fmt: skip
    return batch


def probes(
    run_url: str, label: str, count: int, gap_s: float, first_node: int, src: str | None
) -> dict[str, Any]:
    """Xid-push-to-eviction latency through a real server on ``run_url``."""
    agent = create_token(run_url, "agent", f"bench-agent-{label}")
    reader = create_token(run_url, "read", f"bench-read-{label}")
    env = {
        "FLEETWATCH_SERVER_REFIT_INTERVAL_S": "0",
        "FLEETWATCH_SERVER_METRICS_REQUIRE_TOKEN": "false",
        "FLEETWATCH_SERVER_UNREACHABLE_AFTER_INTERVALS": "1000000",
    }
    if src is not None:
        env["PYTHONPATH"] = src
    latencies: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, running_server(run_url, Path(tmp), 1, env) as server:
        pid = server.process.pid
        push = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {agent}"})
        read = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {reader}"})
        started = time.perf_counter()
        _log(f"{label}: waiting for the server's first passes ...")
        # The leader's first passes (a new leader's rollups and lifetimes are its slowest).
        first = ("assessment", "planner", "alerts", "rollups", "lifecycle")
        while True:
            text = httpx.get(f"{server.url}/metrics", timeout=30).text
            done = {
                line.split('job="')[1].split('"')[0]
                for line in text.splitlines()
                if line.startswith("fleetwatch_background_runs_total{") and float(line.split()[-1])
            }
            if done.issuperset(first):
                break
            time.sleep(2)
        ready_s = time.perf_counter() - started
        _log(f"{label}: first passes done after {ready_s:.0f} s")
        cpu_before, wall_before = _cpu_s(pid), time.perf_counter()
        for i in range(count):
            n = first_node + i
            node = f"gpu-{n:05d}"
            batch = _fatal_batch(n, label)
            sent = time.perf_counter()
            push.post("/v1/ingest", json=batch, timeout=60).raise_for_status()
            while True:
                found = read.get("/v1/evictions", params={"node": node}, timeout=60).json()
                if found["count"]:
                    break
                if time.perf_counter() - sent > 300:
                    raise SystemExit(f"{label}: no eviction of {node} after 300 s")
                time.sleep(0.02)
            latencies.append(time.perf_counter() - sent)
            _log(f"  {label} probe {i + 1}/{count} {node}: {latencies[-1]:.2f} s")
            time.sleep(max(0.0, gap_s - (time.perf_counter() - sent)))
        cpu = _cpu_s(pid) - cpu_before
        wall = time.perf_counter() - wall_before
        metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
        push.close()
        read.close()
    passes = [
        line
        for line in metrics.splitlines()
        if line.startswith("fleetwatch_background_pass_seconds_")
        and ('job="urgent"' in line or 'job="assessment"' in line)
        and ("_sum" in line or "_count" in line)
    ]
    return {
        "label": label,
        "probes": count,
        "p50_s": round(statistics.median(latencies), 3),
        "p99_s": round(_pct(latencies, 99), 3),
        "max_s": round(max(latencies), 3),
        "min_s": round(min(latencies), 3),
        "latencies_s": [round(x, 3) for x in latencies],
        "server_cpu_s": round(cpu, 1),
        "probe_wall_s": round(wall, 1),
        "first_passes_s": round(ready_s, 1),
        "pass_metrics": passes,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=12_500)
    parser.add_argument("--minutes", type=int, default=2)
    parser.add_argument("--hourly-hours", type=int, default=2)
    parser.add_argument("--targeted", type=int, default=5)
    parser.add_argument("--probes", type=int, default=20)
    parser.add_argument("--gap-s", type=float, default=7.0)
    parser.add_argument("--baseline-src", default=None)
    parser.add_argument("--baseline-probes", type=int, default=10)
    parser.add_argument("--skip-in-process", action="store_true")
    parser.add_argument("--reseed", action="store_true")
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--database-url",
        default=os.environ.get(
            "FLEETWATCH_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    parser.add_argument("--seed-name", default="wt_urgent_seed")
    parser.add_argument("--db-name", default="wt_urgent")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes on databases of its own, dropped after"
    )
    args = parser.parse_args(argv)
    if args.smoke:  # never the templates a real run reuses
        args.nodes, args.minutes, args.hourly_hours, args.targeted, args.probes = 3, 1, 1, 1, 1
        args.gap_s, args.reseed = 1.0, True
        args.db_name, args.seed_name = (f"fw_smoke_ul{os.getpid()}{s}" for s in ("", "_seed"))
    try:
        run(args)
    finally:
        if args.smoke:
            bg.drop_databases(args.database_url, (args.db_name, args.seed_name))


def run(args: argparse.Namespace) -> None:
    server = make_url(ServerSettings(database_url=args.database_url, _env_file=None).database_url)  # type: ignore[call-arg]
    admin_url = server.set(database="postgres").render_as_string(hide_password=False)
    seed_url = server.set(database=args.seed_name).render_as_string(hide_password=False)
    run_url = server.set(database=args.db_name).render_as_string(hide_password=False)
    info = bg._ensure_template(args, admin_url, seed_url)
    base = datetime.fromisoformat(info["base"])
    result: dict[str, Any] = {"machine": bg._machine(), "seed": info}
    if not args.skip_in_process:
        _clone(admin_url, args.seed_name, args.db_name, run_url)
        result["in_process"] = in_process(
            run_url, base, info["minutes"], args.targeted, info["nodes"]
        )
    runs = [("lane", args.probes, None)]
    if args.baseline_src:
        runs.append(("baseline", args.baseline_probes, args.baseline_src))
    result["latency"] = []
    for label, count, src in runs:
        _clone(admin_url, args.seed_name, args.db_name, run_url)
        result["latency"].append(probes(run_url, label, count, args.gap_s, 2000, src))
        _log(json.dumps({k: v for k, v in result["latency"][-1].items() if k != "latencies_s"}))
    text = json.dumps(result, indent=2, default=str)
    if args.json:
        Path(args.json).write_text(text)
    print(text)  # noqa: T201


if __name__ == "__main__":
    main()
