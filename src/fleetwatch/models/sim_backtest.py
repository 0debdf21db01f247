"""Simulator backtest: telemetry-covariate risk against the rules, where precursors exist.

A :class:`~fleetwatch.sim.SimFleet` knows when every GPU fails, so the question "would draining
the riskiest GPUs each day have caught the failures, and how early?" has an answer. The backtest:

1. **Telemetry.** Each node is sampled every ``step_minutes`` (30 by default, not the agent's 10 s:
   months of 10 s samples are too slow to simulate) and all its events are read; the samples and
   Xids of each GPU-hour fold into an :class:`~fleetwatch.models.telemetry_features.HourRollup`
   with :func:`~fleetwatch.models.telemetry_features.rollup_hour`, exactly as the server does.
   Samples taken while the node is silent are dropped (the agent sends nothing then).
2. **Training** on what was known before the cutoff :math:`c` only: GPUs that failed before
   :math:`c` (event, duration = age at failure, covariates over the ``window_days`` before the
   failure) and GPUs alive at :math:`c` (censored at :math:`c`, covariates over the window before
   :math:`c`). Windows hold whole hours ending at or before their end, so the fatal Xid never
   leaks into its own covariates. The model is the product's:
   :class:`~fleetwatch.models.registry.RiskBundle` with the server's defaults, group = SKU, so
   its covariate design (median imputation, ``log1p`` on counts and rates, clipping to the
   training range) is the one the server scores with. With too few failures with telemetry
   for its AFT it scores by the Weibull fits, as the server would.
3. **Evaluation** at every midnight :math:`d` from :math:`c` until ``window`` before the horizon
   (so every label is known): for each GPU alive at :math:`d`, the risk within :math:`H` (1 and 7
   days) from the trailing window; the **model** flags the ``budget`` highest risks for each
   :math:`H` (the daily drain budget). **Rules** flag every GPU with a verdict that counts against
   it at :math:`d`: :func:`~fleetwatch.rules.xid.judge_xids` over the trailing 24 h of events and
   :func:`~fleetwatch.rules.health.judge_health` over samples every 60 s in the 10 minutes before
   :math:`d` (the rules' windows are 60 s and 600 s, so coarse samples would misjudge rates).
   **Rules + model** flags the rules' GPUs, then fills the rest of the budget with model picks.
4. **Metrics** per method: precision at the budget (share of flagged GPU-days whose GPU fails
   within 7 days), recall at 24 h (flagged at the last evaluation before the failure, which is
   within 24 h) and at 7 days (flagged at some evaluation in the 7 days before), lead time (hours
   from the first 7-day flag to the failure: p10/p50/p90) and false flags per day.
"""

from __future__ import annotations

import csv
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd

from fleetwatch.models.backtest import Metrics, score_risks
from fleetwatch.models.base import AGE_COL, DURATION_COL, EVENT_COL, ModelFitError
from fleetwatch.models.landmarks import LANDMARK_COL
from fleetwatch.models.registry import DURATION_DAYS, EVENT, GROUP, RiskBundle
from fleetwatch.models.sim_scoring import (
    HORIZONS_DAYS,
    METHODS,
    MethodMetrics,
    failure_table,
    flag_days,
    method_metrics,
)
from fleetwatch.models.telemetry_features import (
    FEATURE_NAMES,
    HourRollup,
    rollup_hour,
    window_features,
)
from fleetwatch.models.telemetry_landmarks import (
    daily_landmarks,
    landmark_units,
    telemetry_landmark_rows,
)
from fleetwatch.rules.health import BootSample, judge_health
from fleetwatch.rules.thresholds import HealthThresholds
from fleetwatch.rules.xid import XidCatalog, judge_xids
from fleetwatch.sim.fleet import SimFleet
from fleetwatch.sim.spec import FailureModel, FleetSpec
from fleetwatch.sim.truth import lifetime_rows, parse_time
from fleetwatch.telemetry import Event

__all__ = [
    "METHODS",
    "MethodMetrics",
    "SimBacktestResult",
    "default_spec",
    "run_sim_backtest",
    "without_precursors",
    "write_report",
]

logger = logging.getLogger(__name__)

_DAY = timedelta(days=1)
_HOUR = timedelta(hours=1)
_RULE_SAMPLES = tuple(range(-600, 1, 60))  # seconds before d: the rules' 60 s and 600 s windows

