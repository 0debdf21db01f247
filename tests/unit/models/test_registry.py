"""RiskBundle: recovery of known parameters, JSON round trip, scoring rules, wear-out onsets."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from tests.unit.models.synth import SEED

from fleetwatch.models.base import ModelFitError
from fleetwatch.models.registry import Factor, RiskBundle
from fleetwatch.models.wear_out import wear_out_onsets

RHO, LAM = 1.5, 1000.0
# Effects on log lifetime, per unit of the model's scale: log1p(sbe_per_day), a count rate.
BETA = {"sbe_per_day": -0.5, "temp_p95_c": 0.0, "x2": 0.3}


def _weibull_frame(
    rng: np.random.Generator, n: int, rho: float, lam: float, group: object = "A"
) -> pd.DataFrame:
    t = lam * rng.weibull(rho, size=n)
    censor = rng.uniform(0, 3 * lam, size=n)
    return pd.DataFrame(
        {"duration_days": np.minimum(t, censor), "event": (t <= censor).astype(int), "group": group}
    )


def _aft_frame(rng: np.random.Generator, n: int = 5000) -> pd.DataFrame:
    # SBE rates are heavy-tailed and non-negative; the AFT sees log1p(sbe_per_day).
    log_sbe = rng.gamma(4.0, 0.5, size=n)
    cov = {
        "sbe_per_day": np.expm1(log_sbe),
        "temp_p95_c": 70 + 5 * rng.normal(size=n),
        "x2": rng.normal(size=n),
    }
    log_lam = math.log(LAM) + BETA["sbe_per_day"] * (log_sbe - 2.0) + BETA["x2"] * cov["x2"]
    t = np.exp(log_lam) * rng.weibull(RHO, size=n)
    censor = rng.uniform(0, 3 * LAM, size=n)
    frame = pd.DataFrame(
        {
            "duration_days": np.minimum(t, censor),
            "event": (t <= censor).astype(int),
            "group": rng.choice(["H100", "A100"], size=n),
            **cov,
            "always_one": 1.0,
        }
    )
    # A tenth of the units never reported SBE counters.
    frame.loc[rng.random(n) < 0.1, "sbe_per_day"] = np.nan
    return frame


@pytest.fixture(scope="module")
def aft_bundle() -> tuple[RiskBundle, pd.DataFrame]:
    frame = _aft_frame(np.random.default_rng(SEED))
    return RiskBundle.fit(frame), frame


@pytest.fixture(scope="module")
def weibull_bundle() -> RiskBundle:
    rng = np.random.default_rng(SEED + 1)
    frame = pd.concat(
        [
            _weibull_frame(rng, 5000, RHO, LAM, "A"),
            _weibull_frame(rng, 30, 1.0, 300.0, "tiny"),
            _weibull_frame(rng, 200, 1.0, 300.0, None),
        ],
        ignore_index=True,
    )
    frame.loc[frame.index[-5:], "event"] = 0
    return RiskBundle.fit(frame, min_group_events=50)


def test_registry_recovers_weibull_shape_and_scale(rng: np.random.Generator) -> None:
    bundle = RiskBundle.fit(_weibull_frame(rng, 5000, RHO, LAM))
    for fit in (bundle.metrics["fleet"], bundle.metrics["groups"]["A"]):
        assert fit["rho"] == pytest.approx(RHO, rel=0.05)
        assert fit["lambda"] == pytest.approx(LAM, rel=0.05)
        lo, hi = fit["rho_ci"]
        assert lo < fit["rho"] < hi and hi - lo < 0.2
        est, mlo, mhi = fit["mtbf_days"]
        assert mlo < est < mhi
        assert est == pytest.approx(LAM * math.gamma(1 + 1 / RHO), rel=0.05)
    assert bundle.metrics["n"] == 5000 and bundle.metrics["aft"] is None
    assert not bundle.has_aft


def test_registry_small_groups_fall_back_to_the_fleet_fit(weibull_bundle: RiskBundle) -> None:
    assert set(weibull_bundle.metrics["groups"]) == {"A"}
    units = pd.DataFrame({"age_days": [100.0, 100.0, 100.0], "group": ["A", "tiny", None]})
    scores = weibull_bundle.score(units, 30)
    assert scores.model == ["weibull:A", "weibull:fleet", "weibull:fleet"]
    assert scores.factors == [[], [], []]
    # Fleet (mixed with exponential units) and group A differ.
    assert scores.probability[0] != pytest.approx(scores.probability[1])
    assert scores.probability[1] == pytest.approx(scores.probability[2])


def test_registry_aft_recovers_covariate_effects(
    aft_bundle: tuple[RiskBundle, pd.DataFrame],
) -> None:
    bundle, _ = aft_bundle
    aft = bundle.metrics["aft"]
    assert bundle.has_aft
    assert aft["coefficients"]["sbe_per_day"] == pytest.approx(BETA["sbe_per_day"], abs=0.06)
    assert aft["coefficients"]["x2"] == pytest.approx(BETA["x2"], abs=0.06)
    assert abs(aft["coefficients"]["temp_p95_c"]) < 0.02
    assert aft["rho"] == pytest.approx(RHO, rel=0.05)
    assert aft["rho_ci"][0] < aft["rho"] < aft["rho_ci"][1]
    assert aft["dropped_constant"] == ["always_one"]
    assert aft["log1p"] == ["sbe_per_day"]  # temperatures and other covariates stay raw
    assert aft["concordance_on"] == "held_out" and aft["concordance"] > 0.6
    # Units with high SBE rates (shorter lives) are riskier, and the factor says so.
    high = math.expm1(4.0)
    units = pd.DataFrame(
        {"age_days": [500.0, 500.0], "sbe_per_day": [high, 0.0], "x2": 0.0, "temp_p95_c": 70.0}
    )
    scores = bundle.score(units, 90)
    assert scores.model == ["aft", "aft"]
    assert scores.probability[0] > 2 * scores.probability[1]
    top = scores.factors[0][0]
    assert top.name == "sbe_per_day" and top.value == high and top.hazard_ratio > 1
    assert scores.factors[1][0].hazard_ratio < 1


def test_registry_factors_are_the_strongest_three(
    aft_bundle: tuple[RiskBundle, pd.DataFrame],
) -> None:
    bundle, frame = aft_bundle
    scores = bundle.score(frame.assign(age_days=100.0).head(200), 30)
    assert all(len(f) == 3 for f in scores.factors)  # three covariates survive the fit
    for unit in scores.factors:
        strengths = [abs(math.log(f.hazard_ratio)) for f in unit]
        assert strengths == sorted(strengths, reverse=True)
        assert {f.name for f in unit} == {"sbe_per_day", "x2", "temp_p95_c"}


def test_registry_missing_covariate_is_imputed_and_marked(
    aft_bundle: tuple[RiskBundle, pd.DataFrame],
) -> None:
    bundle, frame = aft_bundle
    median = float(frame["sbe_per_day"].median())
    units = pd.DataFrame(
        {
            "age_days": [300.0, 300.0],
            "sbe_per_day": [np.nan, median],
            "x2": 0.5,
            "temp_p95_c": 72.0,
        }
    )
    scores = bundle.score(units, 30)
    assert scores.probability[0] == pytest.approx(scores.probability[1])
    imputed = {f.name: f for f in scores.factors[0]}["sbe_per_day"]
    reported = {f.name: f for f in scores.factors[1]}["sbe_per_day"]
    assert imputed.value is None and reported.value == pytest.approx(median)
    assert imputed.hazard_ratio == pytest.approx(reported.hazard_ratio)
    # A column absent altogether is imputed too.
    no_column = bundle.score(units.drop(columns=["sbe_per_day"]), 30)
    np.testing.assert_allclose(no_column.probability, scores.probability[0])
    assert all(
        f.value is None for unit in no_column.factors for f in unit if f.name == "sbe_per_day"
    )


def test_registry_params_round_trip_scores_identically(
    aft_bundle: tuple[RiskBundle, pd.DataFrame], weibull_bundle: RiskBundle
) -> None:
    rng = np.random.default_rng(SEED + 2)
    units = pd.DataFrame(
        {
            "age_days": rng.uniform(0, 3000, 500),
            "group": rng.choice(["A", "tiny", "H100"], 500),
            "sbe_per_day": np.where(rng.random(500) < 0.2, np.nan, rng.normal(size=500)),
            "x2": rng.normal(size=500),
            "temp_p95_c": rng.normal(70, 5, 500),
        }
    )
    for bundle in (aft_bundle[0], weibull_bundle):
        text = json.dumps(bundle.to_params(), allow_nan=False)
        loaded = RiskBundle.from_params(json.loads(text))
        assert loaded.has_aft == bundle.has_aft
        before, after = bundle.score(units, 45), loaded.score(units, 45)
        np.testing.assert_array_equal(before.probability, after.probability)
        assert before.model == after.model and before.factors == after.factors


def test_registry_aft_clips_covariates_to_the_training_range(
    aft_bundle: tuple[RiskBundle, pd.DataFrame],
) -> None:
    bundle, frame = aft_bundle
    top = float(frame["sbe_per_day"].max())
    units = pd.DataFrame(
        {"age_days": 300.0, "sbe_per_day": [top, 1e300, np.inf], "x2": [0.0, 0.0, 0.0]}
    )
    scores = bundle.score(units, 30)
    # Beyond the training maximum the risk stays at the maximum's: no overflow, no nan.
    assert scores.probability[1] == pytest.approx(scores.probability[0])
    assert np.isfinite(scores.probability).all()
    by_name = [{f.name: f for f in unit} for unit in scores.factors]
    assert by_name[1]["sbe_per_day"].value == 1e300  # the raw reading, unclipped
    assert by_name[1]["sbe_per_day"].hazard_ratio == pytest.approx(
        by_name[0]["sbe_per_day"].hazard_ratio
    )
    assert by_name[2]["sbe_per_day"].value is None  # not finite: imputed
    design = bundle.aft_covariates(units)
    assert list(design.columns) == ["sbe_per_day", "temp_p95_c", "x2"]
    assert design["sbe_per_day"].iloc[0] == pytest.approx(math.log1p(top))
    assert design["sbe_per_day"].iloc[1] == design["sbe_per_day"].iloc[0]


def test_registry_format_1_params_score_without_transform(
    aft_bundle: tuple[RiskBundle, pd.DataFrame],
) -> None:
    params = aft_bundle[0].to_params()
    aft = {k: v for k, v in params["aft"].items() if k not in ("log1p", "low", "high")}
    old = RiskBundle.from_params({**params, "format": 1, "aft": aft})
    units = pd.DataFrame({"age_days": [200.0], "sbe_per_day": [3.0], "x2": [5.0]})
    raw = {"sbe_per_day": 3.0, "x2": 5.0, "temp_p95_c": aft["median"][1]}
    log_lam = aft["intercept"] + sum(
        b * raw[f] for f, b in zip(aft["features"], aft["coef"], strict=True)
    )
    rho = aft["rho"]
    expected = 1 - math.exp((200 / math.exp(log_lam)) ** rho - (230 / math.exp(log_lam)) ** rho)
    assert old.score(units, 30).probability[0] == pytest.approx(expected, rel=1e-9)
    # And it writes itself back as JSON (no infinite bounds).
    again = RiskBundle.from_params(json.loads(json.dumps(old.to_params(), allow_nan=False)))
    assert again.score(units, 30).probability[0] == pytest.approx(expected, rel=1e-9)


def test_registry_from_params_refuses_unknown_format(weibull_bundle: RiskBundle) -> None:
    params = {**weibull_bundle.to_params(), "format": 99}
    with pytest.raises(ModelFitError, match="format 99"):
        RiskBundle.from_params(params)


@pytest.mark.parametrize("which", ["aft", "weibull"])
def test_registry_risk_is_a_probability_that_grows_with_horizon(
    which: str, aft_bundle: tuple[RiskBundle, pd.DataFrame], weibull_bundle: RiskBundle
) -> None:
    bundle = aft_bundle[0] if which == "aft" else weibull_bundle
    rng = np.random.default_rng(SEED + 3)
    units = pd.DataFrame(
        {
            "age_days": np.r_[0.0, rng.uniform(0, 10_000, 99)],
            "group": "A",
            "sbe_per_day": rng.normal(0, 3, 100),
            "x2": rng.normal(0, 3, 100),
        }
    )
    horizons = [0.0, 1.0, 30.0, 365.0, 1e6]
    risks = np.stack([bundle.score(units, h).probability for h in horizons])
    assert np.all((risks >= 0) & (risks <= 1))
    assert np.all(np.diff(risks, axis=0) >= 0)
    assert np.all(risks[0] == 0) and np.all(risks[-1] > 0.99)


def test_registry_score_refuses_bad_input(weibull_bundle: RiskBundle) -> None:
    with pytest.raises(ValueError, match="age_days"):
        weibull_bundle.score(pd.DataFrame({"group": ["A"]}), 30)
    with pytest.raises(ValueError, match="negative"):
        weibull_bundle.score(pd.DataFrame({"age_days": [-1.0]}), 30)
    with pytest.raises(ValueError, match="horizon"):
        weibull_bundle.score(pd.DataFrame({"age_days": [1.0]}), -5)


def test_registry_fit_refuses_unusable_frames(rng: np.random.Generator) -> None:
    with pytest.raises(ModelFitError, match="duration_days"):
        RiskBundle.fit(pd.DataFrame({"event": [1]}))
    with pytest.raises(ModelFitError, match="empty"):
        RiskBundle.fit(pd.DataFrame({"duration_days": [], "event": []}))
    no_failures = _weibull_frame(rng, 50, RHO, LAM).assign(event=0)
    with pytest.raises(ModelFitError, match="no failures"):
        RiskBundle.fit(no_failures)
    with pytest.raises(ModelFitError, match="not numeric"):
        RiskBundle.fit(_weibull_frame(rng, 50, RHO, LAM).assign(rack="r1"))


def test_registry_aft_needs_enough_failures_with_telemetry(rng: np.random.Generator) -> None:
    frame = _weibull_frame(rng, 2000, RHO, LAM).assign(sbe_per_day=np.nan)
    frame.loc[:14, "sbe_per_day"] = rng.normal(size=15)  # at most 15 failures with telemetry
    bundle = RiskBundle.fit(frame, min_aft_events=20)
    assert not bundle.has_aft and bundle.metrics["aft"] is None
    units = pd.DataFrame({"age_days": [1.0], "group": ["A"], "sbe_per_day": [5.0]})
    assert bundle.score(units, 10).model == ["weibull:A"]


# -- wear-out onsets ---------------------------------------------------------------------------


def _params_bundle(rho: float, rho_ci: tuple[float, float]) -> RiskBundle:
    fit = {"lambda": 1000.0, "rho": rho, "rho_ci": list(rho_ci)}
    return RiskBundle.from_params({"format": 1, "fleet": fit, "groups": {"A": fit}, "aft": None})


def test_registry_wear_out_onset_fires_when_shape_crosses_one(rng: np.random.Generator) -> None:
    before = RiskBundle.fit(_weibull_frame(rng, 3000, 0.8, LAM), min_group_events=10**6)
    after = RiskBundle.fit(_weibull_frame(rng, 3000, 1.5, LAM), min_group_events=10**6)
    onsets = wear_out_onsets(before, after)
    assert [o["group"] for o in onsets] == ["fleet"]
    onset = onsets[0]
    assert onset["previous_rho"] <= 1 < onset["rho_ci"][0] < onset["rho"]
    assert onset["events"] == after.metrics["events"] and onset["mtbf_days"][0] > 0
    json.dumps(onsets)  # evidence goes into an event's JSON details
    # Round-tripped previous versions (as the server loads them) give the same answer.
    loaded = RiskBundle.from_params(before.to_params())
    assert [o["group"] for o in wear_out_onsets(loaded, after)] == ["fleet"]


@pytest.mark.parametrize(
    ("before", "after", "fires"),
    [
        ((0.95, (0.9, 1.0)), (1.3, (1.1, 1.5)), True),
        ((0.95, (0.9, 1.0)), (1.05, (0.95, 1.15)), False),  # the CI straddles 1: noise
        ((1.1, (1.0, 1.2)), (1.4, (1.2, 1.6)), False),  # already wearing out
        ((0.9, (0.8, 1.0)), (0.95, (0.9, 1.0)), False),
    ],
)
def test_registry_wear_out_onset_needs_the_ci_above_one(
    before: tuple[float, tuple[float, float]],
    after: tuple[float, tuple[float, float]],
    fires: bool,
) -> None:
    onsets = wear_out_onsets(_params_bundle(*before), _params_bundle(*after))
    assert sorted(o["group"] for o in onsets) == (["A", "fleet"] if fires else [])


def test_registry_wear_out_needs_a_previous_version() -> None:
    assert wear_out_onsets(None, _params_bundle(1.3, (1.1, 1.5))) == []


def test_registry_factor_is_frozen() -> None:
    factor = Factor("sbe_per_day", None, 1.2)
    with pytest.raises(AttributeError):
        factor.value = 3.0  # type: ignore[misc]


@pytest.mark.parametrize("which", ["aft", "weibull"])
def test_registry_probability_is_the_score_s_probability(
    which: str, aft_bundle: tuple[RiskBundle, pd.DataFrame], weibull_bundle: RiskBundle
) -> None:
    """What a second horizon of the same units is scored with: no factors, same numbers; and
    the factors and model names the first horizon's score built do not depend on the horizon."""
    bundle = aft_bundle[0] if which == "aft" else weibull_bundle
    rng = np.random.default_rng(SEED + 4)
    units = pd.DataFrame(
        {
            "age_days": rng.uniform(0, 3000, 200),
            "group": rng.choice(["A", "tiny", "other"], 200),
            "sbe_per_day": np.where(rng.random(200) < 0.2, np.nan, rng.normal(0, 3, 200)),
            "x2": rng.normal(0, 3, 200),
        }
    )
    day, week = bundle.score(units, 1.0), bundle.score(units, 7.0)
    assert np.array_equal(bundle.probability(units, 1.0), day.probability)
    assert np.array_equal(bundle.probability(units, 7.0), week.probability)
    assert not np.array_equal(day.probability, week.probability)
    assert day.model == week.model and day.factors == week.factors
    with pytest.raises(ValueError, match="horizon"):
        bundle.probability(units, -1.0)
