"""The agent: collect every interval, spool, push; critical events at once.

Three kinds of thread: the collection loop (this module's ``run``), the pusher draining the spool,
and one per watching collector (kernel log, NVML events) that hands events over the moment they
appear. Only this module catches broad exceptions, once per cycle, so that one bad reading never
stops the agent.

With a push interval longer than the collection interval, collections are staged in the spool and
combined into one batch per push (:mod:`fleetwatch.agent.batching` says how nothing is lost or
stored twice); otherwise each collection is its own batch.
"""

from __future__ import annotations

import gzip
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from fleetwatch import __version__
from fleetwatch.agent.batching import combine_ticks, split_critical, tick_body, ticks_per_push
from fleetwatch.agent.collectors.base import Collection, Collector, Watcher, merge_readings
from fleetwatch.agent.event_gpus import attach_gpu_uuids
from fleetwatch.agent.push import Pusher
from fleetwatch.agent.selfmetrics import AgentMetrics
from fleetwatch.agent.spool import DropReport, SetAside, Spool
from fleetwatch.agent.spool_staging import NewBatch, StagedTick
from fleetwatch.agent.textclean import clean_batch, clean_text
from fleetwatch.errors import CollectorError
from fleetwatch.telemetry import Batch, Event, GpuIdentity, NodeInfo

__all__ = ["Agent", "build_batch", "read_boot_id"]

logger = logging.getLogger(__name__)


def read_boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def build_batch(node: NodeInfo, collection: Collection, batch_id: str | None = None) -> Batch:
    """The batch to send, its text cleaned of control characters (see :mod:`.textclean`)."""
    return clean_batch(
        Batch(
            batch_id=batch_id or str(uuid.uuid4()),
            node=node,
            gpus=collection.gpus,
            samples=collection.samples,
            events=collection.events,
            ports=collection.ports or None,
        )
    )


def encode(batch: Batch) -> bytes:
    """The exact bytes pushed (and replayed): absent fields are left out, never sent as null."""
    return gzip.compress(batch.model_dump_json(exclude_none=True).encode(), compresslevel=6)


def _readings(batch: Batch) -> int:
    """What the spool counts as a batch's samples: GPU samples and port readings alike, so that
    a tick holding only ports is a collection and its loss is reported."""
    return len(batch.samples) + len(batch.ports or ())


def _drop_event(report: DropReport, now: datetime) -> Event:
    return Event(
        kind="spool_dropped",
        ts=now,
        message=(
            f"agent spool was full: dropped {report.batches} batches "
            f"({report.samples} samples, {report.events} events)"
        ),
        details={"batches": report.batches, "samples": report.samples, "events": report.events},
    )


def _set_aside_event(item: SetAside) -> Event:
    answer = clean_text(item.answer)
    return Event(
        kind="batch_set_aside",
        ts=datetime.fromtimestamp(item.at, UTC),
        message=(
            f"agent set aside batch {item.batch_id} ({item.samples} samples, {item.events} "
            f"events): the server answered {item.status} to it {item.attempts} times over "
            f"{item.failing_s:.0f} s while taking other batches: {answer}"
        )[:4096],
        details={
            "batch_id": item.batch_id,
            "status": item.status,
            "attempts": item.attempts,
            "failing_s": item.failing_s,
            "samples": item.samples,
            "events": item.events,
            "answer": answer,
        },
    )


