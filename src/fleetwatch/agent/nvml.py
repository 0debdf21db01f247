"""NVML through nvidia-ml-py: the one module that imports ``pynvml``, and only in :meth:`Nvml.open`.

:class:`Nvml` wraps a pynvml-like module (the real one, or :class:`fleetwatch.testing.FakePynvml`)
and reads every canonical field NVML offers for every GPU. Units, from the NVML API reference:

- nvmlDeviceGetPowerUsage, nvmlDeviceGetEnforcedPowerLimit: milliwatts; power_w = mW / 1000
- nvmlDeviceGetTotalEnergyConsumption: millijoules since the driver loaded; energy_mj as is
- nvmlDeviceGetViolationStatus: ``violationTime`` in nanoseconds; *_violation_us = ns // 1000
- nvmlDeviceGetMemoryInfo (v1): bytes, ``used`` counts driver-reserved memory; fb_*_mib = B / 2**20
- nvmlDeviceGetTemperature, field NVML_FI_DEV_MEMORY_TEMP (82): degrees Celsius
- nvmlDeviceGetRetiredPages: the list of retired page addresses; retired_pages_* = its length
- nvmlDeviceGetNvLinkErrorCounter: per link; nvlink_*_total = the sum over the active links

NVMLError codes map onto our errors; any other code is a plain :class:`CollectorError`: that field
is absent from this sample, counted, and asked again next time::

    UNINITIALIZED DRIVER_NOT_LOADED LIBRARY_NOT_FOUND LIB_RM_VERSION_MISMATCH  NvmlUnavailable
    GPU_IS_LOST GPU_NOT_FOUND UNKNOWN RESET_REQUIRED                           DeviceLost
    NOT_SUPPORTED FUNCTION_NOT_FOUND NO_PERMISSION                             FieldNotSupported

A field a GPU does not offer is turned off for that GPU, with one WARNING, and never asked again;
a field this nvidia-ml-py lacks is turned off for all GPUs at :meth:`Nvml.open`, with one WARNING.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar, cast

from pydantic import BaseModel, ValidationError

from fleetwatch.errors import CollectorError, DeviceLost, FieldNotSupported, NvmlUnavailable
from fleetwatch.telemetry import Event, GpuIdentity, GpuSample, normalize_pci_bus_id

__all__ = ["COLLECTOR", "LostGpu", "Nvml", "NvmlLike", "NvmlRead"]

logger = logging.getLogger(__name__)

COLLECTOR = "nvml"
T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

# pynvml keeps process-wide state (library handle, init refcount), so every adapter shares one
# lock; every NVML call holds it, except the blocking nvmlEventSetWait_v2 (see Nvml._wait).
_LOCK = threading.Lock()

_UNAVAILABLE = (
    "UNINITIALIZED",
    "DRIVER_NOT_LOADED",
    "LIBRARY_NOT_FOUND",
    "LIB_RM_VERSION_MISMATCH",
)
_LOST = ("GPU_IS_LOST", "GPU_NOT_FOUND", "UNKNOWN", "RESET_REQUIRED")
_UNSUPPORTED = ("NOT_SUPPORTED", "FUNCTION_NOT_FOUND", "NO_PERMISSION")
# nvmlValueType_t → member of the c_nvmlValue_t union; fixed by the NVML ABI.
_VALUE_MEMBER = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
_MIB = 1024 * 1024
_EVENT_KINDS = (  # event type constant, Event.kind, message
    ("nvmlEventTypeXidCriticalError", "xid", "NVML Xid critical error event"),
    ("nvmlEventTypeDoubleBitEccError", "ecc_dbe", "NVML double-bit ECC error event"),
    ("nvmlEventTypeSingleBitEccError", "ecc_sbe", "NVML single-bit ECC error event"),
)


class NvmlLike(Protocol):
    """The part of ``pynvml`` FleetWatch uses: same names, parameters and constants."""

    @property
    def NVMLError(self) -> type[Exception]: ...

    NVML_SUCCESS: int
    NVML_ERROR_TIMEOUT: int
    NVML_FEATURE_ENABLED: int
    NVML_TEMPERATURE_GPU: int
    NVML_CLOCK_SM: int
    NVML_CLOCK_MEM: int
    NVML_PERF_POLICY_POWER: int
    NVML_PERF_POLICY_THERMAL: int
    NVML_MEMORY_ERROR_TYPE_CORRECTED: int
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED: int
    NVML_VOLATILE_ECC: int
    NVML_AGGREGATE_ECC: int
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS: int
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: int
    NVML_NVLINK_MAX_LINKS: int
    NVML_FI_DEV_MEMORY_TEMP: int

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str: ...
    def nvmlDeviceGetSerial(self, handle: Any) -> str: ...
    def nvmlDeviceGetName(self, handle: Any) -> str: ...
    def nvmlDeviceGetVbiosVersion(self, handle: Any) -> str: ...
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...
    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list[int]) -> Sequence[Any]: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int: ...
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int: ...
    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int: ...
    def nvmlDeviceGetViolationStatus(self, device: Any, perfPolicyType: int) -> Any: ...
    def nvmlDeviceGetFanSpeed(self, handle: Any) -> int: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any: ...
    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int: ...
    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int: ...
    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int: ...
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int: ...
    def nvmlDeviceGetRetiredPages(self, device: Any, sourceFilter: int) -> list[int]: ...
    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: Any) -> int: ...
    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]: ...
    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int: ...
    def nvmlDeviceGetNvLinkErrorCounter(self, device: Any, link: int, counter: int) -> int: ...
    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int: ...
    def nvmlEventSetCreate(self) -> Any: ...
    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None: ...
    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> Any: ...
    def nvmlEventSetFree(self, eventSet: Any) -> None: ...


@dataclass(frozen=True)
class LostGpu:
    """A GPU that did not answer this cycle; ``new`` on the first cycle it stopped answering."""

    index: int
    uuid: str | None
    pci_bus_id: str | None
    message: str
    new: bool

    def to_event(self, ts: datetime) -> Event:
        return Event(
            kind="gpu_lost", ts=ts, uuid=self.uuid, pci_bus_id=self.pci_bus_id, message=self.message
        )


@dataclass
class NvmlRead:
    """One pass over every GPU."""

    gpus: list[GpuIdentity] = field(default_factory=list)
    samples: list[GpuSample] = field(default_factory=list)
    lost: list[LostGpu] = field(default_factory=list)


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


class Nvml:
    """NVML for FleetWatch: init/shutdown, one lock, error mapping, per-GPU field reading.

    ``errors`` counts failures by ``(collector, reason)`` for the agent's self-metrics;
    ``disabled`` lists, per GPU uuid, the canonical fields that GPU does not offer.
    """

    def __init__(self, lib: NvmlLike | None = None) -> None:
        self._lib = lib
        self._cond = threading.Condition(_LOCK)
        self._open = self._closing = False
        self._waiting = 0  # threads inside nvmlEventSetWait_v2, which nvmlShutdown must outwait
        self._stats = threading.Lock()
        self._probes: tuple[_Probe, ...] = ()
        self._kinds: dict[int, type[CollectorError]] = {}
        self._names: dict[int, str] = {}
        self._count = 0
        self._handles: dict[int, Any] = {}
        self._identities: dict[int, GpuIdentity] = {}
        self._uuids: dict[int, str] = {}
        self._link_counts: dict[str, int] = {}
        self._reason_fn: dict[str, str] = {}
        self._lost: set[int] = set()
        self._failing: set[tuple[int, str]] = set()
        self.driver_version: str | None = None
        self.errors: Counter[tuple[str, str]] = Counter()
        self.disabled: dict[str, set[str]] = {}
        self.unavailable_fields: tuple[str, ...] = ()
        self.last_read_s: float | None = None

    @property
    def lib(self) -> NvmlLike:
        if self._lib is None:
            raise NvmlUnavailable("NVML is not open; call Nvml.open() first")
        return self._lib

    def open(self) -> Nvml:
        """Load pynvml (unless given one) and initialise NVML; raises :class:`NvmlUnavailable`."""
        with self._cond:
            if self._open:
                return self
            if self._lib is None:
                self._lib = _import_pynvml()
            lib = self._lib
            try:
                lib.nvmlInit()
            except lib.NVMLError as exc:
                raise NvmlUnavailable(
                    f"cannot initialise NVML: {exc}; is the NVIDIA driver loaded?"
                ) from exc
            self._open = True
            self._names = {getattr(lib, n): n for n in dir(lib) if n.startswith("NVML_ERROR_")}
            for names, kind in (
                (_UNAVAILABLE, NvmlUnavailable),
                (_LOST, DeviceLost),
                (_UNSUPPORTED, FieldNotSupported),
            ):
                # getattr: an older nvidia-ml-py lacks some codes (NVML_ERROR_GPU_NOT_FOUND)
                codes = (getattr(lib, f"NVML_ERROR_{name}", None) for name in names)
                self._kinds.update((code, kind) for code in codes if code is not None)
        try:
            self._count = self._call(self.lib.nvmlDeviceGetCount)
        except CollectorError as exc:
            self.close()
            raise NvmlUnavailable(f"NVML cannot count the GPUs: {exc}") from exc
        try:
            self.driver_version = self._call(self.lib.nvmlSystemGetDriverVersion)
        except (DeviceLost, FieldNotSupported):
            self.driver_version = None
        self._probes = tuple(p for p in _PROBES if all(hasattr(lib, n) for n in p.needs))
        missing = [f for p in _PROBES if p not in self._probes for f in p.fields]
        self.unavailable_fields = tuple(missing)
        if missing:
            logger.warning("this nvidia-ml-py lacks what NVML needs for %s", ", ".join(missing))
        return self

    def close(self) -> None:
        """Shut NVML down, after any event wait in progress returns."""
        with self._cond:
            if not self._open:
                return
            self._closing = True
            self._cond.wait_for(lambda: self._waiting == 0, timeout=10.0)
            try:
                self.lib.nvmlShutdown()
            except self.lib.NVMLError as exc:
                logger.warning("nvmlShutdown failed: %s", exc)
            finally:
                self._open = self._closing = False
                self._handles.clear()
                self._identities.clear()

    def __enter__(self) -> Nvml:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def read_all(self, now: datetime) -> NvmlRead:
        """Every GPU's identity and sample; a lost GPU is skipped and listed in ``lost``."""
        started = time.perf_counter()
        out = NvmlRead()
        for index in range(self._count):
            try:
                gpu, sample = self._read(index, now)
            except DeviceLost as exc:
                out.lost.append(self._mark_lost(index, exc))
                continue
            except NvmlUnavailable:
                raise
            except CollectorError as exc:  # no handle or uuid: nothing to file the readings under
                self._note_failure(index, "device", exc)
                continue
            except ValidationError as exc:  # not even uuid and index are valid
                self._note_failure(index, "device", CollectorError(str(exc)))
                continue
            if index in self._lost:
                self._lost.discard(index)
                logger.warning("GPU %s (index %d) answers again after being lost", gpu.uuid, index)
            out.gpus.append(gpu)
            out.samples.append(sample)
        self.last_read_s = time.perf_counter() - started
        return out

    def watch_events(
        self,
        stop: threading.Event,
        *,
        kinds: Sequence[str] = ("xid", "ecc_dbe"),
        timeout_ms: int = 500,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> Iterator[Event]:
        """Yield NVML events (Xid, ECC) as they happen, until ``stop`` is set.

        Waits at most ``timeout_ms`` at a time so that ``stop`` is seen promptly. Single-bit ECC
        events are off by default: they can come in storms, and the SBE counters carry them.
        """
        lib = self.lib
        wanted = [(getattr(lib, c, 0), k, m) for c, k, m in _EVENT_KINDS if k in kinds]
        try:
            event_set, devices = self._register(sum(t for t, _, _ in wanted))
        except NvmlUnavailable as exc:
            logger.warning("no NVML events: %s", exc)
            return
        failing = False
        try:
            while not stop.is_set():
                try:
                    data = self._wait(event_set, timeout_ms)
                except NvmlUnavailable:
                    return
                except CollectorError as exc:
                    self._bump("event_wait")
                    if not failing:
                        logger.warning("waiting for NVML events failed: %s", exc)
                    failing = True
                    stop.wait(timeout_ms / 1000)
                    continue
                failing = False
                if data is not None:
                    yield _to_event(data, wanted, devices.get(_handle_key(data.device)), clock())
        finally:
            try:
                self._call(lib.nvmlEventSetFree, event_set)
            except CollectorError as exc:
                logger.debug("nvmlEventSetFree failed: %s", exc)

    # -- NVML calls and error mapping -------------------------------------------------------

    def _call(
        self, fn: Callable[..., T], *args: Any, index: int | None = None, uuid: str | None = None
    ) -> T:
        with self._cond:
            if not self._open or self._closing:
                raise NvmlUnavailable("NVML is not open")
            try:
                return fn(*args)
            except self.lib.NVMLError as exc:
                raise self._translate(exc, fn, index, uuid) from exc

    def _wait(self, event_set: Any, timeout_ms: int) -> Any:
        with self._cond:
            if not self._open or self._closing:
                raise NvmlUnavailable("NVML is not open")
            self._waiting += 1
        try:
            # Outside the lock: this blocks for up to timeout_ms and would stall collect(); NVML
            # calls are thread-safe, and close() waits for _waiting to reach 0 before shutdown.
            return self.lib.nvmlEventSetWait_v2(event_set, timeout_ms)
        except self.lib.NVMLError as exc:
            if getattr(exc, "value", None) == self.lib.NVML_ERROR_TIMEOUT:
                return None
            with self._cond:
                raise self._translate(exc, self.lib.nvmlEventSetWait_v2, None, None) from exc
        finally:
            with self._cond:
                self._waiting -= 1
                self._cond.notify_all()

    def _translate(
        self, exc: Exception, fn: Callable[..., Any], index: int | None, uuid: str | None
    ) -> CollectorError:
        code: int = getattr(exc, "value", -1)
        kind = self._kinds.get(code, CollectorError)
        what = getattr(fn, "__name__", "NVML call")
        message = f"{what}: {exc} [{self._names.get(code, code)}]"
        if kind is DeviceLost:
            return DeviceLost(message, gpu_uuid=uuid, index=index)
        if kind is FieldNotSupported:
            return FieldNotSupported(what, message)
        return kind(message)

    # -- one GPU ----------------------------------------------------------------------------

    def _handle(self, index: int) -> Any:
        if index not in self._handles:
            self._handles[index] = self._call(
                self.lib.nvmlDeviceGetHandleByIndex, index, index=index
            )
        return self._handles[index]

    def _read(self, index: int, now: datetime) -> tuple[GpuIdentity, GpuSample]:
        lib = self.lib
        dev = _Device(self, lib, self._handle(index), index, self._uuids.get(index))
        gpu = self._identities.get(index)
        if gpu is None:
            dev.uuid = self._uuids[index] = dev.call(lib.nvmlDeviceGetUUID, dev.handle)
            ident = self._run(dev, _IDENTITY_PROBES)
            ident.update(uuid=dev.uuid, index=index, driver_version=self.driver_version)
            gpu = self._identities[index] = self._model(GpuIdentity, ident, index)
        try:
            values = self._run(dev, self._probes)
        finally:
            if dev.turned_off:  # one WARNING per GPU, however many fields it lacks
                by_reason: dict[str, list[str]] = {}
                for fields, why in dev.turned_off:
                    by_reason.setdefault(why, []).extend(fields)
                lacks = "; ".join(f"{', '.join(f)} ({why})" for why, f in by_reason.items())
                logger.warning("GPU %s (index %d) does not offer %s", dev.uuid, index, lacks)
        return gpu, self._model(GpuSample, {"uuid": gpu.uuid, "ts": now, **values}, index)

    def _run(self, dev: _Device, probes: Sequence[_Probe]) -> dict[str, Any]:
        assert dev.uuid is not None
        off = self.disabled.setdefault(dev.uuid, set())
        values: dict[str, Any] = {}
        for probe in probes:
            if probe.fields[0] in off:
                continue
            try:
                values.update(probe.read(dev))
            except (DeviceLost, NvmlUnavailable):
                raise
            except FieldNotSupported as exc:
                off.update(probe.fields)
                dev.turned_off.append((probe.fields, str(exc)))
                self._bump("field_not_supported")
            except CollectorError as exc:
                self._note_failure(dev.index, probe.fields[0], exc)
            else:
                if (dev.index, probe.fields[0]) in self._failing:
                    self._failing.discard((dev.index, probe.fields[0]))
                    logger.info("GPU %s: %s reads again", dev.uuid, probe.fields[0])
        return values

    def _model(self, model: type[M], values: dict[str, Any], index: int) -> M:
        try:
            return model(**values)
        except ValidationError as exc:
            # One implausible value (a driver glitch) must not cost the GPU's other readings.
            bad = {str(err["loc"][0]) for err in exc.errors() if err["loc"]} - {"uuid", "ts"}
            self._bump("invalid_value")
            logger.debug("GPU index %d: dropping invalid %s: %s", index, sorted(bad), exc)
            return model(**{k: v for k, v in values.items() if k not in bad})

    def _mark_lost(self, index: int, exc: DeviceLost) -> LostGpu:
        self._bump("device_lost")
        self._handles.pop(index, None)  # ask for a fresh handle and identity when it is back
        gpu = self._identities.pop(index, None)
        uuid = exc.gpu_uuid or self._uuids.get(index)
        new = index not in self._lost
        if new:
            self._lost.add(index)
            logger.warning("GPU %s (index %d) is lost: %s", uuid, index, exc)
        pci = gpu.pci_bus_id if gpu else None
        return LostGpu(index, uuid, pci, f"GPU index {index} is lost (NVML {exc})", new)

    def _note_failure(self, index: int, what: str, exc: CollectorError) -> None:
        self._bump("nvml_error")
        if (index, what) not in self._failing:
            self._failing.add((index, what))
            logger.warning("GPU index %d: cannot read %s: %s", index, what, exc)

    def _bump(self, reason: str) -> None:
        with self._stats:
            self.errors[(COLLECTOR, reason)] += 1

    # -- helpers used by the probes ---------------------------------------------------------

    def _field_value(self, dev: _Device, const: str) -> Any:
        """One entry of a single nvmlDeviceGetFieldValues call for all field-value probes."""
        lib, off = dev.lib, self.disabled.get(dev.uuid or "", set())

        def fetch() -> dict[int, Any]:
            ids = [getattr(lib, c) for f, c in _FIELD_IDS if f not in off and hasattr(lib, c)]
            return {e.fieldId: e for e in dev.call(lib.nvmlDeviceGetFieldValues, dev.handle, ids)}

        entry = dev.once("field_values", fetch)[getattr(lib, const)]
        if entry.nvmlReturn != lib.NVML_SUCCESS:
            raise self._translate(
                lib.NVMLError(entry.nvmlReturn), lib.nvmlDeviceGetFieldValues, dev.index, dev.uuid
            )
        return getattr(entry.value, _VALUE_MEMBER[entry.valueType])

    def _active_links(self, dev: _Device) -> list[int]:
        """Active NVLink links; the link count is found once, by asking until NVML refuses."""
        assert dev.uuid is not None
        lib, known = dev.lib, self._link_counts.get(dev.uuid)
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
        self._link_counts.setdefault(dev.uuid, count)
        return active

    def _clock_reasons(self, dev: _Device) -> int:
        """nvmlDeviceGetCurrentClocksEventReasons (R535+), else the older ...ThrottleReasons."""
        assert dev.uuid is not None
        names = [
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
        ]
        chosen = self._reason_fn.get(dev.uuid)
        error = FieldNotSupported("clocks_event_reasons", "no clocks event reasons in NVML")
        for name in [chosen] if chosen else [n for n in names if hasattr(dev.lib, n)]:
            try:
                value: int = dev.call(getattr(dev.lib, name), dev.handle)
            except FieldNotSupported as exc:
                error = exc
                continue
            self._reason_fn[dev.uuid] = name
            return value
        raise error

    def _register(self, mask: int) -> tuple[Any, dict[int, tuple[str | None, str | None]]]:
        lib = self.lib
        event_set = self._call(lib.nvmlEventSetCreate)
        devices: dict[int, tuple[str | None, str | None]] = {}
        for index in range(self._count):
            try:
                handle = self._handle(index)
                types = self._call(lib.nvmlDeviceGetSupportedEventTypes, handle, index=index)
                if types & mask:
                    self._call(
                        lib.nvmlDeviceRegisterEvents, handle, types & mask, event_set, index=index
                    )
                uuid = self._uuids.get(index) or self._call(lib.nvmlDeviceGetUUID, handle)
            except NvmlUnavailable:
                raise
            except CollectorError as exc:
                logger.warning("GPU index %d: no NVML events: %s", index, exc)
                continue
            if not types & mask:
                logger.warning("GPU %s (index %d) offers no Xid/ECC events", uuid, index)
            gpu = self._identities.get(index)
            pci = gpu.pci_bus_id if gpu else self._pci_or_none(handle, index, uuid)
            devices[_handle_key(handle)] = (uuid, pci)
        return event_set, devices

    def _pci_or_none(self, handle: Any, index: int, uuid: str) -> str | None:
        try:
            return _pci_bus_id(_Device(self, self.lib, handle, index, uuid)).get("pci_bus_id")
        except CollectorError:
            return None


def _import_pynvml() -> NvmlLike:
    try:
        return cast(NvmlLike, importlib.import_module("pynvml"))
    except ImportError as exc:
        raise NvmlUnavailable(
            "nvidia-ml-py is not installed; install it with pip install 'fleetwatch[agent]'"
        ) from exc


def _handle_key(handle: Any) -> int:
    # pynvml hands out a new ctypes pointer object per call; the address names the device.
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value or 0
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


def _to_event(
    data: Any,
    wanted: list[tuple[int, str, str]],
    gpu: tuple[str | None, str | None] | None,
    ts: datetime,
) -> Event:
    uuid, pci = gpu or (None, None)
    kind, message = next(
        ((k, m) for t, k, m in wanted if data.eventType & t), ("nvml", "NVML event")
    )
    code = int(data.eventData)
    if kind == "xid" and code <= 0xFFFF:
        return Event(kind="xid", xid=code, uuid=uuid, pci_bus_id=pci, ts=ts, message=message)
    details = {"event_type": int(data.eventType), "event_data": code}
    return Event(
        kind=kind if kind != "xid" else "nvml",
        uuid=uuid,
        pci_bus_id=pci,
        ts=ts,
        message=message,
        details=details,
    )


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
        links = dev.once("nvlink_links", lambda: dev.nvml._active_links(dev))
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
        lambda dev: {name: int(dev.nvml._field_value(dev, const))},
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
        lambda dev: {"clocks_event_reasons": dev.nvml._clock_reasons(dev)},
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
