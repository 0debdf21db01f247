"""The simulated fleet in the formats real sources print, for real collectors to read.

* :func:`dcgm_exporter_text`: a dcgm-exporter ``/metrics`` scrape of one node (``DCGM_FI_*``
  names, ``# HELP``/``# TYPE``, the exporter's labels ``gpu``, ``UUID``, ``pci_bus_id``,
  ``device``, ``modelName``, ``Hostname``, ``DCGM_FI_DRIVER_VERSION`` plus the serial and VBIOS
  label fields), including ``DCGM_FI_DEV_XID_ERRORS``, the last Xid since boot;
* :func:`kernel_log_lines`: ``dmesg --time-format=iso`` lines, ``NVRM: Xid (PCI:0000:18:00): 79,
  pid=..., name=..., <message>``, the driver's "GPU has fallen off the bus" line, and the driver's
  load banner at each boot;
* :func:`run_emitter`: keeps ``<out>/<node>/dcgm.prom`` current (replaced atomically each
  interval, removed while the node is silent, as an exporter that cannot be reached), appends
  to ``<out>/<node>/kern.log`` and refreshes the node's adapter ports under
  ``<out>/<node>/infiniband`` (a ``/sys/class/infiniband`` tree, :mod:`fleetwatch.sim.sysfs`), so
  that the dcgm-exporter, kernel-log and infiniband collectors can follow a simulated fleet
  exactly as they follow a real one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fleetwatch.sim.fleet import SimFleet
from fleetwatch.sim.sysfs import write_infiniband_tree
from fleetwatch.telemetry import SAMPLE_FIELDS, Event

__all__ = ["dcgm_exporter_text", "kernel_log_lines", "run_emitter", "write_node_files"]

logger = logging.getLogger(__name__)

DCGM_FILE = "dcgm.prom"
KERNEL_LOG_FILE = "kern.log"
INFINIBAND_DIR = "infiniband"


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float | int | bool) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    # dcgm-exporter prints float fields with six decimals; our values have at most three, so
    # the text reads back to the same float.
    return str(int(value)) if value.is_integer() else f"{value:.6f}"


def dcgm_exporter_text(fleet: SimFleet, node: str, t: datetime) -> str:
    """One dcgm-exporter scrape of ``node`` at simulated time ``t`` (failed GPUs absent)."""
    samples = {sample.uuid: sample for sample in fleet.sample(node, t)}
    gpus = [gpu for gpu in fleet.identities(node) if gpu.uuid in samples]
    labels = {
        gpu.uuid: ",".join(
            f'{key}="{_label_value(value)}"'
            for key, value in (
                ("gpu", str(gpu.index)),
                ("UUID", gpu.uuid),
                ("pci_bus_id", f"0000{gpu.pci_bus_id or ''}"),  # NVML's 8-digit domain
                ("device", f"nvidia{gpu.index}"),
                ("modelName", gpu.name or ""),
                ("Hostname", node),
                ("DCGM_FI_DRIVER_VERSION", gpu.driver_version or ""),
                ("DCGM_FI_DEV_SERIAL", gpu.serial or ""),
                ("DCGM_FI_DEV_VBIOS_VERSION", gpu.vbios_version or ""),
            )
        )
        for gpu in gpus
    }
    lines: list[str] = []
    for field in SAMPLE_FIELDS:
        if field.dcgm is None:
            continue
        series = [
            (gpu.uuid, value)
            for gpu in gpus
            if (value := getattr(samples[gpu.uuid], field.name)) is not None
        ]
        if not series:
            continue
        lines.append(f"# HELP {field.dcgm} {field.help} (in {field.unit}).")
        lines.append(f"# TYPE {field.dcgm} {'counter' if field.kind == 'counter' else 'gauge'}")
        lines += [f"{field.dcgm}{{{labels[uuid]}}} {_number(value)}" for uuid, value in series]
    if gpus:
        last = fleet.last_xid(node, t)
        lines.append("# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.")
        lines.append("# TYPE DCGM_FI_DEV_XID_ERRORS gauge")
        lines += [f"DCGM_FI_DEV_XID_ERRORS{{{labels[g.uuid]}}} {last[g.uuid]}" for g in gpus]
    return "\n".join(lines) + "\n"


def _stamp(t: datetime) -> str:
    # dmesg --time-format=iso: 2024-11-15T12:02:03,470068+00:00
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S,%f+00:00")


def _kernel_line(event: Event) -> str:
    pci = event.pci_bus_id or "0000:00:00.0"
    if event.kind == "gpu_lost":
        return f"{_stamp(event.ts)} NVRM: GPU {pci}: {event.message}"
    pid = str(event.pid) if event.pid is not None else "'<unknown>'"
    name = event.process if event.process is not None else "<unknown>"
    # The kernel prints the bus id without its function: PCI:0000:18:00.
    return (
        f"{_stamp(event.ts)} NVRM: Xid (PCI:{pci.rsplit('.', 1)[0]}): {event.xid}, "
        f"pid={pid}, name={name}, {event.message}"
    )


def kernel_log_lines(fleet: SimFleet, node: str, t0: datetime, t1: datetime) -> list[str]:
    """The node's kernel-log lines with ``t0 < time <= t1``, oldest first."""
    driver = fleet.identities(node)[0].driver_version
    # The driver's banner at each boot: not a GPU event, which the parser must see past.
    timed: list[tuple[datetime, int, str]] = [
        (boot, 0, f"{_stamp(boot)} NVRM: loading NVIDIA UNIX x86_64 Kernel Module  {driver}")
        for boot, _ in fleet.boots(node, t0, t1)
    ]
    timed += [(event.ts, 1, _kernel_line(event)) for event in fleet.events(node, t0, t1)]
    timed.sort(key=lambda item: (item[0], item[1]))
    return [line for _, _, line in timed]


