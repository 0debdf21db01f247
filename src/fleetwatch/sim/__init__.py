"""Fleet simulator: N nodes x G GPUs with realistic behaviour and known ground truth.

Deterministic from a seed, so that one agent process per node, each with its own
:class:`SimFleet`, tells one consistent story. See :mod:`fleetwatch.sim.fleet` for the API,
:mod:`fleetwatch.sim.lifetimes` for the failure model, :mod:`fleetwatch.sim.links` for the network
adapter ports and their link faults, and :mod:`fleetwatch.sim.emit` for the
dcgm-exporter and kernel-log formats.
"""

from __future__ import annotations

from fleetwatch.sim.emit import dcgm_exporter_text, kernel_log_lines, run_emitter
from fleetwatch.sim.fleet import SimFleet
from fleetwatch.sim.spec import (
    BatchSpec,
    BehaviourSpec,
    CauseSpec,
    FailureModel,
    FleetSpec,
    LayoutSpec,
    NetworkSpec,
    SkuSpec,
)
from fleetwatch.sim.truth import write_ground_truth

__all__ = [
    "BatchSpec",
    "BehaviourSpec",
    "CauseSpec",
    "FailureModel",
    "FleetSpec",
    "LayoutSpec",
    "NetworkSpec",
    "SimFleet",
    "SkuSpec",
    "dcgm_exporter_text",
    "kernel_log_lines",
    "run_emitter",
    "write_ground_truth",
]
