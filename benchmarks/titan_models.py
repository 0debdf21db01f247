"""Titan forward splits (issue 40): every model and feature set tried, AUC/AP/ECE per split.

Each split is a cutoff :math:`c` and horizon :math:`H` on Titan's ``gc_full.csv``: fit on what
was known before :math:`c` (:func:`fleetwatch.models.backtest.backtest`), score P(failure within
:math:`H`) for every unit in service at :math:`c`, compare with the failures in
:math:`(c, c + H]`. The splits are fixed below, before any result was seen, and never tuned:

* ``dev``: quarterly cutoffs 2016-01-01 .. 2017-01-01, horizons 90 and 180 days (10 splits;
  every window ends by 2017-06-30). Features, hyper-parameters and the model are chosen here.
* ``report``: quarterly cutoffs 2017-07-01 .. 2019-01-01, horizons 90 and 180 days (14 splits,
  every cutoff after every dev window). The figures reported.

Models: the three baselines of the backtest (``aft``: today's Weibull AFT; ``age_only``;
``location_only``), the landmark GBM (:class:`~fleetwatch.models.landmark_risk.LandmarkRisk`)
with several feature sets and settings (:func:`_variants`), and ``blend``: the mean of the AFT's
and ``gbm_all``'s probabilities.

Selection is mechanical (:func:`select`): among today's AFT, every variant and the blend, the one
with the best mean AUC over the dev splits; any within :data:`TIE_AUC` of it that is simpler
(the AFT first, then fewer feature groups) wins, then the higher mean average precision. A
second, rolling rule is printed too: at each report cutoff, the candidate with the best mean AUC
over the splits whose windows had ended by that cutoff.

ECE: 10 equal-count bins (:func:`fleetwatch.models.backtest.expected_calibration_error`).

``--ceiling`` prints something else, not a forecast: at each split, the same gradient boosting
fitted by 5-fold cross-validation *inside* the scored window (covariates at the cutoff, labels
from the window itself). It sees the future, so it is no model to serve; it bounds what these
covariates could give if the hazard of that very window were known, i.e. how much of the gap to a
target is the data's and not the learner's.

    .venv/bin/python benchmarks/titan_models.py [--out rows.csv] [--variants a,b] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from procstats import machine  # noqa: E402

from fleetwatch.models.backtest import LandmarkModel, Metrics, backtest, score_risks  # noqa: E402
from fleetwatch.models.features import read_titan  # noqa: E402
from fleetwatch.models.landmark_features import FEATURE_GROUPS  # noqa: E402
from fleetwatch.models.landmark_risk import LandmarkRisk  # noqa: E402
from fleetwatch.models.landmarks import FeatureCache  # noqa: E402
from fleetwatch.models.snapshot import prepare_records  # noqa: E402

TITAN = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "titan" / "gc_full.csv"
HORIZONS = (90.0, 180.0)
DEV_CUTOFFS = ("2016-01-01", "2016-04-01", "2016-07-01", "2016-10-01", "2017-01-01")
REPORT_CUTOFFS = (
    "2017-07-01", "2017-10-01", "2018-01-01", "2018-04-01", "2018-07-01", "2018-10-01",
    "2019-01-01",
)  # fmt: skip
SPLITS = tuple(
    (pd.Timestamp(c), h, role)
    for role, cutoffs in (("dev", DEV_CUTOFFS), ("report", REPORT_CUTOFFS))
    for c in cutoffs
    for h in HORIZONS
)
TIE_AUC = 0.002
BASELINES = ("aft", "age_only", "location_only")
ALL_GROUPS = tuple(FEATURE_GROUPS)
GENERIC = ("position", "age", "unit", "neighbours", "lot")


@dataclass(frozen=True)
class Variant:
    name: str
    about: str
    make: Callable[[], LandmarkRisk]
    groups: tuple[str, ...]


def _gbm(groups: tuple[str, ...], **params: object) -> Callable[[], LandmarkRisk]:
    return lambda: LandmarkRisk(groups=groups, **params)


def _variants() -> list[Variant]:
    out = [
        Variant("gbm_position_age", "position and age only", _gbm(("position", "age")),
                ("position", "age")),
        Variant("gbm_generic", "the issue's generic GBM: position, age, removals, serial lot, "
                "neighbours", _gbm(GENERIC), GENERIC),
        Variant("gbm_all", "every feature group", _gbm(ALL_GROUPS), ALL_GROUPS),
    ]  # fmt: skip
    for group in ALL_GROUPS:
        if group in ("position", "age"):
            continue
        rest = tuple(g for g in ALL_GROUPS if g != group)
        out.append(Variant(f"gbm_all-{group}", f"every group but {group}", _gbm(rest), rest))
    out += [
        Variant("gbm_all_small_trees", "4 leaves, 500 per leaf, 300 rounds",
                _gbm(ALL_GROUPS, max_leaf_nodes=4, min_samples_leaf=500, max_iter=300),
                ALL_GROUPS),
        Variant("gbm_all_platt", "Platt map on the 3 latest complete landmarks",
                _gbm(ALL_GROUPS, calibration_landmarks=3), ALL_GROUPS),
        Variant("gbm_all_quarterly", "landmarks at quarter starts only",
                _gbm(ALL_GROUPS, landmark_freq="QS"), ALL_GROUPS),
        Variant("gbm_all_neg10", "10 % of the non-failures kept (20 % by default)",
                _gbm(ALL_GROUPS, negative_fraction=0.1), ALL_GROUPS),
    ]  # fmt: skip
    return out


def _machine() -> str:
    """The machine line of the report: :func:`procstats.machine` plus the libraries that fit."""
    m = machine()
    return (
        f"nproc {m['cpus']}, {m['cpu_model']}, Python {m['python']}, pandas {pd.__version__}, "
        f"numpy {np.__version__}, load average {m['loadavg_at_start'][0]:.2f} at start"
    )


BLEND_OF = "gbm_all"
"""The variant also averaged with today's AFT (mean of the two probabilities): ``blend``."""


