"""Fleet assessment: every GPU's rule verdicts, age, covariates and failure probability.

The background loop (:mod:`fleetwatch.server.judge.assessor`) builds a :class:`FleetAssessment`
every ``assess_interval_s`` in a worker thread; requests only read the newest one, so ``GET
/v1/risk`` never queries telemetry or fits anything. Scores are computed once per horizon per
snapshot and cached on it.

Rules first: a GPU with a verdict that takes it out of service (critical or fatal, counted
against the GPU) has probability 1 with basis ``rule``, whatever the model says. Otherwise the
probability is the model's P(failure within H | survived to its age, covariates), basis
``model``. The covariates are the telemetry window's and, with a ``location_pattern`` set, the
``loc_*`` parts of the location of the GPU's newest lifetime, as the refit read them from each
lifetime it fitted on. Without any fitted model the probability is absent (``None``), never made up.
Node risk is :math:`1 - \\prod_i (1 - p_i)` over its GPUs.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Self, TypeVar, cast

import numpy as np
import pandas as pd
from sqlalchemy import Connection, Select, func, select

from fleetwatch.gc_paused import gc_paused
from fleetwatch.inventory import location_covariates
from fleetwatch.models.registry import Factor, RiskBundle
from fleetwatch.models.telemetry_features import FEATURE_NAMES
from fleetwatch.server.db.raw_rows import psycopg_rows
from fleetwatch.server.db.tables import gpu_lifetimes, gpus, nodes
from fleetwatch.server.judge.judging import FleetJudge, Verdict
from fleetwatch.server.runtime.passes import give_way
from fleetwatch.server.upkeep.rollups import fleet_window_features

__all__ = [
    "FEATURES_SINCE",
    "FleetAssessment",
    "GpuAssessment",
    "GpuRisk",
    "assess_fleet",
    "assess_nodes",
    "risk_order",
]

_DAY_S = 86400.0
FEATURES_SINCE = timedelta(days=30)  # GPUs with a rollup this recent get covariates
_GIVE_WAY_EVERY = 4096  # GPUs assessed between two chances for the urgent lane to go first
T = TypeVar("T")
U = TypeVar("U")
V = TypeVar("V")


# Slotted: a snapshot holds one of each per GPU (100,000 at fleet scale), and the previous
# snapshot lives on while the next is built.
@dataclass(frozen=True, slots=True)
class GpuAssessment:
    uuid: str
    node: str
    index: int
    serial: str | None
    sku: str | None
    installed_at: datetime
    age_days: float
    features: dict[str, float]
    verdicts: tuple[Verdict, ...]

    @property
    def out_of_service(self) -> bool:
        return any(v.takes_gpu_out for v in self.verdicts)


@dataclass(frozen=True, slots=True)
class GpuRisk:
    gpu: GpuAssessment
    probability: float | None
    model_probability: float | None
    basis: str  # "rule" | "model" | "none"
    model: str | None
    factors: tuple[Factor, ...]


@dataclass(frozen=True, slots=True)
class _ScoringBasis:
    """What scoring a snapshot at any horizon needs that does not depend on the horizon: the
    model's input table, each GPU's rule flag, model name and strongest factors."""

    units: pd.DataFrame
    out_of_service: list[bool]
    models: list[str | None]
    factors: list[tuple[Factor, ...]]


@dataclass
class FleetAssessment:
    """Every GPU's assessment as of ``at``. A snapshot patched by a targeted pass
    (:meth:`patched`) holds the nodes of that pass as of ``at`` and the rest as of
    ``fleet_at``, the whole-fleet assessment it was built on: :meth:`judged_at` says which."""

    at: datetime
    gpus: list[GpuAssessment]
    bundle: RiskBundle | None
    model_version: int | None
    fleet_at: datetime | None = None  # None: a whole-fleet assessment (at)
    nodes_at: Mapping[str, datetime] = field(default_factory=dict)  # nodes judged after fleet_at
    _scores: dict[float, list[GpuRisk]] = field(default_factory=dict, repr=False)
    _memo: dict[str, object] = field(default_factory=dict, repr=False)
    _nodes: dict[float, dict[str, tuple[float | None, list[GpuRisk]]]] = field(
        default_factory=dict, repr=False
    )
    _per_node: dict[str, dict[str, object]] = field(default_factory=dict, repr=False)
    _basis: _ScoringBasis | None = field(default=None, repr=False)
    # Re-entrant: a memo (the /metrics text) computes risks, which take the lock too.
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    @property
    def whole_at(self) -> datetime:
        """When the whole fleet was last assessed (what a count of assessments counts)."""
        return self.at if self.fleet_at is None else self.fleet_at

    def judged_at(self, node: str) -> datetime:
        """When the GPUs of ``node`` were judged for this snapshot: evidence about it newer
        than this is evidence the snapshot has not seen."""
        return self.nodes_at.get(node, self.whole_at)

    def patched(self, at: datetime, names: Collection[str], fresh: list[GpuAssessment]) -> Self:
        """This snapshot with the nodes ``names`` judged anew at ``at``: their GPUs replaced by
        ``fresh`` (a GPU no longer there dropped, a new one added), every other GPU as it was.
        The risks already scored are carried over for the other GPUs (their assessments are the
        same objects); only ``fresh`` is scored."""
        names = frozenset(names)
        nodes_at = {**self.nodes_at, **dict.fromkeys(names, at)}
        out = type(self)(
            at,
            _merged(self.gpus, names, fresh, lambda g: g.node),
            self.bundle,
            self.model_version,
            fleet_at=self.whole_at,
            nodes_at=nodes_at,
        )
        with self._lock:
            scored = dict(self._scores)
            by_node = dict(self._nodes)
            per_node = dict(self._per_node)
        out._per_node = {
            key: {node: part for node, part in parts.items() if node not in names}
            for key, parts in per_node.items()
        }
        if scored:
            new = type(self)(at, fresh, self.bundle, self.model_version)
            out._scores = {
                h: _merged(risks, names, new.risks(h), lambda r: r.gpu.node)
                for h, risks in scored.items()
            }
            # Node risks too: regrouping 100,000 GPUs for each urgent patch cost the /metrics
            # render of every patched snapshot seconds of CPU at fleet scale.
            out._nodes = {
                h: _merged_nodes(nodes, names, new.node_risks(h))
                for h, nodes in by_node.items()
                if h in scored
            }
        return out

    def memo(self, key: str, compute: Callable[[], T]) -> T:
        """``compute()`` once per snapshot (the /metrics text of its risks, say)."""
        with self._lock:
            if key not in self._memo:
                self._memo[key] = compute()
            return cast(T, self._memo[key])

    def per_node(self, key: str, nodes: Iterable[str], compute: Callable[[str], T]) -> dict[str, T]:
        """``compute(node)`` for each of ``nodes``, once per snapshot and ``key``; a snapshot
        :meth:`patched` from this one computes only the nodes it judged anew. ``compute`` must
        depend on the node's GPUs alone (their assessments and risks), as with the /metrics
        lines of one node."""
        with self._lock:
            parts = self._per_node.setdefault(key, {})
            out: dict[str, T] = {}
            for node in nodes:
                part = parts.get(node)
                if part is None:
                    part = parts[node] = compute(node)
                out[node] = cast(T, part)
            return out

    def risks(self, horizon_days: float) -> list[GpuRisk]:
        """Every GPU's risk within ``horizon_days``, in the order of :attr:`gpus` (cached)."""
        key = round(float(horizon_days), 9)
        with self._lock:
            cached = self._scores.get(key)
            if cached is None:
                cached = self._score(key)
                if len(self._scores) >= 16:
                    self._scores.clear()  # a few horizons are asked for; never grow unbounded
                self._scores[key] = cached
            return cached

    def _score(self, horizon_days: float) -> list[GpuRisk]:
        with gc_paused():  # 100,000 GPUs' risks form no cycles
            return self._score_all(horizon_days)

    def _score_all(self, horizon_days: float) -> list[GpuRisk]:
        scored = self.bundle is not None and bool(self.gpus)
        first: Iterable[float] = ()
        if self._basis is None:
            self._basis, first = self._scoring_basis(horizon_days)
        elif scored:
            assert self.bundle is not None
            first = self.bundle.probability(self._basis.units, horizon_days)
        basis = self._basis
        probabilities: Sequence[float | None] = (
            [float(p) for p in first] if scored else [None] * len(self.gpus)
        )
        out = []
        for gpu, out_of_service, p, model, f in zip(
            self.gpus, basis.out_of_service, probabilities, basis.models, basis.factors, strict=True
        ):
            if out_of_service:
                out.append(GpuRisk(gpu, 1.0, p, "rule", model, f))
            else:
                out.append(GpuRisk(gpu, p, p, "model" if p is not None else "none", model, f))
        return out

    def _scoring_basis(self, horizon_days: float) -> tuple[_ScoringBasis, Iterable[float]]:
        """What every horizon's scores share, and the probabilities of the horizon it was built
        with (none without a model). At 100,000 GPUs the model's input table, the factors and
        the rule flags were three quarters of scoring a horizon, rebuilt for each of them."""
        n = len(self.gpus)
        units = _units(self.gpus, self.bundle.covariates if self.bundle is not None else ())
        out_of_service = [g.out_of_service for g in self.gpus]
        if self.bundle is None or not self.gpus:
            return _ScoringBasis(units, out_of_service, [None] * n, [()] * n), []
        scores = self.bundle.score(units, horizon_days)
        factors = [tuple(f) for f in scores.factors]
        return _ScoringBasis(units, out_of_service, list(scores.model), factors), scores.probability

    def node_risks(self, horizon_days: float) -> dict[str, tuple[float | None, list[GpuRisk]]]:
        """Node name to (1 − Π(1 − p), its GPUs' risks); None when no GPU has a probability.
        Cached per horizon, like :meth:`risks`."""
        key = round(float(horizon_days), 9)
        cached = self._nodes.get(key)
        if cached is None:
            cached = self._node_risks(key)
            with self._lock:
                if len(self._nodes) >= 16:
                    self._nodes.clear()
                self._nodes[key] = cached
        return cached

    def _node_risks(self, horizon_days: float) -> dict[str, tuple[float | None, list[GpuRisk]]]:
        grouped: dict[str, list[GpuRisk]] = {}
        for risk in self.risks(horizon_days):
            grouped.setdefault(risk.gpu.node, []).append(risk)
        out: dict[str, tuple[float | None, list[GpuRisk]]] = {}
        for node, members in grouped.items():
            known = [r.probability for r in members if r.probability is not None]
            p = 1.0 - float(np.prod([1.0 - q for q in known])) if known else None
            out[node] = (p, members)
        return out


