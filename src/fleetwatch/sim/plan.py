"""The fleet as built: each node's place and SKU, each GPU's identity, covariates and fate.

Everything here is drawn once, at construction, from per-node and per-GPU substreams, so it is
cheap (no events yet) and identical in every process.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fleetwatch.sim._random import Stream, new_uuid, substream
from fleetwatch.sim.lifetimes import DAY, Fate, draw_fate, reference_scale_days, scale_days
from fleetwatch.sim.spec import FleetSpec, SkuSpec

__all__ = ["GpuPlan", "NodePlan", "build_nodes"]

# PCI buses of the GPUs on an HGX H100 baseboard (DGX H100 order), then spare ones for G > 8.
_PCI_BUSES: tuple[int, ...] = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_PCI_BUSES += (0x0C, 0x1F, 0x46, 0x4E, 0x86, 0x8F, 0xC8, 0xE3)


@dataclass(frozen=True)
class GpuPlan:
    """One GPU: identity, covariates, fate, and the constants its readings use."""

    node: str
    node_index: int
    index: int
    uuid: str
    serial: str
    pci_bus_id: str
    sku: SkuSpec
    batch: str
    offset_c: float  # how much hotter its place runs than the coolest one (covariate)
    install_s: float
    shape: float
    scale_days: float
    lifetime_days: float  # drawn lifetime since install; beyond the horizon it is censored
    fate: Fate
    noise_key: int
    power_factor: float  # board-to-board spread of power draw at the same load
    sbe_per_s: float  # background single-bit ECC rate of a healthy GPU
    pcie_per_s: float  # background PCIe replay rate


@dataclass(frozen=True)
class NodePlan:
    name: str
    index: int
    row: int
    rack: int
    slot: int
    labels: dict[str, str]
    sku: SkuSpec
    install_s: float
    first_boot_s: float
    gpus: tuple[GpuPlan, ...]


def _choose(rng: np.random.Generator, weights: list[float]) -> int:
    p = np.asarray(weights, dtype=float)
    return int(rng.choice(len(p), p=p / p.sum()))


def _slot_offset_c(spec: FleetSpec, slot: int) -> float:
    # Warm air rises: the top slot runs hottest, quadratically more towards the top.
    per_rack = spec.layout.nodes_per_rack
    if per_rack == 1:
        return 0.0
    return spec.layout.top_of_rack_extra_c * (slot / (per_rack - 1)) ** 2


def build_nodes(spec: FleetSpec) -> list[NodePlan]:
    """Every node of the fleet, with its GPUs, drawn from their own substreams."""
    return [_build_node(spec, index) for index in range(spec.nodes)]


def _build_node(spec: FleetSpec, index: int) -> NodePlan:
    rng = substream(spec.seed, Stream.NODE, index)
    sku = spec.skus[_choose(rng, [s.weight for s in spec.skus])]
    install_s = round(-float(rng.uniform(0.0, spec.max_age_at_start_days)) * DAY, 6)
    # The running kernel was booted some days before the start, never before the install.
    first_boot_s = max(install_s, round(-float(rng.uniform(0.0, 14.0)) * DAY, 6))
    jitter_c = float(rng.normal(0.0, spec.layout.node_jitter_c))
    row, rack, slot = spec.node_place(index)
    name = spec.node_name(index)
    labels = {
        "cluster": spec.layout.cluster,
        "row": str(row),
        "rack": f"r{rack:03d}",
        "position": str(slot),
    }
    base_c = _slot_offset_c(spec, slot) + jitter_c
    gpus = tuple(
        _build_gpu(spec, name, index, gpu, sku, install_s, base_c)
        for gpu in range(spec.gpus_per_node)
    )
    return NodePlan(name, index, row, rack, slot, labels, sku, install_s, first_boot_s, gpus)


def _build_gpu(
    spec: FleetSpec,
    node: str,
    node_index: int,
    index: int,
    sku: SkuSpec,
    install_s: float,
    base_c: float,
) -> GpuPlan:
    rng = substream(spec.seed, Stream.GPU, node_index, index)
    gpu_uuid = f"GPU-{new_uuid(rng)}"
    serial = f"165{int(rng.integers(10**9, 10**10))}"
    batch = spec.batches[_choose(rng, [b.weight for b in spec.batches])]
    rear = spec.layout.rear_gpu_extra_c if index >= spec.gpus_per_node / 2 else 0.0
    offset_c = base_c + rear + float(rng.normal(0.0, 0.3))
    power_factor = float(rng.uniform(0.95, 1.05))
    sbe_per_s = float(rng.uniform(*spec.behaviour.sbe_background_per_gpu_day)) / DAY
    # Most GPUs see no background SBEs at all; a few see a trickle.
    if rng.random() < 0.8:
        sbe_per_s = 0.0
    pcie_per_s = float(rng.uniform(*spec.behaviour.pcie_replays_per_gpu_day)) / DAY
    noise_key = int(rng.integers(0, 2**63))

    shape = batch.weibull_shape if batch.weibull_shape is not None else sku.weibull_shape
    scale = scale_days(
        reference_scale_days(spec.failures.monthly_failure_prob, shape),
        sku_factor=sku.scale_factor,
        batch_factor=batch.scale_factor,
        offset_c=offset_c,
        halving_c=spec.failures.life_halving_c,
    )
    lifetime, fate = draw_fate(
        rng,
        spec.failures,
        shape=shape,
        scale=scale,
        install_s=install_s,
        end_s=spec.horizon_days * DAY,
    )
    bus = _PCI_BUSES[index]
    return GpuPlan(
        node=node,
        node_index=node_index,
        index=index,
        uuid=gpu_uuid,
        serial=serial,
        pci_bus_id=f"0000:{bus:02x}:00.0",
        sku=sku,
        batch=batch.name,
        offset_c=offset_c,
        install_s=install_s,
        shape=shape,
        scale_days=scale,
        lifetime_days=lifetime,
        fate=fate,
        noise_key=noise_key,
        power_factor=power_factor,
        sbe_per_s=sbe_per_s,
        pcie_per_s=pcie_per_s,
    )
