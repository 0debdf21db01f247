"""Work saved by job notices on the simulated fleet (issue 15 item 5).

The simulator backtest (``fleetwatch.models.sim_backtest``) knows when each GPU fails and which
GPUs each method flags at each daily evaluation: **rules** (a verdict that counts against the GPU:
the server's ``gpu_out`` notice and a drain) and **rules + model** (the rules' GPUs, then the
model's riskiest up to the daily budget: a ``risk`` notice). A flag is a notice to the job on that
GPU's node, at the evaluation (midnight) that first flags it.

Jobs: for each size (64, 128, 256, 512 GPUs), the fleet's nodes are cut into as many groups of
``size / 8`` nodes as fit and each group runs one job through the whole evaluation period, with
a fixed checkpoint interval ``T``; a failed GPU's node is replaced at the restart. Each job runs
twice:

- **ignoring notices**: a failure costs the work since the last checkpoint plus the restart,
  on all the job's GPUs;
- **checkpointing on a notice**: a rules notice (``gpu_out`` / ``drain_pending``,
  checkpoint_and_exit) makes the job checkpoint and restart without the node, so that GPU's
  failure no longer hits it (cost: one checkpoint and one planned restart, false notices too); a
  model-only notice (``risk``, checkpoint_now) makes it checkpoint (the periodic schedule restarts
  from there), and a later failure costs only the work since then.

Reported per method: lost GPU-hours (redone work + restarts + checkpoints taken on notices) and
restarts per 1,000 job-hours, the share of failures preceded by a notice (within 7 days) and the
lead time from the first notice to the failure (p50 / p90). Notices come at daily evaluations in
the simulation, while the server assesses every 30 s: lead times are lower bounds.

    .venv/bin/python benchmarks/notice_savings.py [--nodes 64] [--interval-h 2] [--ckpt-min 5]
        [--restart-min 15]
"""

from __future__ import annotations

import argparse
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np

from fleetwatch.models.sim_backtest import default_spec, run_sim_backtest

SIZES = (64, 128, 256, 512)
GPUS_PER_NODE = 8
_H = 3600.0


@dataclass
class Tally:
    job_hours: float = 0.0
    lost_gpu_h: float = 0.0
    failures: int = 0
    planned: int = 0
    notice_ckpts: int = 0

    def add(self, other: Tally) -> None:
        for name in vars(self):
            setattr(self, name, getattr(self, name) + getattr(other, name))


def run_job(
    start: datetime,
    end: datetime,
    gpus: int,
    failures: list[datetime],
    notices: list[tuple[datetime, str, bool]],
    fails_of: dict[str, datetime],
    *,
    interval: timedelta,
    ckpt: timedelta,
    restart: timedelta,
    heed: bool,
    exit_on_notice: bool = True,
) -> Tally:
    """One job on one node group from ``start`` to ``end``. ``failures``: when a GPU of the
    group fails; ``notices``: (time, uuid, exit) where exit is a checkpoint-and-exit notice."""
    tally = Tally(job_hours=(end - start).total_seconds() / _H)
    events: list[tuple[datetime, int, str, bool]] = [(f, 1, "", False) for f in failures]
    if heed:
        events += [(n, 0, u, ex) for n, u, ex in notices]
    events.sort()
    anchor = start  # the periodic schedule's origin: the last restart or notice checkpoint
    avoided: set[datetime] = set()
    left: set[str] = set()  # GPUs the job has left on a notice: later notices do not reach it
    for t, kind, uuid, exits in events:
        if not start <= t < end:
            continue
        if kind == 0 and uuid in left:
            continue
        if kind == 0:  # a notice: checkpoint now
            tally.notice_ckpts += 1
            tally.lost_gpu_h += gpus * ckpt.total_seconds() / _H
            anchor = t
            if (
                exits and exit_on_notice
            ):  # leave the node: a planned restart; its GPU's failure misses the job
                tally.planned += 1
                tally.lost_gpu_h += gpus * restart.total_seconds() / _H
                anchor = t + restart
                left.add(uuid)
                failed = fails_of.get(uuid)
                if failed is not None:
                    avoided.add(failed)
            continue
        if t in avoided:
            continue
        since = (t - anchor).total_seconds() % interval.total_seconds() if t > anchor else 0.0
        tally.failures += 1
        tally.lost_gpu_h += gpus * (since + restart.total_seconds()) / _H
        anchor = t + restart
    return tally