def _merged(
    items: Sequence[U], names: frozenset[str], fresh: Sequence[U], node_of: Callable[[U], str]
) -> list[U]:
    """``items`` with those of the nodes ``names`` replaced by ``fresh``: each node's where its
    old ones were, a node new to ``items`` at the end (by name)."""
    fresh_by_node: dict[str, list[U]] = {}
    for item in fresh:
        fresh_by_node.setdefault(node_of(item), []).append(item)
    merged: list[U] = []
    for item in items:
        node = node_of(item)
        if node not in names:
            merged.append(item)
        elif node in fresh_by_node:
            merged.extend(fresh_by_node.pop(node))
    for node in sorted(fresh_by_node):
        merged.extend(fresh_by_node[node])
    return merged


def _merged_nodes(
    nodes: Mapping[str, V], names: frozenset[str], fresh: Mapping[str, V]
) -> dict[str, V]:
    """``nodes`` with the nodes ``names`` replaced by ``fresh``'s, in :func:`_merged`'s order
    (a node judged anew where it was, a new one at the end by name, one gone dropped)."""
    fresh = dict(fresh)
    merged: dict[str, V] = {}
    for node, value in nodes.items():
        if node not in names:
            merged[node] = value
        elif node in fresh:
            merged[node] = fresh.pop(node)
    for node in sorted(fresh):
        merged[node] = fresh[node]
    return merged