Progress = Callable[[int], None]


def default_spec(
    seed: int = 0, *, nodes: int = 40, days: float = 180.0, monthly_failure_prob: float = 0.04
) -> FleetSpec:
    """The backtest's fleet: ``nodes`` x 8 GPUs over ``days``, failing about 4x the default rate.

    ``failures.monthly_failure_prob = 0.04`` (default 0.01) and no infant-mortality batch (lot-c
    would fail mostly before any cutoff), so that 320 GPUs give dozens of failures after day 90.
    """
    start = datetime(2026, 1, 1, tzinfo=UTC)
    return FleetSpec.model_validate(
        {
            "seed": seed,
            "nodes": nodes,
            "start": start,
            "real_start": start,
            "horizon_days": days,
            "failures": FailureModel(monthly_failure_prob=monthly_failure_prob),
            "batches": [
                {"name": "lot-a", "weight": 0.65},
                {"name": "lot-b", "weight": 0.35, "scale_factor": 0.85},
            ],
        }
    )


def without_precursors(spec: FleetSpec) -> FleetSpec:
    """The same fleet with no warning signs before any failure (every ``precursor_prob = 0``)."""
    causes = [c.model_copy(update={"precursor_prob": 0.0}) for c in spec.failures.causes]
    return spec.model_copy(update={"failures": spec.failures.model_copy(update={"causes": causes})})


@dataclass(frozen=True)
class SimBacktestResult:
    """Outcome of :func:`run_sim_backtest`.

    ``train`` has one row per training GPU (``uuid``, ``sku``, ``install``, ``end`` (failure or
    cutoff), ``window_end``, ``duration``, ``event`` and the AFT's covariates as it saw them:
    imputed, log1p, clipped). ``bundle`` is the fitted model; ``features``, ``medians`` (raw
    scale) and ``coefficients`` are its AFT's (empty when it has none). ``failures`` has
    one row per failure in the evaluation period (``uuid``, ``failure_time``, ``cause_xid``,
    ``precursors``, then ``lead_h_<method>`` (NaN: not flagged within 7 days) and
    ``caught_24h_<method>``). ``ranking`` scores the model's 7-day risk over all GPU-days with
    :func:`~fleetwatch.models.backtest.score_risks` (label: fails within 7 days).
    """

    spec: FleetSpec
    cutoff: datetime
    eval_days: int
    budget: int
    step_minutes: int
    n_gpus: int
    features: list[str]
    medians: dict[str, float]
    train: pd.DataFrame
    failures: pd.DataFrame
    metrics: dict[str, MethodMetrics]
    ranking: Metrics
    wall_s: float
    bundle: RiskBundle
    coefficients: dict[str, float] = field(default_factory=dict)
    # Each method's flagged (evaluation day index, uuid) at H = 1 day, the evaluation midnights
    # and each GPU's node: what benchmarks/notice_savings.py turns into job notices.
    flags: dict[str, set[tuple[int, str]]] = field(default_factory=dict)
    days: list[datetime] = field(default_factory=list)
    gpu_nodes: dict[str, str] = field(default_factory=dict)
    # One row per GPU alive at each evaluation midnight: ``day`` (index into ``days``), ``uuid``,
    # ``age_days``, ``risk_1d``, ``risk_7d``, ``days_to_failure`` (inf: none), ``label`` (fails
    # within 7 days) and ``rule`` (a rule flags it): what models/sim_budget.py ranks.
    scores: pd.DataFrame = field(default_factory=pd.DataFrame)
    # With ``landmark_span_days``: each part of the bundle ("landmark", "aft", "weibull") scored
    # on the evaluation rows, per horizon in days (1 and 7); what decides the served part.
    by_scorer: dict[str, dict[float, Metrics]] = field(default_factory=dict)

    @property
    def n_failures(self) -> int:
        return len(self.failures)


@dataclass
class _Gpu:
    uuid: str
    node: str
    sku: str
    install: datetime
    failure: datetime | None
    cause_xid: int | None
    precursors: bool

    def alive(self, t: datetime) -> bool:
        return self.failure is None or t < self.failure


