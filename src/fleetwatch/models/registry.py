"""A risk-model version: the bundle of fits one refit produces, and how it scores GPUs.

A :class:`RiskBundle` holds

* a fleet Weibull and one Weibull per group (SKU or batch) with at least ``min_group_events``
  failures, for hazard and MTBF per group;
* when the training data has at least ``min_aft_events`` failures among rows with telemetry, a
  Weibull AFT on age plus covariates (:mod:`fleetwatch.models.aft`);
* when it is given landmark rows with enough failures within each horizon, a landmark model
  (:mod:`fleetwatch.models.served_landmark`): gradient-boosted trees on age and telemetry that
  learn P(failure within :math:`H`) from the fleet as it stood at each past midnight.

The bundle's **scorer** says which part scores the units: ``"landmark"``, ``"aft"`` or
``"weibull"`` (each unit by its group's Weibull, else the fleet's). By default the most
specific part fitted; the refit's held-out evaluation picks the one that scored better there
(:mod:`fleetwatch.server.upkeep.promotion`) and :meth:`RiskBundle.with_scorer` records it.

Under the Weibull and AFT parts, risk over a horizon :math:`H` for a unit of age :math:`a` is

.. math::

    \\mathrm{risk} = 1 - \\frac{S(a + H)}{S(a)}
        = 1 - \\exp\\!\\left((a/\\lambda)^{\\rho} - ((a + H)/\\lambda)^{\\rho}\\right),
    \\qquad \\log \\lambda(x) = \\beta_0 + \\beta^\\top x \\ \\text{(AFT)}

Under the ``"aft"`` scorer every unit is scored by the AFT; under ``"weibull"`` by its group's
Weibull, else the fleet's. The AFT's covariate design, fixed at fitting and applied unchanged
when scoring:

1. a covariate the unit did not report is imputed with its training median (raw scale);
2. heavy-tailed counts and rates (:data:`LOG1P_COVARIATES`: every telemetry feature but
   ``temp_p95_c`` and ``throttle_fraction``) enter as :math:`\\log(1 + \\max(x, 0))`, other
   covariates (``loc_*``, temperatures) as they are;
3. every covariate is clipped to its training range, so a reading far outside it cannot make
   :math:`\\exp(\\beta^\\top x)` overflow.

Covariates never reported or constant in training are dropped. An AFT factor reports the unit's
raw reading and a hazard ratio against the training mean :math:`\\bar x_j` on the model's scale,
:math:`\\exp(-\\rho\\,\\beta_j (x_j - \\bar x_j))`; above 1 it raises the unit's risk. A
landmark factor reports the reading and its path contribution to the log-odds of failure within
the horizon (:meth:`~fleetwatch.models.landmark_scoring.LandmarkScorer.contributions`); above 0
it raises the risk. A landmark model takes a missing reading as missing (its trees learnt where
to send one), not as a median.

:meth:`RiskBundle.to_params` is plain JSON and :meth:`RiskBundle.from_params` scores with numpy
alone, so the server stores a version in one row and never needs lifelines to serve it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from fleetwatch.gc_paused import gc_paused
from fleetwatch.models.base import DURATION_COL, EVENT_COL, ModelFitError
from fleetwatch.models.bundle_params import AftParams, WeibullParams, conditional_risk
from fleetwatch.models.landmark_scoring import LandmarkScorer
from fleetwatch.models.telemetry_features import FEATURE_NAMES

__all__ = [
    "EVENT",
    "DURATION_DAYS",
    "FLEET",
    "GROUP",
    "LOG1P_COVARIATES",
    "Factor",
    "RiskBundle",
    "RiskScores",
    "SCORERS",
    "Scorer",
]

DURATION_DAYS = "duration_days"
EVENT = "event"
GROUP = "group"
AGE = "age_days"
FLEET = "fleet"
PARAMS_FORMAT = 3
# 1: before the covariate design (no log1p, no clipping); 2: before the landmark part
_READABLE_FORMATS = (1, 2, 3)
Scorer = Literal["landmark", "aft", "weibull"]
SCORERS: tuple[Scorer, ...] = ("landmark", "aft", "weibull")
"""Most specific first: a bundle scores by the first part it has unless told otherwise."""
MAX_FACTORS = 3
HOLDOUT_FRACTION = 0.2
MIN_HOLDOUT_EVENTS = 10
_SPLIT_SEED = 20260501
_RESERVED = (DURATION_DAYS, EVENT, GROUP, AGE)

LOG1P_COVARIATES: frozenset[str] = frozenset(FEATURE_NAMES) - {"temp_p95_c", "throttle_fraction"}
"""Covariates that enter the AFT as ``log1p``: non-negative counts and rates whose raw values run
into the thousands (SBE rates) and would make the AFT scale overflow."""


@dataclass(frozen=True)
class Factor:
    """One driver of a unit's model risk: a hazard ratio (AFT) or a contribution (landmark)."""

    name: str
    value: float | None
    """The unit's raw reading; None when it did not report one (the AFT then used the training
    median; a landmark model takes it as missing)."""
    hazard_ratio: float | None
    """AFT: > 1 raises this unit's risk compared with the training average, < 1 lowers it
    (compared on the model's scale: after log1p and clipping). None for a landmark model."""
    contribution: float | None = None
    """Landmark model: this covariate's path contribution to the log-odds of failure within the
    horizon; > 0 raises the risk. None for the AFT."""

    @property
    def strength(self) -> float:
        """How strongly it moves the risk, comparable among one unit's factors."""
        if self.contribution is not None:
            return abs(self.contribution)
        return abs(math.log(self.hazard_ratio)) if self.hazard_ratio else 0.0

    @property
    def effect(self) -> str:
        """``×1.23`` (hazard ratio) or ``+0.42`` (log-odds), for pages and messages."""
        if self.contribution is not None:
            return f"{self.contribution:+.2f} log-odds"
        return f"×{self.hazard_ratio:.2f}"