def risk_order(risk: GpuRisk) -> tuple[float, str, int]:
    """The ranking everyone shows (the API, the page): riskiest first, so rule verdicts
    (probability 1) lead; unknown probabilities last; ties by node and index, for a stable page."""
    p = -1.0 if risk.probability is None else risk.probability
    return (-p, risk.gpu.node, risk.gpu.index)


def _units(assessed: Sequence[GpuAssessment], covariates: Sequence[str] = ()) -> pd.DataFrame:
    """The model's input: age, SKU, the telemetry covariates and any other of ``covariates``
    (the bundle's: ``loc_*``) the GPUs have, NaN where a GPU has none."""
    columns: dict[str, Any] = {
        "age_days": np.array([g.age_days for g in assessed], dtype=np.float64),
        "group": [g.sku for g in assessed],
    }
    # One tuple per GPU, then one conversion (an absent covariate, None, becomes NaN): a list
    # per covariate called dict.get 1.1 million times a snapshot at 100,000 GPUs, the planner's
    # largest cost (fleet-scale run 40's profile).
    table = np.array(
        [tuple(map(g.features.get, FEATURE_NAMES)) for g in assessed], np.float64
    ).reshape(len(assessed), len(FEATURE_NAMES))
    for i, name in enumerate(FEATURE_NAMES):
        columns[name] = table[:, i]
    for name in (c for c in covariates if c not in columns):
        columns[name] = np.array([g.features.get(name, np.nan) for g in assessed], np.float64)
    return pd.DataFrame(columns)