def metric_row(
    model: str, cut: pd.Timestamp, h: float, role: str, m: Metrics, seconds: float
) -> dict[str, object]:
    """One (model, split) row of the runs' tables."""
    return {
        "model": model,
        "cutoff": cut.date().isoformat(),
        "horizon": int(h),
        "role": role,
        "auc": m.auc,
        "ap": m.average_precision,
        "ece": m.ece,
        "n": m.n,
        "failures": m.n_failures,
        "seconds": seconds,
    }


def run(
    records: pd.DataFrame,
    variants: list[Variant],
    splits: tuple[tuple[pd.Timestamp, float, str], ...],
) -> pd.DataFrame:
    """One row per (model, split): auc, ap, ece, n, failures, seconds."""
    cache: FeatureCache = {}
    fitted: dict[tuple[object, ...], LandmarkModel] = {}  # a variant's 90 and 180 d: one fit
    rows = []
    for cut, h, role in splits:
        aft = None
        for i, v in enumerate(variants):
            t0 = time.perf_counter()
            res = backtest(records, cut, h, v.make, baselines=i == 0, cache=cache, fitted=fitted)
            sec = time.perf_counter() - t0
            metrics = dict(res.metrics)
            if i == 0:
                aft = res.risks["aft"].to_numpy()
            if v.name == BLEND_OF and aft is not None:
                blend = 0.5 * (aft + res.risks["model"].to_numpy())
                label = res.risks["label"].to_numpy()
                days = res.risks["days_to_failure"].fillna(h).to_numpy()
                metrics["blend"] = score_risks(blend, label, days, k=100)
            for name, m in metrics.items():
                model = v.name if name == "model" else name
                rows.append(metric_row(model, cut, h, role, m, sec if name == "model" else np.nan))
            print(f"{cut.date()} {h:g} d {v.name}: AUC {res.metrics['model'].auc:.3f} AP "
                  f"{res.metrics['model'].average_precision:.3f} ({sec:.1f} s)",
                  file=sys.stderr, flush=True)  # fmt: skip
    return pd.DataFrame(rows)


def _sizes(variants: list[Variant]) -> dict[str, int]:
    """Candidates and how complex each is: today's AFT counts as the simplest, the blend as the
    most complex (it needs both models)."""
    return {"aft": 0, **{v.name: len(v.groups) for v in variants}, "blend": len(ALL_GROUPS) + 1}


def select(rows: pd.DataFrame, variants: list[Variant]) -> str:
    """The dev-split winner: best mean AUC; within TIE_AUC, fewest groups, then best AP."""
    size = _sizes(variants)
    dev = rows[(rows["role"] == "dev") & rows["model"].isin(list(size))]
    means = dev.groupby("model")[["auc", "ap"]].mean()
    best = float(means["auc"].max())
    near = means[means["auc"] >= best - TIE_AUC].assign(size=lambda f: f.index.map(size))
    return str(near.sort_values(["size", "ap"], ascending=[True, False]).index[0])


def rolling(rows: pd.DataFrame, variants: list[Variant]) -> pd.DataFrame:
    """Per report split, the score of the variant best on the splits ended before its cutoff."""
    cand = rows[rows["model"].isin(list(_sizes(variants)))].copy()
    cand["end"] = pd.to_datetime(cand["cutoff"]) + pd.to_timedelta(cand["horizon"], unit="D")
    out = []
    for (cut, _), part in cand[cand["role"] == "report"].groupby(["cutoff", "horizon"]):
        past = cand[cand["end"] <= pd.Timestamp(cut)]
        chosen = str(past.groupby("model")["auc"].mean().idxmax())
        row = part[part["model"] == chosen].iloc[0].to_dict()
        out.append({**row, "model": "rolling", "chosen": chosen})
    return pd.DataFrame(out)


