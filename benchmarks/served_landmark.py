"""The served landmark model against the AFT and the Weibull fits on the simulator (issue 40).

A refit at the cutoff, as the server does it: the bundle is fitted on the lifetimes known before
day ``--cutoff-day`` and, for its landmark part, on every GPU at each midnight of the
``--span-days`` before the cutoff that leaves a week to follow (its age and telemetry then,
whether it failed within 1 and 7 days after: ``fleetwatch.models.telemetry_landmarks``). Every
part of the bundle then scores every GPU alive at each midnight after the cutoff
(``fleetwatch.models.sim_backtest``, ``landmark_span_days``): AUC, average precision, expected
calibration error and precision at the daily drain budget (5 GPUs) against "fails within H".

Seed 0 chose the landmark model's hyper-parameters (``fleetwatch.models.served_landmark``), seed
1 is another fleet with other failures.

    .venv/bin/python benchmarks/served_landmark.py [--nodes 40] [--span-days 83] [--smoke]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from fleetwatch.models.sim_backtest import (  # noqa: E402
    SimBacktestResult,
    default_spec,
    run_sim_backtest,
)

HEADER = (
    "| seed | part | H (d) | AUC | AP | ECE | precision at budget |\n"
    "|---|---|---:|---:|---:|---:|---:|"
)


def _f(value: float) -> str:
    return "nan" if math.isnan(value) else f"{value:.3f}"


def _run(seed: int, args: argparse.Namespace) -> SimBacktestResult:
    began = time.perf_counter()
    done = [0]

    def progress(n: int) -> None:
        done[0] += n
        if done[0] % 8 == 0 or done[0] == args.nodes:
            print(
                f"[served_landmark] seed {seed}: {done[0]}/{args.nodes} nodes, "
                f"{time.perf_counter() - began:.0f} s",
                file=sys.stderr,
            )

    spec = default_spec(seed, nodes=args.nodes, days=args.days)
    return run_sim_backtest(
        spec,
        cutoff_day=args.cutoff_day,
        budget=5,
        progress=progress,
        landmark_span_days=args.span_days,
    )


def rows(seed: int, result: SimBacktestResult) -> list[str]:
    out = []
    for part, per_horizon in result.by_scorer.items():
        for h, m in per_horizon.items():
            out.append(
                f"| {seed} | {part} | {h:g} | {_f(m.auc)} | {_f(m.average_precision)} | "
                f"{_f(m.ece)} | {_f(m.precision_at_k)} |"
            )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=40, help="simulated nodes (8 GPUs each)")
    parser.add_argument("--days", type=float, default=180.0)
    parser.add_argument("--cutoff-day", type=float, default=90.0)
    parser.add_argument("--span-days", type=float, default=83.0, help="landmark span")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = parser.parse_args(argv)
    if args.smoke:
        args.nodes, args.days, args.cutoff_day, args.span_days = 8, 40.0, 20.0, 12.0
        args.seeds = [0]
    load = os.getloadavg()
    print(
        f"nproc {os.cpu_count()}, Python {platform.python_version()}, load average "
        f"{load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f} at start; {args.nodes} nodes x 8 GPUs, "
        f"cutoff day {args.cutoff_day:g}, landmark span {args.span_days:g} days"
    )
    table = [HEADER]
    for seed in args.seeds:
        began = time.perf_counter()
        result = _run(seed, args)
        landmark = result.bundle.metrics.get("landmark") or {}
        fitted = (
            f"landmark part: {landmark.get('n')} rows over {landmark.get('landmarks')} "
            f"midnights, failures within 1 / 7 d: {landmark.get('failures_within')}"
        )
        if "error" in landmark:
            fitted = f"landmark part not fitted: {landmark['error']}"
        print(
            f"seed {seed}: {result.n_gpus} GPUs, {result.n_failures} failures in evaluation, "
            f"{result.eval_days} evaluation days; {fitted}; {time.perf_counter() - began:.0f} s"
        )
        table.extend(rows(seed, result))
    print("\n".join(table))


if __name__ == "__main__":
    main()
