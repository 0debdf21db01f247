"""Notices for running training jobs: what the server knows about their nodes, told to the job.

For each running job (no reported end, heard from within ``notice_job_idle_s``; its nodes are
those its ranks report from) a notice is open while its cause holds:

==============  =====================================================  =======================
kind            cause                                                  action
==============  =====================================================  =======================
drain_pending   an eviction of one of its nodes is pending (the        checkpoint_and_exit
                scheduler drains it next), paged or recommended        (pending) or
                                                                       checkpoint_now
gpu_out         a rule verdict takes one of its GPUs out of service    checkpoint_and_exit
risk            P(failure within the job's horizon) of one of its      checkpoint_now
                nodes, from the model, reaches the job's threshold
cleared         the cause of an open notice no longer holds            continue
==============  =====================================================  =======================

:func:`derive_notices` compares what should be open with what is stored and writes the
difference: a new notice, or ``cleared_at`` on one that no longer holds plus a ``cleared`` notice
pointing back at it (``clears``). Each job's notices are read by id (the job's cursor), so a rank
that reconnects reads what it missed, in order. On PostgreSQL every change also sends
``NOTIFY fleetwatch_notices`` in the same transaction: long-polls of ``GET /v1/jobs/{id}/notices``
on every replica wake on commit.

It is one function of a snapshot and the open evictions, so it runs after a full assessment and
plan, and after a targeted one: with ``nodes`` it reconciles only the notices of those nodes (a
targeted snapshot says nothing about the others).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, insert, or_, select, text, update

from fleetwatch.config import ServerSettings
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import evictions, job_notices, jobs
from fleetwatch.server.judge.assessment import FleetAssessment, GpuAssessment, GpuRisk
from fleetwatch.server.runtime.locks import LockKey, transaction_lock

__all__ = [
    "CHANNEL",
    "JobNotices",
    "NOTICE_STATES",
    "NoticeChanges",
    "RunningJob",
    "Wanted",
    "derive_notices",
    "running_jobs",
    "wanted_notices",
]

logger = logging.getLogger(__name__)

CHANNEL = "fleetwatch_notices"
# Evictions that give a job notice: about to drain (pending), or waiting on a person.
NOTICE_STATES = ("pending", "paged", "recommended")
_CHECKPOINT_NOW = "checkpoint_now"
_CHECKPOINT_AND_EXIT = "checkpoint_and_exit"


@dataclass(frozen=True)
class RunningJob:
    job_id: str
    nodes: tuple[str, ...]
    risk_threshold: float
    horizon_h: float


NoticeKey = tuple[str, str, str, str, str]


def _key(
    job_id: str, kind: str, node: str, gpu: str | None, evidence: Mapping[str, Any] | None
) -> NoticeKey:
    """One notice per cause: a drain notice per eviction (a node drained, returned and drained
    again gives a new notice), a GPU notice per GPU, a risk notice per node."""
    eviction = (evidence or {}).get("eviction_id") if kind == "drain_pending" else None
    return (job_id, kind, node, gpu or "", str(eviction or ""))


@dataclass(frozen=True)
class Wanted:
    """A notice that should be open; ``key`` identifies it across passes."""

    job_id: str
    kind: str
    node: str
    gpu: str | None
    reason: str
    action: str
    evidence: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> NoticeKey:
        return _key(self.job_id, self.kind, self.node, self.gpu, self.evidence)


@dataclass
class NoticeChanges:
    opened: int = 0
    cleared: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.opened or self.cleared)


def running_jobs(conn: Connection, settings: ServerSettings, now: datetime) -> list[RunningJob]:
    since = now - timedelta(seconds=settings.notice_job_idle_s)
    rows = conn.execute(
        select(
            jobs.c.job_id,
            jobs.c.nodes,
            jobs.c.notice_risk_threshold,
            jobs.c.notice_horizon_h,
        ).where(
            jobs.c.outcome.is_(None),
            or_(jobs.c.last_seen >= since, jobs.c.started_at >= since),
        )
    )
    return [
        RunningJob(
            job_id=row.job_id,
            nodes=tuple(row.nodes or ()),
            risk_threshold=row.notice_risk_threshold or settings.notice_risk_threshold,
            horizon_h=row.notice_horizon_h or settings.notice_horizon_h,
        )
        for row in rows
    ]


def _drain_notice(job: RunningJob, eviction: Mapping[str, Any]) -> Wanted:
    state = eviction["state"]
    action = _CHECKPOINT_AND_EXIT if state == "pending" else _CHECKPOINT_NOW
    return Wanted(
        job_id=job.job_id,
        kind="drain_pending",
        node=eviction["node"],
        gpu=None,
        reason=f"drain {state}: {eviction['reason']}",
        action=action,
        evidence={
            "eviction_id": eviction["id"],
            "state": state,
            "reason_kind": eviction["reason_kind"],
            "evidence": eviction["evidence"],
        },
    )


def _out_by_node(snapshot: FleetAssessment) -> dict[str, list[GpuAssessment]]:
    """The GPUs a rule takes out, by node (once per pass, not once per job)."""
    out: dict[str, list[GpuAssessment]] = {}
    for gpu in snapshot.gpus:
        if gpu.out_of_service:
            out.setdefault(gpu.node, []).append(gpu)
    return out


def _gpu_out_notices(
    job: RunningJob, out_by_node: Mapping[str, list[GpuAssessment]]
) -> Iterable[Wanted]:
    for node in job.nodes:
        for gpu in out_by_node.get(node, ()):
            out = [v for v in gpu.verdicts if v.takes_gpu_out]
            first = out[0]
            yield Wanted(
                job_id=job.job_id,
                kind="gpu_out",
                node=gpu.node,
                gpu=gpu.uuid,
                reason=f"GPU {gpu.index} out of service: {first.rule} ({first.severity})",
                action=_CHECKPOINT_AND_EXIT,
                evidence={
                    "index": gpu.index,
                    "verdicts": [
                        {
                            "kind": v.kind,
                            "rule": v.rule,
                            "severity": v.severity,
                            "xids": list(v.xids),
                            "last_seen": v.last_seen.isoformat() if v.last_seen else None,
                        }
                        for v in out
                    ],
                },
            )


def _model_node_risk(members: list[GpuRisk]) -> tuple[float, GpuRisk] | None:
    """1 − Π(1 − p) over the node's GPUs still in service with a model probability (a GPU a
    rule took out is a ``gpu_out`` notice, not a risk), and the riskiest of them."""
    scored = [r for r in members if r.basis == "model" and r.probability is not None]
    if not scored:
        return None
    survive = 1.0
    for r in scored:
        survive *= 1.0 - float(r.probability or 0.0)
    riskiest = max(scored, key=lambda r: r.probability or 0.0)
    return 1.0 - survive, riskiest


def _risk_notices(
    job: RunningJob, by_node: Callable[[float], Mapping[str, list[GpuRisk]]]
) -> Iterable[Wanted]:
    grouped = by_node(job.horizon_h)
    for node in sorted(set(job.nodes)):
        if node not in grouped:
            continue
        found = _model_node_risk(grouped[node])
        if found is None or found[0] < job.risk_threshold:
            continue
        p, riskiest = found
        yield Wanted(
            job_id=job.job_id,
            kind="risk",
            node=node,
            gpu=None,
            reason=(
                f"P(failure within {job.horizon_h:g} h) = {p:.3f} "
                f">= the job's threshold {job.risk_threshold:g}"
            ),
            action=_CHECKPOINT_NOW,
            evidence={
                "probability": p,
                "horizon_h": job.horizon_h,
                "threshold": job.risk_threshold,
                "model": riskiest.model,
                "riskiest_gpu": riskiest.gpu.uuid,
                "riskiest_probability": riskiest.probability,
                "factors": [
                    {
                        "name": f.name,
                        "value": f.value,
                        "hazard_ratio": f.hazard_ratio,
                        "contribution": f.contribution,
                    }
                    for f in riskiest.factors[:3]
                ],
            },
        )


def wanted_notices(
    running: Iterable[RunningJob],
    snapshot: FleetAssessment | None,
    open_evictions: Iterable[Mapping[str, Any]],
) -> list[Wanted]:
    """Every notice that should be open now (pure: no database)."""
    by_node: dict[str, list[Mapping[str, Any]]] = {}
    for eviction in open_evictions:
        if eviction["state"] in NOTICE_STATES:
            by_node.setdefault(eviction["node"], []).append(eviction)
    out_by_node = _out_by_node(snapshot) if snapshot is not None else {}
    risks: dict[float, dict[str, list[GpuRisk]]] = {}

    def risks_by_node(horizon_h: float) -> dict[str, list[GpuRisk]]:
        # Grouped once per horizon the jobs chose, not once per job.
        if horizon_h not in risks and snapshot is not None:
            grouped: dict[str, list[GpuRisk]] = {}
            for risk in snapshot.risks(horizon_h / 24.0):
                grouped.setdefault(risk.gpu.node, []).append(risk)
            risks[horizon_h] = grouped
        return risks.get(horizon_h, {})

    out: list[Wanted] = []
    for job in running:
        for node in job.nodes:
            out.extend(_drain_notice(job, e) for e in by_node.get(node, ()))
        if snapshot is not None:
            out.extend(_gpu_out_notices(job, out_by_node))
            out.extend(_risk_notices(job, risks_by_node))
    return out


def derive_notices(
    conn: Connection,
    settings: ServerSettings,
    snapshot: FleetAssessment | None,
    now: datetime,
    *,
    nodes: Collection[str] | None = None,
) -> NoticeChanges:
    """Open the notices that now hold and clear those that no longer do (in ``conn``'s
    transaction). ``nodes``: reconcile only notices of these nodes (after a targeted assessment).
    Without a snapshot, ``gpu_out`` and ``risk`` notices are left as they are."""
    running = running_jobs(conn, settings, now)
    open_evictions = [
        dict(row._mapping)
        for row in conn.execute(select(evictions).where(evictions.c.state.in_(NOTICE_STATES)))
    ]
    in_scope = (lambda node: True) if nodes is None else set(nodes).__contains__
    judged_kinds = {"drain_pending"} | ({"gpu_out", "risk"} if snapshot is not None else set())
    wanted = {
        w.key: w for w in wanted_notices(running, snapshot, open_evictions) if in_scope(w.node)
    }
    stored = conn.execute(
        select(job_notices).where(
            job_notices.c.cleared_at.is_(None), job_notices.c.kind != "cleared"
        )
    ).all()
    changes = NoticeChanges()
    have: set[NoticeKey] = set()
    for row in stored:
        key = _key(row.job_id, row.kind, row.node, row.gpu, row.evidence)
        if not in_scope(row.node) or row.kind not in judged_kinds:
            have.add(key)
            continue
        if key in wanted and key not in have:
            have.add(key)
            continue
        _clear(conn, row, now)
        changes.cleared += 1
    for key, w in wanted.items():
        if key in have:
            continue
        conn.execute(
            insert(job_notices).values(
                job_id=w.job_id,
                kind=w.kind,
                node=w.node,
                gpu=w.gpu,
                reason=w.reason,
                evidence=dict(w.evidence),
                action=w.action,
                opened_at=now,
            )
        )
        changes.opened += 1
    if changes.changed and conn.dialect.name == "postgresql":
        conn.execute(text(f"SELECT pg_notify('{CHANNEL}', '')"))
    return changes


def _clear(conn: Connection, row: Any, now: datetime) -> None:
    done = conn.execute(
        update(job_notices)
        .where(and_(job_notices.c.id == row.id, job_notices.c.cleared_at.is_(None)))
        .values(cleared_at=now)
    )
    if not done.rowcount:
        return
    conn.execute(
        insert(job_notices).values(
            job_id=row.job_id,
            kind="cleared",
            node=row.node,
            gpu=row.gpu,
            reason=f"no longer: {row.reason}"[:4000],
            evidence={"kind": row.kind, "opened_at": row.opened_at.isoformat()},
            action="continue",
            opened_at=now,
            cleared_at=now,
            clears=row.id,
        )
    )


class JobNotices:
    """Runs :func:`derive_notices` on the newest snapshot; ``on_change`` wakes this process's
    long-polls (other replicas hear the NOTIFY)."""

    def __init__(
        self,
        db: Database,
        settings: ServerSettings,
        latest: Callable[[], FleetAssessment | None],
        *,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.db = db
        self.settings = settings
        self.latest = latest
        self.on_change = on_change
        self._lock = threading.Lock()

    def run_once(
        self,
        snapshot: FleetAssessment | None = None,
        *,
        nodes: Collection[str] | None = None,
        now: datetime | None = None,
    ) -> NoticeChanges:
        """After a full assessment and plan (no arguments), or a targeted one (its snapshot and
        the ``nodes`` it judged)."""
        snapshot = snapshot if snapshot is not None else self.latest()
        if snapshot is not None:
            # Scored before the write transaction (on SQLite it holds the one writer lock).
            snapshot.risks(self.settings.notice_horizon_h / 24.0)
        with self._lock, self.db.write() as conn:
            transaction_lock(conn, LockKey.NOTICES)  # the tick and the after-plan pass
            changes = derive_notices(conn, self.settings, snapshot, now or utcnow(), nodes=nodes)
        if changes.changed:
            logger.info("job notices: %d opened, %d cleared", changes.opened, changes.cleared)
            if self.on_change is not None:
                self.on_change()
        return changes
