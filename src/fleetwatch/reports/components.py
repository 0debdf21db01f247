"""Interruptions by component: which part of the machine took work down this week.

An **interrupting event** is one that takes a GPU or its node out of service (what the rules
drain for): a lost GPU, an Xid of catalogue severity critical or fatal that counts against the
GPU, and the host errors at their draining severities (:func:`~fleetwatch.rules.host_errors.\
is_urgent_host_event`: a fatal SXid, an uncorrected AER, MCE or EDAC record), and the network
port events the port rules drain for (:func:`~fleetwatch.rules.port_health.is_urgent_port_event`:
a port that went down, a flap that reached the limit). Each names one component:

========  ==============================================================================
gpu       a lost GPU, an Xid outside the interconnect category (GPU memory included), an
          uncorrected AER record on a GPU's own PCIe function
nvlink    an interconnect Xid (74, NVLink5 ...), a fatal NVSwitch SXid
memory    an uncorrected EDAC count, a machine check that decoded a host memory error
host      any other machine check (CPU, caches, bus), an uncorrected AER record elsewhere
network   a network adapter port that went down, a link that flapped past the limit
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
from fleetwatch.rules.port_health import PORT_KINDS, is_urgent_port_event
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
    if kind in PORT_KINDS:
        return "network" if is_urgent_port_event(kind, details) else None
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
    """Interruptions per component that began in ``[start, end)``."""
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
    return {c: counts[c] for c in COMPONENTS}