@dataclass(frozen=True)
class RiskScores:
    probability: NDArray[np.float64]
    """P(failure within the horizon | survived to the current age), per unit, in [0, 1]."""
    model: list[str]
    """Per unit: ``"landmark"``, ``"aft"``, ``"weibull:<group>"`` or ``"weibull:fleet"``."""
    factors: list[list[Factor]]
    """Per unit, up to three strongest drivers, strongest first (empty for Weibull units)."""


def _fit_weibull(part: pd.DataFrame, label: str) -> tuple[WeibullParams, dict[str, Any]]:
    """Fit one Weibull on ``part``; return it and its metrics (n, events, rho, CI, MTBF)."""
    from scipy.stats import norm  # only when fitting: its import was a second of each start

    from fleetwatch.models.weibull import WeibullRisk  # lifelines: only when fitting

    y = pd.DataFrame({DURATION_COL: part[DURATION_DAYS].to_numpy(), EVENT_COL: part[EVENT]})
    try:
        model = WeibullRisk().fit(pd.DataFrame(index=y.index), y)
    except ModelFitError as exc:
        raise ModelFitError(f"{label}: {exc}") from exc
    fitter = model.fitter_
    lam, rho = float(fitter.lambda_), float(fitter.rho_)
    se = float(np.sqrt(fitter.variance_matrix_.loc["rho_", "rho_"]))
    z = float(norm.ppf(0.975))
    rho_ci = (rho - z * se, rho + z * se)
    mtbf = model.mtbf()
    metrics = {
        "n": len(part),
        "events": int(part[EVENT].sum()),
        "rho": rho,
        "rho_ci": list(rho_ci),
        "lambda": lam,
        "mtbf_days": [float(v) for v in mtbf],
    }
    return WeibullParams(lam=lam, rho=rho, rho_ci=rho_ci), metrics


def _check_frame(frame: pd.DataFrame) -> list[str]:
    """Validate the training frame; return its covariate columns."""
    missing = [c for c in (DURATION_DAYS, EVENT) if c not in frame.columns]
    if missing:
        raise ModelFitError(
            f"training frame lacks column(s) {missing}; give duration_days (days > 0) and "
            "event (0/1)"
        )
    if len(frame) == 0:
        raise ModelFitError("the training frame is empty; record GPU lifetimes first")
    covariates = [c for c in frame.columns if c not in _RESERVED]
    text = [c for c in covariates if not pd.api.types.is_numeric_dtype(frame[c])]
    if text:
        raise ModelFitError(f"covariates {text} are not numeric; encode them or drop them")
    return covariates


