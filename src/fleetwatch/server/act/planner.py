"""The eviction planner: turns the newest fleet assessment into drain recommendations.

Each pass (every ``planner_interval_s``, in the background) proposes at most one eviction per node,
for the strongest of three reasons:

1. ``rule``: a GPU has a verdict that takes it out of service (a fatal Xid, a row-remap failure),
   or the node is unreachable (nothing for ``unreachable_after_intervals`` of its intervals, heard
   while this process was up: a restart of the server is not every node's silence, see
   ``server.concepts.liveness``). A fact: drain now. Verdicts last seen before the node's latest
   return are history (it was repaired since) and do not count.
2. ``straggler``: a ``hardware`` straggler verdict on the node has been open for at least
   ``straggler_drain_after_s``.
3. ``risk``: the model's P(node fails within ``drain_horizon_h``) makes a drain cheaper than the
   failure it avoids, on two consecutive assessments (counted in ``leader_state``, so a new leader
   continues the count; an assessment older than the last one counted does not count)::

       failure = job_gpus x gpu_hour_usd x (checkpoint_interval_h / 2 + restart_h)
       drain   = node GPUs x drain_hours x gpu_hour_usd
       expected_saving_usd = p x failure - drain          (drain when > 0)

   (a failure interrupts the whole job, which loses on average half a checkpoint interval and
   its restart time; a drain costs the node's GPUs for ``drain_hours``). Rule evictions carry the
   same saving with p = 1; straggler evictions the job's GPU-hours lost to the slowdown,
   ``job_gpus x gpu_hour_usd x (1 - 1/ratio) x drain_horizon_h``, minus the drain.

Hysteresis: no eviction for a node with an open one (pending, acked, completed and not yet
returned, paged, recommended), nor within ``eviction_cooldown_s`` of a rejection or a return. An
eviction nobody acted on (pending, paged, recommended) is cancelled once its node has no reason
left; a reason read from the assessment counts as gone only on an assessment at least as new as
the one the eviction was made from (its ``assessed_at``, else its ``created_at``): a stale
snapshot (a new leader's, or one taken before a fatal Xid) has not seen the evidence. Expired
scheduler leases return their eviction to pending.

Fleet drain budget: at most ``drain_budget_pct`` of the known nodes (at least one node) draining
at once (pending + acked + completed). Past it, new evictions are created ``paged``, never
drained automatically, and one ``drain_budget_exhausted`` fleet event (``node_id`` NULL) records
the episode's counts and top reasons; the episode ends when the budget has room again (whether
one is open is kept in ``leader_state``, so a new leader does not announce it again). An Xid
storm on every node (a bad driver roll-out) thus drains a few nodes and pages a person.

Fleet-wide silence (``server.judge.silence``): when more than ``unreachable_storm_pct`` of the
nodes are unreachable at once, the cause is shared (the server's ingest, the network): no new
unreachable evictions, so a silence cannot fill the drain budget; open ones are left as they are
while their node is silent. Rule evictions (a fatal Xid) are made as usual.

Maintenance windows (``server.concepts.planned``): a node a window covers gets no unreachable,
straggler or risk eviction, nor one for a verdict a planned reboot, reset or cable job causes
(a GPU lost or missing, a port down), and such open evictions of it are cancelled (their reason
is planned). A hardware fault that takes a GPU out (a fatal Xid, an uncorrectable ECC error, a
fatal SXid, an uncorrected AER) still makes its eviction: the node must not go back into service
with it when the window ends. After a window, silence counts from its end.

Repeat offenders: a hardware eviction (one gated on validation, see
:mod:`fleetwatch.server.repo.validations`) of a node that returned from a hardware eviction within
``repeat_offender_days`` records that eviction in ``repeat_of``; it raises a ``repeat_offender``
alert while open, is listed in the weekly report, and sorts first among candidates of its kind,
so that when the drain budget is short its drain is the one that goes through.

Dry run (``planner_dry_run``): evictions are created ``recommended`` with ``dry_run`` true.

Every change is written to ``eviction_audit`` (actor ``planner``). With several workers or
replicas, one pass at a time runs: the pass holds a PostgreSQL advisory lock.

The urgent lane (:mod:`fleetwatch.server.runtime.urgent`) plans for a few nodes at once with
:meth:`EvictionPlanner.run_for`: their rule evictions only, under the same lock, dedup, cooldown
and budget; everything else waits for the whole-fleet pass. Evidence times are per node
(:meth:`FleetAssessment.judged_at`): a snapshot patched for those nodes is as old as its
whole-fleet pass for the others.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Row

from fleetwatch.config import ServerSettings
from fleetwatch.server.concepts.liveness import unreachable_deadline
from fleetwatch.server.concepts.planned import Planned, stands_in_maintenance
from fleetwatch.server.db.session import Database
from fleetwatch.server.judge.assessment import FleetAssessment, GpuAssessment
from fleetwatch.server.judge.assessor import Assessor
from fleetwatch.server.judge.judging import Verdict
from fleetwatch.server.judge.silence import (
    RECENT,
    NodeClock,
    fleet_silence,
    heard_since_of,
    node_clocks,
)
from fleetwatch.server.repo.events import record_fleet_event
from fleetwatch.server.repo.evictions import (
    DRAINING_STATES,
    cancel_eviction,
    cooling_nodes,
    create_eviction,
    expire_leases,
    last_returns,
    open_evictions,
)
from fleetwatch.server.repo.jobs import hardware_stragglers
from fleetwatch.server.repo.maintenance import load_planned
from fleetwatch.server.repo.nodes import count_nodes, unheard_nodes
from fleetwatch.server.repo.validations import HARDWARE_KINDS, needs_validation, repeat_of
from fleetwatch.server.runtime.isolation import ItemGuard
from fleetwatch.server.runtime.locks import LockKey, try_transaction_lock
from fleetwatch.server.runtime.state import load_state, save_state

__all__ = ["Candidate", "DrainCosts", "EvictionPlanner", "PlanResult", "PlannerState", "made_from"]

logger = logging.getLogger(__name__)

_PRIORITY = {"rule": 0, "straggler": 1, "risk": 2}
_RISK_PASSES = 2
_STATE = "planner"  # its row in leader_state


@dataclass(frozen=True)
class DrainCosts:
    """What a failure and a drain cost, in USD (see the module docstring)."""

    gpu_hour_usd: float
    job_gpus: int
    checkpoint_interval_h: float
    restart_h: float
    drain_hours: float

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> DrainCosts:
        return cls(
            settings.gpu_hour_usd,
            settings.job_gpus,
            settings.checkpoint_interval_h,
            settings.restart_h,
            settings.drain_hours,
        )

    @property
    def failure_usd(self) -> float:
        return self.job_gpus * self.gpu_hour_usd * (self.checkpoint_interval_h / 2 + self.restart_h)

    def drain_usd(self, gpus: int) -> float:
        return gpus * self.drain_hours * self.gpu_hour_usd

    def saving(self, probability: float, gpus: int) -> float:
        return probability * self.failure_usd - self.drain_usd(gpus)


@dataclass(frozen=True)
class Candidate:
    node: str
    kind: str  # rule | straggler | risk
    reason: str
    key: str  # the short reason the budget event counts: a rule name, "risk", "straggler"
    evidence: dict[str, Any]
    saving: float | None


@dataclass
class PlanResult:
    created: dict[str, int] = field(default_factory=dict)
    cancelled: int = 0
    expired: int = 0
    draining: int = 0
    budget: int = 0
    budget_event: bool = False
    skipped: bool = False
    silent: int | None = None  # nodes unreachable now (whole-fleet pass)
    silence_storm: bool = False  # more than unreachable_storm_pct of them: no unreachable drains
    next_run_s: float | None = None  # when the next node turns unreachable: plan again then


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _takes_out(v: Verdict) -> bool:
    return v.takes_gpu_out


def _verdict_json(v: Verdict) -> dict[str, Any]:
    return {
        "kind": v.kind,
        "rule": v.rule,
        "severity": v.severity,
        "action": v.action,
        "xids": list(v.xids),
        "source": v.source,
        "first_seen": _iso(v.first_seen),
        "last_seen": _iso(v.last_seen),
        "evidence": dict(v.evidence),
        "note": v.note,
    }


def rule_candidates(
    snapshot: FleetAssessment,
    costs: DrainCosts,
    returned: dict[str, datetime],
    planned: Planned | None = None,
    only: Collection[str] | None = None,
) -> dict[str, Candidate]:
    """Nodes with a GPU that a rule takes out of service, on evidence newer than a repair (of
    the nodes ``only``, if given); in a maintenance window, only a hardware fault counts
    (``server.concepts.planned``)."""
    members = snapshot.gpus if only is None else [g for g in snapshot.gpus if g.node in only]
    gpu_count = Counter(g.node for g in members)
    planned = planned or Planned()
    failing: dict[str, list[tuple[GpuAssessment, list[Verdict]]]] = {}
    for gpu in members:
        since = returned.get(gpu.node)
        takes_out = stands_in_maintenance if planned.covers(gpu.node) else _takes_out
        out = [
            v
            for v in gpu.verdicts
            if takes_out(v) and (since is None or v.last_seen is None or v.last_seen > since)
        ]
        if out:
            failing.setdefault(gpu.node, []).append((gpu, out))
    found = {}
    for node, items in failing.items():
        gpu, verdicts = items[0]
        first = verdicts[0]
        more = f" and {len(items) - 1} more GPU(s)" if len(items) > 1 else ""
        where = f"GPU {gpu.index} ({gpu.uuid})"
        if first.evidence.get("component") == "network":  # a port: the node's, not the GPU's
            netdev = first.evidence.get("netdev")
            where = f"port {first.evidence.get('port_key')}" + (f" ({netdev})" if netdev else "")
        reason = f"{first.rule} on {where}: {first.severity}, {first.action}{more}"
        evidence = {
            "gpus": [
                {
                    "uuid": g.uuid,
                    "index": g.index,
                    "serial": g.serial,
                    "verdicts": [_verdict_json(v) for v in vs],
                }
                for g, vs in items
            ],
            "node_gpus": gpu_count[node],
            "assessed_at": snapshot.judged_at(node).isoformat(),
        }
        found[node] = Candidate(
            node, "rule", reason, first.rule, evidence, round(costs.saving(1.0, gpu_count[node]), 2)
        )
    return found


def unreachable_candidates(
    conn: Connection,
    *,
    now: datetime,
    factor: float,
    costs: DrainCosts,
    gpu_count: Counter[str],
    within: timedelta = RECENT,  # the same cutoff the fleet-wide silence counts by
    heard_since: datetime | None = None,
    planned: Planned | None = None,
    clocks: Sequence[NodeClock] | None = None,
    lag_s: float = 0.0,
) -> dict[str, Candidate]:
    """Nodes silent for ``factor`` of their intervals (agent or node dead): drain them so nothing
    new is scheduled there. Nodes silent for longer than ``within`` are left alone: decommissioned
    or long known, not news. Silence before ``heard_since`` (this process's start) is not
    counted, nor silence in a maintenance window, nor before its end. ``clocks``: every node's,
    read this pass (else read here); ``lag_s``: the fleet's ingest lag, added to every deadline
    (server.concepts.ingest_lag)."""
    planned = planned or Planned()
    if clocks is None:
        rows = node_clocks(conn, now - within)
    else:
        rows = heard_since_of(clocks, now - within)
    found = {}
    for row in rows:
        if planned.covers(row.name):
            continue
        heard = planned.listen_from(row.name, heard_since)
        deadline = unreachable_deadline(row.last_seen, row.interval_s, factor, heard, lag_s)
        if now <= deadline:
            continue
        silent = (now - row.last_seen).total_seconds()
        late = f", and {lag_s:.0f} s for the fleet's late pushes" if lag_s else ""
        reason = (
            f"node_unreachable: no report for {silent:.0f} s "
            f"({factor:g} intervals of {row.interval_s:g} s{late})"
        )
        evidence = {
            "last_seen": _iso(row.last_seen),
            "interval_s": row.interval_s,
            "silent_s": round(silent, 3),
            "after_intervals": factor,
            "fleet_ingest_lag_s": round(lag_s, 3),
        }
        gpus = gpu_count.get(row.name, 0)
        saving = round(costs.saving(1.0, gpus), 2) if gpus else None
        found[row.name] = Candidate(row.name, "rule", reason, "node_unreachable", evidence, saving)
    return found


def next_unreachable_s(
    conn: Connection,
    *,
    now: datetime,
    factor: float,
    heard_since: datetime | None = None,
    planned: Planned | None = None,
    clocks: Sequence[NodeClock] | None = None,
    lag_s: float = 0.0,
) -> float | None:
    """Seconds until the next node still up turns unreachable (None: no node is up);
    ``clocks``: every node's, read this pass (else read here); ``lag_s``: the fleet's ingest
    lag."""
    planned = planned or Planned()
    rows = node_clocks(conn) if clocks is None else clocks
    ahead = [
        (
            unreachable_deadline(
                r.last_seen, r.interval_s, factor, planned.listen_from(r.name, heard_since), lag_s
            )
            - now
        ).total_seconds()
        for r in rows
        if not planned.covers(r.name)
    ]
    upcoming = [s for s in ahead if s >= 0]
    return min(upcoming) if upcoming else None


def risk_candidates(
    snapshot: FleetAssessment, costs: DrainCosts, horizon_h: float
) -> dict[str, Candidate]:
    """Nodes whose model risk makes a drain cheaper than the failure it avoids."""
    found = {}
    failure = costs.failure_usd
    for node, (_, members) in snapshot.node_risks(horizon_h / 24.0).items():
        known = [r for r in members if r.model_probability is not None]
        if not known:
            continue
        p = 1.0 - math.prod(1.0 - float(r.model_probability or 0.0) for r in known)
        drain = costs.drain_usd(len(members))
        saving = p * failure - drain
        if saving <= 0:
            continue
        ranked = sorted(known, key=lambda r: -(r.model_probability or 0.0))
        top = ranked[0]
        break_even = drain / failure if failure > 0 else None
        reason = (
            f"P(failure within {horizon_h:g} h) = {p:.3f} above break-even "
            f"{break_even or 0:.3f}; riskiest GPU {top.gpu.index} ({top.gpu.uuid}) "
            f"p = {top.model_probability:.3f}"
        )
        evidence = {
            "probability": p,
            "horizon_h": horizon_h,
            "model_version": snapshot.model_version,
            "failure_cost_usd": failure,
            "drain_cost_usd": drain,
            "break_even_probability": break_even,
            "assessed_at": snapshot.judged_at(node).isoformat(),
            "gpus": [
                {
                    "uuid": r.gpu.uuid,
                    "index": r.gpu.index,
                    "probability": r.model_probability,
                    "model": r.model,
                    "factors": [
                        {
                            "name": f.name,
                            "value": f.value,
                            "hazard_ratio": f.hazard_ratio,
                            "contribution": f.contribution,
                        }
                        for f in r.factors
                    ],
                }
                for r in ranked
            ],
        }
        found[node] = Candidate(node, "risk", reason, "risk", evidence, round(saving, 2))
    return found


def straggler_candidates(
    conn: Connection,
    *,
    now: datetime,
    after_s: float,
    costs: DrainCosts,
    horizon_h: float,
    gpu_count: Counter[str],
) -> dict[str, Candidate]:
    """Nodes with a hardware straggler verdict open for at least ``after_s``."""
    rows = hardware_stragglers(conn, started_by=now - timedelta(seconds=after_s))
    found: dict[str, Candidate] = {}
    for row in rows:
        if row.node in found:
            continue
        open_s = (now - row.started_at).total_seconds()
        lost = costs.job_gpus * costs.gpu_hour_usd * (1.0 - 1.0 / max(row.ratio, 1.0)) * horizon_h
        saving = lost - costs.drain_usd(gpu_count.get(row.node, 0))
        reason = (
            f"hardware straggler in job {row.job_id} for {open_s / 60:.0f} min: step time "
            f"{row.ratio:.2f}x the job's median over {row.windows} windows"
        )
        evidence = {
            "job_id": row.job_id,
            "ratio": row.ratio,
            "windows": row.windows,
            "started_at": row.started_at.isoformat(),
            "open_s": round(open_s, 1),
            "straggler_id": row.id,
            "detector": row.evidence,
        }
        found[row.node] = Candidate(
            row.node, "straggler", reason, "straggler", evidence, round(saving, 2)
        )
    return found


def made_from(row: Row[Any]) -> datetime | None:
    """When the assessment an open eviction was made from was taken; None for a reason read from
    the database at each pass (an unreachable node, a straggler verdict), which no stale snapshot
    can hide. Evictions made before evidence carried ``assessed_at`` fall back to creation."""
    if row.reason_kind == "straggler" or row.reason.startswith("node_unreachable"):
        return None
    at = (row.evidence or {}).get("assessed_at")
    if isinstance(at, str):
        return datetime.fromisoformat(at)
    created: datetime = row.created_at
    return created


@dataclass
class PlannerState:
    """What the planner remembers between passes, kept in ``leader_state`` (row ``planner``) and
    written in the pass's transaction: a new leader continues the streaks and the episode."""

    streaks: dict[str, int] = field(default_factory=dict)  # node -> consecutive risky assessments
    assessed_at: datetime | None = None  # the newest assessment counted in the streaks
    episode: bool | None = None  # a budget episode is open; None: unknown (nothing stored yet)

    def as_json(self) -> dict[str, Any]:
        return {
            "streaks": self.streaks,
            "assessed_at": _iso(self.assessed_at),
            "episode": self.episode,
        }

    @classmethod
    def load(cls, conn: Connection) -> PlannerState:
        value = load_state(conn, _STATE)
        if value is None:
            return cls()
        at = value.get("assessed_at")
        return cls(
            streaks={str(n): int(k) for n, k in value.get("streaks", {}).items()},
            assessed_at=datetime.fromisoformat(at) if at else None,
            episode=value.get("episode"),
        )


class EvictionPlanner:
    """Plans evictions from the assessor's newest snapshot. Risk streaks (the
    two-consecutive-assessments rule) and whether a budget episode is open are
    :class:`PlannerState` in the database, not in this object: any instance, in any process,
    continues them."""

    def __init__(
        self,
        db: Database,
        settings: ServerSettings,
        assessor: Assessor,
        guard: ItemGuard | None = None,
        heard_since: datetime | None = None,
    ) -> None:
        self.guard = guard or ItemGuard("planner")
        # When this process started listening (None: judge silence by last_seen alone).
        self.heard_since = heard_since
        self.db = db
        self.settings = settings
        self.assessor = assessor
        self.costs = DrainCosts.from_settings(settings)
        self._lock = threading.Lock()

    def run_once(self, now: datetime | None = None) -> PlanResult:
        now = now or datetime.now(UTC)
        snapshot = self.assessor.current()
        # Scored (and cached on the snapshot) before the write transaction: on SQLite that
        # holds the one writer lock, which ingest waits for.
        snapshot.node_risks(self.settings.drain_horizon_h / 24.0)
        with self._lock, self.db.write() as conn:
            if not try_transaction_lock(conn, LockKey.PLANNER):
                return PlanResult(skipped=True)
            result = self._plan(conn, snapshot, now)
        if result.created or result.cancelled or result.expired or result.silence_storm:
            logger.info(
                "planner: created %s, cancelled %d, leases expired %d; %d of %d budget draining; "
                "%s nodes unreachable%s",
                dict(result.created),
                result.cancelled,
                result.expired,
                result.draining,
                result.budget,
                result.silent,
                " (fleet-wide silence: no unreachable evictions)" if result.silence_storm else "",
            )
        return result

    def run_for(self, names: Collection[str], now: datetime | None = None) -> PlanResult:
        """The urgent lane's pass (after a targeted assessment of the nodes ``names``): create
        the rule evictions of those nodes at once, under the same lock, dedup, cooldown and
        fleet drain budget as :meth:`run_once`. It only adds: cancelling what cleared, lease
        expiry, risk streaks, stragglers and unreachable nodes are left to the whole-fleet
        pass. An open eviction whose reason has cleared still counts against the budget until
        that pass cancels it, so the budget is never exceeded, only spent cautiously."""
        now = now or datetime.now(UTC)
        snapshot = self.assessor.current()
        with self._lock, self.db.write() as conn:
            if not try_transaction_lock(conn, LockKey.PLANNER):
                return PlanResult(skipped=True)
            result = self._plan_nodes(conn, snapshot, frozenset(names), now)
        if result.created:
            logger.info(
                "planner (urgent, %d nodes): created %s; %d of %d budget draining",
                len(names),
                dict(result.created),
                result.draining,
                result.budget,
            )
        return result

    def _plan_nodes(
        self, conn: Connection, snapshot: FleetAssessment, names: frozenset[str], now: datetime
    ) -> PlanResult:
        kept = PlannerState.load(conn)
        stored = kept.as_json()
        result = PlanResult()
        returned = last_returns(conn, names)
        # A node in a maintenance window drains for a hardware fault only, as in the full pass.
        planned = load_planned(conn, now)
        rules = rule_candidates(snapshot, self.costs, returned, planned, only=names)
        open_rows = open_evictions(conn)
        cooling = cooling_nodes(
            conn, since=now - timedelta(seconds=self.settings.eviction_cooldown_s), nodes=names
        )
        known = count_nodes(conn)
        result.budget = max(1, math.floor(known * self.settings.drain_budget_pct / 100.0))
        result.draining = sum(1 for row in open_rows if row.state in DRAINING_STATES)
        paged_open = any(row.state == "paged" for row in open_rows)
        still_open = {row.node for row in open_rows}
        self._create(conn, rules, still_open | cooling, result, kept, known, paged_open, now)
        if kept.as_json() != stored:
            save_state(conn, _STATE, kept.as_json(), now)
        return result

    def _risk(
        self, snapshot: FleetAssessment, kept: PlannerState
    ) -> tuple[dict[str, Candidate], dict[str, Candidate]]:
        """(risk candidates now, those seen on enough consecutive assessments)."""
        now_risky = risk_candidates(snapshot, self.costs, self.settings.drain_horizon_h)
        # Count assessments of the whole fleet, not planner passes nor targeted passes (a
        # snapshot patched for a few nodes is the same count); one older than the last counted
        # (a standby's snapshot) is not the next one.
        if kept.assessed_at is None or snapshot.whole_at > kept.assessed_at:
            kept.streaks = {n: kept.streaks.get(n, 0) + 1 for n in now_risky}
            kept.assessed_at = snapshot.whole_at
        ready = {n: c for n, c in now_risky.items() if kept.streaks.get(n, 0) >= _RISK_PASSES}
        return now_risky, ready

    def _plan(self, conn: Connection, snapshot: FleetAssessment, now: datetime) -> PlanResult:
        settings = self.settings
        kept = PlannerState.load(conn)
        stored = kept.as_json()
        result = PlanResult(expired=expire_leases(conn, now=now))
        factor = settings.unreachable_after_intervals
        heard = self.heard_since
        planned = load_planned(conn, now)
        clocks = node_clocks(conn)  # one read for the three questions below
        silence = fleet_silence(
            conn, settings, now=now, heard_since=heard, planned=planned, clocks=clocks
        )
        lag = silence.lag_s
        result.next_run_s = next_unreachable_s(
            conn,
            now=now,
            factor=factor,
            heard_since=heard,
            planned=planned,
            clocks=clocks,
            lag_s=lag,
        )
        unheard = unheard_nodes(
            conn, now=now, factor=factor, heard_since=heard, planned=planned, lag_s=lag
        )
        result.silent, result.silence_storm = len(silence.silent), silence.storm
        returned = last_returns(conn)
        gpu_count = Counter(g.node for g in snapshot.gpus)
        # A fleet-wide silence is the server's or the network's, not each node's: no new
        # unreachable evictions (server.judge.silence); rule evictions go on.
        silent_nodes = (
            {}
            if silence.storm
            else unreachable_candidates(
                conn,
                now=now,
                factor=factor,
                costs=self.costs,
                gpu_count=gpu_count,
                heard_since=heard,
                planned=planned,
                clocks=clocks,
                lag_s=lag,
            )
        )
        rules = {**silent_nodes, **rule_candidates(snapshot, self.costs, returned, planned)}
        slow = straggler_candidates(
            conn,
            now=now,
            after_s=settings.straggler_drain_after_s,
            costs=self.costs,
            horizon_h=settings.drain_horizon_h,
            gpu_count=gpu_count,
        )
        risky_now, risky = self._risk(snapshot, kept)
        if planned.active:  # a node in maintenance is out already: only a hardware fault counts
            slow, risky_now, risky = (
                {n: c for n, c in found.items() if not planned.covers(n)}
                for found in (slow, risky_now, risky)
            )
        candidates: dict[str, Candidate] = {**risky, **slow, **rules}  # stronger reasons win

        open_rows = open_evictions(conn)
        still_open = set()
        for row in open_rows:
            reason_left = row.node in rules or row.node in slow or row.node in risky_now
            # Silent since before this process started: not known to have come back yet.
            reason_left |= row.reason.startswith("node_unreachable") and row.node in unheard
            # Made on the node's own silence before the storm: left as it is while still silent.
            reason_left |= row.reason.startswith("node_unreachable") and (
                silence.storm and row.node in silence.silent
            )
            # Silent past its own deadline, within the fleet's ingest lag: not back either.
            reason_left |= row.reason.startswith("node_unreachable") and (
                row.node in silence.held_by_lag
            )
            unknown = row.reason_kind != "straggler" and row.node not in gpu_count
            made = made_from(row)
            # This snapshot's view of the node predates the eviction's evidence.
            unseen = made is not None and snapshot.judged_at(row.node) < made
            cancelled = False
            if not reason_left and not unknown and not unseen:
                # One eviction per item (a savepoint each; cancellations are few): a failing one
                # stays open and is logged, the others are still planned (server.runtime.isolation).
                with self.guard.item(conn, f"eviction {row.id}"):
                    cancelled = cancel_eviction(conn, row, why="reason cleared", now=now)
            if cancelled:
                result.cancelled += 1
                continue
            still_open.add(row.node)
        cooling = cooling_nodes(conn, since=now - timedelta(seconds=settings.eviction_cooldown_s))
        known = count_nodes(conn)
        result.budget = max(1, math.floor(known * settings.drain_budget_pct / 100.0))
        result.draining = sum(
            1 for row in open_rows if row.state in DRAINING_STATES and row.node in still_open
        )
        paged_open = any(row.state == "paged" for row in open_rows)
        self._create(conn, candidates, still_open | cooling, result, kept, known, paged_open, now)
        if kept.as_json() != stored:
            save_state(conn, _STATE, kept.as_json(), now)
        return result

    def _create(
        self,
        conn: Connection,
        candidates: dict[str, Candidate],
        skip: set[str],
        result: PlanResult,
        kept: PlannerState,
        known: int,
        paged_open: bool,
        now: datetime,
    ) -> None:
        """Create the evictions of ``candidates`` (but for the nodes ``skip``: open or cooling
        down), strongest first, ``pending`` while the drain budget has room, else ``paged``, and
        open the budget episode (its event) or end it."""
        settings = self.settings
        if kept.episode is None:  # nothing stored (a database from before leader_state)
            kept.episode = result.draining >= result.budget and paged_open
        paged: list[Candidate] = []
        within = timedelta(days=settings.repeat_offender_days)
        repeats = {
            node: found
            for node, cand in candidates.items()
            if needs_validation(cand.kind, cand.reason)
            and node not in skip
            and (found := repeat_of(conn, node, now=now, within=within, kinds=HARDWARE_KINDS))
            is not None
        }
        # A repeat offender drains first among equals: under a full budget its drain is the one
        # that goes through, and a node that failed again so soon is the likelier to fail again.
        ordered = sorted(
            candidates.values(),
            key=lambda c: (_PRIORITY[c.kind], c.node not in repeats, -(c.saving or 0.0), c.node),
        )
        for cand in ordered:
            if cand.node in skip:
                continue
            detail = None
            if settings.planner_dry_run:
                state, detail = "recommended", "dry run: not drainable"
            elif result.draining < result.budget:
                state = "pending"
            else:
                state = "paged"
                detail = (
                    f"fleet drain budget exhausted: {result.draining} of {known} nodes "
                    f"draining (budget {result.budget}); a person decides"
                )
            with self.guard.item(conn, f"node {cand.node}") as ok:
                create_eviction(
                    conn,
                    node=cand.node,
                    state=state,
                    reason_kind=cand.kind,
                    reason=cand.reason,
                    evidence=cand.evidence,
                    expected_saving_usd=cand.saving,
                    dry_run=settings.planner_dry_run,
                    now=now,
                    detail=detail,
                    repeat_of=repeats.get(cand.node),
                )
            if not ok:
                continue
            result.created[state] = result.created.get(state, 0) + 1
            if state == "pending":
                result.draining += 1
            elif state == "paged":
                paged.append(cand)
        if paged and not kept.episode:
            with self.guard.item(conn, "drain budget event") as ok:
                self._budget_event(conn, now=now, known=known, result=result, paged=paged)
            result.budget_event = bool(ok)
            kept.episode = bool(ok)
        elif not paged and result.draining < result.budget:
            kept.episode = False

    def _budget_event(
        self,
        conn: Connection,
        *,
        now: datetime,
        known: int,
        result: PlanResult,
        paged: list[Candidate],
    ) -> None:
        top = Counter(c.key for c in paged).most_common(5)
        details = {
            "known_nodes": known,
            "budget_nodes": result.budget,
            "budget_pct": self.settings.drain_budget_pct,
            "draining": result.draining,
            "paged": len(paged),
            "top_reasons": [{"reason": k, "nodes": n} for k, n in top],
        }
        record_fleet_event(
            conn,
            kind="drain_budget_exhausted",
            now=now,
            message=f"fleet drain budget exhausted: {result.draining} of {known} nodes "
            f"draining (budget {result.budget}); {len(paged)} evictions paged instead, "
            f"top reason {top[0][0]} on {top[0][1]} nodes",
            details=details,
        )
        logger.warning(
            "fleet drain budget exhausted: %d of %d nodes draining, %d evictions paged",
            result.draining,
            known,
            len(paged),
        )
