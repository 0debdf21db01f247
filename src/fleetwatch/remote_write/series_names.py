"""The series names FleetWatch reads from Prometheus: dcgm-exporter's (readings and the last
Xid) and node_exporter's (InfiniBand ports, EDAC counts). What a Prometheus ``remote_write``
block keeps (``write_relabel_configs``), what ``fleetwatch import prometheus`` queries."""

from __future__ import annotations

import re

from fleetwatch.agent.parsers.dcgm_exporter import DCGM_METRIC_NAMES
from fleetwatch.remote_write.node_exporter import NODE_EXPORTER_METRIC_NAMES

__all__ = ["DCGM_METRIC_NAMES", "KEEP_PREFIXES", "NODE_EXPORTER_METRIC_NAMES", "keep_regex"]

# The short form of the keep regex: every name FleetWatch reads starts with one of these (a test
# checks it). It keeps a few series FleetWatch counts as unused (DCGM_FI_DEV_* it has no field
# for), in exchange for a regex a person can read; keep_regex() is the exact one.
KEEP_PREFIXES = ("DCGM_FI_DEV_", "dcgm_", "node_infiniband_", "node_edac_")


def keep_regex(*, exact: bool = False) -> str:
    """A ``write_relabel_configs`` regex (Prometheus anchors it) matching every name FleetWatch
    reads: each name (``exact``), or each of :data:`KEEP_PREFIXES` followed by anything."""
    if exact:
        names = DCGM_METRIC_NAMES | NODE_EXPORTER_METRIC_NAMES
        return "|".join(re.escape(name) for name in sorted(names))
    return "|".join(f"{prefix}.+" for prefix in KEEP_PREFIXES)
