"""One sync pass between FleetWatch's evictions and a scheduler, whatever the scheduler.

A pass, in order:

1. ``pending`` evictions: ack (a 409 means another adapter holds it: skip), read the node fresh,
   then
   - node unknown to the scheduler -> reject;
   - node held (drained/cordoned/down) by someone else -> reject; the node is left as it is;
   - node already held by FleetWatch -> complete;
   - otherwise hold it (drain/cordon) and complete; if the scheduler refuses, reject with its
     error.
2. ``completed`` and ``returned`` evictions, the newest per node only (an older eviction of a
   node evicted again says nothing about the node now):
   - ``completed`` whose node is free again in the scheduler (an operator resumed it) ->
     ``POST /v1/nodes/{name}/return``: the repair happened. If the server refuses (409: evicted
     for a hardware reason and no passing ``fleetwatch validate`` since), the node is held again:
     only validated nodes go back into service, whoever resumed them. An admin's forced return
     (``{"force": true, "reason": ...}``) is the way around the gate;
   - ``returned`` whose node FleetWatch still holds -> release it (resume/uncordon).

Between passes the engine long-polls ``GET /v1/evictions?state=pending&state=returned&
changed_after=<cursor>&wait=<interval>``, the cursor being the one the pass's first read
returned: an eviction that became pending (drain it) or returned (release it) since the pass
began starts the next one at once, whichever replica or person made the change. The pass's own
acks and completions are not in those states, so they wake nothing; a node an operator freed is
still found by the pass every interval (that change happens in the scheduler, not FleetWatch).

A server without change cursors (an older one) is long-polled on ``state=pending`` alone, as
before, and a returned eviction waits for the interval there. A server that ignores ``wait``
(older than the long-poll), a failed long-poll, or pending evictions the last pass already saw
(claimed elsewhere, a dry run) never make the loop spin: it then sleeps out the rest of the
interval.

Only holds that are FleetWatch's own are ever released. ``dry_run`` changes nothing, neither in
the scheduler nor in FleetWatch: each pass logs what it would do.

With a ``maintenance`` source (``--maintenance``), each pass ends by keeping FleetWatch's
maintenance windows in step with the scheduler's planned maintenance
(:mod:`fleetwatch.adapters.maintenance`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from typing import ClassVar, Protocol

from fleetwatch.adapters.client import (
    Eviction,
    EvictionConflict,
    ReturnRefused,
    SchedulerClient,
)
from fleetwatch.adapters.maintenance import MaintenanceSource, sync_maintenance
from fleetwatch.errors import FleetWatchError

__all__ = ["BackendError", "Hold", "HoldKind", "NodeBackend", "PassReport", "SyncEngine"]

logger = logging.getLogger(__name__)


class BackendError(FleetWatchError):
    """The scheduler refused or failed a command (scontrol, the Kubernetes API)."""


class HoldKind(Enum):
    FREE = "free"  # schedulable
    OURS = "ours"  # drained/cordoned by FleetWatch
    OTHER = "other"  # drained/cordoned/down for another reason: never touched
    MISSING = "missing"  # the scheduler does not know this node


@dataclass(frozen=True)
class Hold:
    kind: HoldKind
    detail: str = ""
    eviction_id: int | None = None  # which eviction holds it, where the scheduler records that


class NodeBackend(Protocol):
    """What a scheduler adapter does to a node; ``SyncEngine`` decides when."""

    name: ClassVar[str]

    def inspect(self, node: str) -> Hold: ...

    def snapshot(self) -> dict[str, Hold]: ...

    def hold(self, eviction: Eviction) -> None: ...

    def release(self, node: str) -> None: ...


@dataclass
class PassReport:
    held: list[int] = field(default_factory=list)
    completed: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    returned: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    windows_opened: list[str] = field(default_factory=list)  # maintenance keys
    windows_ended: list[str] = field(default_factory=list)
    held_again: list[str] = field(default_factory=list)  # resumed by hand, not validated
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        windows = ""
        if self.windows_opened or self.windows_ended:
            opened, ended = len(self.windows_opened), len(self.windows_ended)
            windows = f"maintenance windows opened {opened}, ended {ended}, "
        return (
            f"held {len(self.held)}, completed {len(self.completed)}, "
            f"rejected {len(self.rejected)}, skipped {len(self.skipped)}, "
            f"returned {len(self.returned)}, released {len(self.released)}, {windows}"
            f"held again {len(self.held_again)}, "
            f"errors {len(self.errors)} in {self.seconds * 1000:.0f} ms"
        )


_Step = Callable[[Eviction, PassReport], None]

MAX_WAIT_S = 60.0  # the longest long-poll the server grants
# What a pass acts on that FleetWatch changes: a new drain, or a node given back.
WAKE_STATES = ("pending", "returned")


class SyncEngine:
    """Runs sync passes of one backend against the scheduler API."""

    def __init__(
        self,
        client: SchedulerClient,
        backend: NodeBackend,
        *,
        dry_run: bool = False,
        lease_s: int = 300,
        limit: int = 500,
        maintenance: MaintenanceSource | None = None,
    ) -> None:
        self._client = client
        self._maintenance = maintenance
        self._backend = backend
        self._dry_run = dry_run
        self._lease_s = lease_s
        self._limit = limit
        self._seen_pending: set[int] = set()  # pending ids the last pass saw
        self._cursor: int | None = None  # where the last pass began, if the server has cursors

    def run_pass(self) -> PassReport:
        """One pass; raises ``SchedulerApiError`` only when the eviction lists cannot be read."""
        started = time.monotonic()
        report = PassReport()
        # Read first: its cursor covers everything this pass can see, so the wait after it
        # hears of any later change, including those made while the pass runs.
        listed = self._client.read_evictions(("pending",), self._limit)
        pending, self._cursor = listed.evictions, listed.cursor
        self._seen_pending = {eviction.id for eviction in pending}
        for eviction in pending:
            self._guard(self._evict, eviction, report)
        finished = self._client.list_evictions("completed", self._limit)
        finished += self._client.list_evictions("returned", self._limit)
        newest: dict[str, Eviction] = {}
        for eviction in finished:
            if eviction.node not in newest or eviction.id > newest[eviction.node].id:
                newest[eviction.node] = eviction
        if newest:
            holds = self._backend.snapshot()
            for eviction in sorted(newest.values(), key=lambda e: e.id):
                hold = holds.get(eviction.node, Hold(HoldKind.MISSING))
                if hold.eviction_id is not None and hold.eviction_id != eviction.id:
                    continue  # FleetWatch holds this node for another eviction
                if eviction.state == "completed" and hold.kind is HoldKind.FREE:
                    self._guard(self._report_back, eviction, report)
                elif eviction.state == "returned" and _ours(hold, eviction):
                    self._guard(self._release, eviction, report)
        if self._maintenance is not None:
            self._sync_windows(self._maintenance, report)
        report.seconds = time.monotonic() - started
        logger.info("%s sync pass: %s", self._backend.name, report.summary())
        return report

    def run_forever(self, stop: threading.Event, interval_s: float) -> None:
        """Passes until ``stop`` is set: at once when a new eviction is pending, else every
        ``interval_s``; failed passes are logged."""
        while not stop.is_set():
            try:
                self.run_pass()
            except FleetWatchError as exc:
                logger.error("%s sync pass failed: %s", self._backend.name, exc)
            except Exception:  # the loop outlives anything one pass hits
                logger.exception("%s sync pass crashed", self._backend.name)
            else:
                self.wait_for_work(stop, interval_s)
                continue
            stop.wait(interval_s)  # the server is not answering: no long-poll either

    def wait_for_work(self, stop: threading.Event, interval_s: float) -> bool:
        """Until an eviction became pending or returned since the last pass began (True), else
        until ``interval_s`` has passed or ``stop`` is set (False)."""
        deadline = time.monotonic() + interval_s
        if stop.is_set():
            return False
        wait_s = min(interval_s, MAX_WAIT_S)
        try:
            if self._cursor is not None:
                changed = self._client.read_evictions(
                    WAKE_STATES, self._limit, changed_after=self._cursor, wait_s=wait_s
                )
                news = bool(changed.evictions)
            else:
                pending = self._client.wait_for_evictions("pending", wait_s, self._limit)
                news = any(eviction.id not in self._seen_pending for eviction in pending)
        except FleetWatchError as exc:
            logger.debug("%s long-poll failed (%s); sleeping the interval", self._backend.name, exc)
            news = False
        if news:
            return True
        stop.wait(max(0.0, deadline - time.monotonic()))
        return False

    def _sync_windows(self, source: MaintenanceSource, report: PassReport) -> None:
        try:
            done = sync_maintenance(
                self._client, source, now=datetime.now(UTC), dry_run=self._dry_run
            )
        except FleetWatchError as exc:
            logger.error("%s maintenance windows: %s", self._backend.name, exc)
            report.errors.append(f"maintenance windows: {exc}")
            return
        report.windows_opened.extend(done.opened)
        report.windows_ended.extend(done.ended)

    @staticmethod
    def _guard(step: _Step, eviction: Eviction, report: PassReport) -> None:
        try:
            step(eviction, report)
        except FleetWatchError as exc:
            logger.error("eviction %d, node %s: %s", eviction.id, eviction.node, exc)
            report.errors.append(f"eviction {eviction.id} (node {eviction.node}): {exc}")

    def _evict(self, eviction: Eviction, report: PassReport) -> None:
        node, backend = eviction.node, self._backend.name
        if eviction.dry_run:
            logger.info(
                "eviction %d, node %s: a dry run on the server; not held", eviction.id, node
            )
            report.skipped.append(eviction.id)
            return
        if self._dry_run:
            hold = self._backend.inspect(node)
            logger.info(
                "dry run: eviction %d, node %s is %s in %s: would %s",
                eviction.id,
                node,
                hold.kind.value,
                backend,
                _plan(hold),
            )
            return
        try:
            self._client.ack(eviction.id, self._lease_s)
        except EvictionConflict:
            logger.info(
                "eviction %d, node %s: claimed by another adapter; skipped", eviction.id, node
            )
            report.skipped.append(eviction.id)
            return
        logger.info("eviction %d, node %s: acked for %d s", eviction.id, node, self._lease_s)
        hold = self._backend.inspect(node)
        if hold.kind is HoldKind.MISSING:
            self._reject(eviction, f"node {node} is not known to {backend}", report)
        elif hold.kind is HoldKind.OTHER:
            self._reject(eviction, f"already drained by someone else: {hold.detail}", report)
        elif hold.kind is HoldKind.OURS:
            logger.info("node %s is already held by fleetwatch in %s", node, backend)
            self._complete(eviction, report)
        else:
            try:
                self._backend.hold(eviction)
            except BackendError as exc:
                self._reject(eviction, f"{backend} failed: {exc}", report)
                return
            logger.info(
                "held node %s in %s for eviction %d (%s: %s)",
                node,
                backend,
                eviction.id,
                eviction.reason_kind,
                eviction.reason,
            )
            report.held.append(eviction.id)
            self._complete(eviction, report)

    def _complete(self, eviction: Eviction, report: PassReport) -> None:
        self._client.complete(eviction.id)
        logger.info("eviction %d completed (node %s)", eviction.id, eviction.node)
        report.completed.append(eviction.id)

    def _reject(self, eviction: Eviction, reason: str, report: PassReport) -> None:
        self._client.reject(eviction.id, reason)
        logger.warning("eviction %d rejected (node %s): %s", eviction.id, eviction.node, reason)
        report.rejected.append(eviction.id)

    def _report_back(self, eviction: Eviction, report: PassReport) -> None:
        node, backend = eviction.node, self._backend.name
        if self._dry_run:
            logger.info("dry run: node %s is back in %s: would report it returned", node, backend)
            return
        note = f"{backend}: node {node} is in service again (released outside FleetWatch)"
        try:
            returned = self._client.return_node(node, note)
        except ReturnRefused as exc:
            # Not validated: back out of service until `fleetwatch validate` passes on it.
            self._backend.hold(eviction)
            logger.warning(
                "node %s was resumed in %s but FleetWatch refuses its return; held again: %s",
                node,
                backend,
                exc,
            )
            report.held_again.append(node)
            return
        if returned:
            logger.info("node %s is back in service in %s: reported returned", node, backend)
            report.returned.append(node)
        else:
            logger.info("node %s: FleetWatch has no completed eviction to return", node)

    def _release(self, eviction: Eviction, report: PassReport) -> None:
        node, backend = eviction.node, self._backend.name
        hold = self._backend.inspect(node)  # fresh: never release a hold that is not ours
        if not _ours(hold, eviction):
            return
        if self._dry_run:
            logger.info("dry run: eviction %d returned: would release node %s", eviction.id, node)
            return
        self._backend.release(node)
        logger.info("released node %s in %s (eviction %d returned)", node, backend, eviction.id)
        report.released.append(node)


def _plan(hold: Hold) -> str:
    return {
        HoldKind.FREE: "hold it and complete",
        HoldKind.OURS: "complete (already held by fleetwatch)",
        HoldKind.OTHER: f"reject (already drained by someone else: {hold.detail})",
        HoldKind.MISSING: "reject (unknown node)",
    }[hold.kind]


def _ours(hold: Hold, eviction: Eviction) -> bool:
    """Held by FleetWatch, or freed by an operator but still marked with this eviction."""
    if hold.kind is HoldKind.OURS:
        return hold.eviction_id in (None, eviction.id)
    return hold.kind is HoldKind.FREE and hold.eviction_id == eviction.id
