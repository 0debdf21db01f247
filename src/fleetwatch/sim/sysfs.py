"""A simulated node's adapter ports as a ``/sys/class/infiniband`` tree, for the real
``infiniband`` collector to read (``fleetwatch agent --collectors infiniband --infiniband-root``).

The layout and text are the kernel's (``ib_core``)::

    <root>/mlx5_0/node_guid                    946d:ae03:1a2b:3c4d
    <root>/mlx5_0/device/net/ib0/dev_port      0
    <root>/mlx5_0/ports/1/state                4: ACTIVE
    <root>/mlx5_0/ports/1/phys_state           5: LinkUp
    <root>/mlx5_0/ports/1/rate                 400 Gb/sec (4X NDR)
    <root>/mlx5_0/ports/1/link_layer           InfiniBand
    <root>/mlx5_0/ports/1/counters/<name>      decimal
    <root>/mlx5_0/ports/1/hw_counters/<name>   decimal, and ``lifespan`` (not a counter)
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from fleetwatch.sim.fleet import SimFleet

__all__ = ["infiniband_files", "write_infiniband_tree"]

_HW_COUNTER_LIFESPAN_MS = "10"  # mlx5's default cache time between hw_counters reads


def infiniband_files(fleet: SimFleet, node: str, t: datetime) -> dict[str, str]:
    """Path (relative to the tree's root) -> text, for every file of the node's ports at ``t``."""
    files: dict[str, str] = {}
    for port in fleet.ports(node, t):
        device = port.device
        base = f"{device}/ports/{port.port}"
        if port.node_guid is not None:
            files[f"{device}/node_guid"] = port.node_guid
        if port.netdev is not None:
            files[f"{device}/device/net/{port.netdev}/dev_port"] = str(port.port - 1)
        if port.state is not None:
            files[f"{base}/state"] = f"{port.state_code}: {port.state}"
        if port.phys_state is not None:
            files[f"{base}/phys_state"] = f"{port.phys_state_code}: {port.phys_state}"
        if port.rate_gbps is not None:
            lanes = f" ({port.link_width}X {port.link_speed})" if port.link_width else ""
            files[f"{base}/rate"] = f"{port.rate_gbps:g} Gb/sec{lanes}"
        if port.link_layer is not None:
            files[f"{base}/link_layer"] = port.link_layer
        for name, value in (port.counters or {}).items():
            files[f"{base}/counters/{name}"] = str(value)
        if port.hw_counters:
            files[f"{base}/hw_counters/lifespan"] = _HW_COUNTER_LIFESPAN_MS
        for name, value in (port.hw_counters or {}).items():
            files[f"{base}/hw_counters/{name}"] = str(value)
    return files


def write_infiniband_tree(
    fleet: SimFleet,
    node: str,
    root: Path,
    t: datetime,
    *,
    written: dict[str, str] | None = None,
) -> int:
    """Write (or refresh) the node's tree under ``root`` as at ``t``; the number of files written.

    Each file is replaced atomically, so a reader sees a counter's old value or its new one,
    never half a number (sysfs makes no promise across files either). ``written`` remembers what
    the last call wrote under ``root``: a file whose text has not changed (most counters stay 0)
    is not written again, which saves nine writes in ten.
    """
    files = infiniband_files(fleet, node, t)
    memo = written if written is not None else {}
    count = 0
    for relative, text in files.items():
        if memo.get(relative) == text:
            continue
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text + "\n")
        tmp.replace(path)
        memo[relative] = text
        count += 1
    return count
