"""What the ingest routes share about urgency: which events may take a GPU out, the rules they
are judged with, and handing a node to the urgent lane."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import Request
from fastapi.concurrency import run_in_threadpool

from fleetwatch.rules.host_errors import is_urgent_host_event
from fleetwatch.rules.thresholds import HealthThresholds
from fleetwatch.rules.xid import XidCatalog, may_take_gpu_out
from fleetwatch.server.ingest.batch_view import EventView
from fleetwatch.server.runtime.leader import notify_wake

__all__ = ["catalog_of", "is_urgent", "thresholds_of", "wake_urgent"]

_DEFAULT_CATALOG = XidCatalog.load()


# Events that may take a GPU out of service: judge and plan at once rather than at the next tick.
# Only what may drain is urgent: an Xid the catalogue rates critical or fatal (application Xids,
# most of a busy fleet's, would keep the lane busy and queue the fatal ones behind them), a lost
# GPU, and host errors at the severities that drain (a fatal SXid, an uncorrected AER, MCE or
# EDAC record; a flood of corrected ones must not wake the planner on every batch).
def is_urgent(event: EventView, catalog: XidCatalog) -> bool:
    if event.kind == "xid":
        return may_take_gpu_out(event.xid, catalog)
    return event.kind == "gpu_lost" or is_urgent_host_event(event.kind, event.details)


def catalog_of(request: Request) -> XidCatalog:
    """The Xid catalogue the rules judge with (the rules file's overrides included); the
    default one in an app built without background jobs."""
    assessor = getattr(request.app.state, "assessor", None)
    return assessor.judge.catalog if assessor is not None else _DEFAULT_CATALOG


def thresholds_of(request: Request) -> HealthThresholds | None:
    """The thresholds the rules run with (the rules file's), for the port events derived on
    ingest; None (the defaults) in an app built without background jobs."""
    assessor = getattr(request.app.state, "assessor", None)
    return assessor.judge.thresholds if assessor is not None else None


async def wake_urgent(request: Request, nodes: Sequence[str]) -> None:
    """Judge and plan ``nodes`` now: in this process's snapshot, and on the leader, which may be
    another process or replica, through the database (the leader itself would only judge the
    nodes twice)."""
    if not nodes:
        return
    request.app.state.urgent.add(list(nodes))
    if not request.app.state.is_leader():
        await run_in_threadpool(notify_wake, request.app.state.db.engine, list(nodes))
