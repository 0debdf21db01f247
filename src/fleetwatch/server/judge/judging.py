"""The rules, applied on the server to what the agents stored: one verdict list per GPU.

:class:`FleetJudge` keeps a short window of every GPU's recent samples in memory, refreshed
incrementally (each pass reads only the sample blocks stored since the last one, by id), so a
pass over 10,000 GPUs does not rescan minutes of samples. Each node is judged as of its newest
reading, on its agent's clock (capped at now): the windows of the rules are the agent's, so a
late spool or a simulated fleet running in the past is judged as it happened. Each pass then runs
:func:`~fleetwatch.rules.xid.judge_xids` per node over the last day of Xid events,
:func:`~fleetwatch.rules.host_errors.judge_host_errors` per node over the same day of NVSwitch
SXid, PCIe AER, machine-check and EDAC events, :func:`~fleetwatch.rules.port_health.\
judge_port_events` per node over the same day of network port events (verdicts of kind ``host``,
component ``network``), :func:`~fleetwatch.rules.health.judge_health` per
GPU over its window, and :func:`~fleetwatch.rules.health.judge_missing_gpus` per node. A host
verdict about the node (the NVSwitch fabric, the CPUs, host memory) is given to each of its
current GPUs: they all leave service with it, though it does not count against any of them.

Each rule family of a node is judged apart (:mod:`fleetwatch.server.judge.node_parts`): one
that raises is logged, counted and named in an ``unjudged_evidence`` verdict on the node's GPUs,
and the node's other families still give theirs (a fatal Xid is judged whatever else fails).
Verdicts are in one vocabulary, :class:`~fleetwatch.server.concepts.verdict.Verdict`.

Verdicts are not sticky: the health rules clear with their evidence, and an Xid verdict whose
remedy is a reset or reboot clears once its node has booted after the last event (so does a
host verdict). A drain-and-inspect verdict stays for the whole lookback: a reboot does not repair
hardware.
Samples older than a GPU's newest judged sample are stored but not judged live: history by then.
"""

from __future__ import annotations

import functools
import threading
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import Connection, func, select

from fleetwatch.rules.health import BootSample, judge_health, judge_missing_gpus
from fleetwatch.rules.health_screen import JUDGED_FIELDS, may_fire
from fleetwatch.rules.host_errors import HOST_KINDS, judge_host_errors
from fleetwatch.rules.port_health import PORT_KINDS, judge_port_events
from fleetwatch.rules.thresholds import HealthThresholds
from fleetwatch.rules.xid import judge_xids
from fleetwatch.rules.xid_catalog import XidCatalog
from fleetwatch.server.concepts.verdict import Verdict
from fleetwatch.server.db.sample_columns import python_type
from fleetwatch.server.db.tables import events, gpus, node_boots, nodes
from fleetwatch.server.judge.node_parts import NodeParts
from fleetwatch.server.judge.windows import EPOCH, SampleWindows
from fleetwatch.server.repo.sample_reader import SampleChunk, read_samples
from fleetwatch.server.runtime.isolation import ItemGuard
from fleetwatch.server.runtime.passes import give_way
from fleetwatch.telemetry import Event

__all__ = ["FleetJudge", "Verdict"]

_US = timedelta(microseconds=1)
_ID_OVERLAP = 2_000  # sample blocks re-read each pass (about a second of 100,000 GPUs' pushes),
# for ids committed out of order
_CHUNK = 20_000  # sample blocks fetched at a time (the first pass reads minutes of the fleet's)
_COMPACT_AFTER = 1_000_000  # samples added within a pass before the windows are compacted
_GIVE_WAY_EVERY = 256  # nodes judged between two chances for the urgent lane to go first
_CLEARED_BY_BOOT = frozenset({"restart_app", "reset_gpu", "drain_reset", "reboot_node"})
_LIVE_KINDS = ("xid", "gpu_lost", "node_boot", *sorted(HOST_KINDS), *sorted(PORT_KINDS))
_CURRENT = timedelta(days=1)  # a GPU last seen this long before its node's newest is gone
STATE_WAIT_S = 0.25


@dataclass
class _Gpu:
    id: int  # gpus.id, the key its samples are stored under
    uuid: str
    node_id: int
    pci_bus_id: str | None
    name: str | None
    first_seen: datetime
    last_seen: datetime
    slot: int  # its window's key in FleetJudge.windows


