"""Maintenance in the scheduler -> FleetWatch maintenance windows, kept in step each sync pass.

A backend that knows of planned maintenance (a Slurm reservation with the MAINT flag, a
Kubernetes node annotated ``fleetwatch.io/maintenance``) lists it as :class:`MaintenancePlan` s,
each under a key of its own (``slurm:<reservation>``, ``kubernetes:<node>``). Each pass
(:func:`sync_maintenance`) compares them with FleetWatch's open windows whose key starts with
``<backend>:``:

- a plan without an open window -> ``POST /v1/maintenance`` with its key;
- an open window whose plan is gone, or changed (other nodes, reason or times) -> ``DELETE``
  (ended now); a changed plan then gets a new window.

Only windows with the backend's key prefix are ever ended: those opened by people (no key) or by
another backend are left alone. Opt-in: ``slurm-sync --maintenance``, ``k8s-sync --maintenance``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from fleetwatch.adapters.client import MaintenanceWindow, SchedulerClient

__all__ = ["MaintenancePlan", "MaintenanceReport", "MaintenanceSource", "sync_maintenance"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MaintenancePlan:
    """Planned maintenance as the scheduler shows it; ``starts_at`` None means now, ``ends_at``
    None until it is gone from the scheduler."""

    nodes: tuple[str, ...]
    reason: str
    starts_at: datetime | None = None
    ends_at: datetime | None = None

    def matches(self, window: MaintenanceWindow) -> bool:
        same = set(self.nodes) == set(window.nodes or ()) and self.reason == window.reason
        if self.starts_at is not None and self.starts_at != window.starts_at:
            return False
        return same and self.ends_at == window.ends_at


class MaintenanceSource(Protocol):
    """A backend that lists the scheduler's planned maintenance, by key (prefix included)."""

    name: str

    def maintenance(self) -> Mapping[str, MaintenancePlan]: ...


@dataclass
class MaintenanceReport:
    opened: list[str] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)


def sync_maintenance(
    client: SchedulerClient, source: MaintenanceSource, *, now: datetime, dry_run: bool = False
) -> MaintenanceReport:
    """One reconciliation (see the module doc); raises ``FleetWatchError`` when a read fails."""
    report = MaintenanceReport()
    prefix = f"{source.name}:"
    wanted = {
        key: plan
        for key, plan in source.maintenance().items()
        if plan.nodes and (plan.ends_at is None or plan.ends_at > now)
    }
    open_windows = {w.key: w for w in client.list_maintenance(prefix) if w.key is not None}
    kept = set()
    for key, window in sorted(open_windows.items()):
        plan = wanted.get(key)
        if plan is not None and plan.matches(window):
            kept.add(key)
            continue
        why = "is gone" if plan is None else "changed"
        if dry_run:
            logger.info("dry run: %s %s: would end maintenance window %d", key, why, window.id)
            continue
        client.end_maintenance(window.id)
        logger.info("%s %s: ended maintenance window %d", key, why, window.id)
        report.ended.append(key)
    for key, plan in sorted(wanted.items()):
        if key in kept:
            continue
        if dry_run:
            logger.info("dry run: %s: would open a maintenance window over %s", key, plan.nodes)
            continue
        made = client.open_maintenance(plan, key=key)
        logger.info("%s: opened maintenance window %d over %s", key, made.id, ",".join(plan.nodes))
        report.opened.append(key)
    return report
