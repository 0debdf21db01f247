"""Titan forward splits (issue 40): survival learners beyond the parametric Weibull AFT.

The issue asked to try gradient-boosted and random-forest survival (scikit-survival) and gradient
boosting with a survival objective (XGBoost's Cox), and to keep the simplest that wins. Each is
fitted here on exactly what today's AFT is fitted on: the lifetimes known before the cutoff with
the backtest's covariates (:data:`fleetwatch.models.features.MODEL_COLUMNS`: position, odd
column, lot and cabinet failure rates over the other folds), scored as
:math:`1 - S(a + H) / S(a)` for every unit in service at the cutoff, on the splits of
``titan_models.py`` (``dev`` chooses, ``report`` is reported), beside the AFT of the same run.

* ``gbsa``: ``sksurv.ensemble.GradientBoostingSurvivalAnalysis``, Cox loss (depth 3, 200
  rounds at 0.1, half of the rows a round, 50 per leaf), Weibull baseline as ``xgb_cox``;
* ``rsf``: ``sksurv.ensemble.RandomSurvivalForest`` (100 trees, 100 per leaf, a third of the rows
  a tree), its own (nonparametric) survival curves;
* ``xgb_cox``: XGBoost's ``survival:cox`` (depth 3, 200 rounds at 0.05), its hazard ratios turned
  into probabilities with a Weibull baseline fitted with them (:func:`_weibull_baseline`);
  ``xgb_cox_breslow`` with Breslow's baseline instead, which cannot forecast past the oldest
  failure it saw (see there).

Settings are the libraries' usual ones, set before any split was scored and not tuned. A
covariate a unit lacks is imputed with its training median (the AFT does the same). ``gbsa`` runs
only when asked for: one fit took 110-167 s on a fifth of Titan, where XGBoost's Cox took 1-5 s
on all of it. The libraries are the ``learners`` extra (in ``dev``).

    .venv/bin/python benchmarks/titan_learners.py [--learners xgb_cox,xgb_cox_breslow,rsf,gbsa]
        [--role dev|report|both] [--out rows.csv] [--smoke]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Self

import numpy as np
import pandas as pd
from numpy.typing import NDArray

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from titan_models import SPLITS, TIE_AUC, TITAN, _machine, metric_row  # noqa: E402

from fleetwatch.models.backtest import backtest  # noqa: E402
from fleetwatch.models.base import AGE_COL  # noqa: E402
from fleetwatch.models.features import read_titan  # noqa: E402
from fleetwatch.models.snapshot import prepare_records  # noqa: E402

SurvivalCurves = Callable[[NDArray[np.float64], NDArray[np.float64]], NDArray[np.float64]]
"""(covariates, times per row) -> S(time) per row."""


def _breslow(
    duration: NDArray[np.float64], event: NDArray[np.bool_], ratio: NDArray[np.float64]
) -> Callable[[NDArray[np.float64], NDArray[np.float64]], NDArray[np.float64]]:
    """A Cox model's S(t | hazard ratio r) = exp(-H0(t) r), with Breslow's baseline from the
    training lifetimes and their ratios: H0(t) = sum over failures s <= t of 1 / (sum of the
    ratios still at risk at s)."""
    order = np.argsort(duration, kind="stable")
    times, failed = duration[order], event[order]
    at_risk = np.cumsum(ratio[order][::-1])[::-1]
    steps = np.concatenate([[0.0], np.cumsum(np.where(failed, 1.0 / at_risk, 0.0))])

    def survival(r: NDArray[np.float64], t: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.exp(-steps[np.searchsorted(times, t, side="right")] * r)

    return survival


def _weibull_baseline(
    duration: NDArray[np.float64], event: NDArray[np.bool_], ratio: NDArray[np.float64]
) -> Callable[[NDArray[np.float64], NDArray[np.float64]], NDArray[np.float64]]:
    """S(t | r) = exp(-r (t / lambda)^rho): a Weibull baseline fitted by maximum likelihood with
    each lifetime's hazard ratio as a fixed factor. Breslow's baseline is flat past the oldest
    failure it saw; on Titan, one cohort installed within months, every unit in service is that
    old at early cutoffs, so it gave every unit the same risk (AUC 0.50). A Weibull carries the
    hazard on, as the AFT does."""
    from scipy.optimize import minimize

    t = np.maximum(duration, 1e-6)
    log_r = np.log(np.maximum(ratio, 1e-300))

    def negative_log_likelihood(p: NDArray[np.float64]) -> float:
        log_rho, log_lam = p
        rho = np.exp(log_rho)
        z = rho * (np.log(t) - log_lam)
        logged = event * (log_rho - log_lam + (rho - 1.0) * (np.log(t) - log_lam) + log_r)
        return float(-(logged.sum() - (ratio * np.exp(z)).sum()))

    start = np.array([0.0, np.log(t.mean())])
    rho, lam = np.exp(minimize(negative_log_likelihood, start, method="Nelder-Mead").x)

    def survival(r: NDArray[np.float64], at: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.exp(-r * (np.maximum(at, 0.0) / lam) ** rho)

    return survival


def _fit_gbsa(
    x: NDArray[np.float64], duration: NDArray[np.float64], event: NDArray[np.bool_]
) -> SurvivalCurves:
    from sksurv.ensemble import GradientBoostingSurvivalAnalysis
    from sksurv.util import Surv

    model = GradientBoostingSurvivalAnalysis(
        n_estimators=200, learning_rate=0.1, max_depth=3, subsample=0.5, min_samples_leaf=50,
        random_state=0,
    )  # fmt: skip
    model.fit(x, Surv.from_arrays(event, duration))
    # Its Cox loss: predict() is the log hazard ratio (sksurv's own survival function is Breslow's
    # on it, flat past the oldest failure: see _weibull_baseline).
    baseline = _weibull_baseline(duration, event, np.exp(model.predict(x)))
    return lambda xs, t: baseline(np.exp(model.predict(xs)), t)


def _fit_rsf(
    x: NDArray[np.float64], duration: NDArray[np.float64], event: NDArray[np.bool_]
) -> SurvivalCurves:
    from sksurv.ensemble import RandomSurvivalForest
    from sksurv.util import Surv

    model = RandomSurvivalForest(
        n_estimators=100, min_samples_leaf=100, max_samples=0.33, n_jobs=2, random_state=0
    )
    model.fit(x, Surv.from_arrays(event, duration))
    grid = np.asarray(model.unique_times_, dtype=np.float64)

    def survival(xs: NDArray[np.float64], t: NDArray[np.float64]) -> NDArray[np.float64]:
        curves = model.predict_survival_function(xs, return_array=True)
        at = np.searchsorted(grid, t, side="right") - 1  # S is 1 before the first time
        picked = curves[np.arange(len(xs)), np.clip(at, 0, len(grid) - 1)]
        return np.where(at < 0, 1.0, picked)

    return survival


def _xgb_cox(baseline_of: Callable[..., Any]) -> Callable[..., SurvivalCurves]:
    def fit(
        x: NDArray[np.float64], duration: NDArray[np.float64], event: NDArray[np.bool_]
    ) -> SurvivalCurves:
        import xgboost as xgb

        # survival:cox reads a negative label as a censored time; predict() is the hazard ratio.
        label = np.where(event, duration, -duration)
        params = {"objective": "survival:cox", "max_depth": 3, "eta": 0.05, "nthread": 2, "seed": 0}
        booster = xgb.train(params, xgb.DMatrix(x, label=label), num_boost_round=200)
        baseline = baseline_of(duration, event, booster.predict(xgb.DMatrix(x)))
        return lambda xs, t: baseline(booster.predict(xgb.DMatrix(xs)), t)

    return fit


LEARNERS: dict[str, Callable[..., SurvivalCurves]] = {
    "xgb_cox": _xgb_cox(_weibull_baseline),
    "xgb_cox_breslow": _xgb_cox(_breslow),
    "rsf": _fit_rsf,
    "gbsa": _fit_gbsa,
}
_FITTED: dict[tuple[str, str], tuple[pd.Series, SurvivalCurves]] = {}


class LearnedSurvival:
    """One of :data:`LEARNERS` as the backtest's survival model: ``fit(X, y)`` on lifetimes,
    ``predict_risk(X, H)`` = :math:`1 - S(a + H) / S(a)` at each unit's age :math:`a`. Fits are
    kept by learner and training data, so a cutoff's two horizons share one."""

    def __init__(self, learner: str) -> None:
        self.learner = learner

    def fit(self, X: pd.DataFrame, y: pd.DataFrame) -> Self:
        digest = hashlib.sha256(
            pd.util.hash_pandas_object(pd.concat([X, y], axis=1)).to_numpy()
        ).hexdigest()
        key = (self.learner, digest)
        if key not in _FITTED:
            median = X.median()
            x = X.fillna(median).to_numpy(np.float64)
            duration = y["duration"].to_numpy(np.float64)
            event = y["event"].to_numpy().astype(bool)
            _FITTED[key] = (median, LEARNERS[self.learner](x, duration, event))
        self.median_, self.survival_ = _FITTED[key]
        self.columns_ = list(X.columns)
        return self

    def predict_risk(self, X: pd.DataFrame, horizon_days: float) -> NDArray[np.float64]:
        x = X[self.columns_].fillna(self.median_).to_numpy(np.float64)
        age = X[AGE_COL].to_numpy(np.float64)
        now = self.survival_(x, age)
        later = self.survival_(x, age + horizon_days)
        return np.clip(1.0 - later / np.maximum(now, 1e-12), 0.0, 1.0)

    def predict_survival(self, X: pd.DataFrame, times: Sequence[float]) -> NDArray[np.float64]:
        x = X[self.columns_].fillna(self.median_).to_numpy(np.float64)
        return np.stack([self.survival_(x, np.full(len(x), t)) for t in times], axis=1)

    def score(self, X: pd.DataFrame, y: pd.DataFrame) -> float:
        raise NotImplementedError("scored by the backtest's metrics")


