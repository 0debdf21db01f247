"""Notice-to-client latency (issue 15): a fatal Xid line appended to a kernel log that a real
agent follows, until a running job's StepReporter hears the notice.

Per trial: an Xid 79 line is appended; the agent pushes it at once; the batch wakes the server's
assessment, the leader's planner drains the node and derives the job's notices right after; the
reporter's long-poll (``GET /v1/jobs/{id}/notices?wait=30``) is woken and ``on_notice`` fires. The
time from the append to the first new ``drain_pending`` or ``gpu_out`` notice is measured. Then
the scheduler acks, completes and returns the node (cooldown 0), which clears the drain notice,
so the next line opens a new one. Default timers (assessment 30 s, planner 10 s): only wake-ups
make it fast.

    .venv/bin/python benchmarks/notices.py [--trials 30]
        [--database-url postgresql://postgres@127.0.0.1:5432/EMPTY_DB]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from agent import run_agent  # noqa: E402
from tests.factories import make_validation  # noqa: E402
from tests.integration.live import create_token, live_server  # noqa: E402

from fleetwatch.client import StepReporter  # noqa: E402
from fleetwatch.config import ServerSettings  # noqa: E402
from fleetwatch.server.db.migrate import upgrade  # noqa: E402
from fleetwatch.server.db.session import make_engine  # noqa: E402

NODE = "bench-node"


def xid79(i: int) -> str:
    return (f"[{3000 + i}.000000] NVRM: Xid (PCI:0000:18:00): 79, pid={70_000 + i}"
            ", name=bench, GPU has fallen off the bus.\n")  # fmt: skip


def trials(url: str, tmp: Path, count: int, timeout_s: float = 30.0) -> list[float]:
    upgrade(make_engine(ServerSettings(database_url=url)))
    agent_token = create_token(url, "agent", "bench-agent")
    sched_token = create_token(url, "scheduler", "bench-sched")
    for name in ("ASSESS_INTERVAL_S", "PLANNER_INTERVAL_S"):
        os.environ.pop(f"FLEETWATCH_SERVER_{name}", None)
    for name, value in {"EVICTION_COOLDOWN_S": "0", "REFIT_INTERVAL_S": "0"}.items():
        os.environ[f"FLEETWATCH_SERVER_{name}"] = value
    heard: list[tuple[float, dict[str, Any]]] = []
    arrived = threading.Condition()

    def on_notice(notice: dict[str, Any]) -> None:
        with arrived:
            heard.append((time.perf_counter(), notice))
            arrived.notify_all()

    latencies: list[float] = []
    with (
        live_server(url, tmp) as server,
        server.client(sched_token) as sched,
        server.client(agent_token) as node,
    ):
        agent = run_agent(server.url, agent_token, 10.0, tmp / "agent", 50.0)
        log = tmp / "agent" / "kern.log"
        reporter = StepReporter(server.url, agent_token, "bench-job", rank=0, node=NODE,
                                flush_interval_s=0.2, on_notice=on_notice)  # fmt: skip
        try:
            reporter.start(nodes=[NODE], started_at=datetime.now(UTC))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not sched.get("/v1/nodes").json()["count"]:
                time.sleep(0.2)
            for i in range(count):
                with arrived:
                    seen = len(heard)
                with log.open("a") as f:
                    f.write(xid79(i))
                written = time.perf_counter()
                with arrived:
                    arrived.wait_for(
                        lambda seen=seen: any(  # type: ignore[misc]
                            n["kind"] in ("drain_pending", "gpu_out") for _, n in heard[seen:]
                        ),
                        timeout=timeout_s,
                    )
                    new = [(t, n) for t, n in heard[seen:] if n["kind"] != "cleared"]
                if not new:
                    latencies.append(float("inf"))
                    print(f"trial {i}: no notice within {timeout_s:.0f} s", flush=True)
                    continue
                latencies.append(new[0][0] - written)
                print(f"trial {i}: {latencies[-1] * 1000:.0f} ms ({new[0][1]['kind']})", flush=True)
                pending = sched.get("/v1/evictions", params={"state": "pending"}).json()["data"]
                for eviction in pending:
                    for step in ("ack", "complete"):
                        sched.post(f"/v1/evictions/{eviction['id']}/{step}").raise_for_status()
                    # A node drained for a hardware reason returns after a passing validation.
                    node.post(
                        f"/v1/nodes/{NODE}/validations", json=make_validation(NODE, gpus=8)
                    ).raise_for_status()
                    sched.post(
                        f"/v1/nodes/{NODE}/return", json={"note": "reset"}
                    ).raise_for_status()
                time.sleep(0.5)  # the return's clearing reaches the reporter before the next line
        finally:
            reporter.close(timeout_s=5)
            agent.terminate()
            agent.wait(timeout=20)
    return latencies


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--database-url", help="an empty PostgreSQL database (default: SQLite)")
    parser.add_argument("--smoke", action="store_true", help="two trials, for the test suite")
    args = parser.parse_args(argv)
    if args.smoke:
        args.trials = 2
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        url = args.database_url or f"sqlite:///{tmp / 'notices.db'}"
        ordered = sorted(trials(url, tmp, args.trials))
        if args.smoke and ordered[-1] == float("inf"):
            sys.exit("smoke: a trial's notice never came")
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        print(f"Xid line -> notice at the job's StepReporter ({len(ordered)} trials, "
              f"{url.split(':')[0]}): p50 {statistics.median(ordered) * 1000:.0f} ms, "
              f"p90 {ordered[int(0.9 * (len(ordered) - 1))] * 1000:.0f} ms, "
              f"p99 {p99 * 1000:.0f} ms, max {ordered[-1] * 1000:.0f} ms, "
              f"min {ordered[0] * 1000:.0f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