# The whole fleet's reads of every pass, as plain tuples on PostgreSQL (db/raw_rows.py): through
# SQLAlchemy's rows the two reads of 100,000 rows were a third of the assessment's CPU
# (fleet-scale run 40's profile).
_FLEET_INSTALLS_SQL = "SELECT serial, max(installed_at) FROM gpu_lifetimes GROUP BY serial"
_FLEET_GPUS_SQL = (
    "SELECT g.uuid, g.index, g.serial, g.name, g.first_seen, n.name FROM gpus g"
    " JOIN nodes n ON n.id = g.node_id WHERE g.last_seen >= %(since)s ORDER BY n.name, g.index"
)


def _install_times(conn: Connection, serials: Select[Any] | None = None) -> dict[str, datetime]:
    """Serial to the install time of its newest lifetime (open, or closed by a failure that the
    GPU is still listed with); of ``serials`` only (a query of them), if given."""
    if serials is None and (raw := psycopg_rows(conn, _FLEET_INSTALLS_SQL)) is not None:
        return dict(raw)
    query = select(gpu_lifetimes.c.serial, func.max(gpu_lifetimes.c.installed_at).label("at"))
    if serials is not None:
        query = query.where(gpu_lifetimes.c.serial.in_(serials.scalar_subquery()))
    return {row.serial: row.at for row in conn.execute(query.group_by(gpu_lifetimes.c.serial))}


def _newest_locations(
    conn: Connection, serials: Select[Any] | None = None
) -> dict[str, str | None]:
    """Serial to the location of its newest lifetime (None where that one has none: a unit
    that moved is not where an older record put it); of ``serials`` only, if given."""
    query = select(gpu_lifetimes.c.serial, gpu_lifetimes.c.installed_at, gpu_lifetimes.c.location)
    if serials is not None:
        query = query.where(gpu_lifetimes.c.serial.in_(serials.scalar_subquery()))
    newest: dict[str, tuple[datetime, str | None]] = {}
    for serial, installed_at, location in conn.execute(query):
        seen = newest.get(serial)
        if seen is None or installed_at > seen[0]:
            newest[serial] = (installed_at, location)
    return {serial: location for serial, (_, location) in newest.items()}


def _gpu_rows(
    conn: Connection, since: datetime, names: Collection[str] | None = None
) -> Iterable[tuple[Any, ...]]:
    """(uuid, index, serial, SKU, first seen, node) of the GPUs seen since ``since``, of the
    nodes ``names`` only if given, by node name and index."""
    if names is None and (raw := psycopg_rows(conn, _FLEET_GPUS_SQL, {"since": since})) is not None:
        return raw
    query = (
        select(gpus.c.uuid, gpus.c.index, gpus.c.serial, gpus.c.name, gpus.c.first_seen)
        .add_columns(nodes.c.name.label("node"))
        .join(nodes, nodes.c.id == gpus.c.node_id)
        .where(gpus.c.last_seen >= since)
        .order_by(nodes.c.name, gpus.c.index)
    )
    if names is not None:
        query = query.where(nodes.c.name.in_(sorted(names)))
    return conn.execute(query)


