"""Training jobs: their step reports, straggler verdicts, the straggler detector's state, node
slowness and telemetry evidence."""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import Connection, Row, and_, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from fleetwatch.models.stragglers import EWMA_WEIGHT, StepRow, Transition
from fleetwatch.server.db.raw_rows import psycopg_rows
from fleetwatch.server.db.tables import (
    job_steps,
    jobs,
    node_slowness,
    nodes,
    straggler_state,
    stragglers,
)
from fleetwatch.server.repo.sample_reader import read_samples, sample_rows

__all__ = [
    "JobRow",
    "StoredDetector",
    "apply_transitions",
    "detector_starts",
    "get_job",
    "hardware_stragglers",
    "list_jobs",
    "list_stragglers",
    "load_detector",
    "load_slowness",
    "read_steps",
    "recent_ratios",
    "save_detector",
    "store_steps",
    "telemetry_evidence",
    "update_slowness",
]

_INSERT_JOB = {
    "postgresql": pg_insert(jobs).on_conflict_do_nothing(index_elements=["job_id"]),
    "sqlite": sqlite_insert(jobs).on_conflict_do_nothing(index_elements=["job_id"]),
}


@dataclass(frozen=True)
class JobRow:
    job_id: str
    first_seen: datetime
    last_seen: datetime
    ranks: int
    nodes: list[str]
    started_at: datetime | None = None
    ended_at: datetime | None = None
    outcome: str | None = None
    end_reason: str | None = None


def store_steps(conn: Connection, job_id: str, rows: Sequence[dict[str, Any]]) -> JobRow:
    """Insert one validated batch of steps; widen the job's first/last seen, ranks and nodes."""
    first = min(r["ts"] for r in rows)
    last = max(r["ts"] for r in rows)
    ranks = max(r["rank"] for r in rows) + 1
    names = sorted({r["node"] for r in rows})
    conn.execute(
        _INSERT_JOB[conn.dialect.name],
        {"job_id": job_id, "first_seen": first, "last_seen": last, "ranks": ranks, "nodes": names},
    )
    current = conn.execute(select(jobs).where(jobs.c.job_id == job_id).with_for_update()).one()
    merged = JobRow(
        job_id=job_id,
        first_seen=min(current.first_seen, first),
        last_seen=max(current.last_seen, last),
        ranks=max(current.ranks, ranks),
        nodes=sorted(set(current.nodes) | set(names)),
    )
    conn.execute(
        update(jobs)
        .where(jobs.c.job_id == job_id)
        .values(
            first_seen=merged.first_seen,
            last_seen=merged.last_seen,
            ranks=merged.ranks,
            nodes=merged.nodes,
        )
    )
    conn.execute(insert(job_steps), [{"job_id": job_id, **r} for r in rows])
    return merged


def _job(row: Any) -> JobRow:
    return JobRow(
        row.job_id,
        row.first_seen,
        row.last_seen,
        row.ranks,
        list(row.nodes),
        row.started_at,
        row.ended_at,
        row.outcome,
        row.end_reason,
    )


def list_jobs(conn: Connection, *, limit: int = 100) -> list[JobRow]:
    """Jobs by their newest step, newest first."""
    found = conn.execute(select(jobs).order_by(jobs.c.last_seen.desc()).limit(limit))
    return [_job(r) for r in found]


def get_job(conn: Connection, job_id: str) -> JobRow | None:
    row = conn.execute(select(jobs).where(jobs.c.job_id == job_id)).first()
    return _job(row) if row is not None else None


def read_steps(conn: Connection, job_id: str, start: datetime, end: datetime) -> list[StepRow]:
    """The job's steps with ``start <= ts < end``, by time."""
    found = conn.execute(
        select(
            job_steps.c.rank,
            job_steps.c.node,
            job_steps.c.duration_ms,
            job_steps.c.ts,
            job_steps.c.stage,
        )
        .where(job_steps.c.job_id == job_id, job_steps.c.ts >= start, job_steps.c.ts < end)
        .order_by(job_steps.c.ts)
    )
    return [StepRow(r.rank, r.node, r.duration_ms, r.ts, r.stage) for r in found]


def list_stragglers(
    conn: Connection,
    *,
    job_id: str | None = None,
    active: bool | None = None,
    kind: str | None = None,
    limit: int = 1000,
) -> list[dict[str, Any]]:
    query = select(stragglers).order_by(stragglers.c.started_at.desc()).limit(limit)
    if job_id is not None:
        query = query.where(stragglers.c.job_id == job_id)
    if active is True:
        query = query.where(stragglers.c.ended_at.is_(None))
    elif active is False:
        query = query.where(stragglers.c.ended_at.is_not(None))
    if kind is not None:
        query = query.where(stragglers.c.kind == kind)
    return [dict(r._mapping) for r in conn.execute(query)]


