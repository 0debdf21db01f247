#!/usr/bin/env python
"""What the /metrics risk lines cost: a whole snapshot's render and a patched snapshot's.

The default page's risk lines (``server/metrics/risk_exposition.py``) are rendered for every new
snapshot a process holds while its page is scraped. Besides one whole-fleet snapshot every 30 s,
the urgent lane patches a node or two into a new snapshot every few seconds; a patched snapshot
carries the other nodes' lines and risks over and computes its own nodes only. This builds a
synthetic snapshot of ``--nodes`` x 8 GPUs scored by a stand-in model (p grows with age), times
in this process's CPU: scoring each horizon, grouping by node, the first render, a patch of one
node, and the patched snapshot's render, and checks that the patched render equals a whole render
of the same GPUs.

Run: ``.venv/bin/python benchmarks/risk_render.py [--nodes 12500] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from fleetwatch.server.judge.assessment import FleetAssessment, GpuAssessment
from fleetwatch.server.metrics.risk_exposition import render_risk

HORIZONS_H = [24.0, 168.0]  # the server's default risk_horizons_h


class _AgeModel:
    """A stand-in for the fitted bundle: p = age x horizon / 1000 days (capped at 1)."""

    covariates: tuple[str, ...] = ()  # age only, as RiskBundle.covariates says

    def score(self, units: Any, horizon_days: float) -> Any:
        p = self.probability(units, horizon_days)
        return type("Scores", (), {"probability": p, "model": ["m"] * len(p),
                                   "factors": [()] * len(p)})()  # fmt: skip

    def probability(self, units: Any, horizon_days: float) -> list[float]:
        return [min(1.0, float(a) * horizon_days / 1000) for a in units["age_days"]]


def _snapshot(nodes: int) -> FleetAssessment:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    gpus = [
        GpuAssessment(f"GPU-{n:05d}-{i}", f"node-{n:05d}", i, None, None, at,
                      float(i + n % 300), {}, ())
        for n in range(nodes)
        for i in range(8)
    ]  # fmt: skip
    return FleetAssessment(at, gpus, _AgeModel(), 1)  # type: ignore[arg-type]


def _cpu(step: Any) -> float:
    began = time.process_time()
    step()
    return time.process_time() - began


def one_round(nodes: int) -> dict[str, float]:
    snap = _snapshot(nodes)
    days = [h / 24.0 for h in HORIZONS_H]
    out = {
        "score_s": _cpu(lambda: [snap.risks(d) for d in days]),
        "group_by_node_s": _cpu(lambda: [snap.node_risks(d) for d in days]),
        "render_whole_s": _cpu(lambda: render_risk(snap, HORIZONS_H)),
    }
    node = snap.gpus[0].node
    fresh = [replace(g, age_days=5.0) for g in snap.gpus if g.node == node]
    holder: list[FleetAssessment] = []
    out["patch_s"] = _cpu(lambda: holder.append(snap.patched(snap.at + timedelta(seconds=5),
                                                             {node}, fresh)))  # fmt: skip
    patched = holder[0]
    out["render_patched_s"] = _cpu(lambda: render_risk(patched, HORIZONS_H))
    whole = FleetAssessment(patched.at, patched.gpus, snap.bundle, 1)
    if render_risk(patched, HORIZONS_H) != render_risk(whole, HORIZONS_H):
        raise SystemExit("the patched render differs from a whole render of the same GPUs")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=12_500, help="nodes of 8 GPUs (12,500)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = parser.parse_args(argv)
    if args.smoke:
        args.nodes, args.repeat = 20, 1
    rounds = []
    for k in range(args.repeat):
        rounds.append(one_round(args.nodes))
        print(f"round {k + 1}/{args.repeat}: {rounds[-1]}", flush=True)
    print(f"\n{args.nodes * 8:,} GPUs, horizons {HORIZONS_H}, CPU seconds (median of "
          f"{args.repeat}):")  # fmt: skip
    for name in rounds[0]:
        print(f"  {name:18} {statistics.median(r[name] for r in rounds):.3f}")


if __name__ == "__main__":
    main()
