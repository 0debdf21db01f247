"""Node validations and the return-to-service gate they open; repeat offenders.

Which evictions need a validation before the node returns (``needs_validation``): those for a
hardware reason, i.e.

- ``rule`` evictions from a GPU, host or port verdict (Xid, health counters, PCIe/NVSwitch host
  errors, a failing network port): a fact about the hardware;
- ``risk`` evictions: the model expects the hardware to fail; a passing validation is the cheap
  evidence that it is sound now.

Not gated: ``straggler`` evictions (slowness is judged by the jobs, which NVML cannot measure at
idle; the straggler detector judges the node again once it runs jobs) and ``node_unreachable``
rule evictions (the node went silent; its agent reporting again is the evidence, and a node that
cannot be reached cannot be validated either).

The gate: the node's newest validation received after the eviction was created must have passed
(received_at is the server's clock, so a node's skewed clock cannot open it). A failed newer
validation closes it again, so a node that passed and then failed stays out.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Row, insert, select

from fleetwatch.server.db.tables import evictions, node_validations
from fleetwatch.validation_wire import ValidationReport, failed_checks

__all__ = [
    "HARDWARE_KINDS",
    "list_validations",
    "needs_validation",
    "repeat_of",
    "return_blocker",
    "store_validation",
]

HARDWARE_KINDS = ("rule", "risk")
_NOT_HARDWARE_RULES = ("node_unreachable",)


def needs_validation(reason_kind: str, reason: str) -> bool:
    """Whether an eviction of this kind and reason is gated on a passing validation."""
    if reason_kind not in HARDWARE_KINDS:
        return False
    return not any(reason.startswith(rule) for rule in _NOT_HARDWARE_RULES)


def store_validation(
    conn: Connection, report: ValidationReport, *, pushed_by: str, now: datetime
) -> Row[Any]:
    """Store a node's validation result; its stored row."""
    new_id = conn.execute(
        insert(node_validations)
        .values(
            node=report.node,
            received_at=now,
            started_at=report.started_at,
            finished_at=report.finished_at,
            passed=report.passed,
            failed=failed_checks(report.checks),
            checks=[c.model_dump(mode="json") for c in report.checks],
            tools=dict(report.tools),
            dcgm_level=report.dcgm_level,
            duration_s=report.duration_s,
            pushed_by=pushed_by,
        )
        .returning(node_validations.c.id)
    ).scalar_one()
    return conn.execute(select(node_validations).where(node_validations.c.id == new_id)).one()


def list_validations(conn: Connection, node: str, *, limit: int = 20) -> list[Row[Any]]:
    """Newest first."""
    rows = conn.execute(
        select(node_validations)
        .where(node_validations.c.node == node)
        .order_by(node_validations.c.received_at.desc(), node_validations.c.id.desc())
        .limit(limit)
    )
    return list(rows)


def return_blocker(conn: Connection, eviction: Row[Any]) -> str | None:
    """Why the evicted node may not return yet, or None when it may."""
    if not needs_validation(eviction.reason_kind, eviction.reason):
        return None
    since: datetime = eviction.created_at
    newest = conn.execute(
        select(node_validations)
        .where(node_validations.c.node == eviction.node, node_validations.c.received_at >= since)
        .order_by(node_validations.c.received_at.desc(), node_validations.c.id.desc())
        .limit(1)
    ).first()
    if newest is None:
        return (
            f"node {eviction.node} was evicted for a hardware reason ({eviction.reason_kind}: "
            f"{_short(eviction.reason)}) and has no validation newer than the eviction at "
            f"{since.isoformat()}; run `fleetwatch validate` on the node"
        )
    if newest.passed:
        return None
    failed = list(newest.failed or []) or ["no check passed"]
    shown = ", ".join(failed[:20]) + (f" and {len(failed) - 20} more" if len(failed) > 20 else "")
    return (
        f"node {eviction.node}'s newest validation (received {newest.received_at.isoformat()}) "
        f"failed: {shown}"
    )


def repeat_of(
    conn: Connection, node: str, *, now: datetime, within: timedelta, kinds: Collection[str]
) -> int | None:
    """The eviction this node returned from within ``within`` before ``now``, if any: a new
    hardware eviction of it makes it a repeat offender."""
    if within <= timedelta(0):
        return None
    found = conn.execute(
        select(evictions.c.id)
        .where(
            evictions.c.node == node,
            evictions.c.returned_at.is_not(None),
            evictions.c.returned_at >= now - within,
            evictions.c.reason_kind.in_(kinds),
        )
        .order_by(evictions.c.returned_at.desc())
        .limit(1)
    ).scalar()
    return int(found) if found is not None else None


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