class Agent:
    def __init__(
        self,
        *,
        node: NodeInfo,
        collectors: Sequence[Collector],
        spool: Spool,
        pusher: Pusher,
        metrics: AgentMetrics,
        clock: Callable[[], datetime],
        boot_id_source: Callable[[datetime], str | None] | None = None,
        push_interval_s: float = 0.0,
    ) -> None:
        self.node = node
        self.push_interval_s = push_interval_s
        # A simulated node reboots in simulated time; a real one restarts the agent instead.
        self._boot_id_source = boot_id_source
        self._collectors = list(collectors)
        self._spool = spool
        self._pusher = pusher
        self._metrics = metrics
        self._clock = clock
        self._known_gpus: list[GpuIdentity] = []
        self._critical_lock = threading.Lock()
        self._dropped_seen = spool.counter("dropped_batches")
        self._errors_seen: dict[tuple[str, str], int] = {}

    @property
    def ticks_per_push(self) -> int:
        return ticks_per_push(self.node.interval_s, self.push_interval_s)

    def node_info(self) -> NodeInfo:
        """The node as batches describe it now: its boot and, when batching, its push interval."""
        update: dict[str, object] = {}
        if self._boot_id_source is not None:
            update["boot_id"] = self._boot_id_source(self._clock())
        if self.ticks_per_push > 1:
            update["push_interval_s"] = self.ticks_per_push * self.node.interval_s
        return self.node.model_copy(update=update) if update else self.node

    # -- one cycle --------------------------------------------------------------------------

    def cycle(self) -> None:
        """Collect once; spool the collection as a batch, or stage it until its push is due."""
        collection = self.collect()
        if self.ticks_per_push == 1:
            batch = self.spool_collection(collection)
            if batch is not None:
                logger.info(
                    "spooled %d samples, %d events for %d GPUs, %d ports",
                    len(batch.samples),
                    len(batch.events),
                    len(batch.gpus),
                    len(batch.ports or ()),
                )
            return
        self.stage_collection(collection)
        if self._push_due():
            self.push_staged()

    def collect(self) -> Collection:
        """Every collector once, merged; a failing collector is counted and skipped."""
        now = self._clock()
        started = time.perf_counter()
        collections = []
        for collector in self._collectors:
            try:
                collections.append(collector.collect(now))
            except CollectorError as exc:
                self._metrics.collector_errors.labels(collector.name, type(exc).__name__).inc()
                logger.warning("collector %s failed: %s", collector.name, exc)
            self._export_inner_errors(collector)
        self._metrics.collect_duration.observe(time.perf_counter() - started)
        merged = merge_readings(collections)
        if merged.gpus:
            self._known_gpus = merged.gpus
        merged.events = attach_gpu_uuids(merged.events, merged.gpus)
        return merged

    def _export_inner_errors(self, collector: Collector) -> None:
        """Collectors that survive per-device failures count them in ``errors``
        ({(collector, reason): n}); carry the increments into the agent's metrics."""
        counts = getattr(collector, "errors", None)
        if not counts:
            return
        for key, total in counts.items():
            new = total - self._errors_seen.get(key, 0)
            if new > 0:
                self._metrics.collector_errors.labels(*key).inc(new)
                self._errors_seen[key] = total

    def spool_collection(self, collection: Collection, *, critical: bool = False) -> Batch | None:
        """Spool what was collected, with the reports the server has not heard yet (drops,
        set-aside batches); ``None`` if there was nothing to send or the full disk dropped it."""
        batch_id = str(uuid.uuid4())
        report = self._spool.take_drop_report()
        set_aside = self._spool.take_set_aside_reports(batch_id)
        if report:
            collection.events.append(_drop_event(report, self._clock()))
        collection.events.extend(_set_aside_event(item) for item in set_aside)
        if not collection.has_readings:
            return None
        try:
            batch = build_batch(self.node_info(), collection, batch_id)
            stored = self._spool.put(
                batch.batch_id,
                encode(batch),
                samples=_readings(batch),
                events=len(batch.events),
                critical=critical,
                carries=report or None,
            )
        except BaseException:
            if report:
                self._spool.restore_drop_report(report)
            if set_aside:
                self._spool.release_set_aside_reports(batch_id)
            raise
        self._count_drops()
        self._pusher.wake()
        return batch if stored else None

    def _count_drops(self) -> None:
        dropped = self._spool.counter("dropped_batches")
        if dropped > self._dropped_seen:
            self._metrics.spool_dropped.inc(dropped - self._dropped_seen)
            self._dropped_seen = dropped

    def stage_collection(self, collection: Collection) -> bool:
        """Stage a collection for the next push; its critical events are pushed at once.
        ``False`` if there was nothing to stage or the full disk dropped it."""
        critical, routine = split_critical(collection.events)
        if critical:
            self.emit_critical(critical)
        waiting = Collection(
            gpus=collection.gpus, samples=collection.samples, events=routine, ports=collection.ports
        )
        if not waiting.has_readings:
            return False
        tick = build_batch(self.node_info(), waiting, "staged")
        stored = self._spool.stage(
            tick_body(tick),
            collected=self._clock().timestamp(),
            samples=_readings(tick),
            events=len(tick.events),
        )
        self._count_drops()
        staged, _ = self._spool.staged()
        self._metrics.staged_ticks.set(staged)
        if not stored:
            return False  # the spool logged the drop
        logger.info(
            "staged %d samples, %d events for %d GPUs (%d of %d collections per push)",
            len(tick.samples),
            len(tick.events),
            len(tick.gpus),
            staged,
            self.ticks_per_push,
        )
        return True

    def _push_due(self) -> bool:
        _, oldest = self._spool.staged()
        if self._spool.staged_collections() >= self.ticks_per_push:
            return True
        # Ticks an earlier run left, or ticks skipped (a cycle with nothing to stage), wait no
        # longer than one push interval.
        period = self.ticks_per_push * self.node.interval_s
        return oldest is not None and self._clock().timestamp() - oldest >= period

    def push_staged(self) -> list[NewBatch]:
        """Combine the staged collections into batches for the pusher (with the reports the
        server has not heard yet), atomically; at each push, at start and at shutdown."""
        carrier = str(uuid.uuid4())
        combined = 0

        def make(
            ticks: list[StagedTick], report: DropReport, aside: list[SetAside]
        ) -> list[NewBatch]:
            nonlocal combined
            combined = len(ticks)
            extra = [_drop_event(report, self._clock())] if report else []
            extra.extend(_set_aside_event(item) for item in aside)
            batches = combine_ticks(
                ticks, node=self.node_info(), carrier=carrier, extra_events=extra
            )
            return [NewBatch(b.batch_id, encode(b), _readings(b), len(b.events)) for b in batches]

        made = self._spool.combine_staged(make, carrier=carrier)
        self._count_drops()
        self._metrics.staged_ticks.set(self._spool.staged()[0])
        if made is None:
            logger.warning("spool disk full: staged collections stay staged until it has room")
            return []
        if made:
            self._pusher.wake()
            logger.info(
                "spooled %d samples, %d events of %d collections in %d batch(es)",
                sum(b.samples for b in made),
                sum(b.events for b in made),
                combined,
                len(made),
            )
        return made

    def emit_critical(self, events: list[Event]) -> None:
        """Called from watcher threads: spool these events as their own batch and push now."""
        if not events:
            return
        events = attach_gpu_uuids(events, self._known_gpus)
        with self._critical_lock:
            # Declare the GPUs we know, so the server can attach the events even if this is the
            # first batch it ever sees from this node.
            self.spool_collection(
                Collection(gpus=list(self._known_gpus), events=events), critical=True
            )
        logger.info(
            "pushed %d event(s) at once: %s",
            len(events),
            ", ".join(f"{e.kind} {e.xid or ''}".strip() for e in events[:5]),
        )

    def emit_routine(self, events: list[Event]) -> None:
        """Called from watcher threads for events that may wait for the next push (corrected
        errors): kept in the spool at once, so none is lost, but not pushed at once: staged to
        ride with the next push when batching, else spooled as an ordinary batch."""
        critical, events = split_critical(events)
        self.emit_critical(critical)  # a caller's mistake must not make a fatal error wait
        if not events:
            return
        events = attach_gpu_uuids(events, self._known_gpus)
        collection = Collection(gpus=list(self._known_gpus), events=events)
        with self._critical_lock:
            if self.ticks_per_push > 1:
                self.stage_collection(collection)
            else:
                self.spool_collection(collection)

    def drain_once(self) -> None:
        """Push what the spool holds now (``--once``); stops at the first failure."""
        self._pusher.drain()

    def spool_depth(self) -> tuple[int, int]:
        return self._spool.depth()

    # -- the loop ---------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        pusher = threading.Thread(target=self._pusher.run, args=(stop,), name="pusher", daemon=True)
        pusher.start()
        watchers = [c for c in self._collectors if isinstance(c, Watcher)]
        for watcher in watchers:
            if hasattr(watcher, "routine_sink"):
                watcher.routine_sink = self.emit_routine  # events that may wait, kept durably
            watcher.start_watch(self.emit_critical)
        logger.info(
            "agent %s for node %s: collectors %s, every %.1fs, pushing every %d collection(s)",
            __version__,
            self.node.name,
            ", ".join(c.name for c in self._collectors),
            self.node.interval_s,
            self.ticks_per_push,
        )
        try:
            self._push_staged_safely()  # what an earlier run left staged has waited enough
            while not stop.is_set():
                started = time.monotonic()
                try:
                    self.cycle()
                except Exception:
                    logger.exception("collection cycle failed; trying again next interval")
                stop.wait(max(0.0, self.node.interval_s - (time.monotonic() - started)))
        finally:
            for watcher in watchers:
                watcher.stop_watch()
            self._push_staged_safely()
            self._pusher.wake()
            pusher.join(timeout=10)
            # One last attempt for what the final cycle spooled; whatever fails stays spooled
            # for the next start.
            self._pusher.drain()
            for collector in self._collectors:
                collector.close()

    def close(self) -> None:
        """Close the collectors and the HTTP client, after ``--once`` (``run`` closes its
        collectors itself and leaves the client, which its caller may own, to its caller)."""
        for collector in self._collectors:
            collector.close()
        self._pusher.close()

    def _push_staged_safely(self) -> None:
        """Combine what is staged, if anything (at start and at shutdown)."""
        try:
            if self._spool.staged()[0]:
                self.push_staged()
        except Exception:
            logger.exception("combining the staged collections failed; they stay staged")
