"""``nvidia-smi -q -x`` (XML) onto the canonical telemetry.

One :class:`GpuReading` per ``<gpu>`` element, in document order. Tested against DTD v11 (R510),
v12 (R525-R570) and v13 (R595) output and an R418 file without a DOCTYPE; elements moved or renamed
between versions are listed as alternatives in :data:`_VALUES`, first readable one wins.

MIG: with MIG mode on, the ``<gpu>`` keeps the whole-GPU values (temperature, power, ECC), which
are read once as for any GPU; its ``<mig_mode>`` and ``<mig_devices>`` (index, GPU and compute
instance ids) become the GPU's MIG identity (``identity["mig"]``, see
:mod:`~fleetwatch.agent.parsers.smi_mig`); each device's own memory use is not the GPU's and is
left out.

``index`` is the ``<gpu>``'s position, which is the NVML index nvidia-smi enumerates by (the "GPU"
column of its table and DCGM's ``gpu`` label). ``<minor_number>`` is the ``/dev/nvidiaN`` number and
differs from it on many nodes, so it is not used.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from fleetwatch.agent.parsers import GpuReading, ParseError
from fleetwatch.agent.parsers.smi_mig import mig_identity
from fleetwatch.agent.parsers.smi_values import (
    CLOCKS_EVENT_BITS,
    Path,
    build_identity,
    clean,
    clocks_event_bitmask,
    ecc_values,
    extract,
    norm_key,
    path,
    path_table,
)

__all__ = ["parse_nvidia_smi_xml"]

_IDENTITY = {
    "uuid": path("uuid"),
    "serial": path("serial"),
    "name": path("product_name"),
    "vbios_version": path("vbios_version"),
}

# canonical field -> candidate element paths under <gpu>, the first readable one wins.
_VALUES = path_table(
    {
        "gpu_temp_c": ("temperature/gpu_temp",),
        "memory_temp_c": ("temperature/memory_temp",),
        # power_draw is NVML's nvmlDeviceGetPowerUsage (a 1 s average from Ampere on), the value
        # DCGM reports; v13 drivers print it only as average_power_draw, so instant comes last.
        "power_w": (
            "power_readings/power_draw",
            "gpu_power_readings/power_draw",
            "gpu_power_readings/average_power_draw",
            "power_readings/average_power_draw",
            "gpu_power_readings/instant_power_draw",
            "power_readings/instant_power_draw",
        ),
        # v12+ calls the enforced limit "current"; power_limit (the requested one) is not it.
        "power_limit_w": (
            "power_readings/enforced_power_limit",
            "gpu_power_readings/current_power_limit",
            "gpu_power_readings/enforced_power_limit",
        ),
        "sm_clock_mhz": ("clocks/sm_clock",),
        "mem_clock_mhz": ("clocks/mem_clock",),
        "fan_speed_pct": ("fan_speed",),
        "gpu_util_pct": ("utilization/gpu_util",),
        "mem_copy_util_pct": ("utilization/memory_util",),
        "fb_used_mib": ("fb_memory_usage/used",),
        "fb_total_mib": ("fb_memory_usage/total",),
        "pcie_link_gen": ("pci/pci_gpu_link_info/pcie_gen/current_link_gen",),
        "pcie_link_width": ("pci/pci_gpu_link_info/link_widths/current_link_width",),
        "pcie_replay_total": ("pci/replay_counter",),
        "retired_pages_sbe": ("retired_pages/multiple_single_bit_retirement/retired_count",),
        "retired_pages_dbe": ("retired_pages/double_bit_retirement/retired_count",),
        "retired_pages_pending": (
            "retired_pages/pending_retirement",
            "retired_pages/pending_blacklist",
        ),
        "remapped_rows_correctable": ("remapped_rows/remapped_row_corr",),
        "remapped_rows_uncorrectable": ("remapped_rows/remapped_row_unc",),
        "remapped_rows_pending": ("remapped_rows/remapped_row_pending",),
        "remapped_rows_failure": ("remapped_rows/remapped_row_failure",),
        "gpu_recovery_action": ("gpu_recovery_action",),
    }
)

# R535 renamed <clocks_throttle_reasons> to <clocks_event_reasons>, and each child's prefix with it.
_CLOCKS_SECTIONS = {
    "clocks_event_reasons": "clocks_event_reason_",
    "clocks_throttle_reasons": "clocks_throttle_reason_",
}
_REASONS = {norm_key(reason): reason for reason in CLOCKS_EVENT_BITS}

# Subtrees that are long and carry nothing canonical (or, for MIG, nothing of the parent GPU's).
_SKIP = frozenset({"migdevices", "processes", "accountedprocesses", "supportedclocks"})


def parse_nvidia_smi_xml(text: str) -> list[GpuReading]:
    """Parse ``nvidia-smi -q -x`` output; raise :class:`ParseError` if it is something else."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as err:
        line, column = err.position
        raise ParseError(
            f"not valid XML (column {column}): {err}; expected `nvidia-smi -q -x` output",
            line_number=line,
        ) from err
    if root.tag != "nvidia_smi_log":
        raise ParseError(
            f"XML root is <{root.tag}>, not <nvidia_smi_log>; expected `nvidia-smi -q -x` output"
        )
    # R610 deprecates driver_version in favour of kmd_version (the kernel module's).
    driver_version = clean(root.findtext("kmd_version")) or clean(root.findtext("driver_version"))
    return [
        _reading(gpu, position, driver_version) for position, gpu in enumerate(root.findall("gpu"))
    ]


def _flatten(element: ET.Element, prefix: Path, into: dict[Path, str]) -> None:
    for child in element:
        key = (*prefix, norm_key(child.tag))
        if len(child):
            if key[-1] not in _SKIP:
                _flatten(child, key, into)
        else:
            into.setdefault(key, child.text or "")


def _reading(gpu: ET.Element, position: int, driver_version: str | None) -> GpuReading:
    flat: dict[Path, str] = {}
    _flatten(gpu, (), flat)
    values: dict[str, Any] = extract(flat, _VALUES)
    mask = _clocks_event_reasons(gpu)
    if mask is not None:
        values["clocks_event_reasons"] = mask
    values.update(ecc_values(flat))
    identity = build_identity(
        flat,
        _IDENTITY,
        index=position,
        driver_version=driver_version,
        pci_bus_ids=(flat.get(path("pci/pci_bus_id")), gpu.get("id")),
    )
    out = GpuReading(identity=dict(identity), values=values)
    mig = mig_identity(
        gpu.findtext("mig_mode/current_mig"),
        gpu.findtext("mig_mode/pending_mig"),
        (
            {key: device.findtext(key) for key in _MIG_DEVICE_KEYS}
            for device in gpu.iterfind("mig_devices/mig_device")
        ),
    )
    if mig is not None:
        out.identity["mig"] = mig
    return out


_MIG_DEVICE_KEYS = ("index", "gpu_instance_id", "compute_instance_id")


def _clocks_event_reasons(gpu: ET.Element) -> int | None:
    for section, prefix in _CLOCKS_SECTIONS.items():
        element = gpu.find(section)
        if element is not None:
            return clocks_event_bitmask(
                (_REASONS.get(norm_key(child.tag.removeprefix(prefix)), ""), child.text or "")
                for child in element
            )
    return None