def ceiling(
    records: pd.DataFrame, splits: tuple[tuple[pd.Timestamp, float, str], ...]
) -> list[str]:
    """In-window 5-fold cross-validated AUC/AP of every covariate group (an upper bound)."""
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.metrics import average_precision_score, roc_auc_score
    from sklearn.model_selection import StratifiedKFold, cross_val_predict

    from fleetwatch.models.features import failures_in_window
    from fleetwatch.models.landmark_features import landmark_features

    lines = [
        "| cutoff | H | role | in-window CV AUC | in-window CV AP |",
        "|---|---:|---|---:|---:|",
    ]
    scores = []
    for cut, h, role in splits:
        X = landmark_features(records, cut)
        label = X.index.isin(failures_in_window(records, cut, cut + pd.Timedelta(days=h)).index)
        model = HistGradientBoostingClassifier(
            max_leaf_nodes=7, min_samples_leaf=50, max_iter=100, random_state=0
        )
        folds = StratifiedKFold(5, shuffle=True, random_state=0)
        p = cross_val_predict(model, X, label, cv=folds, method="predict_proba")[:, 1]
        auc, ap = roc_auc_score(label, p), average_precision_score(label, p)
        scores.append((role, auc, ap))
        lines.append(f"| {cut.date()} | {h:g} | {role} | {auc:.3f} | {ap:.3f} |")
    for role in ("dev", "report"):
        got = [(a, p) for r, a, p in scores if r == role]
        if got:
            auc, ap = np.mean(got, axis=0)
            lines.append(f"| **mean** | | {role} | **{auc:.3f}** | **{ap:.3f}** |")
    return lines


def _fmt(x: float) -> str:
    return "nan" if not np.isfinite(x) else f"{x:.3f}"


def report(rows: pd.DataFrame, variants: list[Variant], chosen: str) -> list[str]:
    lines = ["| model | dev AUC | dev AP | dev ECE | report AUC | report AP | report ECE |"]
    lines.append("|---|---:|---:|---:|---:|---:|---:|")
    means = rows.groupby(["model", "role"])[["auc", "ap", "ece"]].mean()
    order = [*BASELINES, *(v.name for v in variants), "blend", "rolling"]
    for name in order:
        if name not in means.index.get_level_values(0):
            continue
        cells = []
        for role in ("dev", "report"):
            got = means.loc[name] if role in means.loc[name].index else None
            vals = (
                got.loc[role] if got is not None else pd.Series(np.nan, index=["auc", "ap", "ece"])
            )
            cells += [_fmt(vals["auc"]), _fmt(vals["ap"]), _fmt(vals["ece"])]
        label = f"**{name}** (selected)" if name == chosen else name
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", f"Selected on the dev splits: {chosen}.", ""]
    shown = ["aft", "gbm_generic", chosen, "rolling"]
    shown = list(dict.fromkeys(s for s in shown if s in set(rows["model"])))
    head = "| cutoff | H | role | units | failures | " + " | ".join(
        f"{s} AUC / AP / ECE" for s in shown
    )
    lines += [head + " |", "|---|---:|---|---:|---:|" + "---|" * len(shown)]
    for (cut, h, role), part in rows.groupby(["cutoff", "horizon", "role"], sort=True):
        by = part.set_index("model")
        first = by.iloc[0]
        cells = []
        for s in shown:
            if s in by.index:
                r = by.loc[s]
                cells.append(f"{_fmt(r['auc'])} / {_fmt(r['ap'])} / {_fmt(r['ece'])}")
            else:
                cells.append("")
        lines.append(
            f"| {cut} | {h} | {role} | {int(first['n']):,} | {int(first['failures']):,} | "
            + " | ".join(cells)
            + " |"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--titan-path", type=Path, default=TITAN)
    parser.add_argument("--out", type=Path, default=None, help="CSV of every (model, split) row")
    parser.add_argument("--variants", default="", help="comma-separated subset of variant names")
    parser.add_argument(
        "--smoke", action="store_true", help="a fifth of Titan (columns 0-4), one split, one model"
    )
    parser.add_argument(
        "--ceiling", action="store_true", help="only the in-window cross-validated upper bound"
    )
    args = parser.parse_args(argv)
    variants = _variants()
    if args.variants:
        wanted = set(args.variants.split(","))
        variants = [v for v in variants if v.name in wanted]
    splits = SPLITS
    if args.smoke:
        splits = (SPLITS[-1],)
        variants = variants[:1]
    print(_machine())
    t0 = time.perf_counter()
    records = read_titan(args.titan_path)
    if args.smoke:
        records = records[records["location"].str.match(r"c[0-4]-")]
    records = prepare_records(records)
    if args.ceiling:
        print("\n".join(ceiling(records, splits)))
        return
    rows = run(records, variants, splits)
    chosen = select(rows, variants) if (rows["role"] == "dev").any() else variants[0].name
    if (rows["role"] == "report").any() and (rows["role"] == "dev").any():
        rows = pd.concat([rows, rolling(rows, variants)], ignore_index=True)
    if args.out is not None:
        rows.to_csv(args.out, index=False)
    print()
    print("\n".join(report(rows, variants, chosen)))
    load = os.getloadavg()
    print(f"\n{time.perf_counter() - t0:.0f} s in all; load average at end {load[0]:.2f}")


if __name__ == "__main__":
    main()
