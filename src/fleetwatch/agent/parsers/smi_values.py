"""What the nvidia-smi XML (``-q -x``) and text (``-q``) parsers share.

Both formats print the same values in the same way ("45 C", "312.50 W", "[N/A]"). Once their keys
are normalised with :func:`norm_key` (``gpu_power_readings`` and ``GPU Power Readings`` both become
``gpupowerreadings``), their section layouts mostly coincide too. So each parser only flattens its
input into a :data:`Flat` mapping and keeps its own path table; the value rules live here, once.

A value nvidia-smi could not read is *absent*, never 0: "N/A", "[Not Supported]", "[Unknown
Error]", an empty element, a unit we cannot convert, all give ``None``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from fleetwatch.telemetry import SAMPLE_FIELDS, normalize_pci_bus_id

__all__ = [
    "CLOCKS_EVENT_BITS",
    "Flat",
    "Path",
    "build_identity",
    "clean",
    "clocks_event_bitmask",
    "convert",
    "count",
    "ecc_totals",
    "ecc_values",
    "extract",
    "norm_key",
    "path",
    "path_table",
]

Path = tuple[str, ...]
Flat = Mapping[Path, str]
"""One GPU's printed values: normalised key path (from the GPU's root) -> raw text."""

Value = float | int | bool
Identity = dict[str, str | int]

# NVML's nvmlClocksEventReason* bits (nvml.h), so the mask equals DCGM_FI_DEV_CLOCKS_EVENT_REASONS.
CLOCKS_EVENT_BITS: Mapping[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clocks_setting": 0x100,
}

# nvmlGpuRecoveryAction_t, keyed by what nvidia-smi prints (normalised).
_RECOVERY_ACTIONS: Mapping[str, int] = {
    "none": 0,
    "gpureset": 1,
    "reset": 1,
    "nodereboot": 2,
    "reboot": 2,
    "drainp2p": 3,
    "drainandreset": 4,
}

# Placeholders nvidia-smi prints instead of a value. Anything in [brackets] is one too ("[N/A]",
# "[GPU requires reset]"), and so are serials redacted by whoever shared the capture.
_ABSENT = frozenset(
    {
        "",
        "n/a",
        "na",
        "not supported",
        "not available",
        "unknown",
        "unknown error",
        "insufficient permissions",
        "gpu is lost",
        "requested functionality has been deprecated",
        "redacted",
    }
)

_NOTE = re.compile(r"\s+\[[^\]]*\]$")
_QUANTITY = re.compile(r"^([-+]?\d+(?:\.\d+)?)\s*([A-Za-z%]*)$")
_INTEGER = re.compile(r"^\d+$")

# Accepted printed units per canonical unit (from SAMPLE_FIELDS), with the factor to convert.
# A unit not listed makes the value absent rather than silently wrong.
_SCALES: Mapping[str, Mapping[str, float]] = {
    "celsius": {"": 1.0, "c": 1.0},
    "watts": {"": 1.0, "w": 1.0, "mw": 1e-3, "kw": 1e3},
    "megahertz": {"": 1.0, "mhz": 1.0, "khz": 1e-3, "ghz": 1e3},
    "mebibytes": {"": 1.0, "mib": 1.0, "kib": 1 / 1024, "gib": 1024.0},
    "percent": {"": 1.0, "%": 1.0},
    "generation": {"": 1.0},
    "lanes": {"": 1.0, "x": 1.0},
}
_INTEGER_UNITS = frozenset({"generation", "lanes"})
_SPECS = {spec.name: spec for spec in SAMPLE_FIELDS}


def norm_key(key: str) -> str:
    """``"SRAM Uncorrectable SEC-DED"`` and ``sram_uncorrectable_secded`` -> one key."""
    return re.sub(r"[^a-z0-9]", "", key.lower())


def path(spec: str) -> Path:
    """``"gpu_power_readings/power_draw"`` -> a normalised :data:`Path`."""
    return tuple(norm_key(part) for part in spec.split("/"))


def path_table(table: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[Path, ...]]:
    """Compile a parser's ``field -> candidate paths`` table, rejecting non-canonical names."""
    unknown = sorted(set(table) - set(_SPECS))
    if unknown:
        raise ValueError(f"not canonical sample fields (see telemetry.SAMPLE_FIELDS): {unknown}")
    return {field: tuple(path(p) for p in paths) for field, paths in table.items()}


def clean(raw: str | None) -> str | None:
    """The printed text with whitespace collapsed, or ``None`` for a placeholder."""
    if raw is None:
        return None
    text = " ".join(raw.split())
    if text.startswith("[") and text.endswith("]"):
        return None
    # R610 appends notes: "610.57.04 [Deprecated; will be removed in CUDA 14.0. Use KMD ...]".
    text = _NOTE.sub("", text)
    return None if text.lower() in _ABSENT else text


def count(raw: str | None) -> int | None:
    """A printed non-negative integer (an error counter), or ``None``."""
    text = clean(raw)
    return int(text) if text is not None and _INTEGER.match(text) else None


