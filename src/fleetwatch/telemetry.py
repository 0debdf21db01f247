"""Wire format v1: the canonical telemetry the agent sends and the server stores.

This module is the one contract between agent and server (and any third-party pusher). Every
collector maps its source onto :class:`GpuSample`; the server never knows where a reading came from.

Field names follow DCGM's where one exists, in snake_case with the unit in the name. A field the
source does not report is absent (``None``), never 0: "no data" and "no errors" are different facts.

Every value must be storable as sent on SQLite and PostgreSQL alike (:mod:`fleetwatch.storable`):
text without NUL or lone surrogates, integers within a signed 64-bit column, finite floats only.

``SAMPLE_FIELDS`` describes each sample field once (kind, unit, help text); storage columns,
Prometheus gauges and rate derivation are all generated from it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from fleetwatch.event_details import MAX_EVENT_COUNT, details_problem
from fleetwatch.storable import INT64_MAX, STORABLE_TEXT, Text, json_value_problem, shown

__all__ = [
    "MAX_EVENT_COUNT",
    "SAMPLE_FIELDS",
    "WIRE_VERSION",
    "Batch",
    "Event",
    "FieldKind",
    "FieldSpec",
    "GpuIdentity",
    "GpuSample",
    "IngestLimits",
    "MigIdentity",
    "MigInstance",
    "NodeInfo",
    "PortSample",
    "normalize_pci_bus_id",
]

WIRE_VERSION = 1

FieldKind = Literal["gauge", "counter", "flag", "bitmask"]


@dataclass(frozen=True)
class FieldSpec:
    """One canonical sample field: how to store it, export it and derive rates from it."""

    name: str
    kind: FieldKind
    unit: str
    help: str
    dcgm: str | None = None

    @property
    def is_integer(self) -> bool:
        return self.kind in ("counter", "bitmask")


SAMPLE_FIELDS: tuple[FieldSpec, ...] = (
    # thermal and power
    FieldSpec("gpu_temp_c", "gauge", "celsius", "GPU die temperature", "DCGM_FI_DEV_GPU_TEMP"),
    FieldSpec("memory_temp_c", "gauge", "celsius", "HBM temperature", "DCGM_FI_DEV_MEMORY_TEMP"),
    FieldSpec("power_w", "gauge", "watts", "Board power draw", "DCGM_FI_DEV_POWER_USAGE"),
    FieldSpec(
        "power_limit_w", "gauge", "watts", "Enforced power limit", "DCGM_FI_DEV_POWER_MGMT_LIMIT"
    ),
    FieldSpec(
        "energy_mj",
        "counter",
        "millijoules",
        "Energy consumed since the driver loaded",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    ),
    FieldSpec("sm_clock_mhz", "gauge", "megahertz", "SM clock", "DCGM_FI_DEV_SM_CLOCK"),
    FieldSpec("mem_clock_mhz", "gauge", "megahertz", "Memory clock", "DCGM_FI_DEV_MEM_CLOCK"),
    FieldSpec(
        "clocks_event_reasons",
        "bitmask",
        "bitmask",
        "Clocks event (throttle) reasons, NVML bitmask",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    ),
    FieldSpec(
        "power_violation_us",
        "counter",
        "microseconds",
        "Time throttled by the power limit",
        "DCGM_FI_DEV_POWER_VIOLATION",
    ),
    FieldSpec(
        "thermal_violation_us",
        "counter",
        "microseconds",
        "Time throttled by thermal limits",
        "DCGM_FI_DEV_THERMAL_VIOLATION",
    ),
    FieldSpec("fan_speed_pct", "gauge", "percent", "Fan speed", "DCGM_FI_DEV_FAN_SPEED"),
    # use
    FieldSpec("gpu_util_pct", "gauge", "percent", "GPU utilisation", "DCGM_FI_DEV_GPU_UTIL"),
    FieldSpec(
        "mem_copy_util_pct",
        "gauge",
        "percent",
        "Memory copy utilisation",
        "DCGM_FI_DEV_MEM_COPY_UTIL",
    ),
    FieldSpec("fb_used_mib", "gauge", "mebibytes", "Framebuffer used", "DCGM_FI_DEV_FB_USED"),
    FieldSpec("fb_total_mib", "gauge", "mebibytes", "Framebuffer total", "DCGM_FI_DEV_FB_TOTAL"),
    FieldSpec(
        "pcie_link_gen",
        "gauge",
        "generation",
        "Current PCIe link generation",
        "DCGM_FI_DEV_PCIE_LINK_GEN",
    ),
    FieldSpec(
        "pcie_link_width",
        "gauge",
        "lanes",
        "Current PCIe link width",
        "DCGM_FI_DEV_PCIE_LINK_WIDTH",
    ),
    # memory errors
    FieldSpec(
        "ecc_sbe_volatile_total",
        "counter",
        "errors",
        "Single-bit ECC errors since driver load",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    ),
    FieldSpec(
        "ecc_dbe_volatile_total",
        "counter",
        "errors",
        "Double-bit ECC errors since driver load",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    ),
    FieldSpec(
        "ecc_sbe_aggregate_total",
        "counter",
        "errors",
        "Single-bit ECC errors over the GPU's life",
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    ),
    FieldSpec(
        "ecc_dbe_aggregate_total",
        "counter",
        "errors",
        "Double-bit ECC errors over the GPU's life",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    ),
    FieldSpec(
        "retired_pages_sbe", "counter", "pages", "Pages retired for SBE", "DCGM_FI_DEV_RETIRED_SBE"
    ),
    FieldSpec(
        "retired_pages_dbe", "counter", "pages", "Pages retired for DBE", "DCGM_FI_DEV_RETIRED_DBE"
    ),
    FieldSpec(
        "retired_pages_pending",
        "flag",
        "bool",
        "A page retirement waits for a reset",
        "DCGM_FI_DEV_RETIRED_PENDING",
    ),
    FieldSpec(
        "remapped_rows_correctable",
        "counter",
        "rows",
        "Rows remapped for correctable errors",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    ),
    FieldSpec(
        "remapped_rows_uncorrectable",
        "counter",
        "rows",
        "Rows remapped for uncorrectable errors",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    ),
    FieldSpec(
        "remapped_rows_pending",
        "flag",
        "bool",
        "A row remap waits for a GPU reset",
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
    ),
    FieldSpec(
        "remapped_rows_failure",
        "flag",
        "bool",
        "A row remap failed",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    ),
    # interconnect
    FieldSpec(
        "nvlink_crc_flit_errors_total",
        "counter",
        "errors",
        "NVLink flow-control CRC errors, all links",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    ),
    FieldSpec(
        "nvlink_crc_data_errors_total",
        "counter",
        "errors",
        "NVLink data CRC errors, all links",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    ),
    FieldSpec(
        "nvlink_replay_errors_total",
        "counter",
        "errors",
        "NVLink replays, all links",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    ),
    FieldSpec(
        "nvlink_recovery_errors_total",
        "counter",
        "errors",
        "NVLink recoveries, all links",
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    ),
    FieldSpec(
        "pcie_replay_total", "counter", "replays", "PCIe replays", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
    ),
    FieldSpec(
        "gpu_recovery_action",
        "gauge",
        "enum",
        "Driver's recovery action (0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain+reset)",
        "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION",
    ),
)

SAMPLE_FIELD_NAMES: tuple[str, ...] = tuple(spec.name for spec in SAMPLE_FIELDS)

_PCI_RE = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<dev>[0-9a-fA-F]{1,2})\.(?P<fn>[0-7])$"
)
_NODE_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$"
_UUID_RE = r"^(GPU|MIG)-[A-Za-z0-9-]{1,120}$"
# A MIG device's UUID: MIG-<uuid> from R470 on, MIG-GPU-<parent uuid>/<gi>/<ci> before.
_MIG_UUID_RE = r"^MIG-[A-Za-z0-9-]{1,120}(/[0-9]{1,5}){0,2}$"
_KIND_RE = r"^[a-z][a-z0-9_]{0,63}$"
_LABEL_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def normalize_pci_bus_id(value: str) -> str:
    """Return the canonical ``dddd:bb:dd.f`` form, lower case, of a PCI bus id.

    nvidia-smi prints ``00000000:3B:00.0`` and the kernel ``0000:3b:00.0`` or ``3b:00.0``; all mean
    the same slot.

    >>> normalize_pci_bus_id("00000000:3B:00.0")
    '0000:3b:00.0'
    """
    match = _PCI_RE.match(value.strip())
    if match is None:
        raise ValueError(f"not a PCI bus id (expected like 0000:3b:00.0): {shown(value)}")
    domain = int(match["domain"] or "0", 16)
    if domain > 0xFFFF:
        raise ValueError(f"PCI domain out of range: {shown(value)}")
    return (
        f"{domain:04x}:{int(match['bus'], 16):02x}:{int(match['dev'], 16):02x}.{int(match['fn'])}"
    )


@dataclass(frozen=True)
class IngestLimits:
    """Server-side limits applied while validating a batch (passed as validation context)."""

    now: datetime
    max_future_skew: timedelta = timedelta(minutes=5)
    # An agent's spool holds days of a server outage; a reading older than this is a wrong clock.
    max_past_age: timedelta = timedelta(days=30)
    max_gpus: int = 1024
    max_samples: int = 50_000
    max_events: int = 10_000
    max_ports: int = 1024


def _age(age: timedelta) -> str:
    seconds = age.total_seconds()
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.1f} days"
    return f"{seconds / 3600:.1f} hours" if seconds >= 7200 else f"{seconds:.0f} s"


def _check_ts(value: datetime, info: ValidationInfo) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("timestamp must carry a time zone (e.g. 2026-11-30T05:00:00Z)")
    try:
        value = value.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00:00+14:00 is before year 1 in UTC
        raise ValueError("timestamp is out of range once converted to UTC") from None
    limits = info.context.get("limits") if isinstance(info.context, dict) else None
    if not isinstance(limits, IngestLimits):
        return value
    if value > limits.now + limits.max_future_skew:
        raise ValueError(
            f"timestamp is {value - limits.now} in the future (more than the allowed clock skew of "
            f"{limits.max_future_skew}); check the node's clock"
        )
    if value < limits.now - limits.max_past_age:
        raise ValueError(
            f"timestamp {value.isoformat()} is {_age(limits.now - value)} old; the server takes "
            f"readings up to {_age(limits.max_past_age)} old (setting max_past_age_s); check the "
            "node's clock"
        )
    return value


class _WireModel(BaseModel):
    # allow_inf_nan=False: NaN, Infinity and 1e999 (which parses to inf) are refused everywhere.
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False)


Counter = Annotated[
    int, Field(ge=0, le=INT64_MAX, description="Cumulative counter as read from the GPU")
]
Percent = Annotated[float, Field(ge=0, le=100)]


class NodeInfo(_WireModel):
    """The node that sent the batch."""

    name: str = Field(pattern=_NODE_NAME_RE, description="Node name, unique in the fleet")
    labels: dict[str, Text] = Field(default_factory=dict, description="cluster, rack, row, ...")
    interval_s: float = Field(default=10.0, gt=0, le=3600, description="Collection interval")
    push_interval_s: float | None = Field(
        default=None,
        gt=0,
        le=86400,
        description="Seconds between the agent's pushes when a batch carries several collections "
        "(absent: one push per collection). The server judges silence by the longer of the two: "
        "a node is unreachable after unreachable_after_intervals of them. Added in wire v1 as an "
        "optional field; servers older than it refuse it (422), so upgrade servers first",
    )
    agent_version: Annotated[str, Field(max_length=64), STORABLE_TEXT] | None = None
    boot_id: Annotated[str, Field(max_length=64), STORABLE_TEXT] | None = Field(
        default=None, description="Changes when the node reboots (counter resets)"
    )

    @field_validator("labels")
    @classmethod
    def _labels_are_prometheus_safe(cls, labels: dict[str, str]) -> dict[str, str]:
        if len(labels) > 64:
            raise ValueError("at most 64 labels")
        for key, value in labels.items():
            if not _LABEL_KEY_RE.fullmatch(key):  # match() would let "rack\n" through
                raise ValueError(f"label key {shown(key)} must match [A-Za-z_][A-Za-z0-9_]{{0,62}}")
            if len(value) > 256:
                raise ValueError(f"label {key!r} is longer than 256 characters")
        return labels

    @property
    def report_interval_s(self) -> float:
        """The longest the server should expect between two batches of this node."""
        return max(self.interval_s, self.push_interval_s or 0.0)


MigMode = Literal["enabled", "disabled"]


class MigInstance(_WireModel):
    """One MIG device of a MIG-enabled GPU: a GPU instance (with a compute instance in it).

    Each source knows part of it: NVML all four, dcgm-exporter the GPU instance and its profile,
    ``nvidia-smi -q -x`` the GPU and compute instance ids and the MIG device index. What a source
    does not print is absent, never guessed.
    """

    gpu_instance_id: int = Field(ge=0, le=65535, description="GPU instance id (GI), as printed")
    compute_instance_id: int | None = Field(
        default=None, ge=0, le=65535, description="Compute instance id (CI) within the GI"
    )
    index: int | None = Field(
        default=None, ge=0, le=1023, description="MIG device index under the parent GPU"
    )
    profile: Annotated[str, Field(max_length=64), STORABLE_TEXT] | None = Field(
        default=None, description="GPU instance profile, e.g. 1g.10gb, 3g.40gb, 1g.12gb+me"
    )
    uuid: str | None = Field(
        default=None,
        pattern=_MIG_UUID_RE,
        description="MIG-<uuid> (R470+) or MIG-GPU-<parent uuid>/<gi>/<ci> (older drivers)",
    )


class MigIdentity(_WireModel):
    """A GPU's MIG mode and its GPU instances. Sent only for a GPU with MIG enabled (now or once
    reset): absent means MIG is off or the GPU has none. Its whole-GPU readings stay in the
    GPU's samples; fields NVML or nvidia-smi cannot report on a MIG-enabled GPU (utilisation,
    remapped rows, ...) are absent there, which health rules treat as no evidence."""

    current: MigMode | None = Field(default=None, description="MIG mode now")
    pending: MigMode | None = Field(default=None, description="MIG mode after the next GPU reset")
    instances: list[MigInstance] = Field(
        default_factory=list, max_length=64, description="MIG devices, by GPU instance id"
    )


class GpuIdentity(_WireModel):
    """What does not change while a GPU sits in its slot (and its MIG layout, which may)."""

    uuid: str = Field(pattern=_UUID_RE)
    index: int = Field(ge=0, le=1023)
    serial: Annotated[str, Field(max_length=64), STORABLE_TEXT] | None = None
    pci_bus_id: str | None = Field(default=None, max_length=32)
    name: Annotated[str, Field(max_length=128), STORABLE_TEXT] | None = None
    driver_version: Annotated[str, Field(max_length=64), STORABLE_TEXT] | None = None
    vbios_version: Annotated[str, Field(max_length=64), STORABLE_TEXT] | None = None
    mig: MigIdentity | None = Field(
        default=None,
        description="MIG mode and GPU instances, for a GPU with MIG enabled. Added in wire v1 as "
        "an optional field: agents send it only for MIG-enabled GPUs, and when a server older "
        "than it refuses it (422 on gpus.N.mig) the agent resends the batch without it",
    )

    @field_validator("pci_bus_id")
    @classmethod
    def _normalize_pci(cls, value: str | None) -> str | None:
        return None if value is None else normalize_pci_bus_id(value)


class GpuSample(_WireModel):
    """One GPU at one instant: every canonical field it reported, nothing it did not."""

    uuid: str = Field(pattern=_UUID_RE)
    ts: datetime

    gpu_temp_c: float | None = Field(default=None, ge=-50, le=200)
    memory_temp_c: float | None = Field(default=None, ge=-50, le=200)
    power_w: float | None = Field(default=None, ge=0, le=10_000)
    power_limit_w: float | None = Field(default=None, ge=0, le=10_000)
    energy_mj: Counter | None = None
    sm_clock_mhz: float | None = Field(default=None, ge=0, le=20_000)
    mem_clock_mhz: float | None = Field(default=None, ge=0, le=50_000)
    clocks_event_reasons: int | None = Field(default=None, ge=0, le=2**63 - 1)
    power_violation_us: Counter | None = None
    thermal_violation_us: Counter | None = None
    fan_speed_pct: Percent | None = None

    gpu_util_pct: Percent | None = None
    mem_copy_util_pct: Percent | None = None
    fb_used_mib: float | None = Field(default=None, ge=0)
    fb_total_mib: float | None = Field(default=None, ge=0)
    pcie_link_gen: int | None = Field(default=None, ge=1, le=16)
    pcie_link_width: int | None = Field(default=None, ge=1, le=64)

    ecc_sbe_volatile_total: Counter | None = None
    ecc_dbe_volatile_total: Counter | None = None
    ecc_sbe_aggregate_total: Counter | None = None
    ecc_dbe_aggregate_total: Counter | None = None
    retired_pages_sbe: Counter | None = None
    retired_pages_dbe: Counter | None = None
    retired_pages_pending: StrictBool | None = None
    remapped_rows_correctable: Counter | None = None
    remapped_rows_uncorrectable: Counter | None = None
    remapped_rows_pending: StrictBool | None = None
    remapped_rows_failure: StrictBool | None = None

    nvlink_crc_flit_errors_total: Counter | None = None
    nvlink_crc_data_errors_total: Counter | None = None
    nvlink_replay_errors_total: Counter | None = None
    nvlink_recovery_errors_total: Counter | None = None
    pcie_replay_total: Counter | None = None
    gpu_recovery_action: int | None = Field(default=None, ge=0, le=255)

    _ts = field_validator("ts")(_check_ts)

    def values(self) -> dict[str, Any]:
        """The canonical fields this sample reported (absent ones left out)."""
        return {name: v for name in SAMPLE_FIELD_NAMES if (v := getattr(self, name)) is not None}


_PORT_DEVICE_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
# The kernel prints a node GUID as four groups of four hex digits, e.g. 0a7f:bc12:45ef:d23b.
_NODE_GUID_RE = r"^[0-9a-f]{4}(:[0-9a-f]{4}){3}$"
# A Linux interface name: at most 15 bytes, no slash, no white space (kept to printable ASCII).
_NETDEV_RE = r"^[!-.0-~]{1,15}$"
_PORT_STATE_NAME_RE = r"^[A-Za-z][A-Za-z0-9_ ]{0,31}$"
_PORT_COUNTER_NAME_RE = re.compile(r"^[A-Za-z0-9_]{1,64}$")
_MOST_PORT_COUNTERS = 128

PortCounters = dict[str, Annotated[int, Field(ge=0, le=INT64_MAX)]]


class PortSample(_WireModel):
    """One network adapter port (InfiniBand or RoCE, from ``/sys/class/infiniband``) at one
    instant: its identity, its link as the kernel reports it, and its counters as read.

    Added in wire v1 as an optional list (``Batch.ports``). What sysfs does not show (a counter this
    adapter lacks, a port without a netdev) is absent, never 0. Counters are cumulative and keep
    sysfs's names and units: ``port_rcv_data`` and ``port_xmit_data`` count 4-byte words.
    """

    device: str = Field(
        pattern=_PORT_DEVICE_RE, description="Adapter name in /sys/class/infiniband, e.g. mlx5_0"
    )
    port: int = Field(ge=0, le=255, description="Port number on the adapter (1-based on an HCA)")
    ts: datetime
    link_layer: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z][A-Za-z0-9 _-]{0,31}$",
        description="InfiniBand, or Ethernet for RoCE (as sysfs prints it)",
    )
    node_guid: str | None = Field(
        default=None,
        pattern=_NODE_GUID_RE,
        description="Adapter node GUID, e.g. 0a7f:bc12:45ef:d23b",
    )
    netdev: str | None = Field(
        default=None, pattern=_NETDEV_RE, description="Network interface of the adapter (ib0, eth2)"
    )
    state: str | None = Field(
        default=None,
        pattern=_PORT_STATE_NAME_RE,
        description="Logical port state by name: DOWN, INIT, ARMED, ACTIVE, ACTIVE_DEFER",
    )
    state_code: int | None = Field(
        default=None, ge=0, le=255, description="Logical port state code (4: ACTIVE)"
    )
    phys_state: str | None = Field(
        default=None,
        pattern=_PORT_STATE_NAME_RE,
        description="Physical port state by name: Sleep, Polling, Disabled, LinkUp, ...",
    )
    phys_state_code: int | None = Field(
        default=None, ge=0, le=255, description="Physical port state code (5: LinkUp, 2: Polling)"
    )
    rate_gbps: float | None = Field(
        default=None, ge=0, le=100_000, description="Link rate in Gb/s (400 for 4X NDR)"
    )
    link_width: int | None = Field(
        default=None, ge=1, le=64, description="Lanes in use (4 for 4X), when sysfs prints them"
    )
    link_speed: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9]{1,16}$",
        description="Per-lane speed name (SDR ... NDR, XDR), when sysfs prints it",
    )
    counters: PortCounters | None = Field(
        default=None,
        description="The port's counters/ files by name (symbol_error, link_downed, "
        "port_rcv_errors, port_xmit_wait, ...), cumulative, as read; at most 128",
    )
    hw_counters: PortCounters | None = Field(
        default=None,
        description="The port's hw_counters/ files by name where the driver has them (RoCE: "
        "roce_adp_retrans, out_of_sequence, local_ack_timeout_err, ...), as read; at most 128",
    )

    _ts = field_validator("ts")(_check_ts)

    @field_validator("counters", "hw_counters")
    @classmethod
    def _counter_names(cls, value: dict[str, int] | None) -> dict[str, int] | None:
        if value is None:
            return None
        if len(value) > _MOST_PORT_COUNTERS:
            raise ValueError(f"at most {_MOST_PORT_COUNTERS} counters")
        for name in value:
            if not _PORT_COUNTER_NAME_RE.fullmatch(name):
                raise ValueError(f"counter name {shown(name)} must match [A-Za-z0-9_]{{1,64}}")
        return value


class Event(_WireModel):
    """Something that happened once: an Xid, a GPU lost from the bus, an agent start."""

    kind: str = Field(
        pattern=_KIND_RE,
        description="xid, gpu_lost, sxid (NVSwitch), pcie_aer, mce (machine check or firmware "
        "hardware error), edac (memory controller count), agent_start, ...; a server stores "
        "kinds it does not know as they are",
    )
    ts: datetime
    uuid: str | None = Field(default=None, pattern=_UUID_RE)
    pci_bus_id: str | None = Field(default=None, max_length=32)
    xid: int | None = Field(default=None, ge=0, le=65535)
    message: Annotated[str, Field(max_length=4096), STORABLE_TEXT] | None = None
    pid: int | None = Field(default=None, ge=0, le=INT64_MAX)
    process: Annotated[str, Field(max_length=256), STORABLE_TEXT] | None = None
    details: dict[str, Any] | None = Field(
        default=None,
        description="Source-specific extras, kept as sent (text without NUL, integers within "
        "64 bits, finite numbers). Kernel-log kinds put their reading here: ``severity`` "
        "(sxid: fatal|non_fatal|correctable; pcie_aer: fatal|non_fatal|corrected; mce: "
        "fatal|uncorrected|deferred|corrected; edac: uncorrected|corrected), and e.g. ``sxid`` "
        "and ``link``, the AER ``errors`` and ``reported_by`` port, the EDAC ``count`` and "
        "``label``. The keys the rules read must hold what they read (see "
        "fleetwatch.event_details: e.g. an mce ``bank`` is an integer, a pcie_aer ``errors`` a "
        f"list of texts, an edac ``count`` at most {MAX_EVENT_COUNT}), else the batch is refused",
    )

    _ts = field_validator("ts")(_check_ts)

    @field_validator("pci_bus_id")
    @classmethod
    def _normalize_pci(cls, value: str | None) -> str | None:
        return None if value is None else normalize_pci_bus_id(value)

    @field_validator("details")
    @classmethod
    def _details_are_storable(
        cls, value: dict[str, Any] | None, info: ValidationInfo
    ) -> dict[str, Any] | None:
        problem = json_value_problem(value)
        if problem is not None:
            path, reason = problem
            # ctx["path"] lets the server name the exact place: body.events.0.details.<path>.
            raise PydanticCustomError(
                "unstorable_value", "{reason}", {"reason": reason, "path": path}
            )
        # What the rules read of this kind must be readable, or one event blinds them to its
        # node (event_details.py). No kind here: its own error is reported already.
        kind = info.data.get("kind")
        readable = details_problem(kind, value) if isinstance(kind, str) else None
        if readable is not None:
            path, reason = readable
            raise PydanticCustomError(
                "unreadable_detail", "{reason}", {"reason": reason, "path": path}
            )
        return value

    @model_validator(mode="after")
    def _xid_needs_code(self) -> Event:
        if self.kind == "xid" and self.xid is None:
            raise ValueError("an event of kind 'xid' needs the field 'xid' (the Xid code)")
        return self


BATCH_EXAMPLE: dict[str, Any] = {
    "batch_id": "0b9c5e1e-4f7d-4d6e-9a7e-1c1f1b0a2f00",
    "node": {
        "name": "gpu-node-017",
        "labels": {"cluster": "a", "rack": "r12", "row": "3"},
        "interval_s": 10,
        "push_interval_s": 60,
        "agent_version": "0.1.0",
        "boot_id": "5f0e6a4c-2b1d-4c3e-8f7a-9d8c7b6a5e4f",
    },
    "gpus": [
        {
            "uuid": "GPU-5e1d2c3b-4a59-6877-8695-a4b3c2d1e0f9",
            "index": 0,
            "serial": "1652823011234",
            "pci_bus_id": "0000:18:00.0",
            "name": "NVIDIA H100 80GB HBM3",
            "driver_version": "550.90.07",
        }
    ],
    "samples": [
        {
            "uuid": "GPU-5e1d2c3b-4a59-6877-8695-a4b3c2d1e0f9",
            "ts": "2026-11-30T05:00:00Z",
            "gpu_temp_c": 41,
            "power_w": 312.5,
            "ecc_dbe_volatile_total": 0,
            "remapped_rows_pending": False,
        }
    ],
    "events": [
        {
            "kind": "xid",
            "uuid": "GPU-5e1d2c3b-4a59-6877-8695-a4b3c2d1e0f9",
            "pci_bus_id": "0000:18:00.0",
            "xid": 79,
            "ts": "2026-11-30T05:00:03Z",
            "message": "GPU has fallen off the bus.",
        }
    ],
}


class Batch(_WireModel):
    """``POST /v1/ingest`` body: one node's readings since its last push."""

    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,
        json_schema_extra={"examples": [BATCH_EXAMPLE]},
    )

    batch_id: str = Field(
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9._:-]+$",
        description="Unique per batch (a UUID); a replay of the same id is stored once",
    )
    node: NodeInfo
    gpus: list[GpuIdentity] = Field(default_factory=list)
    samples: list[GpuSample] = Field(default_factory=list)
    events: list[Event] = Field(default_factory=list)
    # None rather than an empty list: a batch without ports must serialise without the key, or
    # every push to a server older than the field would be refused first.
    ports: list[PortSample] | None = Field(
        default=None,
        description="Network adapter ports (InfiniBand, RoCE), one reading per port and instant. "
        "Added in wire v1 as an optional field: agents send it only when a port was read, and "
        "when a server older than it refuses it (422 on ports) the agent resends the batch "
        "without it",
    )

    @model_validator(mode="after")
    def _within_limits(self, info: ValidationInfo) -> Batch:
        limits = info.context.get("limits") if isinstance(info.context, dict) else None
        if not isinstance(limits, IngestLimits):
            return self
        for name, items, most in (
            ("gpus", self.gpus, limits.max_gpus),
            ("samples", self.samples, limits.max_samples),
            ("events", self.events, limits.max_events),
            ("ports", self.ports or [], limits.max_ports),
        ):
            if len(items) > most:
                raise ValueError(
                    f"too many {name}: {len(items)} > {most}; split the batch into smaller ones"
                )
        return self
