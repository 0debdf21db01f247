"""The default page's risk lines of a patched snapshot (only the patched nodes computed anew)
are those of the same GPUs judged as a whole snapshot, byte for byte."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from fleetwatch.server.judge.assessment import FleetAssessment, GpuAssessment
from fleetwatch.server.judge.judging import Verdict
from fleetwatch.server.metrics import risk_exposition
from fleetwatch.server.metrics.risk_exposition import render_risk

AT = datetime(2026, 1, 1, tzinfo=UTC)


class _AgeBundle:
    """A stand-in risk model: p grows with age and horizon."""

    covariates: tuple[str, ...] = ()  # age only, as RiskBundle.covariates says

    def score(self, units: Any, horizon_days: float) -> Any:
        p = self.probability(units, horizon_days)
        return type("Scores", (), {"probability": p, "model": ["m"] * len(p),
                                   "factors": [()] * len(p)})()  # fmt: skip

    def probability(self, units: Any, horizon_days: float) -> list[float]:
        return [min(1.0, float(a) * horizon_days / 300) for a in units["age_days"]]


def _verdict(kind: str, severity: str, **evidence: str) -> Verdict:
    action = "drain_reset" if severity == "fatal" else "monitor"
    return Verdict(kind, f"rule_{severity}", severity, action, True, "test", AT, AT, (), evidence)  # type: ignore[arg-type]


def _gpu(node: str, index: int, rng: random.Random) -> GpuAssessment:
    draw = rng.random()
    verdicts: tuple[Verdict, ...] = ()
    if draw < 0.05:
        verdicts = (_verdict("xid", "fatal"),)
    elif draw < 0.08:
        verdicts = (_verdict("health", "warning"), _verdict("health", "critical"))
    elif draw < 0.1:
        verdicts = (_verdict("host", "critical", scope="node", component="port mlx5_0"),)
    age = float(rng.randrange(0, 300))
    return GpuAssessment(f"GPU-{node}-{index}", node, index, None, None, AT, age, {}, verdicts)


@pytest.mark.parametrize("horizons", [[24.0, 168.0], [12.0], []])
@pytest.mark.parametrize("scored", [True, False])
def test_a_patched_snapshot_renders_as_the_same_gpus_judged_whole(
    horizons: list[float], scored: bool
) -> None:
    rng = random.Random(11)
    nodes = [f"node-{n:03d}" for n in range(60)] + ['node-"quoted"']
    gpus = [_gpu(node, i, rng) for node in nodes for i in range(4)]
    bundle = _AgeBundle() if scored else None
    base = FleetAssessment(AT, gpus, bundle, 1 if scored else None)  # type: ignore[arg-type]
    render_risk(base, horizons)  # what the prefetch does: the parts are computed once
    fresh = [_gpu("node-007", i, rng) for i in range(3)] + [_gpu("node-new", 0, rng)]
    fresh.append(
        GpuAssessment("GPU-x", "node-008", 0, None, None, AT, 9.0, {}, (_verdict("xid", "fatal"),))
    )
    names = {"node-007", "node-008", "node-new", "node-010"}  # node-010: no GPU left
    patched = base.patched(AT + timedelta(seconds=5), names, fresh)
    whole = FleetAssessment(patched.at, patched.gpus, bundle, 1 if scored else None)  # type: ignore[arg-type]
    text = render_risk(patched, horizons)
    assert text == render_risk(whole, horizons)
    assert 'node="node-010"' not in text


def test_a_patch_computes_only_its_own_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(5)
    gpus = [_gpu(f"node-{n:03d}", i, rng) for n in range(20) for i in range(2)]
    base = FleetAssessment(AT, gpus, _AgeBundle(), 1)  # type: ignore[arg-type]
    render_risk(base, [24.0])
    computed: list[str] = []
    real = risk_exposition._node_part

    def counting(node: str, *args: Any) -> Any:
        computed.append(node)
        return real(node, *args)

    monkeypatch.setattr(risk_exposition, "_node_part", counting)
    patched = base.patched(AT + timedelta(seconds=1), {"node-003"}, [_gpu("node-003", 0, rng)])
    render_risk(patched, [24.0])
    assert computed == ["node-003"]