def assess_fleet(
    conn: Connection,
    judge: FleetJudge,
    *,
    now: datetime,
    bundle: RiskBundle | None,
    model_version: int | None,
    feature_window: timedelta,
    stale_after: timedelta = timedelta(days=1),
    features: Mapping[str, dict[str, float]] | None = None,
    location_pattern: re.Pattern[str] | None = None,
) -> FleetAssessment:
    """Judge every GPU seen within ``stale_after`` and gather what its risk needs.

    ``features``: the covariates :func:`fleet_window_features` gives for ``feature_window``
    and :data:`FEATURES_SINCE` at ``now``, when the caller has them already.
    ``location_pattern``: the refit's (``location_pattern`` setting), whose ``loc_*`` parts of
    each GPU's location join its covariates. Gives way between its steps
    (:mod:`fleetwatch.server.runtime.passes`)."""
    verdicts = judge.judge(conn, now)
    give_way()
    if features is None:
        features = fleet_window_features(conn, window=feature_window, since=now - FEATURES_SINCE)
    installs = _install_times(conn)
    give_way()
    located = _located(conn, location_pattern)
    rows = _gpu_rows(conn, now - stale_after)
    assessed = _assessed_gpus(rows, now, verdicts, features, installs, located)
    return FleetAssessment(now, assessed, bundle, model_version)


def _located(
    conn: Connection, pattern: re.Pattern[str] | None, serials: Select[Any] | None = None
) -> dict[str, dict[str, float]]:
    """Serial to its ``loc_*`` covariates under ``pattern`` (none without one)."""
    if pattern is None:
        return {}
    found = {}
    for serial, location in _newest_locations(conn, serials).items():
        if parts := location_covariates(location, pattern):
            found[serial] = parts
    return found


def assess_nodes(
    conn: Connection,
    judge: FleetJudge,
    names: Collection[str],
    *,
    now: datetime,
    features: Mapping[str, dict[str, float]],
    stale_after: timedelta = timedelta(days=1),
    location_pattern: re.Pattern[str] | None = None,
) -> list[GpuAssessment]:
    """:func:`assess_fleet`'s GPUs of the nodes ``names`` alone (a targeted pass,
    :meth:`FleetJudge.judge_nodes`), to patch into the newest snapshot."""
    verdicts, _ = judge.judge_nodes(conn, now, names)
    serials = select(func.coalesce(gpus.c.serial, gpus.c.uuid)).join(
        nodes, nodes.c.id == gpus.c.node_id
    )
    of_nodes = serials.where(nodes.c.name.in_(sorted(names)))
    installs = _install_times(conn, of_nodes)
    located = _located(conn, location_pattern, of_nodes)
    return _assessed_gpus(
        _gpu_rows(conn, now - stale_after, names), now, verdicts, features, installs, located
    )


def _assessed_gpus(
    rows: Iterable[tuple[Any, ...]],
    now: datetime,
    verdicts: Mapping[str, list[Verdict]],
    features: Mapping[str, dict[str, float]],
    installs: Mapping[str, datetime],
    located: Mapping[str, dict[str, float]],
) -> list[GpuAssessment]:
    assessed = []
    # One string object per node name and per SKU, not one per GPU row.
    nodes_seen: dict[str, str] = {}
    skus: dict[str | None, str | None] = {}
    no_features: dict[str, float] = {}
    for n, (uuid, slot, serial, sku, first_seen, node) in enumerate(rows, 1):
        if not n % _GIVE_WAY_EVERY:
            give_way()
        installed = installs.get(serial or uuid, first_seen)
        found = verdicts.get(uuid)
        covariates = features.get(uuid, no_features)
        if located and (parts := located.get(serial or uuid)):
            covariates = {**covariates, **parts}
        assessed.append(
            GpuAssessment(
                uuid=uuid,
                node=nodes_seen.setdefault(node, node),
                index=slot,
                serial=serial,
                sku=skus.setdefault(sku, sku),
                installed_at=installed,
                age_days=max((now - installed).total_seconds(), 0.0) / _DAY_S,
                features=covariates,
                verdicts=tuple(found) if found else (),
            )
        )
    return assessed
