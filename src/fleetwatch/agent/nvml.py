"""NVML through nvidia-ml-py: the one module that imports ``pynvml``, and only in :meth:`Nvml.open`.

:class:`Nvml` wraps a pynvml-like module (the real one, or :class:`fleetwatch.testing.FakePynvml`)
and reads every canonical field NVML offers for every GPU: the field table (and units) lives in
:mod:`fleetwatch.agent.nvml_fields`, the event watching in :mod:`fleetwatch.agent.nvml_events`.

NVMLError codes map onto our errors; any other code is a plain :class:`CollectorError`: that field
is absent from this sample, counted, and asked again next time::

    UNINITIALIZED DRIVER_NOT_LOADED LIBRARY_NOT_FOUND LIB_RM_VERSION_MISMATCH  NvmlUnavailable
    GPU_IS_LOST GPU_NOT_FOUND UNKNOWN RESET_REQUIRED                           DeviceLost
    NOT_SUPPORTED FUNCTION_NOT_FOUND NO_PERMISSION                             FieldNotSupported

A field a GPU does not offer is turned off for that GPU, with one WARNING, and never asked again;
a field this nvidia-ml-py lacks is turned off for all GPUs at :meth:`Nvml.open`, with one WARNING.
A MIG-enabled GPU is read as a whole GPU through its own handle; what NVML refuses only because
MIG is on is absent, not a fault (:mod:`fleetwatch.agent.nvml_mig`), and its MIG mode and devices
go into its identity.
"""

from __future__ import annotations

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

from fleetwatch.agent.nvml_events import _EVENT_KINDS as _EVENT_KINDS  # for tests
from fleetwatch.agent.nvml_events import _watch
from fleetwatch.agent.nvml_fields import _FIELD_IDS as _FIELD_IDS  # for tests
from fleetwatch.agent.nvml_fields import _IDENTITY_PROBES, _PROBES, _Device, _Probe
from fleetwatch.agent.nvml_mig import MIG_CALLS, MigTracker
from fleetwatch.agent.textclean import clean_fields
from fleetwatch.errors import CollectorError, DeviceLost, FieldNotSupported, NvmlUnavailable
from fleetwatch.telemetry import Event, GpuIdentity, GpuSample

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


class NvmlLike(Protocol):
    """The part of ``pynvml`` FleetWatch uses: same names, parameters and constants."""

    @property
    def NVMLError(self) -> type[Exception]: ...

    NVML_SUCCESS: int
    NVML_ERROR_TIMEOUT: int
    NVML_FEATURE_ENABLED: int
    NVML_DEVICE_MIG_ENABLE: int
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
    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]: ...
    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any: ...
    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int: ...
    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int: ...
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
        self._mig = MigTracker()
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
        self._mig.available = all(hasattr(lib, name) for name in MIG_CALLS)
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
        yield from _watch(self, stop, kinds, timeout_ms, clock)

    def device_read(self, index: int, function: str) -> Any:
        """One reading the sample does not carry (``fleetwatch validate``: the maximum PCIe link),
        by pynvml function name; :class:`FieldNotSupported` when this nvidia-ml-py or GPU lacks
        it, :class:`DeviceLost` when the GPU does not answer."""
        fn = getattr(self.lib, function, None)
        if fn is None:
            raise FieldNotSupported(function, f"this nvidia-ml-py has no {function}")
        handle = self._handle(index)
        result: Any = self._call(fn, handle, index=index, uuid=self._uuids.get(index))
        return result

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
            gpu = self._identities[index] = self._model(GpuIdentity, clean_fields(ident), index)
        try:
            gpu = self._mig.with_layout(dev, gpu, self.disabled)
        except (DeviceLost, NvmlUnavailable):
            raise
        except CollectorError as exc:  # the GPU's readings are still worth sending
            self._note_failure(index, "mig", exc)
        try:
            values = self._run(dev, self._probes)
        finally:
            if dev.turned_off:  # one WARNING per GPU, however many fields it lacks
                by_reason: dict[str, list[str]] = {}
                for fields, why in dev.turned_off:
                    by_reason.setdefault(why, []).extend(fields)
                lacks = "; ".join(f"{', '.join(f)} ({why})" for why, f in by_reason.items())
                logger.warning("GPU %s (index %d) does not offer %s", dev.uuid, index, lacks)
            self._mig.log_absent(dev)
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
                if dev.mig_on:
                    self._mig.absent_under_mig(dev, probe.fields)  # absent, not a fault
                    continue
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


def _import_pynvml() -> NvmlLike:
    try:
        return cast(NvmlLike, importlib.import_module("pynvml"))
    except ImportError as exc:
        raise NvmlUnavailable(
            "nvidia-ml-py is not installed; install it with pip install 'fleetwatch[agent]'"
        ) from exc
