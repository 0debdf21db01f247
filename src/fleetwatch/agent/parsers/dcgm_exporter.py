"""dcgm-exporter's Prometheus ``/metrics`` text, onto canonical GPU readings.

Three generations of metric names reach us and all map onto the same canonical fields:

* the classic ``DCGM_FI_DEV_GPU_TEMP`` spellings (dcgm-exporter 2.x to 4.x, still the default);
* DCGM 4.6's unit-suffixed renames (``DCGM_FI_DEV_GPU_TEMP_CELSIUS``,
  ``DCGM_FI_DEV_BOARD_POWER_WATTS``, ``DCGM_FI_DEV_ROW_REMAP_FAILED``, ...), which an exporter
  counters file may name;
* the legacy 1.x names (``dcgm_gpu_temp``, ``dcgm_power_usage``, ...) with a lower-case ``uuid``
  label.

The mapping itself, :func:`read_dcgm_samples`, takes samples from anywhere: the agent's scrape of
the exporter's text (:func:`parse_dcgm_scrape`) and the server's Prometheus remote write
(:mod:`fleetwatch.remote_write.readings`) both read dcgm-exporter's series through it, so the
two cannot map a name or a label differently.

Series are grouped into one :class:`GpuReading` per GPU, keyed by the ``UUID`` (or 1.x ``uuid``)
label, else by ``Hostname`` plus ``gpu`` index. A series with neither carries no GPU and is
dropped, so the unlabelled dummy series some fixtures hold never become fake GPUs.

MIG: series carrying ``GPU_I_ID`` / ``GPU_I_PROFILE`` are one GPU instance's copy of its parent
GPU's series. :mod:`~fleetwatch.agent.parsers.dcgm_mig` turns the copies into one whole-GPU
reading (whole-GPU fields taken once, per-instance ones such as framebuffer use left absent) and
the instances into the GPU's MIG identity (``identity["mig"]``). A whole-GPU series, when the
exporter also prints one, always wins over the copies.

``DCGM_FI_DEV_XID_ERRORS`` is the code of the *last* Xid DCGM saw, sticky until DCGM restarts,
not a count, so it is no sample field. :func:`parse_dcgm_scrape` returns it apart, as
``DcgmScrape.last_xid`` (GPU UUID to code; 0 means no Xid since DCGM started);
:func:`last_xids` is the shortcut. Kernel-log Xid events remain the source of truth for Xids.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from fleetwatch.agent.parsers import GpuReading, ParseError
from fleetwatch.agent.parsers.dcgm_mig import MigCopies
from fleetwatch.telemetry import SAMPLE_FIELDS, normalize_pci_bus_id

__all__ = [
    "DCGM_METRIC_NAMES",
    "DcgmSample",
    "DcgmScrape",
    "is_dcgm_metric",
    "last_xids",
    "parse_dcgm_exporter",
    "parse_dcgm_scrape",
    "read_dcgm_samples",
]

# Canonical field -> source metric names, best first: when one GPU exposes several, the first
# listed wins. Units are the canonical ones already (DCGM reports mJ, MiB, MHz, W, C, %).
# DCGM_FI_DEV_GPU_UTIL_RATIO is left out on purpose: DCGM 4.6 gave that name to field 203 (an
# integer percent) and 4.7 to a new field 1613 (a 0-1 ratio), so the name alone does not fix
# the scale. The violation counters are microseconds per dcgm_fields.h (some CSVs say ns).
_SOURCES: dict[str, tuple[str, ...]] = {
    "gpu_temp_c": ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_TEMP_CELSIUS", "dcgm_gpu_temp"),
    "memory_temp_c": (
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS",
        "dcgm_memory_temp",
    ),
    "power_w": ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_BOARD_POWER_WATTS", "dcgm_power_usage"),
    "power_limit_w": (
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        "DCGM_FI_DEV_BOARD_POWER_LIMIT_REQUESTED_WATTS",
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        "DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS",
    ),
    "energy_mj": ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "dcgm_total_energy_consumption"),
    "sm_clock_mhz": ("DCGM_FI_DEV_SM_CLOCK", "dcgm_sm_clock"),
    "mem_clock_mhz": ("DCGM_FI_DEV_MEM_CLOCK", "dcgm_memory_clock"),
    "clocks_event_reasons": (
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    ),
    "power_violation_us": ("DCGM_FI_DEV_POWER_VIOLATION", "dcgm_power_violation"),
    "thermal_violation_us": ("DCGM_FI_DEV_THERMAL_VIOLATION", "dcgm_thermal_violation"),
    "fan_speed_pct": ("DCGM_FI_DEV_FAN_SPEED",),
    "gpu_util_pct": ("DCGM_FI_DEV_GPU_UTIL", "dcgm_gpu_utilization"),
    "mem_copy_util_pct": ("DCGM_FI_DEV_MEM_COPY_UTIL", "dcgm_mem_copy_utilization"),
    "fb_used_mib": ("DCGM_FI_DEV_FB_USED", "dcgm_fb_used"),
    "fb_total_mib": ("DCGM_FI_DEV_FB_TOTAL",),
    "pcie_link_gen": ("DCGM_FI_DEV_PCIE_LINK_GEN",),
    "pcie_link_width": ("DCGM_FI_DEV_PCIE_LINK_WIDTH",),
    "ecc_sbe_volatile_total": ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "dcgm_ecc_sbe_volatile_total"),
    "ecc_dbe_volatile_total": ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "dcgm_ecc_dbe_volatile_total"),
    "ecc_sbe_aggregate_total": ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "dcgm_ecc_sbe_aggregate_total"),
    "ecc_dbe_aggregate_total": ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "dcgm_ecc_dbe_aggregate_total"),
    "retired_pages_sbe": (
        "DCGM_FI_DEV_RETIRED_SBE",
        "DCGM_FI_DEV_PAGE_RETIRED_SBE_TOTAL",
        "dcgm_retired_pages_sbe",
    ),
    "retired_pages_dbe": (
        "DCGM_FI_DEV_RETIRED_DBE",
        "DCGM_FI_DEV_PAGE_RETIRED_DBE_TOTAL",
        "dcgm_retired_pages_dbe",
    ),
    "retired_pages_pending": (
        "DCGM_FI_DEV_RETIRED_PENDING",
        "DCGM_FI_DEV_PAGE_RETIRED_PENDING",
        "dcgm_retired_pages_pending",
    ),
    "remapped_rows_correctable": (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL",
    ),
    "remapped_rows_uncorrectable": (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL",
    ),
    "remapped_rows_pending": ("DCGM_FI_DEV_ROW_REMAP_PENDING",),
    "remapped_rows_failure": ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_FAILED"),
    "nvlink_crc_flit_errors_total": (
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL",
        "dcgm_nvlink_flit_crc_error_count_total",
    ),
    "nvlink_crc_data_errors_total": (
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL",
        "dcgm_nvlink_data_crc_error_count_total",
    ),
    "nvlink_replay_errors_total": (
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL",
        "dcgm_nvlink_replay_error_count_total",
    ),
    "nvlink_recovery_errors_total": (
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL",
        "dcgm_nvlink_recovery_error_count_total",
    ),
    "pcie_replay_total": (
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_PCIE_REPLAY_TOTAL",
        "dcgm_pcie_replay_counter",
    ),
    "gpu_recovery_action": (
        "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION",
        "DCGM_FI_DEV_GPU_RECOVERY_ACTION",
    ),
}

_XID_METRICS = frozenset({"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERROR", "dcgm_xid_errors"})

# Identity key -> labels that carry it, best first.
_IDENTITY_LABELS: dict[str, tuple[str, ...]] = {
    "uuid": ("UUID", "uuid"),
    "pci_bus_id": ("pci_bus_id",),
    "serial": ("DCGM_FI_DEV_SERIAL",),
    "name": ("modelName", "DCGM_FI_DEV_NAME"),
    "driver_version": ("DCGM_FI_DRIVER_VERSION",),
    "vbios_version": ("DCGM_FI_DEV_VBIOS_VERSION",),
}

_MIG_LABELS = ("GPU_I_ID", "GPU_I_PROFILE")
_GI_ID = re.compile(r"^[0-9]{1,5}$")

# GpuSample types these gauges as strict int, so a float would be refused at ingest.
_INT_GAUGES = frozenset({"pcie_link_gen", "pcie_link_width", "gpu_recovery_action"})

_KIND = {spec.name: spec.kind for spec in SAMPLE_FIELDS}
_METRIC_FIELD: dict[str, tuple[str, int]] = {
    metric: (name, rank)
    for name, metrics in _SOURCES.items()
    for rank, metric in enumerate(metrics)
}


@dataclass(frozen=True)
class DcgmScrape:
    """Everything FleetWatch reads from one scrape."""

    readings: list[GpuReading]
    last_xid: dict[str, int]  # GPU UUID -> code of the last Xid (0: none since DCGM started)
    ignored_metrics: frozenset[str]  # metric names with no canonical meaning, for debugging


@dataclass(frozen=True)
class DcgmSample:
    """One sample of one series: the names it may go by (from text, a counter is known by its
    sample and its family name), its labels and its value."""

    names: tuple[str, ...]
    labels: Mapping[str, str]
    value: float


DCGM_METRIC_NAMES = frozenset(_METRIC_FIELD) | _XID_METRICS
"""Every dcgm-exporter series name FleetWatch reads (all spellings of every generation)."""


def is_dcgm_metric(name: str) -> bool:
    """Whether FleetWatch reads the series ``name`` (a reading or the last Xid)."""
    return name in _METRIC_FIELD or name in _XID_METRICS


@dataclass
class _Gpu:
    reading: GpuReading = field(default_factory=GpuReading)
    ranks: dict[str, int] = field(default_factory=dict)
    mig: MigCopies = field(default_factory=MigCopies)


def parse_dcgm_exporter(text: str) -> list[GpuReading]:
    """One reading per GPU in a dcgm-exporter scrape, in order of first appearance."""
    return parse_dcgm_scrape(text).readings


def last_xids(text: str) -> dict[str, int]:
    """GPU UUID -> code of the last Xid DCGM saw (0: none), from a dcgm-exporter scrape."""
    return parse_dcgm_scrape(text).last_xid


def parse_dcgm_scrape(text: str) -> DcgmScrape:
    """Parse a scrape into readings, last-Xid codes and the names of metrics it ignored.

    Raises :class:`ParseError` (with the line number) for text that is not Prometheus
    exposition format.
    """
    return read_dcgm_samples(_samples(text))


def read_dcgm_samples(samples: Iterable[DcgmSample]) -> DcgmScrape:
    """Readings, last-Xid codes and ignored metric names from the samples of one scrape."""
    gpus: dict[tuple[str, str], _Gpu] = {}
    last_xid: dict[str, int] = {}
    ignored: set[str] = set()
    for sample in samples:
        labels, value, names = sample.labels, sample.value, sample.names
        key = _gpu_key(labels)
        if key is None:
            continue
        gpu = gpus.setdefault(key, _Gpu())
        _merge_identity(gpu.reading.identity, labels)
        instance = _gpu_instance(labels)
        if instance is None and any(label in labels for label in _MIG_LABELS):
            continue  # a MIG label without a usable instance id: nothing to file it under
        if instance is not None:
            gpu.mig.note_instance(instance, labels.get("GPU_I_PROFILE") or None)
        if any(name in _XID_METRICS for name in names):
            uuid = gpu.reading.identity.get("uuid")
            if uuid is not None and math.isfinite(value):
                if instance is None:
                    last_xid.setdefault(uuid, int(value))
                else:
                    gpu.mig.xids.append((instance, int(value)))
            continue
        mapped = next((_METRIC_FIELD[n] for n in names if n in _METRIC_FIELD), None)
        if mapped is None:
            ignored.add(names[-1])
            continue
        converted = _convert(mapped[0], value)
        if converted is None:
            continue
        if instance is None:
            _set_value(gpu, *mapped, converted)
        else:
            gpu.mig.add(*mapped, instance, converted)
    for gpu in gpus.values():
        _fold_mig_copies(gpu, last_xid)
    readings = [gpu.reading for gpu in gpus.values()]
    return DcgmScrape(readings, last_xid, frozenset(ignored))


def _gpu_instance(labels: Mapping[str, str]) -> int | None:
    gi = labels.get("GPU_I_ID", "")
    return int(gi) if _GI_ID.match(gi) else None


def _fold_mig_copies(gpu: _Gpu, last_xid: dict[str, int]) -> None:
    """Whole-GPU values the GPU's own series lacked, from its instances' copies; its MIG
    identity from its instances."""
    for name, value in gpu.mig.whole_gpu_values().items():
        gpu.reading.values.setdefault(name, value)
    uuid, xid = gpu.reading.identity.get("uuid"), gpu.mig.last_xid()
    if uuid is not None and xid is not None:
        last_xid.setdefault(uuid, xid)
    mig = gpu.mig.identity()
    if mig is not None:
        gpu.reading.identity["mig"] = mig


def _samples(text: str) -> Iterable[DcgmSample]:
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise ParseError(
            f"not Prometheus exposition format ({exc})", line_number=_bad_line(text)
        ) from exc
    for family in families:
        for sample in family.samples:
            # prometheus_client appends "_total" to counters that lack it and strips a trailing
            # "_total" from the family name, so the name as exposed is one of the two (the
            # family's last: an ignored counter is named by it).
            names = (sample.name, family.name) if family.type == "counter" else (sample.name,)
            # Not float(): the parser keeps integers exact, which large counters need.
            yield DcgmSample(names, sample.labels, sample.value)


def _bad_line(text: str) -> int | None:
    """The first line the Prometheus parser refuses on its own (its errors carry no position)."""
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            list(text_string_to_metric_families(line))
        except ValueError:
            return number
    return None


def _gpu_key(labels: Mapping[str, str]) -> tuple[str, str] | None:
    uuid = labels.get("UUID") or labels.get("uuid")
    if uuid:
        return ("uuid", uuid)
    index = labels.get("gpu")
    if index:
        return ("index", f"{labels.get('Hostname', '')}/{index}")
    return None


def _merge_identity(identity: dict[str, Any], labels: Mapping[str, str]) -> None:
    for key, label_names in _IDENTITY_LABELS.items():
        if key in identity:
            continue
        value = next((labels[n] for n in label_names if labels.get(n)), None)
        if value is None:
            continue
        if key == "pci_bus_id":
            try:
                value = normalize_pci_bus_id(value)
            except ValueError:
                continue  # a malformed label is no identity; the GPU keeps its other keys
        identity[key] = value
    index = labels.get("gpu", "")
    if "index" not in identity and index.isdigit():
        identity["index"] = int(index)


def _convert(name: str, value: float) -> float | int | bool | None:
    """The value in ``name``'s canonical type; ``None`` for NaN/Inf, which mean "no reading"."""
    if not math.isfinite(value):
        return None
    kind = _KIND[name]
    if kind == "flag":
        return value != 0
    if kind in ("counter", "bitmask") or name in _INT_GAUGES:
        # Counters arrive as floats, sometimes in scientific notation (7.824041e+06).
        return round(value)
    return float(value)


def _set_value(gpu: _Gpu, name: str, rank: int, value: float | int | bool) -> None:
    if name in gpu.ranks and gpu.ranks[name] <= rank:
        return
    gpu.reading.values[name] = value
    gpu.ranks[name] = rank