def run(
    records: pd.DataFrame, learners: list[str], splits: Sequence[tuple[pd.Timestamp, float, str]]
) -> pd.DataFrame:
    rows = []
    for n, (cut, h, role) in enumerate(splits, 1):
        aft = None
        for i, learner in enumerate(learners):
            t0 = time.perf_counter()
            res = backtest(records, cut, h, partial(LearnedSurvival, learner), baselines=i == 0)
            sec = time.perf_counter() - t0
            for name, m in res.metrics.items():
                if name in ("age_only", "location_only"):
                    continue
                model = learner if name == "model" else name
                rows.append(metric_row(model, cut, h, role, m, sec if name == "model" else np.nan))
            got, aft = res.metrics["model"], res.metrics.get("aft", aft)
            assert aft is not None
            print(
                f"[titan_learners] split {n}/{len(splits)} {cut.date()} {h:g} d {learner}: "
                f"AUC {got.auc:.3f} AP {got.average_precision:.3f} (AFT {aft.auc:.3f}) {sec:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    return pd.DataFrame(rows)


def report(rows: pd.DataFrame) -> list[str]:
    means = rows.groupby(["model", "role"])[["auc", "ap", "ece"]].mean().unstack("role")
    fits = rows.groupby("model")["seconds"].median()
    lines = [
        "| model | dev AUC | dev AP | dev ECE | report AUC | report AP | report ECE | s / fit |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for model in ["aft", *[m for m in means.index if m != "aft"]]:
        cells = [f"{means.loc[model, (k, r)]:.3f}" if (k, r) in means.columns else "-"
                 for r in ("dev", "report") for k in ("auc", "ap", "ece")]  # fmt: skip
        sec = "-" if np.isnan(fits.get(model, np.nan)) else f"{fits[model]:.0f}"
        lines.append(f"| {model} | {' | '.join(cells)} | {sec} |")
    if ("auc", "dev") in means.columns:
        dev = means[("auc", "dev")]
        best = dev.idxmax()
        keep = "aft" if dev["aft"] >= dev[best] - TIE_AUC else best
        lines.append(f"\nBest mean dev AUC: {best} ({dev[best]:.3f}); kept by the rule (the AFT "
                     f"unless beaten by more than {TIE_AUC}): {keep}")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--titan-path", type=Path, default=TITAN)
    parser.add_argument(
        "--learners",
        default="xgb_cox,xgb_cox_breslow,rsf",
        help=f"comma-separated, of {', '.join(LEARNERS)} (gbsa: minutes a fit on all of Titan)",
    )
    parser.add_argument("--role", choices=("dev", "report", "both"), default="both")
    parser.add_argument("--out", type=Path, default=None, help="CSV of every (model, split) row")
    parser.add_argument("--smoke", action="store_true", help="a fifth of Titan, one split")
    args = parser.parse_args(argv)
    learners = args.learners.split(",")
    unknown = sorted(set(learners) - LEARNERS.keys())
    if unknown:
        parser.error(f"unknown learners {unknown}; choose from {sorted(LEARNERS)}")
    splits = [s for s in SPLITS if args.role in ("both", s[2])]
    if args.smoke:
        splits = [SPLITS[-1]]
    print(_machine())
    t0 = time.perf_counter()
    records = read_titan(args.titan_path)
    if args.smoke:
        records = records[records["location"].str.match(r"c[0-4]-")]
    rows = run(prepare_records(records), learners, splits)
    if args.out is not None:
        rows.to_csv(args.out, index=False)
    print("\n".join(report(rows)))
    print(
        f"\n{time.perf_counter() - t0:.0f} s in all; load average at end {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