def _gpus(fleet: SimFleet) -> list[_Gpu]:
    return [
        _Gpu(
            uuid=row["uuid"],
            node=row["node"],
            sku=row["sku"],
            install=parse_time(row["install_time"]),
            failure=parse_time(row["failure_time"]) if row["failure_time"] else None,
            cause_xid=row["cause_xid"],
            precursors=row["precursor_start"] is not None,
        )
        for row in lifetime_rows(fleet)
    ]


def _hours_between(start: datetime, t0: datetime, t1: datetime) -> range:
    """Indices of the hours (from ``start``) that overlap ``[t0, t1)``."""
    first = math.floor((t0 - start) / _HOUR)
    last = math.ceil((t1 - start) / _HOUR)
    return range(max(0, first), last)


class _NodeTelemetry:
    """One node's hourly rollups (built from coarse samples) and its events."""

    def __init__(
        self, fleet: SimFleet, node: str, hours: set[int], step: timedelta, catalog: XidCatalog
    ) -> None:
        start = fleet.spec.start
        per_hour = max(1, round(_HOUR / step))
        self.events = fleet.events(node, start - _HOUR, fleet.spec.end + _HOUR)
        xids: dict[tuple[str, int], list[int]] = defaultdict(list)
        for e in self.events:
            if e.kind == "xid" and e.xid is not None and e.uuid is not None:
                xids[(e.uuid, math.floor((e.ts - start) / _HOUR))].append(e.xid)
        self.rollups: dict[str, dict[int, HourRollup]] = defaultdict(dict)
        for h in sorted(hours):
            hour = start + h * _HOUR
            samples: dict[str, list[object]] = defaultdict(list)
            for j in range(per_hour):
                t = hour + j * step
                if fleet.is_silent(node, t):
                    continue
                for s in fleet.sample(node, t):
                    samples[s.uuid].append(s)
            for uuid, got in samples.items():
                self.rollups[uuid][h] = rollup_hour(
                    uuid, hour, got, xids.get((uuid, h), ()), catalog=catalog
                )

    def features(
        self, uuid: str, start: datetime, end: datetime, window: timedelta
    ) -> dict[str, float]:
        """Covariates over the whole hours in ``[end - window, end)``."""
        first = math.ceil((end - window - start) / _HOUR)
        last = math.floor((end - start) / _HOUR)  # exclusive: the hour [last, last+1) ends after
        mine = self.rollups.get(uuid, {})
        return window_features([mine[h] for h in range(max(first, 0), last) if h in mine])


def _ruleflag_days(
    fleet: SimFleet,
    node: str,
    gpus: Sequence[_Gpu],
    events: Sequence[Event],
    d: datetime,
    catalog: XidCatalog,
    thresholds: HealthThresholds,
) -> set[str]:
    """UUIDs of the node's live GPUs with a verdict that counts against them at ``d``."""
    alive = {g.uuid: g for g in gpus if g.alive(d)}
    recent = [e for e in events if d - _DAY < e.ts <= d]
    flagged: set[str] = set()
    by_bus: dict[str, str] = {}
    for e in recent:
        if e.pci_bus_id and e.uuid:
            by_bus[e.pci_bus_id] = e.uuid
    for v in judge_xids(recent, catalog=catalog, now=d, lookback=_DAY):
        uuid = v.uuid or by_bus.get(v.pci_bus_id or "")
        if v.counts_against_gpu and uuid in alive:
            flagged.add(uuid)
    series: dict[str, list[BootSample]] = defaultdict(list)
    for offset in _RULE_SAMPLES:
        t = d + timedelta(seconds=offset)
        if fleet.is_silent(node, t):
            continue
        boot = fleet.boot_id(node, t)
        for s in fleet.sample(node, t):
            series[s.uuid].append(BootSample(boot, s))
    for uuid, samples in series.items():
        if uuid not in alive or uuid in flagged:
            continue
        verdicts = judge_health(
            samples, events=recent, thresholds=thresholds, now=d, gpu_name=alive[uuid].sku
        )
        if any(v.counts_against_gpu for v in verdicts):
            flagged.add(uuid)
    return flagged


