"""How fast schedulers read evictions, and how fast a fatal Xid becomes one.

1. ``GET /v1/evictions?state=pending`` p50/p99 against a real server process over loopback, with
   ``--nodes`` nodes (default 10,000) and as many evictions seeded directly: 5 % pending (the
   default drain budget) and the rest history (returned, rejected, cancelled), each with a rule
   verdict's evidence (~1 KB). Side by side: ``GET /healthz`` (the HTTP floor), ``limit=50``, one
   eviction with its audit trail.
2. End to end (``--trials``, default 50): an Xid 79 line appended to a kernel log file that a real
   agent process follows (fake NVML with 8 GPUs, as in ``benchmarks/agent.py``), pushed at once,
   judged by the server's background assessment, turned into an eviction by the planner, until it
   shows at ``GET /v1/evictions?state=pending``. Assessment and planner on their default timers
   (30 s and 10 s): the batch carrying the Xid wakes them. After each trial the scheduler acks,
   completes and returns the node (cooldown 0), so the next Xid drains it again.

    .venv/bin/python benchmarks/evictions.py [--nodes 10000] [--requests 300] [--trials 50]
        [--database-url postgresql://postgres@127.0.0.1:5432/EMPTY_DB]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import insert

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from agent import run_agent  # noqa: E402
from tests.factories import make_validation  # noqa: E402
from tests.integration.live import create_token, live_server  # noqa: E402

from fleetwatch.config import ServerSettings  # noqa: E402
from fleetwatch.server.db.migrate import upgrade  # noqa: E402
from fleetwatch.server.db.session import Database, make_engine  # noqa: E402
from fleetwatch.server.db.tables import eviction_audit, evictions, nodes  # noqa: E402

_EVIDENCE = {
    "gpus": [{
        "uuid": "GPU-5e1d0000-0000-0000-0000-000000000000", "index": 3, "serial": "1652823011234",
        "verdicts": [{
            "kind": "xid", "rule": "xid_79", "severity": "fatal", "action": "drain_reset",
            "xids": [79], "source": "xid_catalog.csv:79", "first_seen": "2026-11-30T05:00:03+00:00",
            "last_seen": "2026-11-30T05:00:03+00:00", "note": "GPU has fallen off the bus.",
            "evidence": {"count": 1, "event_counts": {"79": 1}, "follow_ons": {},
                         "timestamps": ["2026-11-30T05:00:03+00:00"], "processes": ["python"],
                         "known": True},
        }],
    }],
    "node_gpus": 8,
}  # fmt: skip


def seed(db: Database, count: int) -> None:
    now = datetime.now(UTC)
    pending = max(1, count * 5 // 100)
    history = ("returned", "rejected", "cancelled")
    node_rows, eviction_rows = [], []
    for i in range(count):
        name = f"gpu-node-{i:05d}"
        node_rows.append({"name": name, "labels": {"rack": f"r{i // 32}"}, "interval_s": 10.0,
                          "first_seen": now, "last_seen": now})  # fmt: skip
        state = "pending" if i < pending else history[i % 3]
        at = now - timedelta(minutes=i % 600)
        eviction_rows.append({
            "node": name, "state": state, "reason_kind": "rule",
            "reason": "xid_79 on GPU 3 (GPU-5e1d...): fatal, drain_reset", "evidence": _EVIDENCE,
            "expected_saving_usd": 880.0, "dry_run": False, "created_at": at, "updated_at": at,
            "returned_at": at if state == "returned" else None,
        })  # fmt: skip
    with db.write() as conn:
        conn.execute(insert(nodes), node_rows)
        conn.execute(insert(evictions), eviction_rows)
        conn.execute(insert(eviction_audit), [
            {"eviction_id": i + 1, "node": r["node"], "ts": r["created_at"], "from_state": None,
             "to_state": "pending", "actor": "planner", "detail": None}
            for i, r in enumerate(eviction_rows)
        ])  # fmt: skip


def _timed(client: httpx.Client, path: str, params: dict[str, str] | None = None) -> float:
    started = time.perf_counter()
    client.get(path, params=params).raise_for_status()
    return time.perf_counter() - started


def _pcts(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return f"p50 {statistics.median(ordered) * 1000:8.1f} ms  p99 {p99 * 1000:8.1f} ms"


def list_latency(url: str, tmp: Path, count: int, requests: int) -> None:
    db = Database(make_engine(ServerSettings(database_url=url)))
    upgrade(db.engine)
    started = time.perf_counter()
    seed(db, count)
    print(f"seeded {count} nodes and evictions in {time.perf_counter() - started:.1f} s")
    db.dispose()
    token = create_token(url, "scheduler", "bench-sched")
    with live_server(url, tmp) as server, server.client(token) as client:
        pending = client.get("/v1/evictions", params={"state": "pending"}).json()
        size = len(client.get("/v1/evictions", params={"state": "pending"}).content)
        print(f"GET /v1/evictions?state=pending: {pending['count']} rows, {size / 1024:.0f} KiB")
        one = pending["data"][0]["id"]
        for _ in range(20):
            _timed(client, "/v1/evictions", {"state": "pending"})  # warm up
        rows = {
            "GET /healthz (HTTP floor)": lambda: _timed(client, "/healthz"),
            "GET /v1/evictions?state=pending": lambda: _timed(
                client, "/v1/evictions", {"state": "pending"}
            ),
            "GET /v1/evictions?state=pending&limit=50": lambda: _timed(
                client, "/v1/evictions", {"state": "pending", "limit": "50"}
            ),
            "GET /v1/evictions/{id} (with audit)": lambda: _timed(client, f"/v1/evictions/{one}"),
        }
        for name, call in rows.items():
            print(f"{name:42s} {_pcts([call() for _ in range(requests)])}  ({requests} requests)")


def kernel_line_trials(
    url: str, tmp: Path, trials: int, lines: Callable[[int], str], timeout_s: float
) -> list[tuple[float, dict[str, Any] | None]]:
    """A real agent follows a kernel log; per trial, ``lines(i)`` is appended and the time until a
    new eviction is pending at ``GET /v1/evictions`` is measured (``inf`` and ``None`` if none
    within ``timeout_s``); the eviction is then acked, completed, a passing validation pushed
    (a node drained for a hardware reason returns only after one) and the node returned."""
    upgrade(make_engine(ServerSettings(database_url=url)))
    agent_token = create_token(url, "agent", "bench-agent")
    sched_token = create_token(url, "scheduler", "bench-sched-e2e")
    # Default assessment and planner timers (30 s, 10 s): the batch carrying the line wakes them.
    for name in ("ASSESS_INTERVAL_S", "PLANNER_INTERVAL_S"):
        os.environ.pop(f"FLEETWATCH_SERVER_{name}", None)
    for name, value in {"EVICTION_COOLDOWN_S": "0", "REFIT_INTERVAL_S": "0"}.items():
        os.environ[f"FLEETWATCH_SERVER_{name}"] = value
    results: list[tuple[float, dict[str, Any] | None]] = []
    with (
        live_server(url, tmp) as server,
        server.client(sched_token) as sched,
        server.client(agent_token) as node,
    ):
        agent = run_agent(server.url, agent_token, 10.0, tmp / "agent", 50.0)
        log = tmp / "agent" / "kern.log"
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # the agent's first batch names its GPUs
                if sched.get("/v1/nodes").json()["count"]:
                    break
                time.sleep(0.2)
            seen: set[int] = set()
            for i in range(trials):
                with log.open("a") as f:
                    f.write(lines(i))
                written = time.perf_counter()
                found = None
                while time.perf_counter() - written < timeout_s and found is None:
                    data = sched.get("/v1/evictions", params={"state": "pending"}).json()["data"]
                    found = next((e for e in data if e["id"] not in seen), None)
                    if found is None:
                        time.sleep(0.01)
                if found is None:
                    results.append((float("inf"), None))
                    continue
                results.append((time.perf_counter() - written, found))
                seen.add(found["id"])
                for step in ("ack", "complete"):
                    sched.post(f"/v1/evictions/{found['id']}/{step}").raise_for_status()
                node.post(
                    "/v1/nodes/bench-node/validations", json=make_validation("bench-node", gpus=8)
                ).raise_for_status()
                sched.post("/v1/nodes/bench-node/return", json={"note": "reset"}).raise_for_status()
                time.sleep(0.2)
        finally:
            agent.terminate()
            agent.wait(timeout=20)
    return results


def end_to_end(url: str, tmp: Path, trials: int) -> list[float]:
    def xid79(i: int) -> str:
        return (f"[{2000 + i}.000000] NVRM: Xid (PCI:0000:18:00): 79, pid={60_000 + i}"
                ", name=bench, GPU has fallen off the bus.\n")  # fmt: skip

    latencies = [seconds for seconds, _ in kernel_line_trials(url, tmp, trials, xid79, 30.0)]
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    print(f"Xid line -> pending eviction at the API ({len(latencies)} trials): "
          f"p50 {statistics.median(ordered) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, "
          f"max {ordered[-1] * 1000:.0f} ms, min {ordered[0] * 1000:.0f} ms")  # fmt: skip
    return latencies


def killed_agent(url: str, tmp: Path, trials: int, interval: float = 2.0) -> list[float]:
    """A real agent pushing every ``interval`` s is killed (SIGKILL): time until the node shows
    unreachable at ``GET /v1/nodes`` and until its eviction is pending, in push intervals."""
    upgrade(make_engine(ServerSettings(database_url=url)))
    agent_token = create_token(url, "agent", "bench-agent-kill")
    sched_token = create_token(url, "scheduler", "bench-sched-kill")
    for name in ("ASSESS_INTERVAL_S", "PLANNER_INTERVAL_S"):  # default timers
        os.environ.pop(f"FLEETWATCH_SERVER_{name}", None)
    unreachable: list[float] = []
    evicted: list[float] = []
    with live_server(url, tmp) as server, server.client(sched_token) as api:
        for i in range(trials):
            agent = run_agent(server.url, agent_token, interval, tmp / f"kill-{i}", 50.0)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # up, with a fresh report
                node = api.get("/v1/nodes/bench-node")
                if node.status_code == 200 and node.json()["state"] == "up":
                    pending = api.get("/v1/evictions", params={"state": "pending"}).json()
                    if not pending["count"]:
                        break
                time.sleep(0.2)
            time.sleep(interval * 1.5)
            last = datetime.fromisoformat(api.get("/v1/nodes/bench-node").json()["last_seen"])
            agent.kill()
            agent.wait()
            killed = time.perf_counter()
            seen_unreachable = seen_evicted = None
            while time.perf_counter() - killed < 30 * interval and seen_evicted is None:
                now = time.perf_counter()
                if seen_unreachable is None:
                    if api.get("/v1/nodes/bench-node").json()["state"] == "unreachable":
                        seen_unreachable = now
                data = api.get("/v1/evictions", params={"state": "pending"}).json()["data"]
                if any(e["reason"].startswith("node_unreachable") for e in data):
                    seen_evicted = now
                time.sleep(0.05)
            # Measured from the last report the server had, in push intervals.
            since_last = (datetime.now(UTC) - last).total_seconds() - (time.perf_counter() - killed)
            for seen, out in ((seen_unreachable, unreachable), (seen_evicted, evicted)):
                out.append(math.inf if seen is None else (seen - killed + since_last) / interval)
    for name, values in (("node unreachable", unreachable), ("eviction pending", evicted)):
        ordered = sorted(values)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        print(f"killed agent -> {name:17s} ({len(values)} trials, push interval {interval:g} s): "
              f"p50 {statistics.median(ordered):.2f}, p99 {p99:.2f}, "
              f"max {ordered[-1]:.2f} intervals after its last report")  # fmt: skip
    return evicted


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--kill-trials", type=int, default=10)
    parser.add_argument("--database-url", help="an empty PostgreSQL database (default: SQLite)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = parser.parse_args(argv)
    if args.smoke:
        args.nodes, args.requests, args.trials, args.kill_trials = 40, 3, 2, 1
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        # Background jobs slow for the read benchmark: the planner would cancel nothing here
        # (the seeded nodes have no GPUs), but its passes are not what is measured.
        os.environ["FLEETWATCH_SERVER_ASSESS_INTERVAL_S"] = "3600"
        os.environ["FLEETWATCH_SERVER_PLANNER_INTERVAL_S"] = "3600"
        os.environ["FLEETWATCH_SERVER_REFIT_INTERVAL_S"] = "0"
        url = args.database_url or f"sqlite:///{tmp / 'evictions.db'}"
        list_latency(url, tmp, args.nodes, args.requests)
        latencies = (
            end_to_end(f"sqlite:///{tmp / 'e2e.db'}", tmp, args.trials) if args.trials else []
        )
        if args.kill_trials:
            latencies += killed_agent(f"sqlite:///{tmp / 'kill.db'}", tmp, args.kill_trials)
    if args.smoke and math.inf in latencies:
        sys.exit("smoke: a trial's eviction never came")


if __name__ == "__main__":
    main()