class RiskBundle:
    """One model version: fleet and per-group Weibull fits and, when the data allows, an AFT.

    Build with :meth:`fit` (needs lifelines) or :meth:`from_params` (numpy only).

    Attributes
    ----------
    metrics : dict
        ``n``, ``events``, ``fleet`` and ``groups`` (per group ``n``, ``events``, ``rho``,
        ``rho_ci``, ``lambda``, ``mtbf_days`` as ``[estimate, lower, upper]``) and ``aft``
        (``n``, ``events``, ``concordance``, ``concordance_on``: ``"held_out"`` or
        ``"in_sample"``, ``rho``, ``rho_ci``, ``coefficients`` (on the model's scale),
        ``dropped_constant``, ``log1p``: the covariates that enter as log1p) or None.
        Empty for a bundle loaded with :meth:`from_params`.

    Examples
    --------
    >>> bundle = RiskBundle.fit(frame)  # doctest: +SKIP
    >>> bundle.score(units, horizon_days=30).probability  # doctest: +SKIP
    """

    def __init__(
        self,
        fleet: WeibullParams,
        groups: dict[str, WeibullParams],
        aft: AftParams | None,
        metrics: dict[str, Any] | None = None,
        *,
        landmark: LandmarkScorer | None = None,
        scorer: Scorer | None = None,
    ) -> None:
        self._fleet = fleet
        self._groups = groups
        self._aft = aft
        self._landmark = landmark
        self.metrics: dict[str, Any] = metrics or {}
        available = self.scorers
        if scorer is not None and scorer not in available:
            raise ModelFitError(
                f"scorer {scorer!r} needs a part this bundle lacks; has {available}"
            )
        self.scorer: Scorer = scorer or available[0]

    @property
    def has_aft(self) -> bool:
        return self._aft is not None

    @property
    def has_landmark(self) -> bool:
        return self._landmark is not None

    @property
    def covariates(self) -> tuple[str, ...]:
        """Every covariate a part of this bundle reads (``age_days`` aside), for a caller that
        builds the units to score."""
        names = list(self._aft.features) if self._aft is not None else []
        if self._landmark is not None:
            names += [n for n in self._landmark.feature_names if n != AGE and n not in names]
        return tuple(names)

    @property
    def scorers(self) -> list[Scorer]:
        """The scorers this bundle can use, most specific first (``"weibull"`` always)."""
        parts = {"landmark": self.has_landmark, "aft": self.has_aft, "weibull": True}
        return [s for s in SCORERS if parts[s]]

    def with_scorer(self, scorer: Scorer) -> RiskBundle:
        """This bundle (the same fitted parts) scoring by ``scorer``."""
        return RiskBundle(
            self._fleet,
            self._groups,
            self._aft,
            self.metrics,
            landmark=self._landmark,
            scorer=scorer,
        )

    @property
    def weibulls(self) -> dict[str, WeibullParams]:
        """The Weibull fits by name: ``"fleet"`` and each group's."""
        return {FLEET: self._fleet, **self._groups}

    @classmethod
    def fit(
        cls,
        frame: pd.DataFrame,
        *,
        min_group_events: int = 10,
        min_aft_events: int = 20,
        penalizer: float = 0.01,
        landmarks: tuple[pd.DataFrame, pd.DataFrame] | None = None,
        landmark_horizons: Sequence[float] = (1.0, 7.0),
    ) -> RiskBundle:
        """Fit every part of the bundle on ``frame``.

        Parameters
        ----------
        frame : pandas.DataFrame
            ``duration_days`` (float > 0), ``event`` (0/1), optional ``group`` (str or None) and
            numeric covariates (NaN = not reported).
        min_group_events : int
            Failures a group needs for its own Weibull.
        min_aft_events : int
            Failures among rows with any covariate reported that the AFT needs.
        penalizer : float
            The AFT's L2 penalty.
        landmarks : (X, y), optional
            Landmark rows (:func:`~fleetwatch.models.telemetry_landmarks.telemetry_landmark_rows`)
            for a landmark part; without them, or with too few failures, the bundle has none.
        landmark_horizons : sequence of float
            The landmark part's horizons in days, one classifier each.

        Raises
        ------
        ModelFitError
            If the frame is unusable or the fleet fit fails.
        """
        if min_group_events < 1 or min_aft_events < 1:
            raise ModelFitError("min_group_events and min_aft_events must be >= 1")
        covariates = _check_frame(frame)
        frame = frame.reset_index(drop=True)
        fleet, fleet_metrics = _fit_weibull(frame, "fleet Weibull")
        groups: dict[str, WeibullParams] = {}
        group_metrics: dict[str, Any] = {}
        if GROUP in frame.columns:
            keys = frame[GROUP].astype(object).where(frame[GROUP].notna(), None)
            for key, part in frame.groupby(keys.to_numpy(), dropna=True):
                if key is None or int(part[EVENT].sum()) < min_group_events:
                    continue
                groups[str(key)], group_metrics[str(key)] = _fit_weibull(
                    part, f"Weibull for group {key!r}"
                )
        aft, aft_metrics = _fit_aft(frame, covariates, min_aft_events, penalizer)
        landmark, landmark_metrics = None, None
        if landmarks is not None:
            from fleetwatch.models.served_landmark import fit_served_landmark

            landmark, landmark_metrics = fit_served_landmark(*landmarks, landmark_horizons)
        metrics = {
            "n": len(frame),
            "events": int(frame[EVENT].sum()),
            "fleet": fleet_metrics,
            "groups": group_metrics,
            "aft": aft_metrics,
            "landmark": landmark_metrics,
        }
        return cls(fleet, groups, aft, metrics, landmark=landmark)

    def to_params(self) -> dict[str, Any]:
        """Everything :meth:`score` needs, as JSON-safe values."""
        return {
            "format": PARAMS_FORMAT,
            "fleet": self._fleet.to_params(),
            "groups": {k: w.to_params() for k, w in self._groups.items()},
            "aft": None if self._aft is None else self._aft.to_params(),
            "landmark": None if self._landmark is None else self._landmark.to_params(),
            "scorer": self.scorer,
        }

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> RiskBundle:
        """The bundle :meth:`to_params` described (``metrics`` is left empty)."""
        if params.get("format") not in _READABLE_FORMATS:
            raise ModelFitError(
                f"model params have format {params.get('format')!r}; this version reads "
                f"{', '.join(map(str, _READABLE_FORMATS))}: refit the model"
            )
        aft = params.get("aft")
        landmark = params.get("landmark")
        return cls(
            WeibullParams.from_params(params["fleet"]),
            {str(k): WeibullParams.from_params(v) for k, v in params["groups"].items()},
            None if aft is None else AftParams.from_params(aft),
            landmark=None if landmark is None else LandmarkScorer.from_params(landmark),
            scorer=cast("Scorer | None", params.get("scorer")),
        )

    def score(self, units: pd.DataFrame, horizon_days: float) -> RiskScores:
        """Risk of failure within ``horizon_days`` for each row of ``units``.

        ``units`` has ``age_days`` (>= 0), optional ``group`` and any covariates (NaN allowed).
        """
        ages = _checked_ages(units, horizon_days)
        if self.scorer == "landmark" and self._landmark is not None:
            return self._score_landmark(self._landmark, units, horizon_days)
        if self.scorer == "aft" and self._aft is not None:
            return self._score_aft(self._aft, units, ages, horizon_days)
        return self._score_weibull(units, ages, horizon_days)

    def probability(self, units: pd.DataFrame, horizon_days: float) -> NDArray[np.float64]:
        """:meth:`score`'s ``probability`` alone, for another horizon of units already scored:
        the models and factors do not depend on the horizon, and building the factors is most
        of a score's cost."""
        ages = _checked_ages(units, horizon_days)
        if self.scorer == "landmark" and self._landmark is not None:
            return self._landmark.risk(_landmark_input(self._landmark, units), horizon_days)
        if self.scorer == "aft" and self._aft is not None:
            x = self._aft.design(_raw_covariates(units, self._aft.features))
            mu = self._aft.intercept + x @ self._aft.coef
            return conditional_risk(ages, horizon_days, mu, self._aft.rho)
        lam, rho, _ = self._weibull_parameters(units)
        return conditional_risk(ages, horizon_days, np.log(lam), rho)

    def aft_covariates(self, units: pd.DataFrame) -> pd.DataFrame:
        """The AFT's covariates for ``units`` as it sees them: imputed, log1p, clipped.

        One column per AFT feature, in the model's order; no columns when the bundle has no AFT.
        """
        if self._aft is None:
            return pd.DataFrame(index=units.index)
        x = self._aft.design(_raw_covariates(units, self._aft.features))
        return pd.DataFrame(x, index=units.index, columns=list(self._aft.features))

    def _score_weibull(
        self, units: pd.DataFrame, ages: NDArray[np.float64], horizon: float
    ) -> RiskScores:
        lam, rho, labels = self._weibull_parameters(units)
        empty: list[list[Factor]] = [[] for _ in range(len(units))]
        probability = conditional_risk(ages, horizon, np.log(lam), rho)
        return RiskScores(probability, labels.tolist(), empty)

    def _weibull_parameters(
        self, units: pd.DataFrame
    ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.object_]]:
        """Per unit: its group's Weibull scale and shape (the fleet's without a group fit), and
        the model's label."""
        n = len(units)
        lam = np.full(n, self._fleet.lam)
        rho = np.full(n, self._fleet.rho)
        labels = np.full(n, f"weibull:{FLEET}", dtype=object)
        if self._groups and GROUP in units.columns:
            keys = units[GROUP].to_numpy(dtype=object)
            for key, fit in self._groups.items():
                mask = keys == key
                lam[mask], rho[mask], labels[mask] = fit.lam, fit.rho, f"weibull:{key}"
        return lam, rho, labels

    @staticmethod
    def _score_landmark(
        landmark: LandmarkScorer, units: pd.DataFrame, horizon: float
    ) -> RiskScores:
        x = _landmark_input(landmark, units)
        probability = landmark.risk(x, horizon)
        _, contributions = landmark.contributions(x, horizon)
        c = contributions.to_numpy(dtype=np.float64)
        n, p = c.shape
        k = min(MAX_FACTORS, p)
        top = np.argsort(-np.abs(c), axis=1, kind="stable")[:, :k]
        rows = np.arange(n)[:, None]
        raw = x.to_numpy(dtype=np.float64)[rows, top]
        chosen = raw.astype(object)
        chosen[~np.isfinite(raw)] = None
        values = chosen.ravel().tolist()
        names = np.asarray(landmark.feature_names, dtype=object)[top].ravel().tolist()
        shares = c[rows, top].ravel().tolist()
        with gc_paused():
            flat = [Factor(m, v, None, w) for m, v, w in zip(names, values, shares, strict=True)]
            factors = [flat[i : i + k] for i in range(0, n * k, k)] if k else [[]] * n
        return RiskScores(probability, ["landmark"] * n, factors)

    @staticmethod
    def _score_aft(
        aft: AftParams, units: pd.DataFrame, ages: NDArray[np.float64], horizon: float
    ) -> RiskScores:
        n, p = len(units), len(aft.features)
        raw = _raw_covariates(units, aft.features)
        reported = np.isfinite(raw)
        x = aft.design(raw)
        probability = conditional_risk(ages, horizon, aft.intercept + x @ aft.coef, aft.rho)

        # Clipped: far outside the training range exp() overflows; e^±50 says enough.
        log_hr = np.clip(-aft.rho * aft.coef * (x - aft.mean), -50.0, 50.0)
        k = min(MAX_FACTORS, p)
        top = np.argsort(-np.abs(log_hr), axis=1, kind="stable")[:, :k]
        rows = np.arange(n)[:, None]
        # One flat pass builds the Factors (the bulk of the cost), then rows are sliced off.
        names = np.asarray(aft.features, dtype=object)[top].ravel().tolist()
        chosen = raw[rows, top].astype(object)
        chosen[~reported[rows, top]] = None
        values = chosen.ravel().tolist()
        ratios = np.exp(log_hr[rows, top]).ravel().tolist()
        if k == 0:  # an AFT without covariates: nothing drives the risk
            return RiskScores(probability, ["aft"] * n, [[] for _ in range(n)])
        with gc_paused():
            flat = list(map(Factor, names, values, ratios))
            factors = [flat[i : i + k] for i in range(0, n * k, k)]
        return RiskScores(probability, ["aft"] * n, factors)