def _flag(text: str) -> bool | None:
    return {"yes": True, "no": False, "true": True, "false": False}.get(text.lower())


def convert(field: str, raw: str | None) -> Value | None:
    """Turn one printed value into ``field``'s canonical unit and type, or ``None``."""
    text = clean(raw)
    if text is None:
        return None
    spec = _SPECS[field]
    if spec.kind == "flag":
        return _flag(text)
    if spec.kind == "counter":
        return count(text)
    if field == "gpu_recovery_action":
        return _RECOVERY_ACTIONS.get(norm_key(text))
    match = _QUANTITY.match(text)
    factor = _SCALES.get(spec.unit, {}).get(match[2].lower()) if match else None
    if match is None or factor is None:
        return None
    value = float(match[1]) * factor
    if spec.unit in _INTEGER_UNITS:
        return int(value) if value.is_integer() else None
    return value


def extract(flat: Flat, table: Mapping[str, tuple[Path, ...]]) -> dict[str, Value]:
    """Every field of ``table`` whose first readable candidate path ``flat`` has."""
    values: dict[str, Value] = {}
    for field, candidates in table.items():
        for candidate in candidates:
            value = convert(field, flat.get(candidate))
            if value is not None:
                values[field] = value
                break
    return values


def clocks_event_bitmask(flags: Iterable[tuple[str, str]]) -> int | None:
    """OR the NVML bits of the ``(reason, "Active" | "Not Active")`` pairs.

    ``None`` when no pair was readable: a missing section is no data, not "nothing throttles".
    Reasons not in :data:`CLOCKS_EVENT_BITS` (future drivers) are ignored.
    """
    mask: int | None = None
    for reason, raw in flags:
        state = (clean(raw) or "").lower()
        if reason not in CLOCKS_EVENT_BITS or state not in ("active", "not active"):
            continue
        mask = (mask or 0) | (CLOCKS_EVENT_BITS[reason] if state == "active" else 0)
    return mask


_SRAM_UNCORRECTABLE_SPLIT = ("sram_uncorrectable_parity", "sram_uncorrectable_secded")


def _count(flat: Flat, block: Path, *names: str) -> int | None:
    return count(flat.get((*block, *(norm_key(name) for name in names))))


def _sum(parts: Iterable[int | None]) -> int | None:
    present = [part for part in parts if part is not None]
    return sum(present) if present else None


def ecc_values(flat: Flat) -> dict[str, int]:
    """The four canonical ECC totals, from ``ECC Errors`` (text) or ``<ecc_errors>`` (XML)."""
    values: dict[str, int] = {}
    for block in ("volatile", "aggregate"):
        sbe, dbe = ecc_totals(flat, ("eccerrors", block))
        if sbe is not None:
            values[f"ecc_sbe_{block}_total"] = sbe
        if dbe is not None:
            values[f"ecc_dbe_{block}_total"] = dbe
    return values


def ecc_totals(flat: Flat, block: Path) -> tuple[int | None, int | None]:
    """``(correctable, uncorrectable)`` totals of one ECC block (volatile or aggregate).

    Pre-Ampere drivers print ``single_bit``/``double_bit`` groups with their own ``total``; those
    totals are used as printed. Newer drivers print only SRAM and DRAM counts, whose sum is what
    NVML's ``nvmlDeviceGetTotalEccErrors`` (and so DCGM's ``*_TOTAL``) reports; SRAM uncorrectable
    is split into parity and SEC-DED from R550 on, and those replace the single SRAM count rather
    than adding to it. Parts printed as N/A are left out of the sum; all N/A gives ``None``.
    """
    sbe = _count(flat, block, "single_bit", "total")
    dbe = _count(flat, block, "double_bit", "total")
    if sbe is None:
        sbe = _sum(_count(flat, block, name) for name in ("sram_correctable", "dram_correctable"))
    if dbe is None:
        split = _sum(_count(flat, block, name) for name in _SRAM_UNCORRECTABLE_SPLIT)
        sram = split if split is not None else _count(flat, block, "sram_uncorrectable")
        dbe = _sum((sram, _count(flat, block, "dram_uncorrectable")))
    return sbe, dbe


def build_identity(
    flat: Flat,
    table: Mapping[str, Path],
    *,
    index: int,
    driver_version: str | None,
    pci_bus_ids: Iterable[str | None],
) -> Identity:
    """The identity keys printed for one GPU; ``pci_bus_id`` from the first well-formed one."""
    identity: Identity = {"index": index}
    for key, source in table.items():
        value = clean(flat.get(source))
        if value is not None:
            identity[key] = value
    if driver_version is not None:
        identity["driver_version"] = driver_version
    for raw in pci_bus_ids:
        bus_id = clean(raw)
        if bus_id is None:
            continue
        try:
            identity["pci_bus_id"] = normalize_pci_bus_id(bus_id)
        except ValueError:
            continue
        break
    return identity