def _fit(
    train: pd.DataFrame,
    penalizer: float,
    landmarks: tuple[pd.DataFrame, pd.DataFrame] | None = None,
) -> RiskBundle:
    """The product's :class:`RiskBundle` on the training GPUs (group = SKU), with its landmark
    part when landmark rows are given."""
    covariates = [c for c in FEATURE_NAMES if c in train.columns]
    frame = pd.DataFrame(
        {
            DURATION_DAYS: train[DURATION_COL].astype(np.float64),
            EVENT: train[EVENT_COL].astype(int),
            GROUP: train["sku"],
        }
    ).join(train[covariates].astype(np.float64))
    try:
        bundle = RiskBundle.fit(
            frame,
            penalizer=penalizer,
            landmarks=landmarks,
            landmark_horizons=HORIZONS_DAYS,
        )
    except ModelFitError as exc:
        first = str(exc).splitlines()[0].rstrip(": ")
        raise ModelFitError(
            f"{first} on {len(train)} training GPUs with {int(train[EVENT_COL].sum())} "
            "failures; simulate more nodes, more days or a higher failure rate"
        ) from exc
    if not bundle.has_aft:
        logger.warning(
            "simulator backtest: too few failures with telemetry for the AFT; scoring by the "
            "Weibull fits (age and SKU only)"
        )
    return bundle


