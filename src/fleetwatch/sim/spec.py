"""The simulated fleet's specification, saved as JSON so that every agent process reads the same.

A :class:`FleetSpec` fixes everything: the seed, the size and layout of the fleet, the SKU and
manufacturing-batch mix, the failure model, the background behaviour (jobs, application Xids,
stragglers, outages, reboots, NVLink CRC bursts) and the network adapter ports with their link
faults. Two processes that load the same file build the
same fleet, GPU for GPU and event for event, without talking to each other.

Time. Simulated time runs from ``start`` for ``horizon_days``. A live run maps real time onto it:
``sim = start + (real - real_start) * speed``, capped at ``real`` (see
:meth:`fleetwatch.sim.fleet.SimFleet.sim_time`). :meth:`FleetSpec.live` puts ``start`` far enough in
the past, ``horizon * (1 - 1/speed)`` before ``real_start``, that simulated time reaches the end of
the horizon exactly when it catches up with the real clock; so a reading's timestamp is never in
the future, which the server refuses.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "BatchSpec",
    "BehaviourSpec",
    "CauseSpec",
    "FailureModel",
    "FleetSpec",
    "LayoutSpec",
    "NetworkSpec",
    "SkuSpec",
]

_NODE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
Range = tuple[float, float]


class _SpecModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _ordered(value: Range) -> Range:
    low, high = value
    if not 0 <= low <= high:
        raise ValueError(f"a range must be (low, high) with 0 <= low <= high, got {value}")
    return value


class SkuSpec(_SpecModel):
    """One GPU model: its ratings, and how long it lives relative to the reference."""

    name: str = "NVIDIA H100 80GB HBM3"
    weight: float = Field(default=1.0, gt=0, description="Share of nodes with this SKU")
    power_limit_w: float = Field(default=700.0, gt=0)
    idle_power_w: float = Field(default=72.0, gt=0)
    celsius_per_watt: float = Field(default=0.07, gt=0, description="Die over inlet, per watt")
    max_sm_clock_mhz: int = Field(default=1980, gt=0)
    idle_sm_clock_mhz: int = Field(default=345, gt=0)
    mem_clock_mhz: int = Field(default=2619, gt=0)
    fb_total_mib: int = Field(default=81559, gt=0)
    pcie_gen: int = Field(default=5, ge=1, le=16)
    nvlinks: int = Field(default=18, ge=0)
    driver_version: str = "550.90.07"
    vbios_version: str = "96.00.74.00.01"
    weibull_shape: float = Field(default=1.2, gt=0, description=">1 wear-out, <1 infant mortality")
    scale_factor: float = Field(default=1.0, gt=0, description="Multiplies the Weibull scale")

    @model_validator(mode="after")
    def _idle_below_limit(self) -> Self:
        if self.idle_power_w >= self.power_limit_w:
            raise ValueError("idle_power_w must be below power_limit_w")
        return self


def _default_skus() -> list[SkuSpec]:
    return [
        SkuSpec(weight=0.75),
        SkuSpec(
            name="NVIDIA A100-SXM4-80GB",
            weight=0.25,
            power_limit_w=400.0,
            idle_power_w=55.0,
            celsius_per_watt=0.11,
            max_sm_clock_mhz=1410,
            idle_sm_clock_mhz=210,
            mem_clock_mhz=1593,
            fb_total_mib=81920,
            pcie_gen=4,
            nvlinks=12,
            driver_version="535.183.01",
            vbios_version="92.00.45.00.06",
            weibull_shape=1.5,
            scale_factor=0.8,
        ),
    ]


class BatchSpec(_SpecModel):
    """A manufacturing batch (lot): a bad one lives shorter, and may die young (shape < 1)."""

    name: str
    weight: float = Field(gt=0, description="Share of GPUs from this batch")
    scale_factor: float = Field(default=1.0, gt=0, description="Multiplies the Weibull scale")
    weibull_shape: float | None = Field(default=None, gt=0, description="Overrides the SKU's")


def _default_batches() -> list[BatchSpec]:
    return [
        BatchSpec(name="lot-a", weight=0.6),
        BatchSpec(name="lot-b", weight=0.3, scale_factor=0.85),
        # Infant mortality: a decreasing hazard, high in the first weeks.
        BatchSpec(name="lot-c", weight=0.1, scale_factor=0.1, weibull_shape=0.5),
    ]


class CauseSpec(_SpecModel):
    """One way a GPU dies (the fatal Xid), and what it shows beforehand."""

    xid: int = Field(ge=0, le=65535)
    weight: float = Field(gt=0)
    precursor_prob: float = Field(ge=0, le=1, description="Share with warning signs first")
    memory_precursors: bool = Field(description="SBE rate, row remaps, Xid 63/64/92/94")
    pcie_precursors: bool = Field(default=False, description="Rising PCIe replays")
    node_hang_prob: float = Field(default=0.0, ge=0, le=1, description="Node goes silent after")


def _default_causes() -> list[CauseSpec]:
    return [
        CauseSpec(xid=48, weight=0.30, precursor_prob=0.9, memory_precursors=True),
        CauseSpec(
            xid=95, weight=0.15, precursor_prob=0.85, memory_precursors=True, node_hang_prob=0.1
        ),
        CauseSpec(
            xid=79,
            weight=0.30,
            precursor_prob=0.7,
            memory_precursors=False,
            pcie_precursors=True,
            node_hang_prob=0.5,
        ),
        CauseSpec(
            xid=119, weight=0.25, precursor_prob=0.6, memory_precursors=False, node_hang_prob=0.2
        ),
    ]


class FailureModel(_SpecModel):
    """Weibull lifetimes with covariates, precursors and the fatal event.

    A GPU's lifetime is ``T ~ Weibull(k, lambda)`` with ``k`` from its batch (else its SKU) and
    ``lambda = lambda_0(k) * sku.scale_factor * batch.scale_factor * 2 ** (-offset_c / halving_c)``,
    where ``offset_c`` is how much hotter its slot runs than the coolest one, and ``lambda_0(k)``
    is chosen so that a reference GPU (factors 1, offset 0) fails within its first year with
    probability ``1 - (1 - monthly_failure_prob) ** 12``. The fleet as a whole fails more often
    than the reference (most places run warmer than the coolest): about 2 % of GPUs a month at
    the defaults.
    """

    monthly_failure_prob: float = Field(
        default=0.01, gt=0, lt=1, description="Reference GPU, first year, per month"
    )
    life_halving_c: float = Field(default=10.0, gt=0, description="Hotter by this: half the life")
    causes: list[CauseSpec] = Field(default_factory=_default_causes, min_length=1)
    precursor_lead_days: Range = (1.0, 14.0)
    precursor_temp_rise_c: Range = (3.0, 10.0)
    precursor_sbe_peak_per_hour: Range = (20.0, 400.0)
    precursor_pcie_peak_per_hour: Range = (10.0, 200.0)
    hang_hours: Range = (0.5, 6.0)
    spurious_remaps_per_gpu_year: float = Field(
        default=0.1, ge=0, description="Isolated Xid 63 on GPUs that are fine (false alarms)"
    )

    _ranges = field_validator(
        "precursor_lead_days",
        "precursor_temp_rise_c",
        "precursor_sbe_peak_per_hour",
        "precursor_pcie_peak_per_hour",
        "hang_hours",
    )(_ordered)


class LayoutSpec(_SpecModel):
    """Where nodes sit, and how much hotter each place runs."""

    cluster: str = "sim"
    nodes_per_rack: int = Field(default=4, ge=1, le=64)
    racks_per_row: int = Field(default=8, ge=1, le=1024)
    top_of_rack_extra_c: float = Field(
        default=8.0, ge=0, description="Top slot over bottom slot (quadratic in between)"
    )
    rear_gpu_extra_c: float = Field(
        default=2.0, ge=0, description="GPUs in the rear half of the baseboard (downstream air)"
    )
    node_jitter_c: float = Field(default=1.0, ge=0, description="Per-node spread (sd)")


class BehaviourSpec(_SpecModel):
    """Everything that happens to a healthy fleet: none of it is a failure."""

    job_hours: Range = (2.0, 72.0)
    idle_hours: Range = (0.1, 6.0)
    app_faults_per_gpu_day: float = Field(default=0.05, ge=0, description="Xid 13/31/43 (+45)")
    straggler_windows_per_node_month: float = Field(default=1.0, ge=0)
    straggler_hours: Range = (1.0, 12.0)
    straggler_slowdown: Range = (1.1, 1.8)
    outages_per_node_month: float = Field(default=1.0, ge=0, description="Agent/network outages")
    outage_minutes: Range = (2.0, 60.0)
    reboots_per_node_month: float = Field(default=0.5, ge=0)
    reboot_minutes: Range = (3.0, 10.0)
    nvlink_bursts_per_gpu_month: float = Field(default=0.3, ge=0)
    nvlink_burst_flits: Range = (100.0, 20000.0)
    sbe_background_per_gpu_day: Range = (0.0, 2.0)
    pcie_replays_per_gpu_day: Range = (0.0, 3.0)

    _ranges = field_validator(
        "job_hours",
        "idle_hours",
        "straggler_hours",
        "straggler_slowdown",
        "outage_minutes",
        "reboot_minutes",
        "nvlink_burst_flits",
        "sbe_background_per_gpu_day",
        "pcie_replays_per_gpu_day",
    )(_ordered)

    @field_validator("straggler_slowdown")
    @classmethod
    def _slows_down(cls, value: Range) -> Range:
        if value[0] < 1.0:
            raise ValueError("a straggler slowdown factor is at least 1.0")
        return value


class NetworkSpec(_SpecModel):
    """Each node's network adapter ports (one per GPU rail) and what goes wrong with their links.

    Ports are InfiniBand unless the node is one of the ``roce_node_share`` that run RoCE
    (Ethernet link layer, with the RoCE ``hw_counters``). Link faults are drawn per port: flap
    episodes (the link goes down for seconds and retrains, a few times), degradations (the
    symbol-error rate climbs over hours, the link may retrain at fewer lanes, then it is
    reseated, or dies) and links that go down for good. While a link is degraded or flapping, the
    node's training steps run slower by the fault's ``slowdown``.
    """

    ports_per_node: int = Field(default=8, ge=0, le=32)
    rate_gbps: float = Field(default=400.0, gt=0, description="Per port, 4X NDR")
    link_width: int = Field(default=4, ge=1, le=16, description="Lanes (4X)")
    link_speed: str = Field(default="NDR", pattern=r"^[A-Za-z0-9]{1,16}$")
    roce_node_share: float = Field(default=0.25, ge=0, le=1, description="Nodes with RoCE ports")
    traffic_share: Range = Field(
        default=(0.15, 0.45), description="A busy node's traffic per port, as a share of its rate"
    )
    symbol_errors_per_port_day: Range = Field(
        default=(0.0, 20.0), description="Background on a healthy link (some links see none)"
    )
    flaps_per_port_month: float = Field(default=0.05, ge=0, description="Flap episodes")
    flap_downs: tuple[int, int] = (1, 5)
    flap_down_seconds: Range = (5.0, 90.0)
    flap_episode_minutes: Range = (1.0, 120.0)
    flap_slowdown: Range = (1.2, 2.5)
    degradations_per_port_month: float = Field(default=0.02, ge=0)
    degrade_hours: Range = (2.0, 48.0)
    degrade_symbol_peak_per_hour: Range = (200.0, 20000.0)
    degrade_downshift_prob: float = Field(
        default=0.5, ge=0, le=1, description="Retrains at half its lanes (400 -> 200 Gb/s)"
    )
    degrade_slowdown: Range = (1.1, 1.6)
    degrade_dies_prob: float = Field(
        default=0.2, ge=0, le=1, description="Ends with the link down for good, not reseated"
    )
    deaths_per_port_month: float = Field(default=0.003, ge=0, description="Sudden, no warning")
    dead_slowdown: Range = (1.1, 1.4)

    _ranges = field_validator(
        "traffic_share",
        "symbol_errors_per_port_day",
        "flap_down_seconds",
        "flap_episode_minutes",
        "flap_slowdown",
        "degrade_hours",
        "degrade_symbol_peak_per_hour",
        "degrade_slowdown",
        "dead_slowdown",
    )(_ordered)

    @field_validator("flap_downs")
    @classmethod
    def _some_downs(cls, value: tuple[int, int]) -> tuple[int, int]:
        if not 1 <= value[0] <= value[1]:
            raise ValueError("flap_downs must be (low, high) with 1 <= low <= high")
        return value

    @field_validator("flap_slowdown", "degrade_slowdown", "dead_slowdown")
    @classmethod
    def _slows_down(cls, value: Range) -> Range:
        if value[0] < 1.0:
            raise ValueError("a slowdown factor is at least 1.0")
        return value

    @field_validator("traffic_share")
    @classmethod
    def _a_share(cls, value: Range) -> Range:
        if value[1] > 1.0:
            raise ValueError("a port carries at most its rate: traffic_share must be <= 1")
        return value


class FleetSpec(_SpecModel):
    """A simulated fleet: N nodes x G GPUs, all of its history fixed by ``seed``."""

    version: Literal[1] = 1
    seed: int = Field(ge=0, le=2**63 - 1)
    nodes: int = Field(default=16, ge=1, le=100_000)
    gpus_per_node: int = Field(default=8, ge=1, le=16)
    start: datetime = Field(description="Simulated time zero (UTC)")
    real_start: datetime = Field(description="Real time that maps onto start (UTC)")
    speed: float = Field(default=1.0, gt=0, le=1e7, description="Sim seconds per real second")
    horizon_days: float = Field(default=365.0, gt=0, le=36500)
    max_age_at_start_days: float = Field(
        default=90.0, ge=0, description="Nodes were installed up to this long before start"
    )
    node_name_pattern: str = Field(
        default="sim-node-{index:03d}",
        description="str.format fields: index, cluster, row, rack, slot",
    )
    skus: list[SkuSpec] = Field(default_factory=_default_skus, min_length=1)
    batches: list[BatchSpec] = Field(default_factory=_default_batches, min_length=1)
    layout: LayoutSpec = Field(default_factory=LayoutSpec)
    failures: FailureModel = Field(default_factory=FailureModel)
    behaviour: BehaviourSpec = Field(default_factory=BehaviourSpec)
    network: NetworkSpec = Field(default_factory=NetworkSpec)

    @field_validator("start", "real_start")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError("must carry a time zone, e.g. 2026-01-01T00:00:00Z")
        return value.astimezone(UTC)

    @model_validator(mode="after")
    def _names_are_valid(self) -> Self:
        names = [self.node_name(i) for i in range(self.nodes)]
        bad = next((name for name in names if not _NODE_NAME_RE.match(name)), None)
        if bad is not None:
            raise ValueError(f"node_name_pattern gives an invalid node name {bad!r}")
        if len(set(names)) != len(names):
            raise ValueError("node_name_pattern must give every node its own name; use {index}")
        return self

    @property
    def end(self) -> datetime:
        """The end of the simulated horizon: GPUs still alive then are censored."""
        return self.start + timedelta(days=self.horizon_days)

    def node_place(self, index: int) -> tuple[int, int, int]:
        """``(row, rack, slot)`` of node ``index``; racks fill bottom slot first."""
        per_rack = self.layout.nodes_per_rack
        rack, slot = divmod(index, per_rack)
        return rack // self.layout.racks_per_row, rack, slot

    def node_name(self, index: int) -> str:
        row, rack, slot = self.node_place(index)
        try:
            return self.node_name_pattern.format(
                index=index, cluster=self.layout.cluster, row=row, rack=rack, slot=slot
            )
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"bad node_name_pattern {self.node_name_pattern!r}: {exc}") from exc

    @classmethod
    def live(
        cls,
        *,
        seed: int,
        real_start: datetime,
        speed: float = 1.0,
        horizon_days: float = 365.0,
        **fields: Any,
    ) -> FleetSpec:
        """A spec for a live run from ``real_start``: its sim time never passes the real clock.

        ``start = real_start - horizon * (1 - 1/speed)`` (``real_start`` itself when
        ``speed <= 1``), so simulated time reaches the end of the horizon as it catches up with
        real time. ``fields`` are the other :class:`FleetSpec` fields.
        """
        horizon = timedelta(days=horizon_days)
        lag = horizon * (1.0 - 1.0 / speed) if speed > 1 else timedelta(0)
        return cls.model_validate(
            {
                "seed": seed,
                "real_start": real_start,
                "speed": speed,
                "horizon_days": horizon_days,
                "start": real_start - lag,
            }
            | fields
        )

    def save(self, path: Path) -> None:
        """Write the spec as JSON (atomically: a reader never sees half a file)."""
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(self.model_dump_json(indent=2) + "\n")
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> FleetSpec:
        return cls.model_validate_json(path.read_text())
