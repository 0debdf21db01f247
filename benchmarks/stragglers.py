"""Straggler detection on simulated jobs: detection latency, precision/recall, kind confusion.

Each scenario simulates ``--jobs`` jobs (default 50) on the job's own clock and runs the
detector exactly as the server does (windows of 10 s judged in order, 1.25x, robust z 3.5,
3 windows), through :func:`fleetwatch.models.stragglers.judge_window` and ``JobDetector``:

* ``hw-8``: 64 ranks on 8 nodes, one node turns 1.3x slow at a random moment (60-180 s);
* ``hw-64``: 512 ranks on 64 nodes (8 each), one node turns 1.3x slow likewise;
* ``hw-stage``: as ``hw-8`` in a job of 4 pipeline stages (its stage peers stay normal);
* ``stage``: 64 ranks on 8 nodes in 4 pipeline stages; one stage (2 nodes) turns 1.3-1.5x slow
  (half the jobs from the start, half from a random moment): workload;
* ``first``: 8 nodes, one node 1.3x slow from the job's start (a layout imbalance): workload;
* ``mild-1.15``: as ``hw-8`` at 1.15x, below the 1.25x ratio: not meant to be flagged;
* ``healthy``: 8 nodes, nobody slow (false positives only).

Step times are log-normal (3 % per step) around 500 ms with a persistent per-rank offset (1 %),
and 1 % of steps are 3x slow at random (noisy steps). Ranks report a step every 0.5 s (1 s for
``hw-64``); jobs last 300 s (240 s for ``hw-64``), so every onset has 60 s left.

Latency is step time from the onset to the moment the verdict's third slow window becomes
judgeable (window end + half a window, as the server waits for late ranks).

    .venv/bin/python benchmarks/stragglers.py [--jobs 50] [--seed 0]
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np

from fleetwatch.models.stragglers import DetectorConfig, JobDetector, StepRow, judge_window

START = datetime(2025, 1, 1, tzinfo=UTC)


@dataclass
class Job:
    nodes: int
    ranks_per_node: int
    seconds: float
    period_s: float
    stages: int | None
    slow: dict[str, tuple[float, float]]  # node -> (onset s, factor)
    truth: str  # hardware | workload | none


def simulate(job: Job, rng: np.random.Generator) -> list[list[StepRow]]:
    """Steps cut into 10 s windows."""
    ranks = job.nodes * job.ranks_per_node
    names = [f"n{r // job.ranks_per_node:03d}" for r in range(ranks)]
    stage_of = [r * job.stages // ranks if job.stages else None for r in range(ranks)]
    offset = rng.lognormal(0.0, 0.01, size=ranks)
    factor_onset = np.full(ranks, np.inf)
    factor = np.ones(ranks)
    for r, name in enumerate(names):
        if name in job.slow:
            factor_onset[r], factor[r] = job.slow[name]
    steps = int(job.seconds / job.period_s)
    windows: list[list[StepRow]] = [[] for _ in range(int(job.seconds // 10))]
    for i in range(steps):
        t = i * job.period_s
        w = int(t // 10)
        if w >= len(windows):
            break
        d = 500.0 * offset * rng.lognormal(0.0, 0.03, size=ranks)
        d = np.where(t >= factor_onset, d * factor, d)
        d = np.where(rng.random(ranks) < 0.01, d * 3.0, d)
        ts = START + timedelta(seconds=t)
        windows[w].extend(StepRow(r, names[r], float(d[r]), ts, stage_of[r]) for r in range(ranks))
    return windows


def detect(windows: list[list[StepRow]]) -> list[tuple[str, str, float]]:
    """(node, kind, step-time second the verdict became judgeable) for every opened verdict."""
    config = DetectorConfig()
    detector = JobDetector(config)
    opened = []
    for w, rows in enumerate(windows):
        start = START + timedelta(seconds=10 * w)
        result = judge_window(rows, start, start + timedelta(seconds=10), ratio=config.ratio)
        for t in detector.feed(result):
            if t.action == "open":
                assert t.kind is not None
                opened.append((t.node, t.kind, 10.0 * (w + 1) + config.window_s / 2))
    return opened


def scenario(name: str, rng: np.random.Generator) -> Job:
    if name in ("hw-8", "hw-64"):
        nodes = 8 if name == "hw-8" else 64
        node = f"n{int(rng.integers(nodes)):03d}"
        onset = float(rng.uniform(60, 180))
        return Job(nodes, 8, 300.0 if nodes == 8 else 240.0, 0.5 if nodes == 8 else 1.0,
                   None, {node: (onset, 1.3)}, "hardware")  # fmt: skip
    if name in ("hw-stage", "mild-1.15"):
        node = f"n{int(rng.integers(8)):03d}"
        factor = 1.3 if name == "hw-stage" else 1.15
        return Job(8, 8, 300.0, 0.5, 4 if name == "hw-stage" else None,
                   {node: (float(rng.uniform(60, 180)), factor)}, "hardware")  # fmt: skip
    if name == "stage":
        stage = int(rng.integers(4))
        onset = 0.0 if rng.random() < 0.5 else float(rng.uniform(60, 180))
        factor = float(rng.uniform(1.3, 1.5))
        slow = {f"n{2 * stage + k:03d}": (onset, factor) for k in range(2)}
        return Job(8, 8, 300.0, 0.5, 4, slow, "workload")
    if name == "first":
        return Job(8, 8, 300.0, 0.5, None, {f"n{int(rng.integers(8)):03d}": (0.0, 1.3)},
                   "workload")  # fmt: skip
    return Job(8, 8, 300.0, 0.5, None, {}, "none")


def db_pass(rng: np.random.Generator) -> None:
    """One server pass over one stored hw-8 job (38,400 steps) in a fresh SQLite file."""
    import tempfile
    from pathlib import Path

    from fleetwatch.config import ServerSettings
    from fleetwatch.server.db.migrate import upgrade
    from fleetwatch.server.db.session import Database, make_engine
    from fleetwatch.server.judge.straggler_detector import StragglerDetector
    from fleetwatch.server.repo.jobs import store_steps

    with tempfile.TemporaryDirectory() as tmp:
        settings = ServerSettings(database_url=f"sqlite:///{Path(tmp) / 'b.db'}")
        db = Database(make_engine(settings))
        upgrade(db.engine)
        rows = [r for w in simulate(scenario("hw-8", rng), rng) for r in w]
        started = time.perf_counter()
        for i in range(0, len(rows), 5000):
            with db.write() as conn:
                store_steps(conn, "bench", [
                    {"rank": r.rank, "node": r.node, "step": i + k, "duration_ms": r.duration_ms,
                     "ts": r.ts, "stage": r.stage, "dp_group": None}
                    for k, r in enumerate(rows[i : i + 5000])
                ])  # fmt: skip
        stored = time.perf_counter() - started
        detector = StragglerDetector(db, settings)
        started = time.perf_counter()
        judged = detector.run_once()
        elapsed = time.perf_counter() - started
        per_window = 1000 * elapsed / max(judged, 1)
        print(f"\nSQLite: stored {len(rows)} steps in {stored:.2f} s "  # noqa: T201
              f"({len(rows) / stored:,.0f}/s); one detector pass judged {judged} windows "
              f"in {elapsed:.2f} s ({per_window:.1f} ms a window)")  # fmt: skip
        db.dispose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--db-only", action="store_true", help="only the SQLite pass")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = parser.parse_args(argv)
    if args.smoke:
        args.jobs = 2
    rng = np.random.default_rng(args.seed)
    if args.db_only:
        db_pass(rng)
        return
    confusion: Counter[tuple[str, str]] = Counter()
    print(
        "| scenario | jobs | slow nodes | detected | recall | verdicts | precision "
        "| kind right | latency p50 / p90 / max (s) | judge time / window (ms) |"
    )  # noqa: T201
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")  # noqa: T201
    for name in ("hw-8", "hw-64", "hw-stage", "stage", "first", "mild-1.15", "healthy"):
        injected = detected = verdicts = true_verdicts = kind_right = 0
        latencies: list[float] = []
        judge_s = 0.0
        windows_judged = 0
        for _ in range(args.jobs):
            job = scenario(name, rng)
            windows = simulate(job, rng)
            started = time.perf_counter()
            opened = detect(windows)
            judge_s += time.perf_counter() - started
            windows_judged += len(windows)
            injected += len(job.slow)
            seen = set()
            for node, kind, at in opened:
                verdicts += 1
                if node in job.slow:
                    true_verdicts += 1
                    if node not in seen:
                        seen.add(node)
                        kind_right += kind == job.truth
                        confusion[(job.truth, kind)] += 1
                        latencies.append(at - job.slow[node][0])
                else:
                    confusion[("none", kind)] += 1
            detected += len(seen)
            for _node in set(job.slow) - seen:
                confusion[(job.truth, "missed")] += 1
        lat = (f"{np.percentile(latencies, 50):.1f} / {np.percentile(latencies, 90):.1f} / "
               f"{max(latencies):.1f}") if latencies else "-"  # fmt: skip
        recall = f"{detected / injected:.3f}" if injected else "-"
        precision = f"{true_verdicts / verdicts:.3f}" if verdicts else "-"
        right = f"{kind_right}/{detected}" if detected else "-"
        print(f"| {name} | {args.jobs} | {injected} | {detected} | {recall} | {verdicts} | "
              f"{precision} | {right} | {lat} | {1000 * judge_s / windows_judged:.1f} |")  # noqa: T201  # fmt: skip
    print("\nconfusion (truth -> verdict):")  # noqa: T201
    for (truth, kind), count in sorted(confusion.items()):
        print(f"  {truth:>8} -> {kind:<8} {count}")  # noqa: T201
    db_pass(rng)


if __name__ == "__main__":
    main()
