"""A simulated quarter through the real API: availability, refused returns, repeat offenders.

91 days of a fleet (default 256 nodes x 8 GPUs). Which GPU fails when is the simulator's ground
truth (:mod:`fleetwatch.sim`, ``monthly_failure_prob`` as given); on top of it the script plays
the people and the scheduler, with its own seeded random numbers:

- a GPU failure of a node in service: a fatal Xid 79 pushed to ``POST /v1/ingest`` as the
  node's agent would, then the urgent lane's passes at that minute (``Assessor.run_nodes`` and
  ``EvictionPlanner.run_for``, what the server runs on a fatal Xid; drain budget 100 %: every
  failure is drained), which create the ``rule`` eviction and mark a repeat offender; acked
  after 5 min and completed after 15 min through ``POST /v1/evictions/{id}/ack|complete``; a
  failure of a node already out of service is folded into that outage;
- repair: 4 to 48 h (uniform), then ``POST /v1/nodes/{name}/validations``; ``--imperfect`` of
  repairs (default 20 %) leave rows pending remap: the validation fails, the return is refused
  (409, counted), another 2 to 12 h of repair, a passing validation, the return accepted;
- ``--flaky`` of returned nodes (default 15 %) fail again 1 to 25 days after their return
  (injected, beside the simulator's own failures): repeat offenders;
- maintenance windows through ``POST /v1/maintenance``: ``--windows-per-month`` (default 4), each
  over 4 to 12 nodes for 2 to 8 h, leaving out nodes out of service then (so planned and
  unplanned never overlap);
- jobs through ``POST /v1/jobs/{id}/start|end``: 2,000 over the quarter on 2 to 32 nodes in
  service, 6 to 72 h each; a job one of whose nodes fails ends ``failed`` 2 min after the failure
  (interrupted by hardware), 3 % fail on their own, 2 % are cancelled, the rest complete.

Every time is a whole minute. The server's clock (``utcnow``) is injected: each call runs at its
simulated time. Then ``GET /v1/availability`` over the quarter is printed beside the same figures
computed independently: minute-by-minute sampling of the script's own timeline (numpy masks of
node x minute), by FleetWatch's definitions (unplanned = drain completed -> returned). Also
printed: the unplanned downtime counted from the failure itself (the 15 min before the drain
completes is downtime FleetWatch does not count without the GPU-failure lifetimes, which this
script does not feed), refused returns, and repeat offenders found against those in the timeline.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/quarter.py [--nodes 256] [--seed 14]``.
"""

from __future__ import annotations

import argparse
import platform
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.factories import make_batch  # noqa: E402  (the tests' agent batches)

MIN = timedelta(minutes=1)
SINCE = datetime(2026, 7, 6, tzinfo=UTC)
DAYS = 91
UNTIL = SINCE + timedelta(days=DAYS)
REPEAT_DAYS = 30.0
VALIDATION_CHECKS = (
    "nvml.remapped_rows",
    "nvml.ecc_volatile",
    "nvml.pcie_link",
    "nvml.clocks_idle",
)