def run_sim_backtest(
    spec: FleetSpec,
    *,
    cutoff_day: float = 90.0,
    budget: int = 5,
    step_minutes: int = 30,
    window_days: float = 7.0,
    penalizer: float = 0.01,
    progress: Progress | None = None,
    landmark_span_days: float | None = None,
    landmark_max_rows: int = 20_000,
) -> SimBacktestResult:
    """Train before ``cutoff_day``, then flag GPUs daily by model, rules and both; see module doc.

    Parameters
    ----------
    spec : FleetSpec
        The fleet (seeded); see :func:`default_spec`.
    cutoff_day : float
        Days after ``spec.start``; training sees nothing later.
    budget : int
        Daily drain budget :math:`k` (GPUs the model may flag per day).
    step_minutes : int
        Telemetry sampling step; at most 30 so that every hour has two samples (rates need two).
    window_days : float
        Trailing covariate window, and the 7-day label and recall horizon.
    progress : callable, optional
        Called with 1 after each node is simulated.
    landmark_span_days : float, optional
        Also fit the bundle's landmark part, as a refit at the cutoff would: on every GPU at each
        midnight of this many days before the cutoff that has 7 days of follow-up
        (:mod:`fleetwatch.models.telemetry_landmarks`), and score every part of the bundle
        (``by_scorer``). The bundle's default part (the landmark model when it could be fitted)
        scores the rest of the backtest. Off by default.
    landmark_max_rows : int
        The landmark rows' sampling budget (the server's ``model_landmark_max_rows``).

    Raises
    ------
    ValueError
        If the evaluation period is empty or the arguments are out of range.
    ModelFitError
        If the training data cannot fit the AFT model (too few failures, or no convergence).
    """
    started = time.perf_counter()
    if budget < 1 or not 0 < step_minutes <= 30 or window_days <= 0:
        raise ValueError("need budget >= 1, 0 < step_minutes <= 30 and window_days > 0")
    window = timedelta(days=window_days)
    n_eval = int(math.floor(spec.horizon_days - window_days - cutoff_day)) + 1
    if cutoff_day < window_days or n_eval < 1:
        raise ValueError(
            f"cutoff day {cutoff_day:g} must be >= {window_days:g} and <= horizon - "
            f"{window_days:g} = {spec.horizon_days - window_days:g}; choose another --cutoff-day"
        )
    fleet = SimFleet(spec)
    start = spec.start
    cutoff = start + timedelta(days=cutoff_day)
    days = [cutoff + i * _DAY for i in range(n_eval)]
    eval_end = days[-1] + _DAY
    catalog = XidCatalog.load()
    thresholds = HealthThresholds()
    step = timedelta(minutes=step_minutes)
    gpus = _gpus(fleet)
    by_node: dict[str, list[_Gpu]] = defaultdict(list)
    for g in gpus:
        by_node[g.node].append(g)

    sku = {g.uuid: g.sku for g in gpus}
    marks = _landmark_plan(gpus, cutoff, landmark_span_days, landmark_max_rows)
    mark_features: list[dict[str, float]] = [{}] * len(marks)
    train_rows: list[dict[str, object]] = []
    eval_rows: list[dict[str, object]] = []
    rules: set[tuple[int, str]] = set()  # (day index, uuid)
    for node in fleet.node_names():
        mine = by_node[node]
        hours = set(_hours_between(start, cutoff - window, days[-1]))
        early = [g for g in mine if g.failure is not None and g.failure < cutoff]
        for g in early:
            assert g.failure is not None
            hours |= set(_hours_between(start, g.failure - window, g.failure))
        mine_marks = np.flatnonzero(marks["node"].to_numpy(dtype=object) == node)
        if len(mine_marks):
            first_mark = marks[LANDMARK_COL].iloc[mine_marks].min().to_pydatetime()
            hours |= set(_hours_between(start, first_mark - window, cutoff))
        tel = _NodeTelemetry(fleet, node, hours, step, catalog)
        for row in mine_marks:
            at = marks[LANDMARK_COL].iloc[row].to_pydatetime()
            mark_features[row] = tel.features(marks["gpu_uuid"].iloc[row], start, at, window)
        for g in mine:
            if not g.alive(start):
                continue
            end = g.failure if g.failure is not None and g.failure < cutoff else cutoff
            feats = tel.features(g.uuid, start, end, window)
            train_rows.append(
                {
                    "uuid": g.uuid,
                    "sku": g.sku,
                    "install": g.install,
                    "end": end,
                    "window_end": end,
                    DURATION_COL: (end - g.install) / _DAY,
                    EVENT_COL: end < cutoff,
                    **feats,
                }
            )
        for i, d in enumerate(days):
            for g in mine:
                if g.alive(d):
                    feats = tel.features(g.uuid, start, d, window)
                    eval_rows.append(
                        {"day": i, "uuid": g.uuid, AGE_COL: (d - g.install) / _DAY, **feats}
                    )
            rules |= {
                (i, u)
                for u in _ruleflag_days(fleet, node, mine, tel.events, d, catalog, thresholds)
            }
        if progress is not None:
            progress(1)

    train = pd.DataFrame(train_rows)
    landmarks = None
    if landmark_span_days is not None:
        features = iter(mark_features)
        landmarks = telemetry_landmark_rows(
            marks, lambda uuids, _at: [next(features) for _ in uuids]
        )
    bundle = _fit(train, penalizer, landmarks)
    design = bundle.aft_covariates(train)
    train = train.assign(**{c: design[c] for c in design.columns})
    ev = pd.DataFrame(eval_rows)
    units = ev.assign(**{GROUP: ev["uuid"].map(sku)})
    for h in HORIZONS_DAYS:
        ev[f"risk_{h:g}d"] = bundle.score(units, h).probability
    by_scorer: dict[str, dict[float, Metrics]] = {}
    day_s = np.array([(d - start).total_seconds() for d in days])
    fail_s = {g.uuid: (g.failure - start).total_seconds() if g.failure else math.inf for g in gpus}
    days_to = (ev["uuid"].map(fail_s).to_numpy(dtype=np.float64) - day_s[ev["day"]]) / 86400.0
    ev["days_to_failure"] = days_to
    ev["label"] = days_to <= window_days
    ev["rule"] = [(i, u) in rules for i, u in zip(ev["day"], ev["uuid"], strict=True)]
    if landmark_span_days is not None:
        for kind in bundle.scorers:
            part = bundle.with_scorer(kind)
            by_scorer[kind] = {
                h: score_risks(
                    part.probability(units, h),
                    days_to <= h,
                    np.minimum(days_to, h),
                    budget * n_eval,
                )
                for h in HORIZONS_DAYS
            }

    flags = flag_days(ev, budget)
    failures = failure_table(gpus, cutoff, eval_end, days, flags, window)
    n_days = len(days)
    metrics = {m: method_metrics(m, ev, flags[(m, 7.0)], failures, n_days) for m in METHODS}
    ranking = score_risks(
        ev["risk_7d"].to_numpy(dtype=np.float64),
        ev["label"].to_numpy(dtype=bool),
        np.minimum(days_to, window_days),
        budget * n_days,
    )
    wall = time.perf_counter() - started
    logger.info("simulator backtest: %d GPUs, %d eval days, %.1f s", len(gpus), n_days, wall)
    return SimBacktestResult(
        spec=spec,
        cutoff=cutoff,
        eval_days=n_days,
        budget=budget,
        step_minutes=step_minutes,
        n_gpus=len(gpus),
        features=list(design.columns),
        medians=_medians(bundle),
        train=train,
        failures=failures,
        metrics=metrics,
        ranking=ranking,
        wall_s=wall,
        bundle=bundle,
        coefficients=dict((bundle.metrics.get("aft") or {}).get("coefficients", {})),
        flags={m: flags[(m, 1.0)] for m in METHODS},
        days=list(days),
        gpu_nodes={g.uuid: g.node for g in gpus},
        scores=ev[
            ["day", "uuid", AGE_COL, "risk_1d", "risk_7d", "days_to_failure", "label", "rule"]
        ],
        by_scorer=by_scorer,
    )