def hardware_stragglers(conn: Connection, *, started_by: datetime) -> list[Row[Any]]:
    """Open ``hardware`` straggler verdicts that began by ``started_by``, slowest first."""
    query = (
        select(stragglers)
        .where(
            stragglers.c.kind == "hardware",
            stragglers.c.ended_at.is_(None),
            stragglers.c.started_at <= started_by,
        )
        .order_by(stragglers.c.ratio.desc(), stragglers.c.id)
    )
    return list(conn.execute(query))


def apply_transitions(
    conn: Connection, job_id: str, transitions: Iterable[Transition], now: datetime
) -> None:
    """Open, update and close ``stragglers`` rows (``updated_at`` on the wall clock)."""
    for t in transitions:
        open_row = and_(
            stragglers.c.job_id == job_id,
            stragglers.c.node == t.node,
            stragglers.c.ended_at.is_(None),
        )
        if t.action == "open":
            # Idempotent: another worker (SQLite has no advisory lock) may have opened it.
            existing = conn.execute(select(stragglers.c.id).where(open_row)).first()
            if existing is not None:
                conn.execute(
                    update(stragglers)
                    .where(stragglers.c.id == existing.id)
                    .values(windows=t.windows, ratio=t.ratio, updated_at=now)
                )
                continue
            conn.execute(
                insert(stragglers).values(
                    job_id=job_id,
                    node=t.node,
                    kind=t.kind,
                    started_at=t.started_at,
                    updated_at=now,
                    windows=t.windows,
                    ratio=t.ratio,
                    evidence=t.evidence,
                )
            )
        elif t.action == "update":
            conn.execute(
                update(stragglers)
                .where(open_row)
                .values(windows=t.windows, ratio=t.ratio, updated_at=now)
            )
        else:
            conn.execute(update(stragglers).where(open_row).values(ended_at=t.at, updated_at=now))


@dataclass(frozen=True)
class StoredDetector:
    """A job's straggler detector after the windows judged so far (``straggler_state``)."""

    next_start: datetime  # the first window not judged yet
    detector: dict[str, Any]  # JobDetector.state()
    ratios: dict[str, float]  # each node's ratio in the newest window with steps


def detector_starts(conn: Connection, job_ids: Sequence[str]) -> dict[str, datetime]:
    """The first unjudged window of each of ``job_ids`` that has a stored detector."""
    found: dict[str, datetime] = {}
    for i in range(0, len(job_ids), 1000):
        rows = conn.execute(
            select(straggler_state.c.job_id, straggler_state.c.next_start).where(
                straggler_state.c.job_id.in_(job_ids[i : i + 1000])
            )
        )
        found.update({r.job_id: r.next_start for r in rows})
    return found


def load_detector(conn: Connection, job_id: str) -> StoredDetector | None:
    row = conn.execute(select(straggler_state).where(straggler_state.c.job_id == job_id)).first()
    if row is None:
        return None
    return StoredDetector(row.next_start, dict(row.detector), dict(row.ratios))


def save_detector(conn: Connection, job_id: str, stored: StoredDetector, now: datetime) -> None:
    """Replace the job's detector state, in the transaction of the verdicts it led to."""
    values = {
        "job_id": job_id,
        "next_start": stored.next_start,
        "detector": stored.detector,
        "ratios": stored.ratios,
        "updated_at": now,
    }
    new = (pg_insert if conn.dialect.name == "postgresql" else sqlite_insert)(straggler_state)
    new = new.values(values)
    changed = {k: new.excluded[k] for k in values if k != "job_id"}
    conn.execute(new.on_conflict_do_update(index_elements=["job_id"], set_=changed))


def recent_ratios(conn: Connection, *, since: datetime) -> list[tuple[str, str, float]]:
    """(job, node, ratio) of the newest window of each job judged since ``since``."""
    rows = conn.execute(
        select(straggler_state.c.job_id, straggler_state.c.ratios)
        .where(straggler_state.c.updated_at >= since)
        .order_by(straggler_state.c.job_id)
    )
    return [(r.job_id, n, float(ratio)) for r in rows for n, ratio in sorted(r.ratios.items())]


def load_slowness(conn: Connection) -> dict[str, float]:
    """Every node's slowness score (read at each /metrics shard scrape: plain tuples on
    PostgreSQL, db/raw_rows.py)."""
    raw = psycopg_rows(conn, "SELECT node, score FROM node_slowness")
    if raw is not None:
        return dict(raw)
    return {
        r.node: r.score for r in conn.execute(select(node_slowness.c.node, node_slowness.c.score))
    }


