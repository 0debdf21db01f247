"""How long the survival models take at fleet scale, and how the Titan backtest ranks.

Synthetic, right-censored Weibull lifetimes from known parameters (``numpy.random.default_rng``
with a fixed seed), timed with ``time.perf_counter`` (median of ``--repeats``):

* ``WeibullRisk.fit`` on 100,000 lifetimes, next to ``scipy.stats.weibull_min.fit`` on the same
  censored data and the closed-form scale MLE given the shape (one vectorised step: a floor);
* ``WeibullAFTRisk.fit`` with 20 covariates on 100,000 rows, next to L-BFGS on the same
  log-likelihood with an analytic gradient in numpy/scipy (no lifelines);
* ``predict_risk`` for 100,000 GPUs (AFT and age-only), next to the closed-form risk in numpy.

``--titan`` also runs ``fleetwatch.cli.model_cmd backtest`` (90 and 180 days) at five cutoffs on
Titan's gc_full.csv and prints AUC of the model (the landmark model) and the three baselines
(today's AFT, age-only, location-only) from the CSVs it wrote. benchmarks/titan_models.py has the
full forward-split comparison.

    .venv/bin/python benchmarks/models.py [--n 100000] [--repeats 3] [--titan]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lifelines
import numpy as np
import pandas as pd
from numpy.typing import NDArray
from scipy import optimize, stats
from sklearn.metrics import roc_auc_score

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from fleetwatch.models.aft import WeibullAFTRisk  # noqa: E402
from fleetwatch.models.registry import RiskBundle  # noqa: E402
from fleetwatch.models.weibull import WeibullRisk  # noqa: E402

SEED = 20260501
RHO, LAM = 1.4, 1500.0  # true shape and scale (days)
N_COV = 20
TITAN = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "titan" / "gc_full.csv"
CUTOFFS = ("2016-01-01", "2016-07-01", "2017-01-01", "2017-07-01", "2018-01-01")


def _timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def _machine() -> str:
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()
    return (
        f"nproc {os.cpu_count()}, {cpu}, Python {platform.python_version()}, lifelines "
        f"{lifelines.__version__}, numpy {np.__version__}, load average "
        f"{load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f} at start"
    )


def _lifetimes(
    rng: np.random.Generator, scale: NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """Weibull(RHO, scale) lifetimes, right-censored at a uniform 200..2500 days."""
    t = scale * rng.weibull(RHO, size=len(scale))
    censor = rng.uniform(200.0, 2500.0, size=len(scale))
    return np.minimum(t, censor), t <= censor


def _aft_nll(
    theta: NDArray[np.float64], Z: NDArray[np.float64], t: NDArray[np.float64], d: NDArray[np.bool_]
) -> tuple[float, NDArray[np.float64]]:
    """Weibull AFT negative log-likelihood and gradient; theta = (beta0, beta, log rho)."""
    beta, log_rho = theta[:-1], theta[-1]
    rho = np.exp(log_rho)
    eta = Z @ beta  # log scale
    u = rho * (np.log(t) - eta)
    h = np.exp(u)  # cumulative hazard (t / lambda)^rho
    ll = d * (log_rho + u - np.log(t)) - h
    g_eta = rho * (d - h)  # d(-ll)/d eta
    g_logrho = -(d * (1.0 + u) - h * u)
    grad = np.concatenate([Z.T @ g_eta, [g_logrho.sum()]])
    return float(-ll.sum()), grad


def run_synthetic(n: int, repeats: int) -> list[str]:
    rng = np.random.default_rng(SEED)
    rows = ["| step | FleetWatch median s | reference | reference median s | check |"]
    rows.append("|---|---:|---|---:|---|")

    # 1. age-only Weibull refit
    t, d = _lifetimes(rng, np.full(n, LAM))
    X0, y0 = pd.DataFrame(index=range(n)), pd.DataFrame({"duration": t, "event": d})
    sec, model = _timed(lambda: WeibullRisk().fit(X0, y0), repeats)
    lam_hat, rho_hat = float(model.fitter_.lambda_), float(model.fitter_.rho_)
    data = stats.CensoredData(uncensored=t[d], right=t[~d])

    def scipy_fit() -> tuple[float, ...]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return tuple(stats.weibull_min.fit(data, floc=0))

    sec_sp, (c_sp, _, s_sp) = _timed(scipy_fit, repeats)
    sec_cf, lam_cf = _timed(lambda: float((np.sum(t**rho_hat) / d.sum()) ** (1 / rho_hat)), 5)
    rows.append(
        f"| Weibull refit, {n:,} lifetimes ({d.mean():.0%} failed) | {sec:.3f} | "
        f"scipy `weibull_min.fit(CensoredData)` | {sec_sp:.3f} | true rho {RHO}, lambda {LAM:g}; "
        f"ours {rho_hat:.3f}, {lam_hat:.0f}; scipy {c_sp:.3f}, {s_sp:.0f} |"
    )
    rows.append(
        f"| | | closed-form scale MLE given rho (floor) | {sec_cf:.4f} | lambda {lam_cf:.0f} |"
    )

    # 2. Weibull AFT, 20 covariates
    Xc = rng.normal(size=(n, N_COV))
    beta = rng.uniform(-0.3, 0.3, size=N_COV)
    t2, d2 = _lifetimes(rng, np.exp(np.log(LAM) + Xc @ beta))
    cols = [f"x{j}" for j in range(N_COV)]
    X2, y2 = pd.DataFrame(Xc, columns=cols), pd.DataFrame({"duration": t2, "event": d2})
    sec_aft, aft = _timed(lambda: WeibullAFTRisk().fit(X2, y2), repeats)
    err = float(np.max(np.abs(aft.coefficients().to_numpy() - beta)))
    Z = np.column_stack([np.ones(n), Xc])
    theta0 = np.concatenate([[np.log(np.mean(t2))], np.zeros(N_COV), [0.0]])

    def lbfgs() -> NDArray[np.float64]:
        res = optimize.minimize(_aft_nll, theta0, args=(Z, t2, d2), jac=True, method="L-BFGS-B")
        return np.asarray(res.x, dtype=np.float64)

    sec_ref, theta = _timed(lbfgs, repeats)
    err_ref = float(np.max(np.abs(theta[1:-1] - beta)))
    rows.append(
        f"| Weibull AFT fit, {N_COV} covariates, {n:,} rows | {sec_aft:.3f} | "
        f"numpy log-likelihood + analytic gradient, scipy L-BFGS-B | {sec_ref:.3f} | "
        f"max abs beta error: ours {err:.4f}, reference {err_ref:.4f}; rho "
        f"{float(np.exp(aft.fitter_.params_.loc['rho_']['Intercept'])):.3f} vs "
        f"{float(np.exp(theta[-1])):.3f} |"
    )

    # 3. risk for n GPUs at their current ages
    ages = rng.uniform(0.0, 2000.0, size=n)
    Xr = X2.assign(age_days=ages)
    sec_risk, risk = _timed(lambda: aft.predict_risk(Xr, 90.0), max(repeats, 5))
    lam_i, rho_a = aft._scale_shape(Xr)

    def closed_form() -> NDArray[np.float64]:
        out = 1.0 - np.exp((ages / lam_i) ** rho_a - ((ages + 90.0) / lam_i) ** rho_a)
        return np.asarray(out, dtype=np.float64)

    sec_np, risk_np = _timed(closed_form, max(repeats, 5))
    Xa = pd.DataFrame({"age_days": ages})
    sec_age, _ = _timed(lambda: model.predict_risk(Xa, 90.0), max(repeats, 5))
    rows.append(
        f"| AFT risk (90 d) for {n:,} GPUs | {sec_risk:.4f} | numpy closed form on "
        f"precomputed scales | {sec_np:.4f} | max abs diff {np.max(np.abs(risk - risk_np)):.1e} |"
    )
    rows.append(f"| age-only Weibull risk (90 d) for {n:,} GPUs | {sec_age:.4f} | | | |")
    return rows


def run_bundle_scoring(n: int, repeats: int, n_cov: int = 10, lifetimes: int = 20_000) -> list[str]:
    """``RiskBundle.score`` (AFT, three factors per unit) for ``n`` units, 5% of readings missing;
    also through a ``to_params``/``from_params`` round trip, as the server loads a version."""
    rng = np.random.default_rng(SEED)
    cov = rng.normal(size=(lifetimes, n_cov))
    beta = rng.normal(0, 0.2, size=n_cov)
    t = LAM * np.exp(cov @ beta) * rng.weibull(RHO, size=len(cov))
    c = rng.uniform(0, 3 * LAM, size=len(cov))
    frame = pd.DataFrame(cov, columns=[f"c{j}" for j in range(n_cov)])
    frame["duration_days"], frame["event"] = np.minimum(t, c), (t <= c).astype(int)
    fit_s, bundle = _timed(lambda: RiskBundle.fit(frame), 1)
    loaded = RiskBundle.from_params(bundle.to_params())
    units = pd.DataFrame(rng.normal(size=(n, n_cov)), columns=[f"c{j}" for j in range(n_cov)])
    units = units.mask(rng.random(units.shape) < 0.05)
    units["age_days"] = rng.uniform(0, 3 * LAM, size=n)
    score_s, scores = _timed(lambda: loaded.score(units, 30.0), repeats)
    assert sum(len(f) for f in scores.factors) == 3 * n
    return [
        f"RiskBundle.fit, {lifetimes:,} lifetimes, {n_cov} covariates: {fit_s:.2f} s",
        f"RiskBundle.score, {n:,} units incl. 3 factors each: {score_s:.3f} s",
    ]


def run_titan(path: Path) -> list[str]:
    rows = ["| cutoff | horizon | units in service | failed in window | model AUC | "
            "AFT AUC | age-only AUC | location-only AUC |"]  # fmt: skip
    rows.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for cutoff in CUTOFFS:
            out = Path(tmp) / f"{cutoff}.csv"
            cmd = [sys.executable, "-m", "fleetwatch.cli.model_cmd", "backtest", "--inventory",
                   str(path), "--cutoff", cutoff, "--horizon", "90", "--horizon", "180",
                   "--out", str(out)]  # fmt: skip
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                rows.append(f"| {cutoff} | failed: {proc.stderr.strip().splitlines()[-1]} |")
                continue
            print(f"{cutoff}: {time.perf_counter() - t0:.1f} s\n{proc.stdout}", file=sys.stderr)
            table = pd.read_csv(out, dtype={"serial": str})
            for horizon, sfx in ((90, ""), (180, "_180d")):
                label = table[f"failed_in_window{sfx}"].astype(bool)
                aucs = [
                    roc_auc_score(label, table[f"{c}{sfx}"])
                    for c in ("risk", "risk_aft", "risk_age_only", "risk_location_only")
                ]
                rows.append(
                    f"| {cutoff} | {horizon} d | {len(table):,} | {int(label.sum()):,} | "
                    + " | ".join(f"{a:.3f}" for a in aucs)
                    + " |"
                )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--titan", action="store_true", help="Also run the Titan backtests")
    parser.add_argument("--titan-path", type=Path, default=TITAN)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = parser.parse_args(argv)
    if args.smoke:
        args.n, args.repeats = 500, 1
    print(_machine())
    print()
    print("\n".join(run_synthetic(args.n, args.repeats)))
    lifetimes = 2_000 if args.smoke else 20_000
    print("\n".join(run_bundle_scoring(args.n, args.repeats, lifetimes=lifetimes)))
    if args.titan:
        print()
        print("\n".join(run_titan(args.titan_path)))
    print(f"\nload average at end: {'/'.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
