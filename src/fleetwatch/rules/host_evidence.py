"""The records the host-error rules read, the verdicts they make, and what those quote as evidence.

:class:`HostRecord` is one SXid, AER, MCE or EDAC event as :mod:`fleetwatch.rules.host_errors`
reads it, :class:`HostVerdict` one decision of those rules (and of the port rules). The helpers
here group records, find the densest window of a burst (linear: a flood of corrected errors prints
thousands of records) and gather each kind's evidence, JSON-ready.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from fleetwatch.rules.xid_catalog import Action, Severity
from fleetwatch.storable import INT64_MAX

__all__ = [
    "Component",
    "HostRecord",
    "HostVerdict",
    "MOST_ERRORS",
    "aer_evidence",
    "densest",
    "edac_evidence",
    "error_count",
    "errors",
    "group",
    "mce_evidence",
    "sxid_evidence",
]


Component = Literal["gpu", "memory", "nvlink", "network", "host"]
MOST_ERRORS = INT64_MAX  # where a sum of error counts saturates


@dataclass(frozen=True)
class HostVerdict:
    """One decision about one GPU (``scope`` gpu) or about the node (``scope`` node)."""

    rule: str
    scope: Literal["gpu", "node"]
    component: Component
    action: Action
    severity: Severity
    counts_against_gpu: bool
    source: str
    count: int  # records (for EDAC: errors, the counts summed)
    first_seen: datetime
    last_seen: datetime
    timestamps: tuple[datetime, ...]
    gpu: str | None = None  # PCI bus id of the GPU, for scope gpu
    uuid: str | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""


@dataclass(frozen=True)
class HostRecord:
    """One host-error event as the rules read it: its time filled in, ``details`` never None."""

    kind: str
    ts: datetime
    pci: str | None
    uuid: str | None
    details: Mapping[str, Any]

    @property
    def severity(self) -> str | None:
        value = self.details.get("severity")
        return value if isinstance(value, str) else None


def group(
    evs: Iterable[HostRecord], key: Callable[[HostRecord], str]
) -> dict[str, list[HostRecord]]:
    out: dict[str, list[HostRecord]] = defaultdict(list)
    for e in evs:
        out[key(e)].append(e)
    return dict(out)


def densest(
    evs: Sequence[HostRecord],
    window: timedelta,
    weight: Callable[[HostRecord], int] | None = None,
) -> list[HostRecord]:
    """The events (sorted by time) of the heaviest span no longer than ``window``; linear, as
    a flood of corrected errors can print thousands of records."""
    weigh = weight or (lambda _e: 1)
    best, best_weight, total, lo = (0, 0), 0, 0, 0
    for hi, e in enumerate(evs):
        total += weigh(e)
        while e.ts - evs[lo].ts > window:
            total -= weigh(evs[lo])
            lo += 1
        if total > best_weight:
            best, best_weight = (lo, hi + 1), total
    return list(evs[best[0] : best[1]])


def error_count(e: HostRecord) -> int:
    value = e.details.get("count")
    return value if isinstance(value, int) and value > 0 else 1


def errors(evs: Iterable[HostRecord]) -> int:
    """The errors the records count, saturated at :data:`MOST_ERRORS`: a verdict's count is
    stored and shared as a signed 64-bit integer, and three counts near the top once summed
    past 2**64 and stopped the fleet's snapshot (issue 35)."""
    total = 0
    for e in evs:
        total += error_count(e)
        if total >= MOST_ERRORS:
            return MOST_ERRORS
    return total


def _distinct(evs: Iterable[HostRecord], key: str) -> list[Any]:
    return list(dict.fromkeys(e.details[key] for e in evs if e.details.get(key) is not None))


def sxid_evidence(evs: Sequence[HostRecord]) -> dict[str, Any]:
    names: dict[str, str] = {}
    for e in evs:
        code, name = e.details.get("sxid"), e.details.get("catalog_name") or e.details.get("error")
        if code is not None and name:
            names.setdefault(str(code), str(name))
    return {
        "sxids": _distinct(evs, "sxid"),
        "sxid_names": names,
        "links": _distinct(evs, "link"),
        "switches": _distinct(evs, "switch"),
    }


def aer_evidence(evs: Sequence[HostRecord]) -> dict[str, Any]:
    errors = list(dict.fromkeys(x for e in evs for x in e.details.get("errors") or []))
    return {
        "severities": _distinct(evs, "severity"),
        "errors": errors,
        "reported_by": _distinct(evs, "reported_by"),
        "layers": _distinct(evs, "layer"),
    }


def mce_evidence(evs: Sequence[HostRecord]) -> dict[str, Any]:
    return {
        "severities": _distinct(evs, "severity"),
        "sources": _distinct(evs, "source"),
        "banks": _distinct(evs, "bank"),
        "cpus": _distinct(evs, "cpu"),
        "errors": _distinct(evs, "error"),
        "panic": _distinct(evs, "panic"),
    }


def edac_evidence(evs: Sequence[HostRecord]) -> dict[str, Any]:
    return {
        "errors": errors(evs),
        "records": len(evs),
        "labels": _distinct(evs, "label"),
        "memory_controllers": _distinct(evs, "memory_controller"),
    }
