"""What a prediction is worth on Titan (issue 40 item 3): drain the k riskiest GPUs each week.

For each forward split (cutoff c, span S = 26 weeks by default) today's model (the backtest's
``WeibullAFTRisk(penalizer=0.01)`` on ``MODEL_COLUMNS``) is fitted once on what was known before
c, then every 7 days from c the GPUs in service are scored with their covariates recomputed as
of that day (``fleetwatch.models.rolling_risks``; nothing after a week's decision reaches its
scores). ``--refit weekly`` refits at every decision instead (about 3 s more a week). The
drains follow ``fleetwatch.models.drain_budget``: k per week, a drained GPU leaves the pool, a
hit is a drained GPU that fails within H days after its drain, recall is the share of the
period's failures caught that way, lead time is failure minus drain.

Printed per split and as the mean over splits, for budgets of 0.1 %, 0.5 % and 1 % of the GPUs
in service at the cutoff, and for each horizon H: precision, recall and median lead time of the
model and of two baselines on the same weeks, an age-only Weibull and a random ranking
(``numpy.random.default_rng(0)``). ``--out DIR`` also writes the whole curve (k from 1 to 2 %
of the fleet) as ``curve.csv``.

    .venv/bin/python benchmarks/drain_budget.py [--cutoff 2016-01-01 ...] [--span-days 182]
        [--horizon 7 --horizon 28] [--refit cutoff|weekly] [--out DIR] [--smoke]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from fleetwatch.models.aft import WeibullAFTRisk  # noqa: E402
from fleetwatch.models.drain_budget import (  # noqa: E402
    BUDGET_FRACTIONS,
    BudgetPoint,
    budget_curve,
    budget_k,
    curve_ks,
)
from fleetwatch.models.features import read_titan  # noqa: E402
from fleetwatch.models.rolling_risks import RANKINGS, weekly_risks  # noqa: E402

TITAN = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "titan" / "gc_full.csv"
CUTOFFS = ("2016-01-01", "2016-07-01", "2017-01-01", "2017-07-01", "2018-01-01")


def _fmt(value: float, spec: str = ".3f") -> str:
    return "nan" if math.isnan(value) else format(value, spec)


def _row(split: str, h: float, name: str, fraction: float, p: BudgetPoint) -> str:
    return (
        f"| {split} | {h:g} | {name} | {100 * fraction:g} % | {p.k} | {p.drains} | {p.hits} | "
        f"{p.failures} | {_fmt(p.precision)} | {_fmt(p.recall)} | "
        f"{_fmt(p.median_lead_days, '.1f')} |"
    )


HEADER = (
    "| split | H (d) | ranking | budget | k / week | drains | hits | failures | precision | "
    "recall | median lead (d) |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--titan-path", type=Path, default=TITAN)
    parser.add_argument("--cutoff", action="append", help="split cutoff (repeatable)")
    parser.add_argument("--span-days", type=float, default=182.0)
    parser.add_argument("--horizon", action="append", type=float, help="H in days (repeatable)")
    parser.add_argument("--refit", choices=("cutoff", "weekly"), default="cutoff")
    parser.add_argument("--out", type=Path, help="directory for curve.csv")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = parser.parse_args(argv)
    cutoffs = args.cutoff or (["2017-01-01"] if args.smoke else list(CUTOFFS))
    horizons = args.horizon or [7.0, 28.0]
    span = 14.0 if args.smoke else args.span_days
    load = os.getloadavg()
    print(
        f"nproc {os.cpu_count()}, Python {platform.python_version()}, load average "
        f"{load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f} at start; refit at {args.refit}"
    )
    began = time.perf_counter()
    records = read_titan(args.titan_path)
    lines: list[str] = []
    curve_rows: list[str] = []
    # (H, ranking, fraction) -> per-split (precision, recall, lead)
    means: dict[tuple[float, str, float], list[BudgetPoint]] = {}
    for i, cutoff in enumerate(cutoffs):

        def progress(done: int, total: int, split: int = i) -> None:
            if done == 1 or done % 5 == 0 or done == total:
                print(
                    f"[drain_budget] split {split + 1}/{len(cutoffs)}: week {done}/{total}, "
                    f"{time.perf_counter() - began:.0f} s",
                    file=sys.stderr,
                )

        rolled = weekly_risks(
            records,
            cutoff,
            span,
            horizons,
            lambda: WeibullAFTRisk(penalizer=0.01),
            refit=args.refit,
            progress=progress,
        )
        n = rolled.fleet_size
        marked = [budget_k(n, f) for f in BUDGET_FRACTIONS]
        ks = curve_ks(n)
        weeks_n = len(rolled.weeks[(RANKINGS[0], horizons[0])])
        lines.append(
            f"\nsplit {cutoff}: {weeks_n} weekly decisions, {n} GPUs in service at the cutoff "
            f"(trained on {rolled.n_train} units, {rolled.n_train_failures} failures; "
            f"{rolled.wall_s:.0f} s)"
        )
        lines.append(HEADER)
        for h in horizons:
            for name in RANKINGS:
                curve = budget_curve(rolled.weeks[(name, h)], ks, h)
                by_k = {p.k: p for p in curve}
                for fraction, k in zip(BUDGET_FRACTIONS, marked, strict=True):
                    lines.append(_row(cutoff, h, name, fraction, by_k[k]))
                    means.setdefault((h, name, fraction), []).append(by_k[k])
                curve_rows += [
                    f"{cutoff},{h:g},{name},{p.k},{p.drains},{p.hits},{p.failures},"
                    f"{p.precision:.6g},{p.recall:.6g},{p.median_lead_days:.6g},"
                    f"{p.risk_at_k:.6g}"
                    for p in curve
                ]
    print("\n".join(lines))
    print(f"\nmean over {len(cutoffs)} split(s) (budget as a share of each split's fleet):")
    print("| H (d) | ranking | budget | precision | recall | median lead (d) |")
    print("|---:|---|---:|---:|---:|---:|")
    for (h, name, fraction), points in means.items():
        prec = float(np.nanmean([p.precision for p in points]))
        rec = float(np.nanmean([p.recall for p in points]))
        lead = [p.median_lead_days for p in points if not math.isnan(p.median_lead_days)]
        print(
            f"| {h:g} | {name} | {100 * fraction:g} % | {_fmt(prec)} | {_fmt(rec)} | "
            f"{_fmt(float(np.mean(lead)) if lead else math.nan, '.1f')} |"
        )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / "curve.csv"
        header = "split,horizon_days,ranking,k,drains,hits,failures,precision,recall,"
        header += "median_lead_days,risk_at_k"
        path.write_text("\n".join([header, *curve_rows]) + "\n")
        print(f"\nwrote {path}")
    print(f"\nwall {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
