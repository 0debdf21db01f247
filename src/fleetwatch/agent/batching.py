"""Several collections per push: which readings wait for the push, and how they become batches.

The agent collects every ``interval_s`` and, with a longer ``push_interval_s``, pushes only every
``push_interval_s``: at 10 s and 60 s, one request carries six collections of the node's GPUs
(48 rows for 8 GPUs), so the server takes a sixth of the requests and gzip sees six similar rows
per GPU. The push interval is a whole number of collections (:func:`ticks_per_push`).

How nothing is lost or stored twice:

- **Staged durably.** Each collection (a *tick*) is written to the spool's database before the
  loop sleeps (:mod:`fleetwatch.agent.spool_staging`), as the batch body it would have been
  without a batch id of its own. An agent killed between ticks loses none; the next start
  combines what it finds at once, and a SIGTERM combines what is staged before the last drain.
- **Combined atomically.** At push time, :meth:`~fleetwatch.agent.spool.Spool.combine_staged`
  writes the batches made of the staged ticks and removes those ticks in one SQLite transaction:
  after a crash mid-combine each tick is either still staged or in exactly one spooled batch. From
  there the spool's guarantees hold as for any batch: its exact bytes are replayed until the
  server acknowledges them, and the server stores a ``batch_id`` once. The server does not
  deduplicate a (GPU, ts) sample across batches (only within one, see
  ``server/ingest/checks.py``), so exactly-once rests on this transaction.
- **Critical events never wait.** Events that may take a GPU out of service (:func:`is_critical`:
  the kinds in :data:`CRITICAL_KINDS`, as the server's urgent kinds, and a fatal NVSwitch SXid or
  fatal PCIe AER error) are spooled at once as a critical batch, as a watcher's are, while the
  tick's samples stay staged; other events ride with the tick.
- **Batches the server takes.** A batch holds ticks of one node description (a tick staged before
  a reboot keeps its ``boot_id``, from which the server reads counter resets), one reading per GPU
  (and per adapter port) and instant (a clock stepped back starts a new batch instead of one the
  server refuses with 422), and at most :data:`MAX_BATCH_BYTES` of JSON (half the server's default
  body limit) and :data:`MAX_BATCH_PORTS` port readings. GPUs are declared once per batch, as the
  newest tick saw them.
- **Liveness.** The node tells the server its push interval (``NodeInfo.push_interval_s``), and
  the server judges silence by it rather than by the collection interval.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from pydantic import ValidationError

from fleetwatch.agent.spool_staging import StagedTick
from fleetwatch.telemetry import Batch, Event, GpuIdentity, GpuSample, NodeInfo, PortSample

__all__ = [
    "CRITICAL_KINDS",
    "FATAL_SEVERITY_KINDS",
    "MAX_BATCH_BYTES",
    "MAX_BATCH_PORTS",
    "combine_ticks",
    "is_critical",
    "split_critical",
    "tick_body",
    "ticks_per_push",
]

logger = logging.getLogger(__name__)

CRITICAL_KINDS = frozenset({"xid", "gpu_lost"})
# Critical only when the record says ``fatal``: a fatal SXid stops the NVLink fabric of the GPUs
# behind the switch port, an uncorrected fatal AER error the PCIe link (the GPU may fall off the
# bus next). Their corrected and non-fatal reports are routine and ride with the next tick.
FATAL_SEVERITY_KINDS = frozenset({"sxid", "pcie_aer"})
MAX_BATCH_BYTES = 4 * 1024 * 1024
MAX_BATCH_SAMPLES = 20_000  # well under the server's default max_samples_per_batch (50,000)
MAX_BATCH_PORTS = 512  # half the server's limit (IngestLimits.max_ports)


def ticks_per_push(interval_s: float, push_interval_s: float) -> int:
    """Collections per push: the push interval in whole intervals, at least one (0: one)."""
    if push_interval_s <= interval_s:
        return 1
    return max(1, int(push_interval_s / interval_s + 0.5))


def is_critical(event: Event) -> bool:
    """Whether ``event`` may take a GPU out of service, so it must be pushed at once."""
    if event.kind in CRITICAL_KINDS:
        return True
    return event.kind in FATAL_SEVERITY_KINDS and (event.details or {}).get("severity") == "fatal"


def split_critical(events: Iterable[Event]) -> tuple[list[Event], list[Event]]:
    """(events to push at once, events that may wait for the push)."""
    critical: list[Event] = []
    routine: list[Event] = []
    for event in events:
        (critical if is_critical(event) else routine).append(event)
    return critical, routine


def tick_body(tick: Batch) -> bytes:
    """What is staged for one collection: its batch body, uncompressed (combined at push)."""
    return tick.model_dump_json(exclude_none=True).encode()


@dataclass
class _Group:
    node: NodeInfo
    gpus: dict[str, GpuIdentity] = field(default_factory=dict)
    samples: list[GpuSample] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    ports: list[PortSample] = field(default_factory=list)
    instants: set[tuple[str, datetime]] = field(default_factory=set)
    size: int = 0

    def takes(self, tick: Batch, size: int) -> bool:
        if not (self.samples or self.events or self.ports):
            return True
        return (
            tick.node == self.node
            and self.size + size <= MAX_BATCH_BYTES
            and len(self.samples) + len(tick.samples) <= MAX_BATCH_SAMPLES
            and len(self.ports) + len(tick.ports or ()) <= MAX_BATCH_PORTS
            and not any((s.uuid, s.ts) in self.instants for s in tick.samples)
            and not any(_port_instant(p) in self.instants for p in tick.ports or ())
        )

    def add(self, tick: Batch, size: int) -> None:
        self.gpus.update((gpu.uuid, gpu) for gpu in tick.gpus)  # the newest identity wins
        self.samples.extend(tick.samples)
        self.events.extend(tick.events)
        self.ports.extend(tick.ports or ())
        self.instants.update((s.uuid, s.ts) for s in tick.samples)
        self.instants.update(map(_port_instant, tick.ports or ()))
        self.size += size

    def batch(self, batch_id: str) -> Batch:
        return Batch(
            batch_id=batch_id,
            node=self.node,
            gpus=list(self.gpus.values()),
            samples=self.samples,
            events=self.events,
            ports=self.ports or None,
        )


def _port_instant(port: PortSample) -> tuple[str, datetime]:
    # "/" cannot occur in a GPU uuid, so a port never shares a key with a GPU.
    return (f"{port.device}/{port.port}", port.ts)


def combine_ticks(
    ticks: Iterable[StagedTick], *, node: NodeInfo, carrier: str, extra_events: list[Event]
) -> list[Batch]:
    """The batches for ``ticks``, oldest first; the first is ``carrier`` and carries
    ``extra_events`` (the spool's reports), with ``node`` when no tick is left to carry them."""
    groups: list[_Group] = []
    for staged in ticks:
        try:
            tick = Batch.model_validate_json(staged.body)
        except ValidationError as exc:
            # Staged ticks were valid batches when written: only a damaged file gets here.
            logger.error(
                "staged collection %d is unreadable and is lost (%d samples, %d events): %s",
                staged.seq,
                staged.samples,
                staged.events,
                exc,
            )
            continue
        if not groups or not groups[-1].takes(tick, len(staged.body)):
            groups.append(_Group(node=tick.node))
        groups[-1].add(tick, len(staged.body))
    if extra_events:
        if not groups:
            groups.append(_Group(node=node))
        groups[0].events.extend(extra_events)
    return [group.batch(carrier if i == 0 else str(uuid.uuid4())) for i, group in enumerate(groups)]