def _landmark_plan(
    gpus: Sequence[_Gpu], cutoff: datetime, span_days: float | None, max_rows: int
) -> pd.DataFrame:
    """The landmark rows a refit at ``cutoff`` would learn from (:func:`landmark_units`, with
    each GPU's node), before their telemetry; empty without ``span_days``."""
    if span_days is None:
        return pd.DataFrame(columns=["node", "gpu_uuid", LANDMARK_COL])
    known = [g.failure if g.failure is not None and g.failure <= cutoff else None for g in gpus]
    lifetimes = pd.DataFrame(
        {
            "gpu_uuid": np.array([g.uuid for g in gpus], dtype=object),
            "installed_at": pd.to_datetime([g.install for g in gpus], utc=True),
            "removed_at": pd.to_datetime(known, utc=True),
            "failed": [t is not None for t in known],
        }
    )
    longest = max(HORIZONS_DAYS)
    landmarks = daily_landmarks(cutoff, span_days=span_days, follow_up_days=longest)
    units = landmark_units(
        lifetimes, landmarks, cutoff, longest_horizon_days=longest, max_rows=max_rows
    )
    node_of = {g.uuid: g.node for g in gpus}
    return units.assign(node=units["gpu_uuid"].map(node_of))


def _medians(bundle: RiskBundle) -> dict[str, float]:
    """The AFT's imputation values (raw scale) by covariate; empty without an AFT."""
    aft = bundle.to_params()["aft"]
    if aft is None:
        return {}
    return {str(f): float(m) for f, m in zip(aft["features"], aft["median"], strict=True)}


def write_report(result: SimBacktestResult, out_dir: Path) -> list[Path]:
    """Write ``lead_times.csv`` (one row per failure), ``drain_budget.csv`` (the weekly drain
    budget's curve per ranking: :func:`~fleetwatch.models.sim_budget.budget_rows`) and, with
    matplotlib, ``lead_times.png`` (per method, the share of failures flagged at least x hours
    before, x up to 7 days).

    Returns the paths written; the plot is skipped (with a log line) without matplotlib.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "lead_times.csv"
    frame = result.failures.copy()
    frame["failure_time"] = [t.isoformat().replace("+00:00", "Z") for t in frame["failure_time"]]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(frame.columns)
        for row in frame.itertuples(index=False):
            writer.writerow(["" if isinstance(v, float) and math.isnan(v) else v for v in row])
    written = [path]
    from fleetwatch.models.sim_budget import budget_rows, sim_budget

    rows = budget_rows(sim_budget(result))
    budget_path = out_dir / "drain_budget.csv"
    with budget_path.open("w", newline="") as handle:
        table = csv.DictWriter(handle, fieldnames=list(rows[0]))
        table.writeheader()
        table.writerows(rows)
    written.append(budget_path)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.info("matplotlib is not installed: no lead-time plot")
        return written
    fig, ax = plt.subplots(figsize=(7, 4))
    hours = np.arange(0.0, 24.0 * 7.0 + 1.0)
    n = max(result.n_failures, 1)
    for m in METHODS:
        leads = result.failures[f"lead_h_{m}"].dropna().to_numpy(dtype=np.float64)
        share = [(leads >= h).sum() / n for h in hours]
        ax.step(hours, share, where="post", label=f"{m} ({len(leads)}/{result.n_failures})")
    ax.set_xlabel("lead time x (hours)")
    ax.set_ylabel("share of failures flagged >= x hours before")
    ax.set_xticks(np.arange(0.0, 24.0 * 7.0 + 1.0, 24.0))
    ax.set_ylim(0.0, 1.0)
    ax.set_title(f"Simulator backtest: {result.n_gpus} GPUs, drain budget {result.budget}/day")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png = out_dir / "lead_times.png"
    fig.savefig(png, dpi=100)
    plt.close(fig)
    written.append(png)
    return written
