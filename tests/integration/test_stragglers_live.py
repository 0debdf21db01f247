"""Straggler statistics from several server processes equal those from one.

The same step reports (8 nodes of 2 ranks, a step every 0.5 s for 240 s of job time, one node
1.5x slow from the job's 60th second) go once to a single `fleetwatch server` and once, batch by
batch in turn, to three processes ([api, all, worker]) on one PostgreSQL, whose leader is killed
with kill -9 halfway through. The verdicts (GET /v1/stragglers), the job's last
window (GET /v1/jobs/{id}) and each node's cross-job slowness (windows counted and score, in the
database: no read API shows the count) must come out the same.

Not compared: ``updated_at`` (the wall clock of the pass) and a verdict's
``evidence.node_slowness``, the node's score as it stood when the verdict opened, which depends
on how windows fell into the detector's passes, in one process as well.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.faults.waiting import wait_for
from tests.integration.cluster import Fleet, kill_leader, report, runs, start, the_leader
from tests.integration.live import LiveServer, create_token

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

NODES, RANKS_PER_NODE, SLOW_NODE = 8, 2, 5
PERIOD_S, WINDOW_S, WINDOWS = 0.5, 10, 24


@pytest.fixture
def pg_db(migrated_postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    for name, value in {
        "STRAGGLER_INTERVAL_S": "1",
        "ASSESS_INTERVAL_S": "3600",  # nothing else to do: these jobs idle
        "PLANNER_INTERVAL_S": "3600",
        "ALERT_INTERVAL_S": "3600",
        "ROLLUP_INTERVAL_S": "3600",
        "LIFECYCLE_INTERVAL_S": "3600",
        "REFIT_INTERVAL_S": "0",
        "METRICS_REQUIRE_TOKEN": "false",  # polled often for the leader and its passes
    }.items():
        monkeypatch.setenv(f"FLEETWATCH_SERVER_{name}", value)
    return migrated_postgres_url


@pytest.fixture
def fleet(pg_db: str) -> Iterator[Fleet]:
    counts = Fleet(pg_db)
    yield counts
    counts.dispose()


def simulated_steps(seed: int = 5) -> list[list[tuple[int, int, int, float, float]]]:
    """Per 10 s window of job time: (rank, node index, step, duration ms, seconds into the job).
    Log-normal step times around 500 ms with a per-rank offset, 1 % of steps 3x slow."""
    rng = random.Random(seed)
    ranks = NODES * RANKS_PER_NODE
    offset = [rng.lognormvariate(0.0, 0.01) for _ in range(ranks)]
    windows = []
    for w in range(WINDOWS):
        rows = []
        for i in range(int(WINDOW_S / PERIOD_S)):
            t = w * WINDOW_S + i * PERIOD_S
            for rank in range(ranks):
                node = rank // RANKS_PER_NODE
                d = 500.0 * offset[rank] * rng.lognormvariate(0.0, 0.03)
                d *= 1.5 if node == SLOW_NODE and t >= 60 else 1.0
                d *= 3.0 if rng.random() < 0.01 else 1.0
                rows.append((rank, node, int(t / PERIOD_S), round(d, 3), t))
        windows.append(rows)
    return windows


def batches(prefix: str, start: datetime) -> list[list[dict[str, Any]]]:
    return [
        [{"rank": rank, "node": f"{prefix}-n{node:02d}", "step": step, "duration_ms": d,
          "ts": (start + timedelta(seconds=t + d / 1000)).isoformat()}
         for rank, node, step, d, t in window]
        for window in simulated_steps()
    ]  # fmt: skip


class Run:
    """One run's job ``<prefix>-job`` on nodes ``<prefix>-n00``...; its results with the prefix
    taken out, so that two runs compare."""

    def __init__(self, prefix: str, start: datetime, url: str) -> None:
        self.prefix, self.job = prefix, f"{prefix}-job"
        self.batches = batches(prefix, start)
        self.agent = create_token(url, "agent", f"{prefix}-steps")
        self.read = create_token(url, "read", f"{prefix}-read")
        self.nodes = [f"{prefix}-n{i:02d}" for i in range(NODES)]

    def post(self, servers: list[LiveServer], batches: list[list[dict[str, Any]]]) -> None:
        """One batch at a time, in order, each to the next server in turn."""
        for i, steps in enumerate(batches):
            server = servers[i % len(servers)]
            with server.client(self.agent) as client:
                answer = client.post(f"/v1/jobs/{self.job}/steps", json={"steps": steps})
                assert answer.status_code == 200, answer.text

    def _plain(self, value: Any) -> Any:
        if isinstance(value, str):
            return value.replace(self.prefix, "RUN")
        if isinstance(value, list):
            return [self._plain(v) for v in value]
        if isinstance(value, dict):
            return {self._plain(k): self._plain(v) for k, v in value.items()}
        return value

    def results(self, server: LiveServer, fleet: Fleet) -> dict[str, Any]:
        with server.client(self.read) as read:
            found = read.get("/v1/stragglers", params={"job": self.job})
            detail = read.get(f"/v1/jobs/{self.job}")
        assert found.status_code == detail.status_code == 200, (found.text, detail.text)
        verdicts = [_verdict(v) for v in found.json()["data"]]
        job = detail.json()
        job["stragglers"] = [_verdict(v) for v in job["stragglers"]]
        stored = fleet.slowness(self.nodes)
        slowness = {n: {"windows": w, "score": s} for n, (w, s) in stored.items()}
        return self._plain(
            {"verdicts": sorted(verdicts, key=str), "job": job, "node_slowness": slowness}
        )


def _verdict(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in row.items() if k not in ("id", "updated_at")}
    out["evidence"] = {k: v for k, v in (row["evidence"] or {}).items() if k != "node_slowness"}
    return out


def judged(leader: LiveServer) -> None:
    """Wait for two more passes of the leader's straggler detector: one began after the last
    batch was stored."""
    before = runs(leader, "stragglers")
    wait_for(f"two straggler passes on {leader.url}",
             lambda: runs(leader, "stragglers") >= before + 2)  # fmt: skip


def summary(name: str, found: dict[str, Any]) -> None:
    verdicts = [(v["node"], v["kind"], v["windows"], round(v["ratio"], 3), v["ended_at"])
                for v in found["verdicts"]]  # fmt: skip
    slowness = {n.split("-")[-1]: (s["windows"], round(s["score"], 4))
                for n, s in sorted(found["node_slowness"].items())}  # fmt: skip
    report(f"{name}: verdicts {verdicts}; node_slowness (windows, score) {slowness}")


def test_straggler_statistics_from_three_processes_equal_one_process(
    pg_db: str, fleet: Fleet, tmp_path: Path
) -> None:
    # One run with the leader killed halfway: its first half is the three processes' run without
    # a kill (a variant of its own cost a minute of a loaded suite), its second half the
    # successor's.
    tag = "k"
    start_at = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)
    one, three = Run(f"{tag}1", start_at, pg_db), Run(f"{tag}3", start_at, pg_db)
    with ExitStack() as stack:
        [server] = start(stack, pg_db, tmp_path, ["all"])
        the_leader([server])
        one.post([server], one.batches)
        judged(server)
        alone = one.results(server, fleet)
    summary("one process", alone)
    assert [(v["node"], v["kind"]) for v in alone["verdicts"]] == [
        (f"RUN-n{SLOW_NODE:02d}", "hardware")
    ], alone["verdicts"]

    with ExitStack() as stack:
        servers = start(stack, pg_db, tmp_path, ["api", "all", "worker"])
        leader = the_leader(servers)
        half = len(three.batches) // 2
        three.post(servers, three.batches[:half])
        judged(leader)
        kill_leader(leader)
        servers = [s for s in servers if s is not leader]
        leader = the_leader(servers)
        report(f"three processes: leader killed after {half} of {len(three.batches)} batches")
        three.post(servers, three.batches[half:])
        judged(leader)
        spread = three.results(servers[0], fleet)
    summary("three processes", spread)
    assert spread["node_slowness"] == alone["node_slowness"]
    assert spread["verdicts"] == alone["verdicts"]
    assert spread["job"] == alone["job"]
