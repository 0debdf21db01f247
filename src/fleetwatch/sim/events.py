"""A node's GPU events: application noise, warning signs, false alarms and the fatal Xid.

Four independent sources, each on its own substream:

* **application faults** (Xid 13, 31, 43, then 45 as the driver cleans up): the job's own bugs,
  on busy GPUs only, at the same rate on GPUs that will fail and on those that will not. They must
  never drain a node.
* **precursors** of a failure with warning signs: Xid 92 (high SBE rate), 63 (row remap pending),
  64 (remap failed) and 94 (contained error), denser as the failure nears (density
  ``~ exp(g x)`` in the fraction ``x`` of the lead time elapsed, ``g = 4``).
* **false alarms**: an isolated Xid 63 on a GPU that is fine, so that a row remap alone does not
  give the failure away.
* the **fatal** Xid at the failure time (48, 95, 79, 119), and for Xid 79 the driver's
  "GPU has fallen off the bus" line (a ``gpu_lost`` event).

Nothing happens on a GPU after it has failed, nor on a node that is down (rebooting or hung).
Timestamps are rounded to the microsecond, as the kernel log prints them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from fleetwatch.sim._random import Stream, substream
from fleetwatch.sim.lifetimes import DAY
from fleetwatch.sim.plan import GpuPlan, NodePlan
from fleetwatch.sim.spec import FleetSpec
from fleetwatch.sim.timeline import NodeTimeline

__all__ = ["APP_XIDS", "PRECURSOR_XIDS", "NodeEvents", "SimEvent", "build_events"]

APP_XIDS = frozenset({13, 31, 43, 45})
PRECURSOR_XIDS = frozenset({63, 64, 92, 94})
_PROCESSES = ("python", "python3", "python3.10", "pt_main_thread", "torchrun")
_RAMP = 4.0  # growth of the precursor event density over the lead time

Category = Literal["app", "precursor", "false_alarm", "fatal"]


@dataclass(frozen=True)
class SimEvent:
    ts_s: float
    gpu: int
    kind: Literal["xid", "gpu_lost"]
    xid: int | None
    message: str
    category: Category
    pid: int | None = None
    process: str | None = None


@dataclass
class NodeEvents:
    events: list[SimEvent]  # sorted by time
    remaps: dict[int, list[float]]  # GPU index -> times of its Xid 63 (row remaps), sorted
    remap_failure: dict[int, float]  # GPU index -> time of its first Xid 64


def _fatal_message(xid: int, gpu: GpuPlan, rng: np.random.Generator) -> str:
    address = int(rng.integers(0x100000000, 0x2000000000))
    if xid == 48:
        return (
            "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
            f"at physAddr 0x{address:x} partition {int(rng.integers(0, 8))}, subpartition 1."
        )
    if xid == 95:
        return "Uncontained: LTC TAG (0x2,0x0). RST: Yes, D-RST: No"
    if xid == 79:
        return "GPU has fallen off the bus."
    if xid == 119:
        return (
            f"Timeout after 6s of waiting for RPC response from GPU{gpu.index} GSP! Expected "
            "function 76 (GSP_RM_CONTROL) (0x20800a4c 0x4)."
        )
    return f"GPU fatal error {xid}"


def _ramp_fraction(u: float) -> float:
    # Inverse CDF of the density exp(g x) on [0, 1].
    return math.log1p(u * math.expm1(_RAMP)) / _RAMP


def build_events(spec: FleetSpec, node: NodePlan, timeline: NodeTimeline) -> NodeEvents:
    end_s = spec.horizon_days * DAY
    raw: list[SimEvent] = []
    raw += _app_faults(spec, node, timeline, end_s)
    for gpu in node.gpus:
        raw += _precursors(spec, node, gpu)
    raw += _false_alarms(spec, node, end_s)

    def alive(event: SimEvent) -> bool:
        failure = node.gpus[event.gpu].fate.failure_s
        return failure is None or event.ts_s < failure

    kept = [e for e in raw if 0.0 <= e.ts_s <= end_s and alive(e) and not timeline.is_down(e.ts_s)]
    for gpu in node.gpus:
        kept += _fatal(spec, node, gpu)
    kept.sort(key=lambda e: (e.ts_s, e.gpu, e.kind == "gpu_lost"))

    remaps: dict[int, list[float]] = {}
    remap_failure: dict[int, float] = {}
    for event in kept:
        if event.xid == 63:
            remaps.setdefault(event.gpu, []).append(event.ts_s)
        elif event.xid == 64:
            remap_failure.setdefault(event.gpu, event.ts_s)
    return NodeEvents(kept, remaps, remap_failure)


def _app_faults(
    spec: FleetSpec, node: NodePlan, timeline: NodeTimeline, end_s: float
) -> list[SimEvent]:
    rng = substream(spec.seed, Stream.APP_FAULTS, node.index)
    gpus = spec.gpus_per_node
    rate = spec.behaviour.app_faults_per_gpu_day * gpus / DAY
    out: list[SimEvent] = []
    for t in np.sort(rng.uniform(0.0, end_s, size=rng.poisson(rate * end_s))):
        xid = (13, 31, 43)[int(rng.choice(3, p=[0.45, 0.4, 0.15]))]
        whole_job = rng.random() < 0.4
        one = int(rng.integers(0, gpus))
        pid = int(rng.integers(1000, 4_194_304))
        process = _PROCESSES[int(rng.integers(0, len(_PROCESSES)))]
        cleanup = rng.random() < 0.7
        channel = int(rng.integers(1, 0x40))
        gpc, tpc, sm = (int(v) for v in rng.integers(0, 8, size=3))
        address = int(rng.integers(0x7F0000000000, 0x7FFFFFFFFFFF))
        # Applications fault while they run: an idle GPU has none to fault.
        if not timeline.jobs.busy[timeline.jobs.segment(float(t))]:
            continue
        if xid == 13:
            message = (
                f"Graphics SM Warp Exception on (GPC {gpc}, TPC {tpc}, SM {sm}): "
                "Out Of Range Address"
            )
        elif xid == 31:
            message = (
                f"Ch {channel:08x}, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_{gpc} "
                f"faulted @ 0x{address >> 32:x}_{address & 0xFFFFFFFF:08x}. "
                "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ"
            )
        else:
            message = f"Ch {channel:08x}"
        for gpu in range(gpus) if whole_job else (one,):
            ts = round(float(t) + gpu * 0.000211, 6)
            out.append(SimEvent(ts, gpu, "xid", xid, message, "app", pid, process))
            if cleanup:
                out.append(
                    SimEvent(
                        round(ts + 1.5, 6), gpu, "xid", 45, f"Ch {channel:08x}", "app", pid, process
                    )
                )
    return out


def _precursors(spec: FleetSpec, node: NodePlan, gpu: GpuPlan) -> list[SimEvent]:
    fate = gpu.fate
    if fate.failure_s is None or fate.precursor_start_s is None or fate.cause is None:
        return []
    rng = substream(spec.seed, Stream.PRECURSORS, node.index, gpu.index)
    begin, end = fate.precursor_start_s, fate.failure_s
    counts = {92: rng.poisson(4.0), 63: 1 + rng.poisson(2.0), 94: rng.poisson(2.0)}
    remap_failure = rng.random() < 0.25
    if not fate.cause.memory_precursors:
        return []
    out: list[SimEvent] = []
    for xid, count in counts.items():
        for u in rng.random(size=count):
            ts = round(begin + _ramp_fraction(float(u)) * (end - begin), 6)
            address = int(rng.integers(0x100000000, 0x2000000000))
            if xid == 92:
                message = "High single-bit ECC error rate"
            elif xid == 63:
                message = (
                    f"Row Remapper: New row (0x{address:016x}) marked for remapping, "
                    "reset gpu to activate."
                )
            else:
                message = "Contained: SM (0x1). RST: No, D-RST: No"
            out.append(SimEvent(ts, gpu.index, "xid", xid, message, "precursor"))
    if remap_failure:
        ts = round(begin + float(rng.uniform(0.85, 0.99)) * (end - begin), 6)
        address = int(rng.integers(0x100000000, 0x2000000000))
        message = (
            f"Row Remapper Error: (0x{address:016x}) - All reserved rows for bank are remapped"
        )
        out.append(SimEvent(ts, gpu.index, "xid", 64, message, "precursor"))
    return out


def _false_alarms(spec: FleetSpec, node: NodePlan, end_s: float) -> list[SimEvent]:
    rng = substream(spec.seed, Stream.SPURIOUS, node.index)
    rate = spec.failures.spurious_remaps_per_gpu_year * spec.gpus_per_node / (365.0 * DAY)
    out: list[SimEvent] = []
    for t in np.sort(rng.uniform(0.0, end_s, size=rng.poisson(rate * end_s))):
        gpu = int(rng.integers(0, spec.gpus_per_node))
        address = int(rng.integers(0x100000000, 0x2000000000))
        message = (
            f"Row Remapper: New row (0x{address:016x}) marked for remapping, reset gpu to activate."
        )
        out.append(SimEvent(round(float(t), 6), gpu, "xid", 63, message, "false_alarm"))
    return out


def _fatal(spec: FleetSpec, node: NodePlan, gpu: GpuPlan) -> list[SimEvent]:
    fate = gpu.fate
    if fate.failure_s is None or fate.cause is None:
        return []
    rng = substream(spec.seed, Stream.PRECURSORS, node.index, gpu.index, fate.cause.xid)
    ts = round(fate.failure_s, 6)
    xid = fate.cause.xid
    out = [SimEvent(ts, gpu.index, "xid", xid, _fatal_message(xid, gpu, rng), "fatal")]
    if xid == 79:
        out.append(
            SimEvent(ts, gpu.index, "gpu_lost", None, "GPU has fallen off the bus.", "fatal")
        )
    return out