def _checked_ages(units: pd.DataFrame, horizon_days: float) -> NDArray[np.float64]:
    """``units``' ages in days, after checking them and the horizon (ValueError otherwise)."""
    if not math.isfinite(horizon_days) or horizon_days < 0:
        raise ValueError(f"horizon_days must be finite and >= 0, got {horizon_days}")
    if AGE not in units.columns:
        raise ValueError(f"units lack column {AGE!r} (days since install)")
    ages: NDArray[np.float64] = pd.to_numeric(units[AGE], errors="coerce").to_numpy(np.float64)
    bad = ~np.isfinite(ages) | (ages < 0)
    if bad.any():
        raise ValueError(
            f"{int(bad.sum())} units have a missing or negative {AGE!r} "
            f"(first at position {int(np.flatnonzero(bad)[0])})"
        )
    return ages


def _landmark_input(landmark: LandmarkScorer, units: pd.DataFrame) -> pd.DataFrame:
    """The landmark model's covariates of ``units``, NaN where absent (``age_days`` always)."""
    x = _raw_covariates(units, landmark.feature_names)
    return pd.DataFrame(x, index=units.index, columns=list(landmark.feature_names))


def _raw_covariates(units: pd.DataFrame, features: tuple[str, ...]) -> NDArray[np.float64]:
    """``units``' readings of ``features`` as floats, NaN where absent or not numeric."""
    x = np.full((len(units), len(features)), np.nan)
    for j, name in enumerate(features):
        if name in units.columns:
            x[:, j] = pd.to_numeric(units[name], errors="coerce").to_numpy(dtype=np.float64)
    return x