def write_node_files(
    fleet: SimFleet,
    node: str,
    out_dir: Path,
    t0: datetime,
    t1: datetime,
    *,
    ports_written: dict[str, str] | None = None,
) -> int:
    """Refresh ``<out_dir>/<node>/dcgm.prom`` and its ``infiniband`` tree for ``t1``, and append
    ``(t0, t1]`` to its kern.log. ``ports_written`` is the tree's memo, kept from call to call
    (see :func:`~fleetwatch.sim.sysfs.write_infiniband_tree`).

    Returns the number of kernel-log lines appended.
    """
    node_dir = out_dir / node
    node_dir.mkdir(parents=True, exist_ok=True)
    prom = node_dir / DCGM_FILE
    if fleet.is_silent(node, t1):
        prom.unlink(missing_ok=True)  # the ports' tree stays as last read, as a powered-off node's
    else:
        tmp = node_dir / f".{DCGM_FILE}.tmp"
        tmp.write_text(dcgm_exporter_text(fleet, node, t1))
        tmp.replace(prom)  # atomic: a reader sees the old scrape or the new one, never half
        write_infiniband_tree(fleet, node, node_dir / INFINIBAND_DIR, t1, written=ports_written)
    lines = kernel_log_lines(fleet, node, t0, t1)
    # Opened even with nothing to add, so that a follower finds the file from the first tick.
    with (node_dir / KERNEL_LOG_FILE).open("a") as handle:
        handle.writelines(line + "\n" for line in lines)
    return len(lines)


def run_emitter(
    fleet: SimFleet,
    out_dir: Path,
    *,
    interval_s: float,
    duration_s: float | None,
    nodes: Sequence[str] = (),
    from_start: bool = False,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Write every node's files each ``interval_s`` real seconds, for ``duration_s`` (None:
    forever; 0: once). Returns the number of ticks written.

    The first tick's kernel log covers one interval back, or the whole history from the start of
    the simulation with ``from_start``.
    """
    names = list(nodes) or fleet.node_names()
    unknown = sorted(set(names) - set(fleet.node_names()))
    if unknown:
        raise KeyError(f"no such node(s) in the simulated fleet: {', '.join(unknown)}")
    began = clock()
    t = fleet.sim_time(began)
    if from_start:
        previous = fleet.spec.start - timedelta(microseconds=1)
    else:
        previous = t - timedelta(seconds=interval_s * fleet.spec.speed)
    ticks = 0
    ports_written: dict[str, dict[str, str]] = {node: {} for node in names}
    while True:
        lines = sum(
            write_node_files(fleet, node, out_dir, previous, t, ports_written=ports_written[node])
            for node in names
        )
        ticks += 1
        logger.info(
            "wrote %d nodes at sim time %s, %d kernel-log lines", len(names), t.isoformat(), lines
        )
        previous = t
        next_tick = began + timedelta(seconds=ticks * interval_s)
        if duration_s is not None and (next_tick - began).total_seconds() > duration_s:
            return ticks
        sleep(max(0.0, (next_tick - clock()).total_seconds()))
        t = max(previous, fleet.sim_time(clock()))
