#!/usr/bin/env python
"""What scoring a snapshot's GPUs costs per horizon, with the horizon-independent part shared.

A worker scores each new whole-fleet snapshot at the planner's drain horizon (24 h) and, while
its ``/metrics`` is scraped, at every ``risk_horizons_h`` (24 h and 168 h by default): two
horizons. This builds ``--nodes`` x 8 synthetic GPUs with the model's telemetry covariates (70 %
of GPUs with readings, 5 % with a fatal verdict) and an AFT fitted on synthetic lifetimes with
those covariates, then measures in this process's CPU, side by side in one run:

- **shared**: one snapshot scoring 24 h then 168 h (the product: the model's input table, the
  factors and the rule flags built once, with the first horizon);
- **each anew**: each horizon scored on a snapshot of its own (what every horizon cost before),

and checks that both give the same risks, GPU for GPU.

Run: ``.venv/bin/python benchmarks/risk_scoring.py [--nodes 12500] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import time
from datetime import UTC, datetime

import numpy as np
import pandas as pd

from fleetwatch.models.registry import RiskBundle
from fleetwatch.models.telemetry_features import FEATURE_NAMES
from fleetwatch.server.judge.assessment import FleetAssessment, GpuAssessment
from fleetwatch.server.judge.judging import Verdict

AT = datetime(2026, 1, 1, tzinfo=UTC)
SKU = "NVIDIA H100 80GB HBM3"
HORIZONS_D = [1.0, 7.0]  # 24 h (drain and /metrics) and 168 h (/metrics)


def _bundle(seed: int = 7, n: int = 3000) -> RiskBundle:
    rng = np.random.default_rng(seed)
    columns = {name: rng.exponential(2.0, n) for name in FEATURE_NAMES}
    drive = 0.15 * columns["sbe_per_day"] + 0.1 * columns["temp_p95_c"]
    life = 400.0 * np.exp(-drive) * rng.weibull(1.4, n)
    censor = rng.uniform(50, 600, n)
    frame = pd.DataFrame(
        {"duration_days": np.minimum(life, censor), "event": (life <= censor).astype(int),
         "group": SKU, **columns}
    )  # fmt: skip
    return RiskBundle.fit(frame)


def _gpus(nodes: int) -> list[GpuAssessment]:
    rng = random.Random(5)
    fatal = Verdict("xid", "xid79_off_bus", "fatal", "reboot_node", True, "bench", AT, AT, (), {})  # type: ignore[arg-type]
    out = []
    for n in range(nodes):
        for i in range(8):
            features = (
                {name: rng.expovariate(0.5) for name in FEATURE_NAMES} if rng.random() < 0.7 else {}
            )
            verdicts = (fatal,) if rng.random() < 0.05 else ()
            out.append(GpuAssessment(f"GPU-{n}-{i}", f"node-{n:05d}", i, None, SKU, AT,
                                     rng.uniform(0, 900), features, verdicts))  # fmt: skip
    return out


def _cpu_s(step: object) -> float:
    began = time.process_time()
    step()  # type: ignore[operator]
    return time.process_time() - began


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=12_500, help="nodes of 8 GPUs (12,500)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = parser.parse_args(argv)
    if args.smoke:
        args.nodes, args.repeat = 20, 1
    bundle, gpus = _bundle(), _gpus(args.nodes)
    shared_s, anew_s = [], []
    for k in range(args.repeat):
        shared = FleetAssessment(AT, gpus, bundle, 1)
        alone = [(FleetAssessment(AT, gpus, bundle, 1), h) for h in HORIZONS_D]
        shared_s.append(_cpu_s(lambda: [shared.node_risks(h) for h in HORIZONS_D]))  # noqa: B023
        anew_s.append(_cpu_s(lambda: [s.node_risks(h) for s, h in alone]))  # noqa: B023
        for s, h in alone:
            a = [(r.probability, r.basis, r.factors) for r in shared.risks(h)]
            b = [(r.probability, r.basis, r.factors) for r in s.risks(h)]
            if a != b:
                raise SystemExit(f"horizon {h} d: shared and anew scores differ")
        print(f"round {k + 1}/{args.repeat}: shared {shared_s[-1]:.2f} s, "
              f"each anew {anew_s[-1]:.2f} s", flush=True)  # fmt: skip
    machine = platform.processor() or platform.machine()
    print(f"\n{len(gpus):,} GPUs, {len(FEATURE_NAMES)} covariates, horizons {HORIZONS_D} days; "
          f"{machine}, Python {platform.python_version()}")  # fmt: skip
    shared_median, anew_median = statistics.median(shared_s), statistics.median(anew_s)
    print(f"CPU s to score both horizons and group by node (median of {args.repeat}): "
          f"shared {shared_median:.2f}, each anew {anew_median:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
