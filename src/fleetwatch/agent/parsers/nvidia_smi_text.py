"""``nvidia-smi -q`` (the indented text report) onto the canonical telemetry.

The report is a header (``Driver Version : 550.90.12``, ``Attached GPUs : 8``) and then one block
per GPU, opened by an unindented ``GPU 00000000:3B:00.0`` line. Inside a block, sections nest by
indentation and values are ``Key : Value`` lines. We flatten each block into normalised key paths
(``ECC Errors / Volatile / DRAM Correctable`` -> ``("eccerrors", "volatile", "dramcorrectable")``),
which for most sections are the paths of the XML report too, and read them with the rules in
:mod:`~fleetwatch.agent.parsers.smi_values`. Tested against R525 to R610 output.

As in the XML parser, ``index`` is the block's position (the NVML index, the "GPU" column of the
default table), not ``Minor Number``; MIG instances (the ``MIG devices`` section) are not readings
of their own: the parent GPU's values are reported once. The ``MIG Mode`` section becomes the
GPU's MIG identity when MIG is enabled; its MIG devices are not read from this format (no real
capture of them in the text report to test against), so the identity lists no instances.
"""

from __future__ import annotations

import re
from typing import Any

from fleetwatch.agent.parsers import GpuReading, ParseError
from fleetwatch.agent.parsers.smi_mig import mig_identity
from fleetwatch.agent.parsers.smi_values import (
    CLOCKS_EVENT_BITS,
    Flat,
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

__all__ = ["parse_nvidia_smi_text"]

_GPU_HEADER = re.compile(r"^GPU\s+([0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")

_IDENTITY = {
    "uuid": path("GPU UUID"),
    "serial": path("Serial Number"),
    "name": path("Product Name"),
    "vbios_version": path("VBIOS Version"),
}

# canonical field -> candidate key paths in a GPU block, as printed (normalised on import).
_VALUES = path_table(
    {
        "gpu_temp_c": ("Temperature/GPU Current Temp",),
        "memory_temp_c": ("Temperature/Memory Current Temp",),
        # "Power Draw" is NVML's power usage (a 1 s average from Ampere on), the value DCGM
        # reports; R590 prints it only as "Average Power Draw", so the instant value comes last.
        "power_w": (
            "Power Readings/Power Draw",
            "GPU Power Readings/Power Draw",
            "GPU Power Readings/Average Power Draw",
            "Power Readings/Average Power Draw",
            "GPU Power Readings/Instantaneous Power Draw",
            "Power Readings/Instantaneous Power Draw",
        ),
        # R535+ calls the enforced limit "Current" (R610 nests it under "GPU Ceiling Power
        # Limit"); plain "Power Limit" is the requested one, not what the GPU enforces.
        "power_limit_w": (
            "Power Readings/Enforced Power Limit",
            "GPU Power Readings/Current Power Limit",
            "GPU Power Readings/GPU Ceiling Power Limit/Current Power Limit",
            "GPU Power Readings/Enforced Power Limit",
        ),
        "sm_clock_mhz": ("Clocks/SM",),
        "mem_clock_mhz": ("Clocks/Memory",),
        "fan_speed_pct": ("Fan Speed",),
        "gpu_util_pct": ("Utilization/Gpu",),
        "mem_copy_util_pct": ("Utilization/Memory",),
        "fb_used_mib": ("FB Memory Usage/Used",),
        "fb_total_mib": ("FB Memory Usage/Total",),
        "pcie_link_gen": ("PCI/GPU Link Info/PCIe Generation/Current",),
        "pcie_link_width": ("PCI/GPU Link Info/Link Width/Current",),
        "pcie_replay_total": ("PCI/Replays Since Reset",),
        "retired_pages_sbe": ("Retired Pages/Single Bit ECC",),
        "retired_pages_dbe": ("Retired Pages/Double Bit ECC",),
        "retired_pages_pending": (
            "Retired Pages/Pending Page Retirement",
            "Retired Pages/Pending Page Blacklist",
            "Retired Pages/Pending",
        ),
        "remapped_rows_correctable": ("Remapped Rows/Correctable Error",),
        "remapped_rows_uncorrectable": ("Remapped Rows/Uncorrectable Error",),
        "remapped_rows_pending": ("Remapped Rows/Pending",),
        "remapped_rows_failure": ("Remapped Rows/Remapping Failure Occurred",),
        "gpu_recovery_action": ("GPU Recovery Action",),
    }
)

# R535 renamed "Clocks Throttle Reasons" to "Clocks Event Reasons". The HW thermal and power-brake
# lines are indented under "HW Slowdown" as if they were its children, so any depth counts.
_CLOCKS_SECTIONS = (path("Clocks Event Reasons"), path("Clocks Throttle Reasons"))
_REASONS = {norm_key(reason): reason for reason in CLOCKS_EVENT_BITS} | {
    "idle": "gpu_idle",
    "displayclocksetting": "display_clocks_setting",
}


def parse_nvidia_smi_text(text: str) -> list[GpuReading]:
    """Parse ``nvidia-smi -q`` output; raise :class:`ParseError` if it is something else."""
    header: dict[Path, str] = {}
    blocks: list[tuple[str, dict[Path, str]]] = []
    current = header
    stack: list[tuple[int, str]] = []
    for raw_line in text.splitlines():
        line = raw_line.expandtabs().rstrip()
        if not line:
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            stack = []
            match = _GPU_HEADER.match(line)
            # Any other unindented line ends the GPU block and belongs to the report's header.
            current = {} if match else header
            if match:
                blocks.append((match[1], current))
                continue
        key, colon, value = line.strip().partition(":")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, norm_key(key)))
        if colon:
            current.setdefault(tuple(name for _, name in stack), value.strip())
    if not blocks and path("Attached GPUs") not in header:
        hint = (
            "this is XML; use parse_nvidia_smi_xml"
            if text.lstrip().startswith("<")
            else "found no 'GPU 00000000:3B:00.0' block and no 'Attached GPUs' line"
        )
        raise ParseError(f"not `nvidia-smi -q` output: {hint}")
    # R610 deprecates "Driver Version" in favour of "KMD Version" (the kernel module's).
    driver_version = clean(header.get(path("KMD Version"))) or clean(
        header.get(path("Driver Version"))
    )
    return [
        _reading(flat, bus_id, position, driver_version)
        for position, (bus_id, flat) in enumerate(blocks)
    ]


def _reading(flat: Flat, bus_id: str, position: int, driver_version: str | None) -> GpuReading:
    values: dict[str, Any] = extract(flat, _VALUES)
    mask = clocks_event_bitmask(
        (_REASONS.get(key[-1], ""), raw)
        for key, raw in flat.items()
        if len(key) > 1 and key[:1] in _CLOCKS_SECTIONS
    )
    if mask is not None:
        values["clocks_event_reasons"] = mask
    values.update(ecc_values(flat))
    identity = build_identity(
        flat,
        _IDENTITY,
        index=position,
        driver_version=driver_version,
        pci_bus_ids=(flat.get(path("PCI/Bus Id")), bus_id),
    )
    out = GpuReading(identity=dict(identity), values=values)
    mig = mig_identity(flat.get(path("MIG Mode/Current")), flat.get(path("MIG Mode/Pending")))
    if mig is not None:
        out.identity["mig"] = mig
    return out
