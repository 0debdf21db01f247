"""What a prediction is worth on the simulator (issue 40 item 3): weekly drain budgets, and the
job-notice threshold chosen from the notice curve.

Two simulated fleets (``default_spec``: ``--nodes`` x 8 GPUs, 180 days, monthly failure
probability 0.04), the model trained before day 90 and scored every midnight after it
(``fleetwatch.models.sim_backtest``). Seed ``--choose-seed`` chooses, seed ``--measure-seed``
(another fleet, other failures) measures, so that the chosen threshold is not judged on the
data it was chosen on.

1. **Drain budget** on both fleets (``fleetwatch.models.sim_budget.sim_budget``): every 7th
   midnight drain the k riskiest GPUs (7-day risk), k = 0.1 %, 0.5 %, 1 % of the GPUs alive at
   the cutoff (at least 1), against age-only and random rankings; the curve to 5 %.
2. **Notice curve** on the choosing fleet: a running job's ``risk`` notice opens when its node's
   P(failure within 24 h) = 1 - prod(1 - p) reaches the threshold; a notice (node-day) is right
   if a GPU of the node fails within those 24 h. The **rule**: the lowest threshold whose
   precision reaches ``--target`` (0.25: at least one risk notice in four is followed by a
   failure of its node within its 24 h) over at least ``--min-notices`` notices.
3. **Before and after** on the measuring fleet: risk notices at today's default (0.5) and at
   the chosen threshold, alone and with the rules' notices (``gpu_out`` / drains: every notice a
   job gets), judged within 24 h and within 7 days (the issue's "right about 15 % of the time"
   is the rules' GPU-days judged within 7 days).

    .venv/bin/python benchmarks/sim_budget.py [--nodes 64] [--target 0.25] [--smoke]
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

from fleetwatch.config import ServerSettings  # noqa: E402
from fleetwatch.models.sim_backtest import (  # noqa: E402
    SimBacktestResult,
    default_spec,
    run_sim_backtest,
)
from fleetwatch.models.sim_budget import (  # noqa: E402
    NoticePoint,
    budget_lines,
    choose_threshold,
    notice_curve,
    sim_budget,
)

TODAY = 0.5  # notice_risk_threshold's default before issue 40


def _f(value: float, spec: str = ".3f") -> str:
    return "nan" if math.isnan(value) else format(value, spec)


def _run(seed: int, args: argparse.Namespace) -> SimBacktestResult:
    began = time.perf_counter()
    done = [0]

    def progress(n: int) -> None:
        done[0] += n
        if done[0] % 8 == 0 or done[0] == args.nodes:
            print(
                f"[sim_budget] seed {seed}: {done[0]}/{args.nodes} nodes, "
                f"{time.perf_counter() - began:.0f} s",
                file=sys.stderr,
            )

    spec = default_spec(seed, nodes=args.nodes, days=args.days)
    return run_sim_backtest(spec, cutoff_day=args.cutoff_day, budget=5, progress=progress)


def budget_table(seed: int, result: SimBacktestResult) -> list[str]:
    lines = budget_lines(sim_budget(result))
    lines[0] = f"\nseed {seed}, {result.n_failures} failures in evaluation; {lines[0]}"
    return lines


def _notice_row(label: str, p: NoticePoint) -> str:
    return (
        f"| {label} | {p.notices} | {p.right} | {_f(p.precision)} | {p.warned} / {p.failures} | "
        f"{_f(p.recall)} | {_f(p.median_lead_h, '.1f')} |"
    )


NOTICE_HEADER = (
    "| notices | node-days | right | precision | failures warned | recall | median lead (h) |\n"
    "|---|---:|---:|---:|---:|---:|---:|"
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=64, help="simulated nodes (8 GPUs each)")
    parser.add_argument("--days", type=float, default=180.0)
    parser.add_argument("--cutoff-day", type=float, default=90.0)
    parser.add_argument("--choose-seed", type=int, default=0)
    parser.add_argument("--measure-seed", type=int, default=1)
    parser.add_argument("--target", type=float, default=0.25, help="precision to reach")
    parser.add_argument("--min-notices", type=int, default=10)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = parser.parse_args(argv)
    if args.smoke:
        args.nodes, args.days, args.cutoff_day, args.min_notices = 8, 40.0, 20.0, 1
    load = os.getloadavg()
    print(
        f"nproc {os.cpu_count()}, Python {platform.python_version()}, load average "
        f"{load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f} at start; {args.nodes} nodes x 8 GPUs"
    )
    began = time.perf_counter()
    chooser = _run(args.choose_seed, args)
    measurer = _run(args.measure_seed, args)
    for seed, result in ((args.choose_seed, chooser), (args.measure_seed, measurer)):
        print("\n".join(budget_table(seed, result)))

    curve = notice_curve(chooser)
    print(f"\nrisk notices (24 h) on seed {args.choose_seed}, by threshold:")
    print(NOTICE_HEADER.replace("| notices |", "| threshold |"))
    for p in curve:
        print(_notice_row(f"{p.threshold:g}", p))
    chosen = choose_threshold(curve, args.target, min_notices=args.min_notices)
    if chosen is None:
        print(f"\nno threshold reaches precision {args.target:g} over {args.min_notices} notices")
        theta = TODAY
    else:
        theta = chosen.threshold
        default = ServerSettings.model_fields["notice_risk_threshold"].default
        print(
            f"\nchosen: {theta:g}, the lowest threshold with precision >= {args.target:g} over "
            f">= {args.min_notices} notices on seed {args.choose_seed} "
            f"({chosen.notices} notices, precision {chosen.precision:.3f}); the server's "
            f"default notice_risk_threshold is {default:g}"
        )
    for judged in (1.0, 7.0):
        print(
            f"\nseed {args.measure_seed}, notices of a 24 h horizon judged within "
            f"{judged * 24:g} h: before (threshold {TODAY:g}) and after ({theta:g})"
        )
        print(NOTICE_HEADER)
        for label, thresholds, rules in (
            ("risk, before", TODAY, False),
            ("risk, after", theta, False),
            ("rules alone", math.inf, True),
            ("rules + risk, before", TODAY, True),
            ("rules + risk, after", theta, True),
        ):
            [p] = notice_curve(measurer, [thresholds], rules=rules, judged_days=judged)
            print(_notice_row(label, p))
    rules = measurer.metrics["rules"]
    print(
        f"\nfor reference, the rules' flagged GPU-days on seed {args.measure_seed} whose GPU "
        f"fails within 7 days: {rules.precision:.3f} (the backtest's precision)"
    )
    print(f"\nwall {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
