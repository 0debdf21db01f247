"""Planned downtime as the judges read it: which nodes a maintenance window covers now, and from
when a node's silence counts again after one.

A window names its nodes, or a label selector (``rack=r12``, ``rack=r12,row=3``: every label
must equal its value; matched against the labels the node's agent reports). While a window
covers a node:

- its silence is planned: no unreachable verdict, alert or eviction (:class:`Planned.covers`);
- a verdict that a planned reboot, reset, power-off or cable job causes (a GPU lost from the bus
  or missing, a port down) is planned too; a hardware fault that takes a GPU out (a fatal Xid,
  an uncorrectable ECC error, a fatal SXid, an uncorrected AER) still stands
  (:func:`stands_in_maintenance`): it is alerted, the lifecycle records the failure, and the
  planner still makes its eviction, so the node does not go back into service with it when the
  window ends.

After a window ends, silence counts from its end (:meth:`Planned.listen_from`), as it counts from
a server's start (``server.concepts.liveness``): a node that was down throughout gets its usual
``unreachable_after_intervals`` before it is called unreachable, not an instant verdict.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from fleetwatch.server.concepts.verdict import Verdict

__all__ = [
    "PLANNED_RULES",
    "Planned",
    "WindowRef",
    "WindowRow",
    "WindowState",
    "caused_by_maintenance",
    "effective_end",
    "parse_selector",
    "stands_in_maintenance",
    "window_nodes",
]

# Where a window stands at a given now.
WindowState = Literal["upcoming", "active", "ended", "cancelled"]

# Verdicts a planned reboot, reset or power-off produces by itself.
PLANNED_RULES = frozenset({"gpu_lost", "gpu_missing", "gpu_silent", "node_unreachable"})
_LABEL_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")  # as the wire's node labels
_MAX_LABEL_VALUE = 256


def parse_selector(text: str) -> dict[str, str]:
    """``rack=r12,row=3`` as ``{"rack": "r12", "row": "3"}``; ValueError saying what is wrong."""
    selector: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise ValueError(f"{part.strip()!r} must look like label=value, e.g. rack=r12")
        if not _LABEL_KEY.fullmatch(key):
            raise ValueError(f"label {key!r} must match [A-Za-z_][A-Za-z0-9_]{{0,62}}")
        if len(value) > _MAX_LABEL_VALUE:
            raise ValueError(f"the value of {key!r} is longer than {_MAX_LABEL_VALUE} characters")
        if key in selector and selector[key] != value:
            raise ValueError(f"label {key!r} is given twice with different values")
        selector[key] = value
    return selector


def caused_by_maintenance(verdict: Verdict) -> bool:
    """Whether a planned reboot, reset, power-off or cable job gives this verdict by itself (a
    GPU lost or missing, a port down): inside a window it is no fault."""
    return verdict.rule in PLANNED_RULES or verdict.evidence.get("component") == "network"


def stands_in_maintenance(verdict: Verdict) -> bool:
    """Whether a verdict takes its GPU out even inside a maintenance window: a hardware fault,
    not what a planned reboot, reset or cable job causes."""
    return verdict.takes_gpu_out and not caused_by_maintenance(verdict)


@dataclass(frozen=True)
class WindowRef:
    """The window a node is in, as ``/v1/nodes`` and the fleet page show it."""

    id: int
    reason: str
    starts_at: datetime
    ends_at: datetime | None  # None: until ended


@dataclass(frozen=True)
class WindowRow:
    """A stored window, as read from ``maintenance_windows``."""

    id: int
    nodes: list[str] | None
    selector: dict[str, str] | None
    starts_at: datetime
    ends_at: datetime | None
    ended_at: datetime | None
    reason: str

    @classmethod
    def from_row(cls, row: Any) -> WindowRow:
        return cls(
            row.id, row.nodes, row.selector, row.starts_at, row.ends_at, row.ended_at, row.reason
        )


def effective_end(ends_at: datetime | None, ended_at: datetime | None) -> datetime | None:
    """When a window stops covering its nodes: its planned end or when it was ended, whichever
    is first (None: until ended)."""
    if ends_at is None:
        return ended_at
    return ends_at if ended_at is None else min(ends_at, ended_at)


def window_nodes(window: WindowRow, labels: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The nodes a window covers: its named ones, or those whose labels match its selector."""
    if window.nodes is not None:
        return list(window.nodes)
    wanted = window.selector or {}
    return [
        name
        for name, have in labels.items()
        if wanted and all(k in have and str(have[k]) == v for k, v in wanted.items())
    ]


@dataclass(frozen=True)
class Planned:
    """Which nodes are in maintenance at ``now``, and when each one's last window ended."""

    active: Mapping[str, WindowRef] = field(default_factory=dict)
    ended: Mapping[str, datetime] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        windows: Iterable[WindowRow],
        labels: Mapping[str, Mapping[str, Any]],
        now: datetime,
    ) -> Planned:
        active: dict[str, WindowRef] = {}
        ended: dict[str, datetime] = {}
        for w in sorted(windows, key=lambda w: w.id):
            end = effective_end(w.ends_at, w.ended_at)
            if w.starts_at > now or (end is not None and end <= w.starts_at):
                continue  # not begun, or called off before it began
            covered = window_nodes(w, labels)
            if end is not None and end <= now:
                for node in covered:
                    ended[node] = max(end, ended.get(node, end))
                continue
            ref = WindowRef(w.id, w.reason, w.starts_at, w.ends_at if w.ended_at is None else end)
            for node in covered:
                held = active.get(node)
                # Show the window that holds the node longest (until ended beats any end).
                if held is None or (held.ends_at is not None and _later(ref.ends_at, held.ends_at)):
                    active[node] = ref
        return cls(active, ended)

    def covers(self, node: str) -> bool:
        return node in self.active

    def window(self, node: str) -> WindowRef | None:
        return self.active.get(node)

    def listen_from(self, node: str, heard_since: datetime | None) -> datetime | None:
        """From when ``node``'s silence counts: this process's start or its last window's end,
        whichever is later (None: from its last report, as ever)."""
        end = self.ended.get(node)
        if end is None:
            return heard_since
        return end if heard_since is None else max(end, heard_since)


def _later(a: datetime | None, b: datetime) -> bool:
    return a is None or a > b
