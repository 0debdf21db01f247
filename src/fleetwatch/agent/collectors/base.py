"""The collector interface, and how readings from several sources merge into one batch.

A collector gets its data source in its constructor and answers ``collect(now)`` once per
interval. A source that can tell of a critical event the moment it happens (the kernel log, an
NVML event set) also implements :class:`Watcher`: the agent starts it once, and it calls ``emit``
from its own thread, so that a fatal Xid is pushed at once instead of at the next tick.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Protocol, runtime_checkable

from fleetwatch.agent.parsers import GpuReading
from fleetwatch.agent.textclean import clean_fields
from fleetwatch.telemetry import SAMPLE_FIELD_NAMES, Event, GpuIdentity, GpuSample, PortSample

__all__ = ["Collection", "Collector", "EmitEvents", "Watcher", "merge_readings"]

EmitEvents = Callable[[list[Event]], None]


@dataclass
class Collection:
    """What one collector saw in one interval."""

    gpus: list[GpuIdentity] = field(default_factory=list)
    samples: list[GpuSample] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    ports: list[PortSample] = field(default_factory=list)  # network adapter ports

    def extend(self, other: Collection) -> None:
        self.gpus.extend(other.gpus)
        self.samples.extend(other.samples)
        self.events.extend(other.events)
        self.ports.extend(other.ports)

    @property
    def has_readings(self) -> bool:
        """Whether there is anything to send (GPU identities alone are not)."""
        return bool(self.samples or self.events or self.ports)


class Collector(Protocol):
    name: ClassVar[str]

    def collect(self, now: datetime) -> Collection: ...

    def close(self) -> None: ...


@runtime_checkable
class Watcher(Protocol):
    def start_watch(self, emit: EmitEvents) -> None: ...

    def stop_watch(self) -> None: ...


_IDENTITY_KEYS = (
    "uuid",
    "index",
    "serial",
    "pci_bus_id",
    "name",
    "driver_version",
    "vbios_version",
    "mig",
)


def readings_to_collection(readings: Iterable[GpuReading], now: datetime) -> Collection:
    """Turn parser output into wire objects; readings without a uuid cannot be sent and are
    skipped (the caller counts them)."""
    out = Collection()
    for reading in readings:
        identity = {k: v for k, v in reading.identity.items() if k in _IDENTITY_KEYS}
        if "uuid" not in identity or "index" not in identity:
            continue
        out.gpus.append(GpuIdentity(**clean_fields(identity)))
        values = {k: v for k, v in reading.values.items() if k in SAMPLE_FIELD_NAMES}
        out.samples.append(GpuSample(uuid=identity["uuid"], ts=now, **values))
    return out


def merge_readings(collections: Iterable[Collection]) -> Collection:
    """One identity and one sample per GPU; earlier collectors win a field both report, later
    ones fill in what earlier ones lack (e.g. NVML first, dcgm-exporter for the rest). Ports
    have one source (sysfs) and pass through."""
    identities: dict[str, dict[str, Any]] = {}
    samples: dict[str, dict[str, Any]] = {}
    events: list[Event] = []
    ports: list[PortSample] = []
    for collection in collections:
        for gpu in collection.gpus:
            known = identities.setdefault(gpu.uuid, {})
            for key, value in gpu.model_dump(exclude_none=True).items():
                known.setdefault(key, value)
        for sample in collection.samples:
            known = samples.setdefault(sample.uuid, {"uuid": sample.uuid, "ts": sample.ts})
            for key, value in sample.values().items():
                known.setdefault(key, value)
        events.extend(collection.events)
        ports.extend(collection.ports)
    return Collection(
        gpus=[GpuIdentity(**fields) for fields in identities.values()],
        samples=[GpuSample(**fields) for fields in samples.values()],
        events=events,
        ports=ports,
    )