def update_slowness(
    conn: Connection, ratios: dict[str, list[float]], known: dict[str, float], now: datetime
) -> None:
    """Fold each node's window ratios into its EWMA score (``known`` is updated in place)."""
    counts = {
        r.node: r.windows
        for r in conn.execute(
            select(node_slowness.c.node, node_slowness.c.windows).where(
                node_slowness.c.node.in_(list(ratios))
            )
        )
    }
    for node, values in ratios.items():
        score = known.get(node, values[0])
        for value in values:
            score = (1 - EWMA_WEIGHT) * score + EWMA_WEIGHT * value
        known[node] = score
        if node in counts:
            conn.execute(
                update(node_slowness)
                .where(node_slowness.c.node == node)
                .values(score=score, windows=counts[node] + len(values), updated_at=now)
            )
        else:
            conn.execute(
                insert(node_slowness).values(
                    node=node, score=score, windows=len(values), updated_at=now
                )
            )


# NVML clocks-event reasons that slow a GPU down (idle 0x1 and app-clock setting 0x2 do not).
THROTTLE_REASONS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}
_NVLINK = (
    "nvlink_crc_flit_errors_total",
    "nvlink_crc_data_errors_total",
    "nvlink_replay_errors_total",
    "nvlink_recovery_errors_total",
)


_EVIDENCE_FIELDS = ("clocks_event_reasons", "sm_clock_mhz", "gpu_temp_c", *_NVLINK)
# One sample as the evidence reads it: its GPU (gpus.id), then _EVIDENCE_FIELDS.
_Reading = namedtuple("_Reading", ["gpu_id", *_EVIDENCE_FIELDS])  # type: ignore[misc]


def _summary(rows: Sequence[Any]) -> dict[str, Any]:
    mask = 0
    throttled = 0
    for r in rows:
        bits = (r.clocks_event_reasons or 0) & sum(THROTTLE_REASONS)
        mask |= bits
        throttled += bool(bits)
    clocks = [r.sm_clock_mhz for r in rows if r.sm_clock_mhz is not None]
    temps = [r.gpu_temp_c for r in rows if r.gpu_temp_c is not None]
    nvlink = 0.0
    per_gpu: dict[str, list[float]] = {}
    for r in rows:
        total = sum(getattr(r, c) or 0.0 for c in _NVLINK)
        per_gpu.setdefault(r.gpu_id, []).append(total)
    for values in per_gpu.values():
        nvlink += max(values) - min(values)
    return {
        "samples": len(rows),
        "throttle_mask": mask,
        "throttled_fraction": throttled / len(rows) if rows else 0.0,
        "sm_clock_mhz": float(np.median(clocks)) if clocks else None,
        "gpu_temp_c": float(np.median(temps)) if temps else None,
        "nvlink_errors": nvlink,
    }


def telemetry_evidence(
    conn: Connection, node: str, onset: datetime, until: datetime
) -> dict[str, Any] | None:
    """The node's GPU telemetry while slow (``onset``..``until``) against the same span before.

    ``correlated`` is true when the slow span shows any of: a throttle reason on more samples
    than before, an SM clock at least 5 % lower, a GPU 5 °C hotter, or more NVLink errors.
    ``None`` when the node sent no samples over the slow span.
    """
    node_id = conn.execute(select(nodes.c.id).where(nodes.c.name == node)).scalar()
    if node_id is None:
        return None
    span = max(until - onset, timedelta(seconds=60))

    def fetch(a: datetime, b: datetime) -> list[Any]:
        chunks = read_samples(conn, _EVIDENCE_FIELDS, since=a, until=b, node_ids=[node_id])
        return [_Reading(*row[1:2], *row[4:]) for chunk in chunks for row in sample_rows(chunk)]

    during = fetch(onset, until)
    if not during:
        return None
    slow = _summary(during)
    before = _summary(fetch(onset - span, onset - timedelta(microseconds=1)))
    signals: list[str] = []
    new_bits = slow["throttle_mask"] & ~before["throttle_mask"]
    if slow["throttled_fraction"] > before["throttled_fraction"] + 0.1:
        names = [n for bit, n in THROTTLE_REASONS.items() if slow["throttle_mask"] & bit]
        signals.append("throttle reasons: " + ", ".join(names))
    if slow["sm_clock_mhz"] and before["sm_clock_mhz"]:
        drop = 1 - slow["sm_clock_mhz"] / before["sm_clock_mhz"]
        if drop >= 0.05:
            signals.append(f"SM clock {drop:.0%} lower")
    if slow["gpu_temp_c"] is not None and before["gpu_temp_c"] is not None:
        rise = slow["gpu_temp_c"] - before["gpu_temp_c"]
        if rise >= 5:
            signals.append(f"GPU {rise:.0f} C hotter")
    if slow["nvlink_errors"] > before["nvlink_errors"]:
        signals.append(
            f"{slow['nvlink_errors']:.0f} NVLink errors (before: {before['nvlink_errors']:.0f})"
        )
    return {
        "correlated": bool(signals),
        "signals": signals,
        "new_throttle_mask": new_bits,
        "slow": slow,
        "before": before if before["samples"] else None,
    }
