"""A snapshot scores its GPUs at each horizon asked for; what does not depend on the horizon
(the model's input table, the factors, the rule flags) is built once, with the first horizon.
Every horizon's risks are those a fresh snapshot scoring that horizon alone gives, with a real
fitted model (an AFT on telemetry covariates) and with none."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pytest

from fleetwatch.models.registry import RiskBundle
from fleetwatch.models.telemetry_features import FEATURE_NAMES
from fleetwatch.server.judge.assessment import (
    FleetAssessment,
    GpuAssessment,
    GpuRisk,
    _units,
)
from fleetwatch.server.judge.judging import Verdict

AT = datetime(2026, 1, 1, tzinfo=UTC)
SKU = "NVIDIA H100 80GB HBM3"


def _bundle() -> RiskBundle:
    """An AFT fitted on synthetic lifetimes where a high SBE rate shortens life."""
    rng = np.random.default_rng(7)
    sbe = rng.exponential(5.0, 600)
    life = 400.0 * np.exp(-0.15 * sbe) * rng.weibull(1.4, 600)
    censor = rng.uniform(50, 600, 600)
    frame = pd.DataFrame({
        "duration_days": np.minimum(life, censor),
        "event": (life <= censor).astype(int),
        "group": SKU,
        "sbe_per_day": sbe,
    })  # fmt: skip
    return RiskBundle.fit(frame)


def _gpus(n: int) -> list[GpuAssessment]:
    rng = random.Random(5)
    fatal = Verdict("xid", "xid79_off_bus", "fatal", "reboot_node", True, "test", AT, AT, (), {})  # type: ignore[arg-type]
    out = []
    for k in range(n):
        features = {"sbe_per_day": rng.expovariate(0.2)} if rng.random() < 0.7 else {}
        verdicts = (fatal,) if rng.random() < 0.05 else ()
        node = f"node-{k // 8:03d}"
        age = rng.uniform(0, 900)
        out.append(GpuAssessment(f"GPU-{k}", node, k % 8, None, SKU, AT, age, features, verdicts))
    return out


def _plain(risks: list[GpuRisk]) -> list[tuple[object, ...]]:
    return [(r.gpu.uuid, r.probability, r.model_probability, r.basis, r.model, r.factors)
            for r in risks]  # fmt: skip


@pytest.mark.parametrize("with_model", [True, False])
@pytest.mark.parametrize("order", [[1.0, 7.0, 30.0], [30.0, 1.0, 7.0]])
def test_each_horizon_scores_as_a_fresh_snapshot_of_it_alone(
    with_model: bool, order: list[float]
) -> None:
    gpus = _gpus(400)
    bundle = _bundle() if with_model else None
    snapshot = FleetAssessment(AT, gpus, bundle, 1 if with_model else None)
    together = {h: snapshot.risks(h) for h in order}
    for h in order:
        alone = FleetAssessment(AT, gpus, bundle, 1 if with_model else None).risks(h)
        assert _plain(together[h]) == _plain(alone)
    if with_model:
        day, month = (np.array([r.probability for r in together[h]]) for h in (1.0, 30.0))
        assert (month >= day).all() and (month > day).any()
        assert any(r.factors for r in together[1.0])  # the AFT's drivers are carried
    assert {r.basis for r in together[1.0]} >= {"rule"}


def test_the_model_input_holds_each_reported_covariate_and_nan_where_absent() -> None:
    gpus = _gpus(60)
    full = dict.fromkeys(FEATURE_NAMES, 2.5) | {"temp_p95_c": 81}
    gpus.append(GpuAssessment("GPU-full", "node-full", 0, None, None, AT, 3.0, full, ()))
    units = _units(gpus)
    assert list(units.columns) == ["age_days", "group", *FEATURE_NAMES]
    assert len(units) == len(gpus)
    for i, gpu in enumerate(gpus):
        assert units["age_days"].iloc[i] == gpu.age_days
        assert units["group"].iloc[i] == gpu.sku
        for name in FEATURE_NAMES:
            value = units[name].iloc[i]
            if name in gpu.features:
                assert value == gpu.features[name]
            else:
                assert np.isnan(value)
    assert units[list(FEATURE_NAMES)].dtypes.eq(np.float64).all()
    empty = _units([])
    assert list(empty.columns) == list(units.columns) and len(empty) == 0