def _minute(t: datetime) -> datetime:
    return SINCE + MIN * ((t - SINCE) // MIN)


@dataclass
class Outage:
    node: str
    failed: datetime
    completed: datetime
    returned: datetime
    imperfect: bool
    refused_at: datetime | None
    injected_repeat: bool
    repeat: bool = False  # within REPEAT_DAYS of the node's previous return


@dataclass
class Timeline:
    outages: list[Outage] = field(default_factory=list)
    windows: list[tuple[list[str], datetime, datetime]] = field(default_factory=list)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    folded: int = 0


def build_timeline(args: argparse.Namespace) -> tuple[list[str], Timeline]:
    from fleetwatch.sim.fleet import SimFleet
    from fleetwatch.sim.spec import FleetSpec

    spec = FleetSpec(
        seed=args.seed,
        nodes=args.nodes,
        gpus_per_node=args.gpus,
        horizon_days=DAYS,
        start=SINCE,
        real_start=SINCE,
        failures={"monthly_failure_prob": args.monthly_failure_prob},
    )
    fleet = SimFleet(spec)
    rng = random.Random(args.seed)
    nodes = fleet.node_names()
    truth = Timeline()
    for plan in fleet.plans:
        pending = sorted(
            (SINCE + timedelta(seconds=g.fate.failure_s), False)
            for g in plan.gpus
            if g.fate.failure_s is not None and 0 <= g.fate.failure_s < DAYS * 86400
        )
        last_return: datetime | None = None
        out_until = SINCE
        while pending:
            failed, injected = pending.pop(0)
            failed = _minute(failed)
            if failed < out_until or failed + timedelta(minutes=15) >= UNTIL:
                truth.folded += failed < out_until
                continue
            imperfect = rng.random() < args.imperfect
            repaired = failed + timedelta(minutes=15) + MIN * rng.randint(4 * 60, 48 * 60)
            refused_at = repaired if imperfect else None
            returned = repaired + MIN * rng.randint(2 * 60, 12 * 60) if imperfect else repaired
            outage = Outage(
                plan.name,
                failed,
                failed + timedelta(minutes=15),
                returned,
                imperfect,
                refused_at,
                injected,
                repeat=last_return is not None
                and failed - last_return <= timedelta(days=REPEAT_DAYS),
            )
            truth.outages.append(outage)
            out_until = returned
            last_return = returned
            if rng.random() < args.flaky:
                again = returned + MIN * rng.randint(1 * 1440, 25 * 1440)
                pending.append((again, True))
                pending.sort()
    down: dict[str, list[tuple[datetime, datetime]]] = {n: [] for n in nodes}
    for o in truth.outages:
        down[o.node].append((o.failed, o.returned))

    def in_service(node: str, a: datetime, b: datetime) -> bool:
        return not any(s < b and a < e for s, e in down[node])

    for _ in range(round(args.windows_per_month * DAYS / 30.4)):
        start = SINCE + MIN * rng.randint(60, (DAYS - 1) * 1440)
        end = start + MIN * rng.randint(2 * 60, 8 * 60)
        chosen = [n for n in rng.sample(nodes, rng.randint(4, 12)) if in_service(n, start, end)]
        chosen = [
            n
            for n in chosen
            if not any(
                n in w[0] and s < end and start < e for w in truth.windows for s, e in [w[1:]]
            )
        ]
        if chosen:
            truth.windows.append((chosen, start, end))
            for n in chosen:
                down[n].append((start, end))
    for j in range(args.jobs):
        start = SINCE + MIN * rng.randint(0, (DAYS - 3) * 1440)
        end = start + MIN * rng.randint(6 * 60, 72 * 60)
        free = [n for n in nodes if in_service(n, start, start + MIN)]
        on = rng.sample(free, min(len(free), rng.randint(2, 32)))
        cut = min(
            (o.failed for o in truth.outages if o.node in on and start < o.failed < end),
            default=None,
        )
        if cut is not None:
            outcome, end, hardware = "failed", cut + 2 * MIN, True
        else:
            draw = rng.random()
            outcome = "failed" if draw < 0.03 else "cancelled" if draw < 0.05 else "completed"
            hardware = False
        truth.jobs.append(
            {
                "id": f"q-{j:05d}",
                "nodes": on,
                "start": start,
                "end": end,
                "outcome": outcome,
                "hardware": hardware,
            }
        )
    return nodes, truth


def independent(nodes: list[str], truth: Timeline) -> dict[str, Any]:
    """The quarter's figures by sampling every node's state at every minute."""
    minutes = DAYS * 1440
    index = {n: i for i, n in enumerate(nodes)}
    planned = np.zeros((len(nodes), minutes), dtype=bool)
    drained = np.zeros((len(nodes), minutes), dtype=bool)
    from_failure = np.zeros((len(nodes), minutes), dtype=bool)

    def span(a: datetime, b: datetime) -> slice:
        return slice(max(0, (a - SINCE) // MIN), min(minutes, (b - SINCE) // MIN))

    for chosen, a, b in truth.windows:
        for n in chosen:
            planned[index[n], span(a, b)] = True
    for o in truth.outages:
        drained[index[o.node], span(o.completed, o.returned)] = True
        from_failure[index[o.node], span(o.failed, o.returned)] = True
    unplanned = drained & ~planned
    hours = len(nodes) * minutes / 60
    planned_h, unplanned_h = planned.sum() / 60, unplanned.sum() / 60
    up_h = hours - planned_h - unplanned_h
    # Episodes: runs of unplanned minutes; begun in the quarter, and ended in it (lengths).
    padded = np.pad(unplanned, ((0, 0), (1, 1)))
    edges = np.diff(padded.astype(np.int8), axis=1)
    starts, ends = np.nonzero(edges == 1), np.nonzero(edges == -1)
    lengths = ends[1] - starts[1]
    ended = ends[1] < minutes
    failures = int(len(starts[1]))
    ended_jobs = [j for j in truth.jobs if j["end"] < UNTIL]
    done = sum(j["outcome"] == "completed" for j in ended_jobs)
    failed = sum(j["outcome"] == "failed" for j in ended_jobs)
    return {
        "node_hours": hours,
        "up_h": up_h,
        "planned_down_h": planned_h,
        "unplanned_down_h": unplanned_h,
        "infrastructure_availability": up_h / hours,
        "workload_availability": up_h / (hours - planned_h),
        "failures": failures,
        "mtbf_h": up_h / failures if failures else None,
        "mttr_h": float(lengths[ended].mean()) / 60 if ended.any() else None,
        "jobs_completed": done,
        "jobs_failed": failed,
        "success_rate": done / (done + failed) if done + failed else None,
        "interrupted_by_hardware": sum(j["hardware"] for j in ended_jobs),
        "unplanned_from_failure_h": (from_failure & ~planned).sum() / 60,
    }


class Clock:
    def __init__(self) -> None:
        self.now = SINCE

    def __call__(self) -> datetime:
        return self.now


@contextmanager
def _clock_injected(clock: Clock) -> Iterator[int]:
    """Every server module's ``utcnow`` reads the simulated clock inside; yields how many were
    patched, and gives each its real clock back on the way out (the test suite runs this script
    in its own process: a clock left behind would make the next test's "now" a simulated one)."""
    from fleetwatch.server.db import base

    real = base.utcnow
    patched = [
        module
        for name, module in list(sys.modules.items())
        if name.startswith("fleetwatch") and getattr(module, "utcnow", None) is real
    ]
    for module in patched:
        module.utcnow = clock  # type: ignore[attr-defined]
    try:
        yield len(patched)
    finally:
        for module in patched:
            module.utcnow = real  # type: ignore[attr-defined]


def _validation(node: str, at: datetime, failing: bool) -> dict[str, Any]:
    return {
        "node": node,
        "started_at": (at - timedelta(seconds=30)).isoformat(),
        "finished_at": at.isoformat(),
        "checks": [
            {
                "name": name,
                "status": "fail"
                if failing and name == VALIDATION_CHECKS[0] and index == 0
                else "pass",
                "gpu_index": index,
                "evidence": {},
            }
            for index in range(8)
            for name in VALIDATION_CHECKS
        ],
        "tools": {"fleetwatch": "benchmarks/quarter.py"},
        "duration_s": 30.0,
    }


def _batch(node: str, at: datetime, *, xid: bool = False) -> dict[str, Any]:
    """One reading of the node's 8 GPUs at ``at``; with ``xid``, a fatal Xid 79 on GPU 3."""
    batch = make_batch(
        node,
        gpus=8,
        ticks=1,
        start=at,
        batch_id=f"{node}-{at:%Y%m%dT%H%M}",
        labels={"cluster": "quarter", "rack": f"r{int(node.rsplit('-', 1)[-1]) % 8}"},
    )
    if xid:
        gpu = batch["gpus"][3]
        batch["events"] = [
            {
                "kind": "xid",
                "ts": at.isoformat(),
                "xid": 79,
                "uuid": gpu["uuid"],
                "message": "NVRM: Xid 79, GPU has fallen off the bus.",
            }
        ]
    return batch


def drive(nodes: list[str], truth: Timeline, db_path: Path) -> dict[str, Any]:
    """Plays the timeline through the API in time order; the API's figures and counts."""
    from fastapi.testclient import TestClient

    from fleetwatch.config import ServerSettings
    from fleetwatch.server.act.planner import EvictionPlanner
    from fleetwatch.server.app import create_app
    from fleetwatch.server.auth import create_token

    settings = ServerSettings(
        database_url=f"sqlite:///{db_path}",
        metrics_cache_ttl_s=0,
        background_jobs=False,
        secret_keys=["gbQ8wacjKpfPdEwoxF_F7tkviWrs_OSrv8akOYcNQFo="],
        repeat_offender_days=REPEAT_DAYS,
        # Every failure is drained here; the budget's deferrals are another benchmark's.
        drain_budget_pct=100.0,
        _env_file=None,
    )
    clock = Clock()
    counts: dict[str, Any] = {"refused_409": 0, "refused_texts": set()}
    with TestClient(create_app(settings)) as client, _clock_injected(clock):
        db = client.app.state.db  # type: ignore[attr-defined]
        with db.write() as conn:
            tok = {
                s: create_token(conn, name=f"q-{s}", scope=s)[0]
                for s in ("agent", "read", "scheduler", "admin")
            }
        h = {s: {"Authorization": f"Bearer {t}"} for s, t in tok.items()}

        def ok(response: Any, *codes: int) -> Any:
            if response.status_code not in (codes or (200, 201)):
                raise RuntimeError(
                    f"{response.request.url}: {response.status_code} {response.text}"
                )
            return response

        for n in nodes:
            ok(client.post("/v1/ingest", headers=h["agent"], json=_batch(n, SINCE)))
        assessor = client.app.state.assessor  # type: ignore[attr-defined]
        planner = EvictionPlanner(db, settings, assessor)

        def evict(node: str, at: datetime) -> int:
            """The fatal Xid pushed as the node's agent would; the urgent lane's passes."""
            ok(client.post("/v1/ingest", headers=h["agent"], json=_batch(node, at, xid=True)))
            assessor.run_nodes({node}, now=at)
            created = planner.run_for({node}, now=at).created
            if created != {"pending": 1}:
                raise RuntimeError(f"{node} at {at}: the planner created {dict(created)}")
            found = ok(
                client.get(
                    "/v1/evictions", headers=h["read"], params={"node": node, "state": "pending"}
                )
            ).json()["data"]
            return int(found[0]["id"])

        steps: list[tuple[datetime, int, Any]] = []
        for o in truth.outages:
            steps += [
                (o.failed, 0, ("evict", o)),
                (o.failed + 5 * MIN, 1, ("ack", o)),
                (o.completed, 2, ("complete", o)),
            ]
            if o.refused_at is not None:
                steps.append((o.refused_at, 3, ("refuse", o)))
            steps.append((o.returned, 4, ("return", o)))
        for chosen, a, b in truth.windows:
            steps.append((a - 60 * MIN, 0, ("window", (chosen, a, b))))
        for j in truth.jobs:
            steps.append((j["start"], 5, ("start", j)))
            if j["end"] < UNTIL:
                steps.append((j["end"], 6, ("end", j)))
        steps.sort(key=lambda s: (s[0], s[1]))
        ids: dict[int, int] = {}
        for at, _, (what, item) in steps:
            clock.now = at
            if what == "evict":
                ids[id(item)] = evict(item.node, at)
            elif what in ("ack", "complete"):
                ok(
                    client.post(
                        f"/v1/evictions/{ids[id(item)]}/{what}",
                        headers=h["scheduler"],
                        **({"json": {"lease_s": 3600}} if what == "ack" else {}),
                    )
                )
            elif what == "refuse":
                ok(
                    client.post(
                        f"/v1/nodes/{item.node}/validations",
                        headers=h["agent"],
                        json=_validation(item.node, at, failing=True),
                    )
                )
                refused = client.post(
                    f"/v1/nodes/{item.node}/return",
                    headers=h["scheduler"],
                    json={"note": "repaired"},
                )
                ok(refused, 409)
                counts["refused_409"] += 1
                counts["refused_texts"].add(refused.json()["error"].split(" failed: ")[-1][:60])
            elif what == "return":
                ok(
                    client.post(
                        f"/v1/nodes/{item.node}/validations",
                        headers=h["agent"],
                        json=_validation(item.node, at, failing=False),
                    )
                )
                ok(
                    client.post(
                        f"/v1/nodes/{item.node}/return",
                        headers=h["scheduler"],
                        json={"note": "repaired"},
                    )
                )
            elif what == "window":
                chosen, a, b = item
                ok(
                    client.post(
                        "/v1/maintenance",
                        headers=h["admin"],
                        json={
                            "nodes": chosen,
                            "starts_at": a.isoformat(),
                            "ends_at": b.isoformat(),
                            "reason": "quarter: planned maintenance",
                        },
                    )
                )
            elif what == "start":
                ok(
                    client.post(
                        f"/v1/jobs/{item['id']}/start",
                        headers=h["agent"],
                        json={
                            "started_at": item["start"].isoformat(),
                            "nodes": item["nodes"],
                            "ranks": 8 * len(item["nodes"]),
                        },
                    )
                )
            elif what == "end":
                ok(
                    client.post(
                        f"/v1/jobs/{item['id']}/end",
                        headers=h["agent"],
                        json={"outcome": item["outcome"], "ended_at": item["end"].isoformat()},
                    )
                )
        clock.now = UNTIL
        figures = ok(
            client.get(
                "/v1/availability",
                headers=h["read"],
                params={"since": SINCE.isoformat(), "until": UNTIL.isoformat()},
            )
        ).json()
        evictions = ok(
            client.get("/v1/evictions", headers=h["read"], params={"limit": 100_000})
        ).json()["data"]
    counts["repeat_found"] = sum(e.get("repeat_of") is not None for e in evictions)
    counts["evictions"] = len(evictions)
    return {"api": figures, **counts}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--monthly-failure-prob", type=float, default=0.01)
    parser.add_argument("--imperfect", type=float, default=0.2)
    parser.add_argument("--flaky", type=float, default=0.15)
    parser.add_argument("--windows-per-month", type=float, default=4.0)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = parser.parse_args(argv)
    if args.smoke:
        args.nodes, args.jobs = 16, 20  # a window takes 4 to 12 nodes
    began = time.perf_counter()
    nodes, truth = build_timeline(args)
    mine = independent(nodes, truth)
    with tempfile.TemporaryDirectory() as tmp:
        got = drive(nodes, truth, Path(tmp) / "quarter.db")
    api, jobs = got["api"]["fleet"], got["api"]["jobs"]
    print(
        f"machine: {platform.machine()}, {platform.processor() or '?'}, Python "
        f"{platform.python_version()}; {args.nodes} nodes x {args.gpus} GPUs, {DAYS} days "
        f"from {SINCE:%Y-%m-%d}, seed {args.seed}, monthly_failure_prob "
        f"{args.monthly_failure_prob}, imperfect repairs {args.imperfect:.0%}, flaky returns "
        f"{args.flaky:.0%}"
    )
    print(
        f"timeline: {len(truth.outages)} outages ({sum(o.injected_repeat for o in truth.outages)}"
        f" injected re-failures; {truth.folded} failures folded into an open outage), "
        f"{len(truth.windows)} maintenance windows over {sum(len(w[0]) for w in truth.windows)}"
        f" node-windows, {len(truth.jobs)} jobs"
    )
    rows = [
        ("node_hours", api["node_hours"], mine["node_hours"]),
        ("up_h", api["up_h"], mine["up_h"]),
        ("planned_down_h", api["planned_down_h"], mine["planned_down_h"]),
        ("unplanned_down_h", api["unplanned_down_h"], mine["unplanned_down_h"]),
        (
            "infrastructure_availability",
            api["infrastructure_availability"],
            mine["infrastructure_availability"],
        ),
        ("workload_availability", api["workload_availability"], mine["workload_availability"]),
        ("failures", api["failures"], mine["failures"]),
        ("mtbf_h", api["mtbf_h"], mine["mtbf_h"]),
        ("mttr_h", api["mttr_h"], mine["mttr_h"]),
        ("jobs completed", jobs.get("completed"), mine["jobs_completed"]),
        ("jobs failed", jobs.get("failed"), mine["jobs_failed"]),
        ("job success_rate", jobs.get("success_rate"), mine["success_rate"]),
        (
            "jobs interrupted_by_hardware",
            jobs.get("interrupted_by_hardware"),
            mine["interrupted_by_hardware"],
        ),
    ]
    print(f"{'figure':30} {'GET /v1/availability':>22} {'minute sampling':>16}  match")
    differ = []
    for name, a, b in rows:
        same = a is not None and b is not None and abs(a - b) <= 1e-9 * max(1.0, abs(b))
        differ += [] if same else [name]
        print(f"{name:30} {a!s:>22.12} {b!s:>16.12}  {'yes' if same else 'NO'}")
    print(
        f"unplanned downtime from the failure itself (not the drain's completion): "
        f"{mine['unplanned_from_failure_h']:.1f} h (minute sampling)"
    )
    print(
        f"returns refused (409) for a failed validation: {got['refused_409']} of "
        f"{len(truth.outages)} repairs ({sum(o.imperfect for o in truth.outages)} imperfect in "
        f"the timeline); refusals named: {sorted(got['refused_texts'])}"
    )
    print(
        f"repeat offenders (evictions within {REPEAT_DAYS:g} d of the node's return): found "
        f"{got['repeat_found']} of {got['evictions']} evictions; in the timeline "
        f"{sum(o.repeat for o in truth.outages)} "
        f"({sum(o.injected_repeat and o.repeat for o in truth.outages)} of them injected)"
    )
    print(f"wall time {time.perf_counter() - began:.0f} s")
    if args.smoke and differ:
        sys.exit(f"smoke: the API and the minute sampling disagree on {differ}")


if __name__ == "__main__":
    main()
