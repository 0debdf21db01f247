"""Interruptions by component: which part of the machine took work down this week.

An **interrupting event** is one that takes a GPU or its node out of service (what the rules
drain for): a lost GPU, an Xid of catalogue severity critical or fatal that counts against the
GPU, and the host errors at their draining severities (:func:`~fleetwatch.rules.host_errors.\
is_urgent_host_event`: a fatal SXid, an uncorrected AER, MCE or EDAC record). Each names one
component:

========  ==============================================================================
gpu       a lost GPU, an Xid outside the interconnect category (GPU memory included), an
          uncorrected AER record on a GPU's own PCIe function
nvlink    an interconnect Xid (74, NVLink5 ...), a fatal NVSwitch SXid
memory    an uncorrected EDAC count, a machine check that decoded a host memory error
host      any other machine check (CPU, caches, bus), an uncorrected AER record elsewhere
network   not judged yet: no event kind feeds it, so its count is absent (None), not 0
========  ==============================================================================

A fault prints several records (an SXid per switch and link, an MCE and its EDAC line, an Xid 79
and the lost GPU): interrupting events of one component on one node with gaps of at most
``INCIDENT_GAP`` are one interruption, counted in the week its first event falls in.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from fleetwatch.rules.host_errors import Component, is_urgent_host_event, mce_component
from fleetwatch.rules.xid_catalog import SEVERITY_RANK, XidCatalog

__all__ = [
    "COMPONENTS",
    "COMPONENT_NAMES",
    "INCIDENT_GAP",
    "event_component",
    "interruptions_by_component",
]

COMPONENTS: tuple[Component, ...] = ("gpu", "memory", "nvlink", "network", "host")
COMPONENT_NAMES: dict[str, str] = {
    "gpu": "GPU",
    "memory": "host memory",
    "nvlink": "NVLink / NVSwitch",
    "network": "network",
    "host": "host (CPU, PCIe)",
}
_JUDGED: tuple[Component, ...] = ("gpu", "memory", "nvlink", "host")
# Records of one fault arrive within seconds; a node that fails again an hour later is a new
# interruption (jobs restart within minutes, see ServerSettings.restart_h).
INCIDENT_GAP = timedelta(hours=1)


def event_component(event: Any, catalog: XidCatalog) -> Component | None:
    """The component an event row interrupts (``kind``, ``xid``, ``gpu_uuid``, ``details``),
    or None when it interrupts nothing."""
    kind, details = event.kind, getattr(event, "details", None) or {}
    if kind == "gpu_lost":
        return "gpu"
    if kind == "xid":
        entry = catalog.lookup(event.xid)
        if (
            not entry.counts_against_gpu
            or SEVERITY_RANK[entry.severity] < SEVERITY_RANK["critical"]
        ):
            return None
        return "nvlink" if entry.category == "interconnect" else "gpu"
    if not is_urgent_host_event(kind, details):
        return None
    if kind == "sxid":
        return "nvlink"
    if kind == "pcie_aer":
        return "gpu" if event.gpu_uuid else "host"
    if kind == "mce":
        return mce_component(details)
    return "memory"  # edac


def interruptions_by_component(
    events: Iterable[Any], catalog: XidCatalog, start: datetime, end: datetime
) -> dict[str, int | None]:
    """Interruptions per component that began in ``[start, end)``; ``network`` is None."""
    times: dict[tuple[Any, Component], list[datetime]] = defaultdict(list)
    for e in events:
        component = event_component(e, catalog)
        if component is not None:
            times[(e.node_id, component)].append(e.ts)
    counts: Counter[Component] = Counter()
    for (_node, component), stamps in times.items():
        stamps.sort()
        starts = [t for i, t in enumerate(stamps) if i == 0 or t - stamps[i - 1] > INCIDENT_GAP]
        counts[component] += sum(start <= t < end for t in starts)
    return {c: (counts[c] if c in _JUDGED else None) for c in COMPONENTS}
