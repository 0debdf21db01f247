"""The simulation's ground truth, as JSON and as a flat CSV of GPU lifetimes.

The JSON holds, per GPU, its identity, covariates (SKU, batch, place, thermal offset), Weibull
parameters, install time, failure time and cause (``null`` when it survives the horizon:
censored), and when its warning signs began; per node, its boots, silent windows, straggler windows
(with the slowdown factor), NVLink CRC bursts, its network (InfiniBand or RoCE) and its link faults
(flaps, degradations, links down for good: which port, when, the slowdown of the node's steps, and
for a flap its down intervals; ``end`` is ``null`` for a link down for good). The CSV has one row
per GPU in the shape survival models take: ``duration_days`` since install, ``event`` 1 for a
failure and 0 for censoring, and ``entry_days`` (age at the start of observation, for left
truncation).
"""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetwatch.sim.lifetimes import DAY
from fleetwatch.sim.links import LinkFault, NodeLinks
from fleetwatch.sim.plan import GpuPlan, NodePlan

if TYPE_CHECKING:
    from fleetwatch.sim.fleet import SimFleet

__all__ = ["LIFETIME_COLUMNS", "ground_truth", "lifetime_rows", "parse_time", "write_ground_truth"]

LIFETIME_COLUMNS = (
    "uuid",
    "node",
    "index",
    "sku",
    "batch",
    "cluster",
    "row",
    "rack",
    "position",
    "thermal_offset_c",
    "install_time",
    "entry_days",
    "duration_days",
    "event",
    "cause_xid",
    "failure_time",
    "precursor_start",
    "precursor_lead_days",
)


