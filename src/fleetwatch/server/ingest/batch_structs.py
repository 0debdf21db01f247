"""Wire format v1 as msgspec structs: what the server's ingest hot path decodes a batch into.

:mod:`fleetwatch.telemetry`'s pydantic models stay the definition of the wire format (the agent
builds them, the OpenAPI document shows them, and every 422 is theirs); these structs mirror them
field for field, with the same names, types and defaults, so that msgspec can decode and check a
batch in C, without a Python object per value. Every bound (minimum, maximum, length, pattern) is
read from the pydantic models' JSON schema, so the two cannot drift apart in their numbers;
``tests/unit/server/ingest/test_batch_structs.py`` checks names, types and defaults too.

msgspec checks what a struct can say. The rest (stored text, timestamps, PCI slots, label keys,
an event's ``details``, per-batch limits) is checked by
:mod:`fleetwatch.server.ingest.batch_decoder`, which also turns each timestamp's text into a
``datetime``.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

from msgspec import Meta, Struct

from fleetwatch.telemetry import SAMPLE_FIELD_NAMES, Batch

__all__ = [
    "BatchStruct",
    "EventStruct",
    "GpuStruct",
    "NodeStruct",
    "SAMPLE_UUID_PATTERN",
    "SampleStruct",
    "python_pattern",
]

_SCHEMA = Batch.model_json_schema()


def python_pattern(pattern: str) -> str:
    """``pattern`` (pydantic's, matched by Rust's regex engine) for Python's ``re.search``.

    Rust's ``$`` matches only at the very end; Python's also before a final newline, which would
    let ``"node-a\\n"`` through. ``\\Z`` is Rust's ``$`` in Python.
    """
    return (
        pattern[:-1] + r"\Z" if pattern.endswith("$") and not pattern.endswith(r"\$") else pattern
    )


def _bounds(model: str, field: str) -> Meta:
    """The constraints pydantic declares for ``model.field``, as a msgspec ``Meta``."""
    properties = (
        _SCHEMA["properties"] if model == "Batch" else _SCHEMA["$defs"][model]["properties"]
    )
    schema = properties[field]
    arm = next(a for a in schema.get("anyOf", [schema]) if a.get("type") != "null")
    names = {
        "exclusiveMinimum": "gt",
        "minimum": "ge",
        "exclusiveMaximum": "lt",
        "maximum": "le",
        "minLength": "min_length",
        "maxLength": "max_length",
        "pattern": "pattern",
    }
    unknown = arm.keys() - names.keys() - {"type", "title", "description", "default"}
    if unknown:  # a rule these structs would not enforce: refuse to start rather than drift
        raise TypeError(f"{model}.{field}: no msgspec equivalent for {sorted(unknown)}")
    constraints: dict[str, Any] = {names[k]: v for k, v in arm.items() if k in names}
    if "pattern" in constraints:
        constraints["pattern"] = python_pattern(constraints["pattern"])
    return Meta(**constraints)


if TYPE_CHECKING:
    WireTimestamp = datetime
else:
    # Decoded as its text; the decoder replaces it by a UTC datetime before anyone reads it.
    # msgspec's own datetime parser rounds a 7th fractional digit where pydantic's truncates.
    WireTimestamp = str

_LABEL_KEY = Annotated[str, Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,62}\Z")]
_LABEL_VALUE = Annotated[str, Meta(max_length=256)]


class NodeStruct(Struct, forbid_unknown_fields=True):
    name: Annotated[str, _bounds("NodeInfo", "name")]
    labels: Annotated[dict[_LABEL_KEY, _LABEL_VALUE], Meta(max_length=64)] = {}
    interval_s: Annotated[float, _bounds("NodeInfo", "interval_s")] = 10.0
    push_interval_s: Annotated[float, _bounds("NodeInfo", "push_interval_s")] | None = None
    agent_version: Annotated[str, _bounds("NodeInfo", "agent_version")] | None = None
    boot_id: Annotated[str, _bounds("NodeInfo", "boot_id")] | None = None

    @property
    def report_interval_s(self) -> float:
        """The longest the server should expect between two batches of this node."""
        return max(self.interval_s, self.push_interval_s or 0.0)


class GpuStruct(Struct, forbid_unknown_fields=True):
    uuid: Annotated[str, _bounds("GpuIdentity", "uuid")]
    index: Annotated[int, _bounds("GpuIdentity", "index")]
    serial: Annotated[str, _bounds("GpuIdentity", "serial")] | None = None
    pci_bus_id: Annotated[str, _bounds("GpuIdentity", "pci_bus_id")] | None = None
    name: Annotated[str, _bounds("GpuIdentity", "name")] | None = None
    driver_version: Annotated[str, _bounds("GpuIdentity", "driver_version")] | None = None
    vbios_version: Annotated[str, _bounds("GpuIdentity", "vbios_version")] | None = None
    # A MIG layout (telemetry.MigIdentity) is checked by pydantic only: the fast path declines a
    # batch that declares one, and structs_of carries the validated layout here as plain JSON.
    mig: dict[str, Any] | None = None


def _sample(field: str) -> Meta:
    return _bounds("GpuSample", field)


# SampleStruct.uuid carries no pattern: the decoder checks each distinct uuid of a batch with it.
SAMPLE_UUID_PATTERN = str(_sample("uuid").pattern)


# gc=False: a sample holds only scalars, so the cycle collector need never track the thousands
# of them in a large batch.
class SampleStruct(Struct, forbid_unknown_fields=True, gc=False):
    # Checked once per distinct value by the decoder (a batch repeats each GPU and instant).
    uuid: str
    ts: WireTimestamp

    gpu_temp_c: Annotated[float, _sample("gpu_temp_c")] | None = None
    memory_temp_c: Annotated[float, _sample("memory_temp_c")] | None = None
    power_w: Annotated[float, _sample("power_w")] | None = None
    power_limit_w: Annotated[float, _sample("power_limit_w")] | None = None
    energy_mj: Annotated[int, _sample("energy_mj")] | None = None
    sm_clock_mhz: Annotated[float, _sample("sm_clock_mhz")] | None = None
    mem_clock_mhz: Annotated[float, _sample("mem_clock_mhz")] | None = None
    clocks_event_reasons: Annotated[int, _sample("clocks_event_reasons")] | None = None
    power_violation_us: Annotated[int, _sample("power_violation_us")] | None = None
    thermal_violation_us: Annotated[int, _sample("thermal_violation_us")] | None = None
    fan_speed_pct: Annotated[float, _sample("fan_speed_pct")] | None = None

    gpu_util_pct: Annotated[float, _sample("gpu_util_pct")] | None = None
    mem_copy_util_pct: Annotated[float, _sample("mem_copy_util_pct")] | None = None
    fb_used_mib: Annotated[float, _sample("fb_used_mib")] | None = None
    fb_total_mib: Annotated[float, _sample("fb_total_mib")] | None = None
    pcie_link_gen: Annotated[int, _sample("pcie_link_gen")] | None = None
    pcie_link_width: Annotated[int, _sample("pcie_link_width")] | None = None

    ecc_sbe_volatile_total: Annotated[int, _sample("ecc_sbe_volatile_total")] | None = None
    ecc_dbe_volatile_total: Annotated[int, _sample("ecc_dbe_volatile_total")] | None = None
    ecc_sbe_aggregate_total: Annotated[int, _sample("ecc_sbe_aggregate_total")] | None = None
    ecc_dbe_aggregate_total: Annotated[int, _sample("ecc_dbe_aggregate_total")] | None = None
    retired_pages_sbe: Annotated[int, _sample("retired_pages_sbe")] | None = None
    retired_pages_dbe: Annotated[int, _sample("retired_pages_dbe")] | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_correctable: Annotated[int, _sample("remapped_rows_correctable")] | None = None
    remapped_rows_uncorrectable: Annotated[int, _sample("remapped_rows_uncorrectable")] | None = (
        None
    )
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None

    nvlink_crc_flit_errors_total: Annotated[int, _sample("nvlink_crc_flit_errors_total")] | None = (
        None
    )
    nvlink_crc_data_errors_total: Annotated[int, _sample("nvlink_crc_data_errors_total")] | None = (
        None
    )
    nvlink_replay_errors_total: Annotated[int, _sample("nvlink_replay_errors_total")] | None = None
    nvlink_recovery_errors_total: Annotated[int, _sample("nvlink_recovery_errors_total")] | None = (
        None
    )
    pcie_replay_total: Annotated[int, _sample("pcie_replay_total")] | None = None
    gpu_recovery_action: Annotated[int, _sample("gpu_recovery_action")] | None = None

    def values(self) -> dict[str, Any]:
        """The canonical fields this sample reported (absent ones left out)."""
        return {name: v for name in SAMPLE_FIELD_NAMES if (v := getattr(self, name)) is not None}


class EventStruct(Struct, forbid_unknown_fields=True):
    kind: Annotated[str, _bounds("Event", "kind")]
    ts: WireTimestamp
    uuid: Annotated[str, _bounds("Event", "uuid")] | None = None
    pci_bus_id: Annotated[str, _bounds("Event", "pci_bus_id")] | None = None
    xid: Annotated[int, _bounds("Event", "xid")] | None = None
    message: Annotated[str, _bounds("Event", "message")] | None = None
    pid: Annotated[int, _bounds("Event", "pid")] | None = None
    process: Annotated[str, _bounds("Event", "process")] | None = None
    details: dict[str, Any] | None = None


class BatchStruct(Struct, forbid_unknown_fields=True):
    batch_id: Annotated[str, _bounds("Batch", "batch_id")]
    node: NodeStruct
    gpus: list[GpuStruct] = []
    samples: list[SampleStruct] = []
    events: list[EventStruct] = []
    # Adapter ports (telemetry.PortSample) are checked by pydantic only, as a MIG layout is: the
    # fast path declines a batch carrying any, and structs_of carries the validated ports here as
    # plain JSON (their ts as a UTC datetime).
    ports: list[dict[str, Any]] | None = None