def _fit_aft(
    frame: pd.DataFrame, covariates: list[str], min_events: int, penalizer: float
) -> tuple[AftParams | None, dict[str, Any] | None]:
    """The AFT on rows with any covariate reported, or None when too few failures have one."""
    if not covariates:
        return None, None
    values = frame[covariates].astype(np.float64)
    rows = frame[values.notna().any(axis=1).to_numpy()]
    if int(rows[EVENT].sum()) < min_events:
        return None, None
    x = values.loc[rows.index]
    x = x.loc[:, x.notna().any(axis=0)]
    median = x.median()
    x = x.fillna(median)
    logged = [c for c in x.columns if c in LOG1P_COVARIATES]
    x[logged] = np.log1p(x[logged].clip(lower=0.0))
    constant = [c for c in x.columns if x[c].nunique() < 2]
    x = x.drop(columns=constant)
    if x.shape[1] == 0:
        return None, None
    from fleetwatch.models.aft import WeibullAFTRisk  # lifelines: only when fitting

    y = pd.DataFrame({DURATION_COL: rows[DURATION_DAYS], EVENT_COL: rows[EVENT]})

    def fit(idx: NDArray[np.int64]) -> WeibullAFTRisk:
        try:
            return WeibullAFTRisk(penalizer=penalizer).fit(x.iloc[idx], y.iloc[idx])
        except ModelFitError as exc:
            raise ModelFitError(f"AFT: {exc}") from exc

    everything = np.arange(len(x))
    order = np.random.default_rng(_SPLIT_SEED).permutation(len(x))
    held = order[: int(len(x) * HOLDOUT_FRACTION)]
    if int(y[EVENT_COL].iloc[held].sum()) >= MIN_HOLDOUT_EVENTS:
        trained = fit(np.sort(order[len(held) :]))
        concordance = trained.score(x.iloc[held], y.iloc[held])
        concordance_on = "held_out"
    else:
        concordance_on = "in_sample"
    model = fit(everything)
    if concordance_on == "in_sample":
        concordance = model.score(x, y)
    params = model.fitter_.params_
    log_rho = float(params.loc[("rho_", "Intercept")])
    ci = model.fitter_.confidence_intervals_.loc[("rho_", "Intercept")].to_numpy(dtype=float)
    features = tuple(str(c) for c in x.columns)
    beta = model.coefficients()
    aft = AftParams(
        intercept=float(params.loc[("lambda_", "Intercept")]),
        rho=math.exp(log_rho),
        features=features,
        coef=beta[list(features)].to_numpy(dtype=np.float64),
        median=median[list(features)].to_numpy(dtype=np.float64),
        mean=x.mean().to_numpy(dtype=np.float64),
        log1p=np.array([f in LOG1P_COVARIATES for f in features], dtype=np.bool_),
        low=x.min().to_numpy(dtype=np.float64),
        high=x.max().to_numpy(dtype=np.float64),
    )
    metrics = {
        "n": len(x),
        "events": int(y[EVENT_COL].sum()),
        "concordance": float(concordance),
        "concordance_on": concordance_on,
        "rho": aft.rho,
        "rho_ci": [math.exp(float(ci[0])), math.exp(float(ci[1]))],
        "coefficients": {f: float(b) for f, b in zip(features, aft.coef, strict=True)},
        "dropped_constant": constant,
        "log1p": [f for f in features if f in LOG1P_COVARIATES],
    }
    return aft, metrics
