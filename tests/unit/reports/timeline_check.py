"""An independent computation of the availability figures: sample every minute of the timeline.

:mod:`fleetwatch.reports.availability` does interval arithmetic (merge, clip, subtract). This
module does none: it marks, for each node and each minute, whether the node is exposed, in a
maintenance window or in an outage, and counts minutes, runs and their ends with numpy. Inputs
must lie on whole minutes for the two to agree exactly; ``random_period`` draws such inputs.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from fleetwatch.reports.availability import (
    Checkpoint,
    FleetPeriod,
    JobRecord,
    Outage,
    Restart,
    StragglerSpan,
)

MIN = timedelta(minutes=1)
PRE = timedelta(days=30)  # outages may start this long before the period


def _minute(rng: np.random.Generator, lo: datetime, hi: datetime) -> datetime:
    return lo + MIN * int(rng.integers(0, max(int((hi - lo) / MIN), 1)))


def random_period(rng: np.random.Generator, nodes: int, days: int) -> FleetPeriod:
    since = datetime(2026, 7, 6, tzinfo=UTC)
    until = since + timedelta(days=days)
    names = [f"gpu-{i:04d}" for i in range(nodes)]
    labels: dict[str, dict[str, Any]] = {}
    for i, n in enumerate(names):
        labels[n] = {"sku": ("H100", "H200")[i % 2]}
        if i % 7:
            labels[n]["rack"] = f"r{i % 3}"
    joined = {n: _minute(rng, since, until) for n in names if rng.random() < 0.2}
    planned = {
        n: [
            (a, a + MIN * int(rng.integers(30, 8 * 60)))
            for a in (_minute(rng, since - timedelta(days=1), until) for _ in range(3))
        ]
        for n in names
        if rng.random() < 0.6
    }
    outages = []
    for n in names:
        for _ in range(int(rng.poisson(days / 10 + 1))):
            a = _minute(rng, since - timedelta(days=3), until + timedelta(hours=6))
            dur = MIN * int(rng.integers(1, 3 * 24 * 60))
            end = None if rng.random() < 0.1 else a + dur
            outages.append(Outage(n, a, end, "drain"))
    jobs, checkpoints, restarts, spans = [], [], [], []
    for j in range(days * 4):
        job = f"job-{j}"
        start = _minute(rng, since - timedelta(days=2), until)
        end = start + MIN * int(rng.integers(10, 3 * 24 * 60))
        outcome = str(rng.choice(["completed", "failed", "cancelled"]))
        running = rng.random() < 0.1
        on = tuple(str(x) for x in rng.choice(names, size=int(rng.integers(1, 5)), replace=False))
        jobs.append(
            JobRecord(
                job,
                on,
                int(rng.integers(1, 64)),
                None if rng.random() < 0.05 else start,
                None if running else end,
                None if running else outcome,
                hardware=outcome == "failed" and rng.random() < 0.5,
            )  # fmt: skip
        )
        for _ in range(int(rng.integers(0, 6))):
            checkpoints.append(Checkpoint(job, _minute(rng, start, end), 60.0 * rng.integers(1, 9)))
        for _ in range(int(rng.integers(0, 3))):
            resumed = _minute(rng, start, end)
            stop = resumed - MIN * int(rng.integers(1, 90)) if rng.random() < 0.8 else None
            lost = float(rng.integers(0, 3600)) if rng.random() < 0.7 else None
            restarts.append(Restart(job, resumed, stop, lost))
        if rng.random() < 0.3:
            a = _minute(rng, start, end)
            b = None if rng.random() < 0.2 else a + MIN * int(rng.integers(5, 600))
            kind = str(rng.choice(["hardware", "workload"]))
            spans.append(StragglerSpan(job, on[0], kind, a, b, float(rng.uniform(1.1, 3.0))))
    return FleetPeriod(
        since, until, labels, joined, planned, outages, jobs, checkpoints, restarts, spans
    )


def _mask(
    t0: datetime, n: int, spans: list[tuple[datetime, datetime | None]], end: datetime
) -> Any:
    """Minute i of ``n`` from ``t0`` is marked when some span holds its start."""
    out = np.zeros(n, dtype=bool)
    for a, b in spans:
        i = max(int((a - t0) / MIN), 0)
        j = min(int(((b or end) - t0) / MIN), n)
        if j > i:
            out[i:j] = True
    return out


def sampled(p: FleetPeriod, by: str | None = None) -> dict[str, dict[str, Any]]:
    """Per group of ``by`` (one group "all" without): minutes and runs counted off the timeline."""
    first = p.since - PRE
    n = int((p.until - first) / MIN)
    in_period = np.zeros(n, dtype=bool)
    in_period[int(PRE / MIN) :] = True
    groups: dict[str, dict[str, Any]] = {}
    for node, labels in p.nodes.items():
        key = "all" if by is None else str(labels.get(by) or "unknown")
        g = groups.setdefault(key, {"exp": 0, "planned": 0, "unplanned": 0, "starts": 0,
                                    "repairs": []})  # fmt: skip
        joined = p.joined.get(node, first)
        exposed = in_period & _mask(first, n, [(joined, None)], p.until)
        planned = _mask(first, n, list(p.planned.get(node, [])), p.until) & exposed
        down = _mask(first, n, [(o.start, o.end) for o in p.outages if o.node == node], p.until)
        g["exp"] += int(exposed.sum())
        g["planned"] += int(planned.sum())
        g["unplanned"] += int((down & exposed & ~planned).sum())
        # A run starts where down follows up; it ends at the first up minute after it.
        before = np.concatenate([[False], down[:-1]])
        g["starts"] += int((down & ~before & exposed).sum())
        starts = np.flatnonzero(down & ~before)
        ends = np.flatnonzero(~down & before)  # runs alternate: the k-th end closes the k-th start
        for a, b in zip(starts, ends, strict=False):
            if in_period[b] and b > int(PRE / MIN):
                g["repairs"].append((b - a) * 60.0)
    return groups


def sim_quarter(seed: int, nodes: int) -> FleetPeriod:
    """91 days of the simulated fleet (:mod:`fleetwatch.sim`), times rounded out to whole minutes.

    A reboot is planned downtime; an outage or a hang (after a GPU failure) is unplanned. Each busy
    segment of a node is a job of its GPUs; one that a hang or outage cuts short failed (by
    hardware for a hang), and the node's next job resumes it. Throttled spans are hardware
    straggler verdicts of the job running when they began, at their slowdown.
    """
    from fleetwatch.sim.fleet import SimFleet
    from fleetwatch.sim.spec import FleetSpec

    since = datetime(2026, 7, 6, tzinfo=UTC)
    spec = FleetSpec(seed=seed, nodes=nodes, horizon_days=91, start=since, real_start=since)
    fleet = SimFleet(spec)
    until = since + timedelta(days=91)

    def floor(s: float) -> datetime:
        return since + MIN * (s // 60)

    def ceil(s: float) -> datetime:
        return since + MIN * -(-s // 60)

    labels: dict[str, dict[str, Any]] = {}
    planned: dict[str, list[tuple[datetime, datetime]]] = {}
    outages, jobs, restarts, spans, checkpoints = [], [], [], [], []
    for node in fleet.node_names():
        labels[node] = {**fleet.labels(node), "sku": fleet.identities(node)[0].name}
        timeline, _ = fleet.node_state(node)
        planned[node] = [(floor(w.start_s), ceil(w.end_s)) for w in timeline.silences
                         if w.reason == "reboot"]  # fmt: skip
        cuts = [w for w in timeline.silences if w.reason != "reboot"]
        outages += [Outage(node, floor(w.start_s), ceil(w.end_s), w.reason) for w in cuts]
        segs = timeline.jobs
        previous_failed: tuple[datetime, bool] | None = None
        for i, busy in enumerate(segs.busy):
            if not busy:
                continue
            a, b = segs.starts[i], segs.end_of(i)
            start = floor(a)
            end = None if b == float("inf") or ceil(b) >= until else ceil(b)
            cut = next((w for w in cuts if a <= w.start_s < b), None)
            job = f"{node}-{i}"
            outcome = None if end is None else ("failed" if cut else "completed")
            jobs.append(JobRecord(job, (node,), spec.gpus_per_node, start, end, outcome,
                                  hardware=cut is not None and cut.reason == "hang"))  # fmt: skip
            if previous_failed is not None:
                restarts.append(Restart(job, start, previous_failed[0], None))
            previous_failed = (end, True) if outcome == "failed" and end is not None else None
            if end is not None and end - start > 2 * timedelta(hours=1):
                checkpoints.append(Checkpoint(job, start + timedelta(hours=1), 120.0))
            for s in timeline.straggles:
                if a <= s.start_s < b and s.slowdown > 1:
                    spans.append(StragglerSpan(job, node, "hardware", floor(s.start_s),
                                               ceil(s.end_s), s.slowdown))  # fmt: skip
    return FleetPeriod(since, until, labels, {}, planned, outages, jobs, checkpoints, restarts,
                       spans)  # fmt: skip