def _gpu_of(row: Any, *, slot: int) -> _Gpu:
    """A GPU of a ``_GPU_COLUMNS`` row, in window ``slot``."""
    return _Gpu(
        id=row.id,
        uuid=row.uuid,
        node_id=row.node_id,
        pci_bus_id=row.pci_bus_id,
        name=row.name,
        first_seen=row.first_seen,
        last_seen=row.last_seen,
        slot=slot,
    )


_GPU_COLUMNS = (
    gpus.c.id,
    gpus.c.uuid,
    gpus.c.node_id,
    gpus.c.pci_bus_id,
    gpus.c.name,
    gpus.c.first_seen,
    gpus.c.last_seen,
)


class FleetJudge:
    """Judges every GPU from the database; call :meth:`judge` from one thread at a time."""

    def __init__(
        self,
        *,
        catalog: XidCatalog,
        thresholds: HealthThresholds,
        xid_lookback: timedelta = timedelta(hours=24),
        unreachable_after_intervals: float = 3.0,
        max_lag: timedelta = timedelta(days=7),
        guard: ItemGuard | None = None,
    ) -> None:
        self.guard = guard or ItemGuard("assessment")
        self.catalog = catalog
        self.thresholds = thresholds
        self.xid_lookback = xid_lookback
        self.unreachable_after_intervals = unreachable_after_intervals
        windows = (
            thresholds.sbe_window_s,
            thresholds.nvlink_window_s,
            thresholds.pcie_window_s,
            thresholds.throttle_window_s,
        )
        self.history = timedelta(seconds=max(windows) * 1.5)
        dense_windows = (thresholds.nvlink_window_s, thresholds.pcie_window_s)
        self.dense = timedelta(seconds=max(dense_windows) * 1.5)
        # At least throttle_min_samples per throttle window, and never coarser than 30 s.
        step = min(30.0, thresholds.throttle_window_s / (thresholds.throttle_min_samples * 3))
        self.sparse_step = timedelta(seconds=step)
        self.max_lag = max_lag
        self._gpus: dict[str, _Gpu] = {}
        self._by_id: dict[int, _Gpu] = {}  # by gpus.id, the key samples are stored under
        # node_boots.id to boot_id: rows of node_boots are only ever inserted, never changed.
        self._boot_ids: dict[int, str] = {}
        self.windows = SampleWindows(JUDGED_FIELDS, [python_type(name) for name in JUDGED_FIELDS])
        self._last_id: int | None = None
        self._oldest_us: int | None = None  # the oldest node's newest sample, at the last pass
        # Held while a whole-fleet pass changes what a targeted pass copies: the GPUs known, the
        # windows, the read position.
        self._state = threading.Lock()
        # How long a targeted pass waits for that copy. A whole-fleet pass holds the lock while
        # it reads and compacts the fleet's new samples, seconds at 100,000 GPUs (the fatal Xid
        # that woke the targeted pass would wait as long): past this, the targeted pass reads
        # its few GPUs' windows whole from the database instead (counted in fresh_reads).
        self.state_wait_s = STATE_WAIT_S
        self.fresh_reads = 0

    def _load_gpus(self, conn: Connection) -> dict[int, tuple[str, datetime, float]]:
        if not self._by_id:
            for row in conn.execute(select(*_GPU_COLUMNS)):
                self._known(row)
        else:
            # A known GPU's row only changes its node and last_seen (the rest is kept from the
            # first read, as _known does): read those, and whole rows of new GPUs alone.
            new = []
            for seen in conn.execute(select(gpus.c.id, gpus.c.node_id, gpus.c.last_seen)):
                gpu = self._by_id.get(seen.id)
                if gpu is None:
                    new.append(seen.id)
                else:
                    gpu.node_id, gpu.last_seen = seen.node_id, seen.last_seen
            if new:
                query = select(*_GPU_COLUMNS).where(gpus.c.id.in_(new)).order_by(gpus.c.id)
                for row in conn.execute(query):
                    self._known(row)
        return {
            row.id: (row.name, row.last_seen, row.interval_s)
            for row in conn.execute(
                select(nodes.c.id, nodes.c.name, nodes.c.last_seen, nodes.c.interval_s)
            )
        }

    def _copy_of(self, row: Any) -> _Gpu:
        """A GPU as :meth:`_load_gpus` would refresh it, as a copy: a whole-fleet pass may be
        reading the one it holds. A GPU new to this judge gets its slot (call under _state)."""
        gpu = self._gpus.get(row.uuid)
        if gpu is None:
            return replace(self._known(row))
        return replace(gpu, node_id=row.node_id, last_seen=row.last_seen)

    def _known(self, row: Any) -> _Gpu:
        gpu = self._gpus.get(row.uuid)
        if gpu is None:
            gpu = self._gpus[row.uuid] = _gpu_of(row, slot=len(self._gpus))
        else:
            gpu.node_id, gpu.last_seen = row.node_id, row.last_seen
        self._by_id[row.id] = gpu
        return gpu

    def _load_samples(self, conn: Connection, now: datetime) -> None:
        if self._last_id is None:
            # The newest sample's time, from gpus (ts has only a BRIN index on PostgreSQL).
            newest = conn.execute(select(func.max(gpus.c.latest_ts))).scalar()
            if newest is None:
                return
            since, after_id = newest - self.history, None
        else:
            # Ids, not times: late samples (a spool emptying, a simulated fleet) are found too.
            # The overlap re-reads rows that may have committed out of id order on PostgreSQL.
            since, after_id = None, self._last_id - _ID_OVERLAP
        # In chunks: a first pass reads minutes of the whole fleet's samples. Compacting between
        # chunks thins exactly as once at the end (see SampleWindows.compact), so memory stays
        # near the thinned windows' size.
        for add_chunk in self._sample_chunks(conn, now, since, after_id):
            add_chunk()
            if self.windows.pending >= _COMPACT_AFTER:
                self._compact()
        self._compact()

    def _sample_chunks(
        self, conn: Connection, now: datetime, since: datetime | None, after_id: int | None
    ) -> Iterator[Callable[[], None]]:
        """The samples with ``ts <= now`` and ``ts >= since`` or in blocks after ``after_id``,
        chunk by chunk, each as the call that adds it to the windows."""
        for chunk in read_samples(
            conn, JUDGED_FIELDS, until=now, since=since, after_id=after_id, chunk=_CHUNK
        ):
            yield functools.partial(self._add_chunk, conn, chunk)

    def _add_chunk(self, conn: Connection, chunk: SampleChunk) -> None:
        """Add a chunk of samples to the windows (each GPU's newer samples only)."""
        newest_id = int(chunk.ids.max())
        self._last_id = newest_id if self._last_id is None else max(self._last_id, newest_id)
        self._add_to(conn, self.windows, chunk, self._slot_of)

    def _slot_of(self, gpu_id: int) -> int:
        gpu = self._by_id.get(gpu_id)
        return -1 if gpu is None else gpu.slot

    def _add_to(
        self,
        conn: Connection,
        windows: SampleWindows,
        chunk: SampleChunk,
        slot_of: Callable[[int], int],
    ) -> None:
        """Add ``chunk``'s samples to ``windows``, each GPU's in its slot (``slot_of(gpus.id)``;
        -1: a GPU not judged here, its samples skipped)."""
        gpu_ids, gpu_of = np.unique(chunk.gpu_ids, return_inverse=True)
        slots = np.asarray([slot_of(i) for i in gpu_ids.tolist()], np.int64)[gpu_of]
        known = slots >= 0
        if not known.all():
            chunk = chunk.take(known)
            slots = slots[known]
        if not slots.size:
            return
        boot_keys, boot_of = np.unique(chunk.boots, return_inverse=True)
        boots = self._boots_of(conn, boot_keys.tolist())
        windows.add_arrays(slots, chunk.ts_us, boots, boot_of, chunk.values, chunk.raw)

    def _boots_of(self, conn: Connection, keys: Sequence[int]) -> list[str | None]:
        """The boot_id of each node_boots key (None: -1, or a key without a row)."""
        missing = [k for k in keys if k >= 0 and k not in self._boot_ids]
        if missing:
            query = select(node_boots.c.id, node_boots.c.boot_id)
            for row in conn.execute(query.where(node_boots.c.id.in_(missing))):
                self._boot_ids[row.id] = row.boot_id
        return [self._boot_ids.get(k) for k in keys]

    def _load_samples_of(
        self,
        conn: Connection,
        now: datetime,
        windows: SampleWindows,
        members: Sequence[_Gpu],
        last_id: int | None,
    ) -> None:
        """What :meth:`_load_samples` would add to the windows of ``members`` (whose read
        position was ``last_id``), added to ``windows`` (their copy) and compacted the same
        way. Read by GPU from a time: samples no newer than their window's newest are skipped
        when merged, so when every GPU has a window the oldest of those bounds the read."""
        if not members:
            return
        newest_us = windows.newest_us()
        if last_id is not None and windows.slots.size == len(members):
            since = EPOCH + timedelta(microseconds=int(newest_us.min()))
        else:
            newest = conn.execute(select(func.max(gpus.c.latest_ts))).scalar()
            if newest is None:
                return
            since = newest - self.history
        slot_by_id = {gpu.id: gpu.slot for gpu in members}
        for chunk in read_samples(
            conn, JUDGED_FIELDS, since=since, until=now, gpu_ids=list(slot_by_id), chunk=_CHUNK
        ):
            self._add_to(conn, windows, chunk, lambda i: slot_by_id.get(i, -1))
        windows.compact(self.history // _US, self.dense // _US, self.sparse_step // _US)

    def _compact(self) -> None:
        self.windows.compact(self.history // _US, self.dense // _US, self.sparse_step // _US)

    def _thinned(self, window: list[BootSample]) -> list[BootSample]:
        """Every sample of the last ``dense`` seconds (the 60 s NVLink and PCIe windows), one per
        ``sparse_step`` before that. Counter rules read a window's first and last sample, and the
        throttle share is estimated from the thinned samples; at a 10 s interval a GPU keeps
        about 29 samples instead of 90, and 10,000 GPUs fit in about a third of the memory."""
        if len(window) < 2:
            return window
        dense_from = window[-1].sample.ts - self.dense
        kept: list[BootSample] = []
        last: datetime | None = None
        for s in window:
            ts = s.sample.ts
            if ts >= dense_from or last is None or ts - last >= self.sparse_step:
                kept.append(s)
                last = ts
        return kept if len(kept) < len(window) else window

    def _as_of(self, newest_us: int | None, now: datetime) -> datetime:
        """A node is judged as of its newest reading (its agent's clock), never after ``now``
        and never more than ``max_lag`` before it."""
        newest = now if newest_us is None else EPOCH + timedelta(microseconds=newest_us)
        return min(now, max(newest, now - self.max_lag))

    def _load_events(
        self,
        conn: Connection,
        since: datetime,
        now: datetime,
        node_ids: Sequence[int] | None = None,
    ) -> dict[int, list[Event]]:
        """Each node's events of the live kinds in [since, now]; of ``node_ids`` only, if given."""
        query = (
            select(events)
            .where(events.c.ts >= since, events.c.ts <= now)
            .where(events.c.kind.in_(_LIVE_KINDS), events.c.node_id.is_not(None))
            .order_by(events.c.ts)
        )
        if node_ids is not None:
            query = query.where(events.c.node_id.in_(node_ids))
        rows = conn.execute(query)
        by_node: dict[int, list[Event]] = defaultdict(list)
        for row in rows:
            by_node[row.node_id].append(
                Event.model_construct(
                    kind=row.kind,
                    ts=row.ts,
                    uuid=row.gpu_uuid,
                    pci_bus_id=row.pci_bus_id,
                    xid=row.xid,
                    message=row.message,
                    pid=row.pid,
                    process=row.process,
                    details=row.details,
                )
            )
        return by_node

    def judge(self, conn: Connection, now: datetime) -> dict[str, list[Verdict]]:
        """Verdicts per GPU UUID as of ``now`` (GPUs without verdicts are absent)."""
        with self._state:  # what a targeted pass reads meanwhile (judge_nodes)
            node_info = self._load_gpus(conn)
            self._load_samples(conn, now)
            known = list(self._gpus.values())
        give_way()  # holding none of the locks above: the urgent lane first (runtime/passes.py)
        by_node: dict[int, list[_Gpu]] = defaultdict(list)
        for gpu in known:
            by_node[gpu.node_id].append(gpu)
        where, newest = self._newest_per_node(self.windows, by_node, len(known))
        self._oldest_us = min((us for us in newest.values() if us is not None), default=None)
        as_of = {node_id: self._as_of(us, now) for node_id, us in newest.items()}
        since = min(as_of.values(), default=now) - self.xid_lookback
        node_events = self._load_events(conn, since, now)
        judged = self._screen(where, node_events, known)
        return self._judge_nodes(
            self.windows, by_node, node_events, as_of, node_info, now, where, judged
        )

    def judge_nodes(
        self, conn: Connection, now: datetime, names: Collection[str]
    ) -> tuple[dict[str, list[Verdict]], set[str]]:
        """The targeted pass: the verdicts :meth:`judge` would give now, for the GPUs of the
        nodes ``names`` only, and those GPUs' UUIDs. Reads only their GPUs, samples and events,
        and leaves the fleet's windows as they are: their samples are judged on a copy of
        their windows (:meth:`SampleWindows.subset`), and the next full pass reads them again.

        Events are read from the time the full pass would read them from (the oldest ``as_of``
        of any node, which is a silent node's, known from the last full pass): a ``gpu_lost``
        is judged however old it is among what was read, so the same start gives the same
        verdicts. Call after :meth:`judge` has run once; without it, judge the fleet.

        Safe beside a :meth:`judge` in another thread (one targeted pass at a time): it waits
        at most :attr:`state_wait_s` while that pass reads new samples into the windows, then
        copies what it needs. Past that it reads its GPUs' windows whole from the database
        instead (:meth:`_fresh_windows`): the same samples, thinned from the oldest one read,
        where the fleet's windows may have kept other instants of a thinned stretch (a rate at
        its rule's threshold may then be judged on the other side of it until the next
        whole-fleet pass; an Xid, a lost GPU or a host error is judged alike either way)."""
        node_info = {
            row.id: (row.name, row.last_seen, row.interval_s)
            for row in conn.execute(
                select(nodes.c.id, nodes.c.name, nodes.c.last_seen, nodes.c.interval_s).where(
                    nodes.c.name.in_(sorted(names))
                )
            )
        }
        query = select(*_GPU_COLUMNS).where(gpus.c.node_id.in_(list(node_info)))
        rows = conn.execute(query.order_by(gpus.c.id)).all()
        by_node: dict[int, list[_Gpu]] = {node_id: [] for node_id in node_info}
        if self._state.acquire(timeout=self.state_wait_s):
            try:
                for row in rows:
                    by_node[row.node_id].append(self._copy_of(row))
                members = [gpu for group in by_node.values() for gpu in group]
                windows = self.windows.subset([gpu.slot for gpu in members])
                last_id, oldest_us, size = self._last_id, self._oldest_us, len(self._gpus)
            finally:
                self._state.release()
        else:
            members, windows = self._fresh_windows(rows, by_node)
            last_id, oldest_us, size = None, self._oldest_us, len(members)
            self.fresh_reads += 1
        self._load_samples_of(conn, now, windows, members, last_id)
        where, newest = self._newest_per_node(windows, by_node, size)
        as_of = {node_id: self._as_of(us, now) for node_id, us in newest.items()}
        oldest = now if oldest_us is None else self._as_of(oldest_us, now)
        since = min([*as_of.values(), oldest]) - self.xid_lookback
        node_events = self._load_events(conn, since, now, node_ids=list(node_info))
        # Every window of these few GPUs: the screen only spares the rules' time, it never
        # keeps a verdict from them (rules.health_screen).
        judged = np.ones(windows.slots.size, dtype=bool)
        verdicts = self._judge_nodes(
            windows, by_node, node_events, as_of, node_info, now, where, judged
        )
        return verdicts, {gpu.uuid for gpu in members}

    def _fresh_windows(
        self, rows: Sequence[Any], by_node: dict[int, list[_Gpu]]
    ) -> tuple[list[_Gpu], SampleWindows]:
        """The GPUs of ``rows`` with slots of their own and empty windows, to be read whole
        from the database (the targeted pass's way when a whole-fleet pass holds the fleet's
        windows): nothing of the judge's state is read or changed."""
        members = []
        for slot, row in enumerate(rows):
            gpu = _gpu_of(row, slot=slot)
            by_node[row.node_id].append(gpu)
            members.append(gpu)
        return members, self.windows.empty_like()

    def _newest_per_node(
        self, windows: SampleWindows, by_node: Mapping[int, list[_Gpu]], size: int
    ) -> tuple[NDArray[np.int64], dict[int, int | None]]:
        """Each GPU's window (a position in ``windows.slots``, -1 for none; ``size``: the slots
        known) and each node's newest sample time (microseconds; None: no sample)."""
        where = np.full(size, -1, np.int64)
        where[windows.slots] = np.arange(windows.slots.size)
        newest = windows.newest_us().tolist()
        return where, {
            node_id: max((newest[w] for g in members if (w := where[g.slot]) >= 0), default=None)
            for node_id, members in by_node.items()
        }

    def _judge_nodes(
        self,
        windows: SampleWindows,
        by_node: Mapping[int, list[_Gpu]],
        node_events: Mapping[int, list[Event]],
        as_of: Mapping[int, datetime],
        node_info: Mapping[int, tuple[str, datetime, float]],
        now: datetime,
        where: NDArray[np.int64],
        judged: NDArray[np.bool_],
    ) -> dict[str, list[Verdict]]:
        out: dict[str, list[Verdict]] = defaultdict(list)
        for n, (node_id, members) in enumerate(by_node.items(), 1):
            if not n % _GIVE_WAY_EVERY:
                give_way()
            # Node by node, and within a node rule family by family (judge.node_parts): what
            # trips one family up is logged, counted and named in a verdict, and the rest of
            # the node and of the fleet is still judged (server.runtime.isolation).
            parts = NodeParts(self.guard, f"node id {node_id}", [g.uuid for g in members])
            with parts.part("the node as a whole"):  # what the parts leave out: named too
                self._judge_node(
                    members,
                    node_events.get(node_id, []),
                    as_of[node_id],
                    node_info.get(node_id),
                    now,
                    parts,
                    where,
                    judged,
                    windows,
                )
            for uuid, verdicts in parts.verdicts().items():
                out[uuid].extend(verdicts)
        return {uuid: verdicts for uuid, verdicts in out.items() if verdicts}

    def _screen(
        self,
        where: NDArray[np.int64],
        node_events: Mapping[int, list[Event]],
        known: Sequence[_Gpu],
    ) -> NDArray[np.bool_]:
        """Per window: whether the health rules must look at it (rules.health_screen), or it
        names a GPU lost from the bus, or holds a value the screen cannot read exactly."""
        w = self.windows
        slowdown_of: dict[str | None, float] = {}
        by_slot = {gpu.slot: gpu for gpu in known}
        names = [by_slot[slot].name for slot in w.slots.tolist()]
        for name in set(names):
            slowdown_of[name] = self.thresholds.slowdown_for(name)[0]
        slowdown = np.array([slowdown_of[name] for name in names], np.float64)
        judged = may_fire(w.columns(), w.boots_as_floats(), w.starts, slowdown, self.thresholds)
        judged |= w.has_inexact()
        lost = {e.uuid for evs in node_events.values() for e in evs if e.kind == "gpu_lost"}
        for uuid in lost:
            gpu = self._gpus.get(uuid or "")
            if gpu is not None and where[gpu.slot] >= 0:
                judged[where[gpu.slot]] = True
        return judged

    def _judge_node(
        self,
        members: list[_Gpu],
        evs: list[Event],
        at: datetime,
        info: tuple[str, datetime, float] | None,
        now: datetime,
        parts: NodeParts,
        where: NDArray[np.int64],
        judged: NDArray[np.bool_],
        windows: SampleWindows,
    ) -> None:
        # Events after ``at`` stay: a node_boot is stamped on the server's clock, and an Xid
        # logged after the newest sample still happened. The Xid rules go first and alone: a
        # fatal Xid is judged whatever else of the node cannot be.
        kinds = {e.kind for e in evs}  # a part with nothing to read costs no item
        if not kinds.isdisjoint(("xid", "gpu_lost")):
            with parts.part("Xid rules") as out:
                self._judge_xids(windows, members, evs, at, out, where)
        if not kinds.isdisjoint(HOST_KINDS):
            with parts.part("host error rules") as out:
                self._judge_host(members, evs, at, out)
        if not kinds.isdisjoint(PORT_KINDS):
            with parts.part("port rules") as out:
                self._judge_ports(members, evs, at, out)
        for gpu in members:
            w = int(where[gpu.slot])
            if w < 0 or not judged[w]:
                continue  # no window, or one no health rule can fire on (rules.health_screen)
            with parts.part(f"telemetry rules of {gpu.uuid}") as out:
                verdicts = judge_health(
                    windows.series(w, gpu.uuid),
                    events=evs,
                    thresholds=self.thresholds,
                    now=at,
                    gpu_name=gpu.name,
                )
                out[gpu.uuid].extend(Verdict.from_health(v) for v in verdicts)
        if info is not None:
            with parts.part("missing GPU rule") as out:
                self._judge_missing(members, info, now, out)

    def _judge_xids(
        self,
        windows: SampleWindows,
        members: list[_Gpu],
        evs: list[Event],
        now: datetime,
        out: dict[str, list[Verdict]],
        where: NDArray[np.int64],
    ) -> None:
        xid_events = [e for e in evs if e.kind in ("xid", "gpu_lost")]
        if not xid_events:
            return
        last_boot = max((e.ts for e in evs if e.kind == "node_boot"), default=None)
        by_pci = {g.pci_bus_id: g.uuid for g in members if g.pci_bus_id}
        uuids = {g.uuid for g in members}
        ends = windows.ends
        recovery = {
            g.uuid: int(action)
            for g in members
            if (w := where[g.slot]) >= 0
            and (action := windows.value(int(ends[w]) - 1, "gpu_recovery_action"))
        }
        verdicts = judge_xids(
            xid_events,
            catalog=self.catalog,
            now=now,
            lookback=self.xid_lookback,
            recovery_actions=recovery,
        )
        for v in verdicts:
            uuid = v.uuid if v.uuid in uuids else by_pci.get(v.pci_bus_id or v.gpu)
            if uuid is None:
                continue  # a GPU this node never reported: nothing to attach it to
            # A reboot after the verdict's last event cleared what a reboot clears.
            rebooted_since = (
                last_boot is not None and v.last_seen is not None and last_boot > v.last_seen
            )
            if rebooted_since and v.action in _CLEARED_BY_BOOT:
                continue
            out[uuid].append(Verdict.from_xid(v))

    def _judge_host(
        self, members: list[_Gpu], evs: list[Event], now: datetime, out: dict[str, list[Verdict]]
    ) -> None:
        host_events = [e for e in evs if e.kind in HOST_KINDS]
        if not host_events or not members:
            return
        newest = max(g.last_seen for g in members)
        current = [g for g in members if g.last_seen >= newest - _CURRENT]
        by_pci = {g.pci_bus_id: g.uuid for g in current if g.pci_bus_id}
        verdicts = judge_host_errors(
            host_events,
            gpus=by_pci,
            now=now,
            thresholds=self.thresholds,
            lookback=self.xid_lookback,
        )
        last_boot = max((e.ts for e in evs if e.kind == "node_boot"), default=None)
        for v in verdicts:
            if last_boot is not None and last_boot > v.last_seen and v.action in _CLEARED_BY_BOOT:
                continue  # the reset or reboot it asked for has happened
            verdict = Verdict.from_host(v)
            if v.scope == "gpu":
                uuid = v.uuid if v.uuid in {g.uuid for g in current} else by_pci.get(v.gpu or "")
                if uuid is not None:
                    out[uuid].append(verdict)
                continue
            for g in current:
                out[g.uuid].append(verdict)

    def _judge_ports(
        self, members: list[_Gpu], evs: list[Event], now: datetime, out: dict[str, list[Verdict]]
    ) -> None:
        """Port verdicts are about the node: each of its current GPUs leaves service with it.
        A port's own ``port_up`` clears them, not a reboot (a reboot does not mend a cable)."""
        port_events = [e for e in evs if e.kind in PORT_KINDS]
        if not port_events or not members:
            return
        newest = max(g.last_seen for g in members)
        current = [g for g in members if g.last_seen >= newest - _CURRENT]
        verdicts = judge_port_events(
            port_events, now=now, thresholds=self.thresholds, lookback=self.xid_lookback
        )
        for v in verdicts:
            verdict = Verdict.from_host(v)
            for g in current:
                out[g.uuid].append(verdict)

    def _judge_missing(
        self,
        members: Iterable[_Gpu],
        info: tuple[str, datetime, float],
        now: datetime,
        out: dict[str, list[Verdict]],
    ) -> None:
        _name, node_seen, interval_s = info
        fresh = node_seen - timedelta(seconds=interval_s * self.unreachable_after_intervals)
        current = [g for g in members if g.last_seen >= node_seen - timedelta(days=1)]
        # A slot taken over by a newer GPU (a replacement) no longer expects the old one.
        newest: dict[str | None, _Gpu] = {}
        for g in sorted(current, key=lambda g: g.first_seen):
            newest[g.pci_bus_id or g.uuid] = g
        expected = {g.uuid for g in newest.values()}
        reporting = {g.uuid for g in newest.values() if g.last_seen >= fresh}
        seen = {g.uuid: g.last_seen for g in newest.values()}
        for v in judge_missing_gpus(expected, reporting, now=now, last_seen=seen):
            out[v.gpu].append(Verdict.from_health(v))