def _iso(fleet: SimFleet, seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return fleet.at(seconds).isoformat().replace("+00:00", "Z")


def _signals(gpu: GpuPlan) -> list[str]:
    fate = gpu.fate
    if fate.precursor_start_s is None:
        return []
    signals = ["temperature"]
    if fate.sbe_peak_per_s > 0:
        signals += ["ecc_sbe", "row_remap", "xid_92", "xid_94"]
    if fate.pcie_peak_per_s > 0:
        signals.append("pcie_replay")
    return signals


def _gpu_truth(fleet: SimFleet, node: NodePlan, gpu: GpuPlan) -> dict[str, Any]:
    fate = gpu.fate
    hang_until = (
        fate.failure_s + fate.hang_s
        if fate.failure_s is not None and fate.hang_s is not None
        else None
    )
    return {
        "uuid": gpu.uuid,
        "serial": gpu.serial,
        "node": node.name,
        "index": gpu.index,
        "pci_bus_id": gpu.pci_bus_id,
        "sku": gpu.sku.name,
        "batch": gpu.batch,
        "position": {**node.labels, "slot": node.slot, "rear": gpu.index >= len(node.gpus) / 2},
        "thermal_offset_c": round(gpu.offset_c, 3),
        "weibull_shape": gpu.shape,
        "weibull_scale_days": round(gpu.scale_days, 3),
        "install_time": _iso(fleet, gpu.install_s),
        "failure_time": _iso(fleet, fate.failure_s),
        "cause_xid": fate.cause.xid if fate.cause is not None else None,
        "precursor_start": _iso(fleet, fate.precursor_start_s),
        "precursor_signals": _signals(gpu),
        "node_silent_until": _iso(fleet, hang_until),
    }


def _finite(fleet: SimFleet, seconds: float) -> str | None:
    return None if math.isinf(seconds) else _iso(fleet, seconds)


def _link_fault_truth(fleet: SimFleet, links: NodeLinks, fault: LinkFault) -> dict[str, Any]:
    port = links.ports[fault.rail]
    truth: dict[str, Any] = {
        "kind": fault.kind,
        "device": port.device,
        "port": port.port,
        "start": _iso(fleet, fault.start_s),
        "end": _finite(fleet, fault.end_s),
        "slowdown": fault.slowdown,
        "link_downs": [[_iso(fleet, a), _finite(fleet, b)] for a, b in fault.downs],
    }
    if fault.kind == "degrade":
        truth |= {
            "symbol_error_peak_per_hour": round(fault.symbol_peak_per_s * 3600.0, 3),
            "downshift": _iso(fleet, fault.downshift_s),
            "then_dead": fault.then_dead,
        }
    return truth


def _node_truth(fleet: SimFleet, node: NodePlan) -> dict[str, Any]:
    timeline, _ = fleet.node_state(node.name)
    links = fleet.node_links(node.name)
    uuids = [gpu.uuid for gpu in node.gpus]
    return {
        "name": node.name,
        "index": node.index,
        "labels": node.labels,
        "sku": node.sku.name,
        "install_time": _iso(fleet, node.install_s),
        "boots": [
            {"boot_id": b.boot_id, "start": _iso(fleet, b.start_s), "reason": b.reason}
            for b in timeline.boots
        ],
        "silent_windows": [
            {"start": _iso(fleet, w.start_s), "end": _iso(fleet, w.end_s), "reason": w.reason}
            for w in timeline.silences
        ],
        "straggler_windows": [
            {
                "start": _iso(fleet, s.start_s),
                "end": _iso(fleet, s.end_s),
                "slowdown": s.slowdown,
                "cause": s.cause,
                "gpus": [uuids[i] for i in s.gpus],
            }
            for s in timeline.straggles
        ],
        "nvlink_bursts": [
            {
                "uuid": uuids[b.gpu],
                "link": b.link,
                "start": _iso(fleet, b.start_s),
                "end": _iso(fleet, b.end_s),
                "crc_flit_errors": b.flits,
            }
            for gpu in sorted(timeline.bursts)
            for b in timeline.bursts[gpu]
        ],
        "network": links.network,
        "link_faults": [_link_fault_truth(fleet, links, f) for f in links.faults],
    }


def _summary(fleet: SimFleet) -> dict[str, Any]:
    end_s = fleet.spec.horizon_days * DAY
    gpus = [gpu for node in fleet.plans for gpu in node.gpus]
    failed = [gpu for gpu in gpus if gpu.fate.failure_s is not None]
    exposure_days = sum(min(g.fate.failure_s or end_s, end_s) for g in gpus) / DAY
    causes = Counter(str(g.fate.cause.xid) for g in failed if g.fate.cause is not None)
    return {
        "nodes": len(fleet.plans),
        "gpus": len(gpus),
        "failed": len(failed),
        "censored": len(gpus) - len(failed),
        "failures_by_cause_xid": dict(sorted(causes.items())),
        "with_precursors": sum(1 for g in failed if g.fate.precursor_start_s is not None),
        "failures_per_gpu_month": round(30.0 * len(failed) / exposure_days, 5),
        "link_faults_by_kind": dict(
            sorted(
                Counter(
                    f.kind for node in fleet.plans for f in fleet.node_links(node.name).faults
                ).items()
            )
        ),
    }


def ground_truth(fleet: SimFleet) -> dict[str, Any]:
    """Everything the simulation drew, JSON-ready (times as ISO 8601 UTC strings)."""
    spec = fleet.spec
    return {
        "version": 1,
        "seed": spec.seed,
        "start": _iso(fleet, 0.0),
        "end": _iso(fleet, spec.horizon_days * DAY),
        "horizon_days": spec.horizon_days,
        "summary": _summary(fleet),
        "gpus": [_gpu_truth(fleet, node, gpu) for node in fleet.plans for gpu in node.gpus],
        "nodes": [_node_truth(fleet, node) for node in fleet.plans],
    }


def lifetime_rows(fleet: SimFleet) -> list[dict[str, Any]]:
    """One row per GPU: duration since install and event (1 failed, 0 censored at the end)."""
    end_s = fleet.spec.horizon_days * DAY
    rows = []
    for node in fleet.plans:
        for gpu in node.gpus:
            fate = gpu.fate
            stop = fate.failure_s if fate.failure_s is not None else end_s
            lead = (
                (fate.failure_s - fate.precursor_start_s) / DAY
                if fate.failure_s is not None and fate.precursor_start_s is not None
                else None
            )
            rows.append(
                {
                    "uuid": gpu.uuid,
                    "node": node.name,
                    "index": gpu.index,
                    "sku": gpu.sku.name,
                    "batch": gpu.batch,
                    "cluster": node.labels["cluster"],
                    "row": node.row,
                    "rack": node.labels["rack"],
                    "position": node.slot,
                    "thermal_offset_c": round(gpu.offset_c, 3),
                    "install_time": _iso(fleet, gpu.install_s),
                    "entry_days": round(max(0.0, -gpu.install_s) / DAY, 6),
                    "duration_days": round((stop - gpu.install_s) / DAY, 6),
                    "event": int(fate.failure_s is not None),
                    "cause_xid": fate.cause.xid if fate.cause is not None else None,
                    "failure_time": _iso(fleet, fate.failure_s),
                    "precursor_start": _iso(fleet, fate.precursor_start_s),
                    "precursor_lead_days": round(lead, 6) if lead is not None else None,
                }
            )
    return rows


def write_ground_truth(fleet: SimFleet, path: Path) -> tuple[Path, Path]:
    """Write the JSON to ``path`` and the lifetimes CSV to ``<stem>_lifetimes.csv`` beside it."""
    csv_path = path.with_name(f"{path.stem}_lifetimes.csv")
    _atomic_write(path, json.dumps(ground_truth(fleet), indent=1) + "\n")
    tmp = csv_path.with_name(f".{csv_path.name}.tmp")
    with tmp.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=LIFETIME_COLUMNS)
        writer.writeheader()
        for row in lifetime_rows(fleet):
            writer.writerow({k: "" if v is None else v for k, v in row.items()})
    tmp.replace(csv_path)
    return path, csv_path


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def parse_time(value: str) -> datetime:
    """Read a ground-truth time back (``...Z``)."""
    return datetime.fromisoformat(value.replace("Z", "+00:00"))