def _leads(
    failures: Any, notices: dict[str, list[tuple[datetime, str, bool]]], nodes: dict[str, str]
) -> list[float]:
    """Hours from the first notice about the failing GPU in the 7 days before its failure."""
    out = []
    for r in failures.itertuples():
        f = r.failure_time.to_pydatetime()
        before = [
            t
            for t, u, _ in notices.get(nodes[r.uuid], ())
            if u == r.uuid and f - timedelta(days=7) <= t < f
        ]
        if before:
            out.append((f - min(before)).total_seconds() / _H)
    return out


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else math.nan


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=64, help="simulated nodes (8 GPUs each)")
    parser.add_argument("--days", type=float, default=180.0)
    parser.add_argument("--cutoff-day", type=float, default=90.0)
    parser.add_argument("--budget", type=int, default=5)
    parser.add_argument("--interval-h", type=float, default=2.0, help="fixed checkpoint interval")
    parser.add_argument("--ckpt-min", type=float, default=5.0, help="minutes per checkpoint")
    parser.add_argument("--restart-min", type=float, default=15.0, help="minutes per restart")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = parser.parse_args(argv)
    if args.smoke:
        args.nodes, args.days, args.cutoff_day = 8, 40.0, 20.0
    began = time.perf_counter()
    result = run_sim_backtest(
        default_spec(seed=0, nodes=args.nodes, days=args.days),
        cutoff_day=args.cutoff_day,
        budget=args.budget,
    )
    report(result, args)
    print(f"\nwall {time.perf_counter() - began:.0f} s (backtest {result.wall_s:.0f} s)")


def report(result: Any, args: argparse.Namespace) -> None:
    """Print the tables from a backtest result (flags at H = 1 day, days, gpu_nodes, failures)."""
    start, end = result.cutoff, result.days[-1] + timedelta(days=1)
    node_names = sorted(set(result.gpu_nodes.values()))
    failures = result.failures
    fails_of = {str(r.uuid): r.failure_time.to_pydatetime() for r in failures.itertuples()}
    interval = timedelta(hours=args.interval_h)
    ckpt, restart = timedelta(minutes=args.ckpt_min), timedelta(minutes=args.restart_min)
    print(f"fleet: {args.nodes} nodes x 8 GPUs, evaluation {start:%Y-%m-%d} to {end:%Y-%m-%d} "
          f"({result.eval_days} days), {len(failures)} failures; T = {args.interval_h:g} h, "
          f"checkpoint {args.ckpt_min:g} min, restart {args.restart_min:g} min")  # fmt: skip
    rules = result.flags["rules"]
    # Rules + model: every rules notice, and a risk notice for each of the model's daily picks
    # (the server's risk notices do not wait for the rules, as the backtest's budget fill does).
    methods = {"rules": rules, "rules+model": rules | result.flags["model"]}
    for method, flagged in methods.items():
        first: dict[str, list[tuple[datetime, str, bool]]] = defaultdict(list)
        seen: dict[tuple[str, bool], int] = {}
        for day, uuid in sorted(flagged):
            key = (uuid, (day, uuid) in rules)  # a rules notice after a risk one is new
            if seen.get(key) == day - 1:  # the same notice, still open
                seen[key] = day
                continue
            seen[key] = day
            node = result.gpu_nodes[uuid]
            first[node].append((result.days[day], uuid, key[1]))
        leads = _leads(failures, first, result.gpu_nodes)
        share = len(leads) / len(failures) if len(failures) else math.nan
        print(f"\n{method}: {share:.0%} of failures preceded by a notice (within 7 days); lead "
              f"time p50 {percentile(leads, 50):.1f} h, p90 {percentile(leads, 90):.1f} h; "
              f"{sum(len(v) for v in first.values())} notices")  # fmt: skip
        print(
            "| job GPUs | jobs | run | lost GPU-h | lost GPU-h / 1,000 job-h | "
            "failures / 1,000 job-h | planned restarts / 1,000 job-h | checkpoints on notice |"
        )
        print("|---:|---:|---|---:|---:|---:|---:|---:|")
        for size in SIZES:
            per_job = size // GPUS_PER_NODE
            groups = [node_names[i:i + per_job]
                      for i in range(0, len(node_names) - per_job + 1, per_job)]  # fmt: skip
            runs = (("ignore", False, False), ("checkpoint", True, False),
                    ("checkpoint + exit", True, True))  # fmt: skip
            for label, heed, exits in runs:
                total = Tally()
                for group in groups:
                    members = set(group)
                    hits = [
                        r.failure_time.to_pydatetime()
                        for r in failures.itertuples()
                        if r.node in members
                    ]
                    notices = [n for node in group for n in first.get(node, [])]
                    total.add(run_job(start, end, size, hits, notices, fails_of,
                                      interval=interval, ckpt=ckpt, restart=restart,
                                      heed=heed, exit_on_notice=exits))  # fmt: skip
                k = 1000.0 / total.job_hours if total.job_hours else math.nan
                print(f"| {size} | {len(groups)} | {label} | "
                      f"{total.lost_gpu_h:,.0f} | {total.lost_gpu_h * k:,.0f} | "
                      f"{total.failures * k:.2f} | {total.planned * k:.2f} | "
                      f"{total.notice_ckpts} |")  # fmt: skip


if __name__ == "__main__":
    main()
