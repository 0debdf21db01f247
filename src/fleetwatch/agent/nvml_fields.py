"""The NVML field table: which pynvml call yields which canonical field, read how.

Each :class:`_Probe` reads one or more canonical fields of one GPU through a :class:`_Device`, whose
:meth:`_Device.call` goes through the adapter (its lock and error mapping); this module never
imports ``pynvml`` nor, at import time, the adapter. Units, from the NVML API reference:

- nvmlDeviceGetPowerUsage, nvmlDeviceGetEnforcedPowerLimit: milliwatts; power_w = mW / 1000
- nvmlDeviceGetTotalEnergyConsumption: millijoules since the driver loaded; energy_mj as is
- nvmlDeviceGetViolationStatus: ``violationTime`` in nanoseconds; *_violation_us = ns // 1000
- nvmlDeviceGetMemoryInfo (v1): bytes, ``used`` counts driver-reserved memory; fb_*_mib = B / 2**20
- nvmlDeviceGetTemperature, field NVML_FI_DEV_MEMORY_TEMP (82): degrees Celsius
- nvmlDeviceGetRetiredPages: the list of retired page addresses; retired_pages_* = its length
- nvmlDeviceGetNvLinkErrorCounter: per link; nvlink_*_total = the sum over the active links
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

from fleetwatch.errors import CollectorError, DeviceLost, FieldNotSupported, NvmlUnavailable
from fleetwatch.telemetry import normalize_pci_bus_id

if TYPE_CHECKING:  # the adapter imports this module; it hands itself over in _Device.nvml
    from fleetwatch.agent.nvml import Nvml, NvmlLike

T = TypeVar("T")

# nvmlValueType_t → member of the c_nvmlValue_t union; fixed by the NVML ABI.
_VALUE_MEMBER = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
_MIB = 1024 * 1024


@dataclass
class _Device:
    """One GPU during one read; ``cache`` shares a result between probes (one NVML call)."""

    nvml: Nvml
    lib: NvmlLike
    handle: Any
    index: int
    uuid: str | None
    cache: dict[str, Any] = field(default_factory=dict)
    turned_off: list[tuple[tuple[str, ...], str]] = field(default_factory=list)
    # MIG (fleetwatch.agent.nvml_mig): on now; fields refused because of it this read; fields
    # refused under the MIG mode the GPU just left, to ask again.
    mig_on: bool = False
    absent_under_mig: list[str] = field(default_factory=list)
    refused_before_mig_change: set[str] = field(default_factory=set)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        return self.nvml._call(fn, *args, index=self.index, uuid=self.uuid)

    def once(self, key: str, compute: Callable[[], T]) -> T:
        if key not in self.cache:
            try:
                self.cache[key] = compute()
            except CollectorError as exc:
                self.cache[key] = exc
        value = self.cache[key]
        if isinstance(value, CollectorError):
            raise value
        return cast(T, value)


@dataclass(frozen=True)
class _Probe:
    """Canonical ``fields`` read by ``read``; ``needs`` names the pynvml attributes it uses."""

    fields: tuple[str, ...]
    needs: tuple[str, ...]
    read: Callable[[_Device], dict[str, Any]]


def _field_value(dev: _Device, const: str) -> Any:
    """One entry of a single nvmlDeviceGetFieldValues call for all field-value probes."""
    lib, off = dev.lib, dev.nvml.disabled.get(dev.uuid or "", set())

    def fetch() -> dict[int, Any]:
        ids = [getattr(lib, c) for f, c in _FIELD_IDS if f not in off and hasattr(lib, c)]
        return {e.fieldId: e for e in dev.call(lib.nvmlDeviceGetFieldValues, dev.handle, ids)}

    entry = dev.once("field_values", fetch)[getattr(lib, const)]
    if entry.nvmlReturn != lib.NVML_SUCCESS:
        raise dev.nvml._translate(
            lib.NVMLError(entry.nvmlReturn), lib.nvmlDeviceGetFieldValues, dev.index, dev.uuid
        )
    return getattr(entry.value, _VALUE_MEMBER[entry.valueType])


def _active_links(dev: _Device) -> list[int]:
    """Active NVLink links; the link count is found once, by asking until NVML refuses."""
    assert dev.uuid is not None
    lib, known = dev.lib, dev.nvml._link_counts.get(dev.uuid)
    active, count = [], 0
    for link in range(lib.NVML_NVLINK_MAX_LINKS if known is None else known):
        try:
            state = dev.call(lib.nvmlDeviceGetNvLinkState, dev.handle, link)
        except (DeviceLost, NvmlUnavailable):
            raise
        except CollectorError:
            if known is not None or link == 0:
                raise  # link 0 refused: this GPU has no NVLink (FieldNotSupported)
            break  # past this GPU's last link (NVML_ERROR_INVALID_ARGUMENT)
        count += 1
        if state == lib.NVML_FEATURE_ENABLED:
            active.append(link)
    dev.nvml._link_counts.setdefault(dev.uuid, count)
    return active


def _clock_reasons(dev: _Device) -> int:
    """nvmlDeviceGetCurrentClocksEventReasons (R535+), else the older ...ThrottleReasons."""
    assert dev.uuid is not None
    names = [
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
    ]
    chosen = dev.nvml._reason_fn.get(dev.uuid)
    error = FieldNotSupported("clocks_event_reasons", "no clocks event reasons in NVML")
    for name in [chosen] if chosen else [n for n in names if hasattr(dev.lib, n)]:
        try:
            value: int = dev.call(getattr(dev.lib, name), dev.handle)
        except FieldNotSupported as exc:
            error = exc
            continue
        dev.nvml._reason_fn[dev.uuid] = name
        return value
    raise error


def _pci_bus_id(dev: _Device) -> dict[str, Any]:
    raw = dev.call(dev.lib.nvmlDeviceGetPciInfo, dev.handle).busId
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    try:
        return {"pci_bus_id": normalize_pci_bus_id(text)}
    except ValueError:
        return {}


def _simple(
    name: str, fn: str, convert: Callable[[Any], Any] = lambda v: v, *consts: str
) -> _Probe:
    """A probe for one field from one call ``fn(handle, *consts)``."""

    def read(dev: _Device) -> dict[str, Any]:
        args = [getattr(dev.lib, c) for c in consts]
        return {name: convert(dev.call(getattr(dev.lib, fn), dev.handle, *args))}

    return _Probe((name,), (fn, *consts), read)


def _ecc(name: str, error_type: str, counter: str) -> _Probe:
    return _simple(name, "nvmlDeviceGetTotalEccErrors", int, error_type, counter)


def _nvlink(name: str, counter: str) -> _Probe:
    def read(dev: _Device) -> dict[str, Any]:
        links = dev.once("nvlink_links", lambda: _active_links(dev))
        fn, kind = dev.lib.nvmlDeviceGetNvLinkErrorCounter, getattr(dev.lib, counter)
        # No active link: no data, which is not the same as no errors.
        return {name: sum(dev.call(fn, dev.handle, link, kind) for link in links)} if links else {}

    return _Probe(
        (name,), ("nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkErrorCounter", counter), read
    )


def _field(name: str, const: str) -> _Probe:
    return _Probe(
        (name,),
        ("nvmlDeviceGetFieldValues", const),
        lambda dev: {name: int(_field_value(dev, const))},
    )


def _remapped(dev: _Device) -> dict[str, Any]:
    corr, unc, pending, failure = dev.call(dev.lib.nvmlDeviceGetRemappedRows, dev.handle)
    return {
        "remapped_rows_correctable": corr,
        "remapped_rows_uncorrectable": unc,
        "remapped_rows_pending": bool(pending),
        "remapped_rows_failure": bool(failure),
    }


def _utilization(dev: _Device) -> dict[str, Any]:
    util = dev.call(dev.lib.nvmlDeviceGetUtilizationRates, dev.handle)
    return {"gpu_util_pct": util.gpu, "mem_copy_util_pct": util.memory}


def _memory(dev: _Device) -> dict[str, Any]:
    mem = dev.call(dev.lib.nvmlDeviceGetMemoryInfo, dev.handle)
    return {"fb_used_mib": mem.used / _MIB, "fb_total_mib": mem.total / _MIB}


def _violation_us(viol: Any) -> int:
    return int(viol.violationTime) // 1000  # nvmlViolationTime_t.violationTime is in ns


_FIELD_IDS = (
    ("memory_temp_c", "NVML_FI_DEV_MEMORY_TEMP"),
    ("gpu_recovery_action", "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"),
)
_CORR, _UNC = "NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"
_VOL, _AGG = "NVML_VOLATILE_ECC", "NVML_AGGREGATE_ECC"
_SBE_CAUSE = "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS"
_DBE_CAUSE = "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR"
_IDENTITY_PROBES = (
    _simple("serial", "nvmlDeviceGetSerial"),
    _simple("name", "nvmlDeviceGetName"),
    _simple("vbios_version", "nvmlDeviceGetVbiosVersion"),
    _Probe(("pci_bus_id",), ("nvmlDeviceGetPciInfo",), _pci_bus_id),
)
_PROBES = (
    _simple("gpu_temp_c", "nvmlDeviceGetTemperature", int, "NVML_TEMPERATURE_GPU"),
    _field("memory_temp_c", "NVML_FI_DEV_MEMORY_TEMP"),
    _simple("power_w", "nvmlDeviceGetPowerUsage", lambda mw: mw / 1000),
    _simple("power_limit_w", "nvmlDeviceGetEnforcedPowerLimit", lambda mw: mw / 1000),
    _simple("energy_mj", "nvmlDeviceGetTotalEnergyConsumption", int),
    _simple("sm_clock_mhz", "nvmlDeviceGetClockInfo", int, "NVML_CLOCK_SM"),
    _simple("mem_clock_mhz", "nvmlDeviceGetClockInfo", int, "NVML_CLOCK_MEM"),
    _Probe(
        ("clocks_event_reasons",),
        (),
        lambda dev: {"clocks_event_reasons": _clock_reasons(dev)},
    ),
    _simple(
        "power_violation_us",
        "nvmlDeviceGetViolationStatus",
        _violation_us,
        "NVML_PERF_POLICY_POWER",
    ),
    _simple(
        "thermal_violation_us",
        "nvmlDeviceGetViolationStatus",
        _violation_us,
        "NVML_PERF_POLICY_THERMAL",
    ),
    _simple("fan_speed_pct", "nvmlDeviceGetFanSpeed", int),
    _Probe(("gpu_util_pct", "mem_copy_util_pct"), ("nvmlDeviceGetUtilizationRates",), _utilization),
    _Probe(("fb_used_mib", "fb_total_mib"), ("nvmlDeviceGetMemoryInfo",), _memory),
    _simple("pcie_link_gen", "nvmlDeviceGetCurrPcieLinkGeneration", int),
    _simple("pcie_link_width", "nvmlDeviceGetCurrPcieLinkWidth", int),
    _ecc("ecc_sbe_volatile_total", _CORR, _VOL),
    _ecc("ecc_dbe_volatile_total", _UNC, _VOL),
    _ecc("ecc_sbe_aggregate_total", _CORR, _AGG),
    _ecc("ecc_dbe_aggregate_total", _UNC, _AGG),
    _simple("retired_pages_sbe", "nvmlDeviceGetRetiredPages", len, _SBE_CAUSE),
    _simple("retired_pages_dbe", "nvmlDeviceGetRetiredPages", len, _DBE_CAUSE),
    _simple("retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus", bool),
    _Probe(
        (
            "remapped_rows_correctable",
            "remapped_rows_uncorrectable",
            "remapped_rows_pending",
            "remapped_rows_failure",
        ),
        ("nvmlDeviceGetRemappedRows",),
        _remapped,
    ),
    _nvlink("nvlink_crc_flit_errors_total", "NVML_NVLINK_ERROR_DL_CRC_FLIT"),
    _nvlink("nvlink_crc_data_errors_total", "NVML_NVLINK_ERROR_DL_CRC_DATA"),
    _nvlink("nvlink_replay_errors_total", "NVML_NVLINK_ERROR_DL_REPLAY"),
    _nvlink("nvlink_recovery_errors_total", "NVML_NVLINK_ERROR_DL_RECOVERY"),
    _simple("pcie_replay_total", "nvmlDeviceGetPcieReplayCounter", int),
    _field("gpu_recovery_action", "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"),
)
