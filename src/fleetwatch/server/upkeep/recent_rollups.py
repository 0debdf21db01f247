"""What the rollups job keeps between its passes: the recent hours, folded so far.

Recomputing an hour of a 100,000-GPU fleet means reading 36 million samples; the job did it for
three hours every five minutes. Instead, the leader's :class:`RecentHours` holds one
:class:`~fleetwatch.models.hour_folds.HourFold` per recent hour (from ``keep_hours`` before the
current one, and any later hour an agent's clock is already in) and folds in only the samples stored
since its last pass, found by their blocks' ids. Every hour at or after :attr:`RecentHours.floor`
was read whole by the first pass, so a fold there holds all of its samples; a sample for an older
hour (a spool emptying after an outage), a sample older than one already folded for its GPU, and a
GPU whose counters float64 cannot sum exactly are recomputed from the database, GPU-hour by
GPU-hour, with :func:`~fleetwatch.models.telemetry_features.rollup_hour` (the caller does that: this
module reads nothing).

PostgreSQL may commit block ids out of order, so each pass re-reads the last ``overlap`` ids
before the newest it folded and skips the ones it already has (every row of a block shares its
block's id).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fleetwatch.models.hour_folds import FOLD_COLUMNS, HourFold, SampleChunk, sample_arrays
from fleetwatch.models.telemetry_features import GPU_CATEGORIES
from fleetwatch.rules.xid_catalog import XidCatalog

__all__ = ["EVENT_ID_OVERLAP", "RecentHours", "SAMPLE_ID_OVERLAP"]

SAMPLE_ID_OVERLAP = 20_000  # block ids re-read each pass: 12 s of a 100,000-GPU fleet's pushes
EVENT_ID_OVERLAP = 1_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_HOUR_US = 3600 * 1_000_000

GpuHour = tuple[datetime, str]  # (hour, GPU UUID)


def _hour(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


class RecentHours:
    """The folds of the hours from :attr:`floor` on, and which of their GPUs changed."""

    def __init__(self, *, floor: datetime, keep_hours: int, catalog: XidCatalog) -> None:
        self.floor = floor
        self.keep_hours = keep_hours
        self.catalog = catalog
        self.folds: dict[datetime, HourFold] = {}
        self.dirty: dict[datetime, set[int]] = defaultdict(set)
        self.after_id: int | None = None  # the newest sample block id folded
        self.passes = 0  # the rollup passes stored when this one's was (leader_state)
        self.after_event_id = 0  # the newest Xid event id seen
        self._event_ids: set[int] = set()  # those seen within the overlap
        self._uuids: list[str] = []
        self._slots: dict[str, int] = {}
        self._recent_ids = np.empty(0, np.int64)
        self._xids: dict[datetime, dict[int, tuple[int, ...]]] = defaultdict(dict)

    def slot(self, uuid: str) -> int:
        found = self._slots.get(uuid)
        if found is None:
            found = self._slots[uuid] = len(self._uuids)
            self._uuids.append(uuid)
        return found

    def uuid(self, slot: int) -> str:
        return self._uuids[slot]

    def fold(
        self, rows: Sequence[Sequence[Any]], *, skip_seen: bool, oldest: datetime
    ) -> set[GpuHour]:
        """Fold sample rows ``(id, gpu_uuid, node_id, ts, *FOLD_COLUMNS)`` in; return the
        GPU-hours to recompute from the database. With ``skip_seen``, rows already folded (the
        overlap) are skipped; rows of hours before ``oldest`` are ignored, as they always were
        (``refresh_rollups``' backfill bound)."""
        if not rows:
            return set()
        columns = list(zip(*rows, strict=True))
        size = len(rows)
        values, reasons = sample_arrays(
            {name: columns[4 + j] for j, name in enumerate(FOLD_COLUMNS)}
        )
        return self.fold_arrays(
            np.asarray(columns[0], np.int64),
            np.fromiter((self.slot(u) for u in columns[1]), np.int64, size),
            np.fromiter(((t - _EPOCH) // _US for t in columns[3]), np.int64, size),
            np.asarray(columns[2], np.int64),
            values,
            reasons,
            skip_seen=skip_seen,
            oldest=oldest,
        )

    def fold_arrays(
        self,
        ids: NDArray[np.int64],
        slot: NDArray[np.int64],
        ts: NDArray[np.int64],
        node: NDArray[np.int64],
        values: Mapping[str, NDArray[np.float64]],
        reasons: NDArray[np.int64],
        *,
        skip_seen: bool,
        oldest: datetime,
    ) -> set[GpuHour]:
        """:meth:`fold` for samples already arrays (a packed read's): per row its id, slot
        (:meth:`slot` of its GPU), time in microseconds since the epoch, node id, the
        :data:`FOLD_COLUMNS` as float64 (NaN: absent) and the throttle masks (0: absent)."""
        if ids.size == 0:
            return set()
        keep = ~np.isin(ids, self._recent_ids) if skip_seen else np.ones(ids.size, dtype=bool)
        self._remember(ids)
        hour = ts - ts % _HOUR_US
        keep &= hour >= (oldest - _EPOCH) // _US
        floor = (self.floor - _EPOCH) // _US
        redo: set[GpuHour] = set()
        old = keep & (hour < floor)
        for i in np.flatnonzero(old).tolist():
            redo.add((_hour(int(hour[i])), self._uuids[int(slot[i])]))
        keep &= ~old
        if not keep.any():
            return redo
        picked = np.flatnonzero(keep)
        chunk = SampleChunk.from_arrays(
            slot[picked],
            ts[picked],
            node[picked],
            {name: values[name][picked] for name in FOLD_COLUMNS},
            reasons[picked],
        )
        hours = hour[picked][np.lexsort((ts[picked], slot[picked]))]
        for h in np.unique(hours).tolist():
            at = _hour(int(h))
            fold = self.folds.get(at)
            if fold is None:
                fold = self.folds[at] = HourFold(at)
            part = chunk.take(hours == h)
            behind = fold.fold(part)
            self.dirty[at].update(np.setdiff1d(part.slot, behind).tolist())
            redo.update((at, self._uuids[s]) for s in behind.tolist())
        return redo

    def _remember(self, ids: NDArray[np.int64]) -> None:
        newest = int(ids.max())
        self.after_id = newest if self.after_id is None else max(self.after_id, newest)
        recent = np.concatenate((self._recent_ids, ids))
        self._recent_ids = np.unique(recent[recent > self.after_id - SAMPLE_ID_OVERLAP])

    def new_events(self, rows: Sequence[Any]) -> list[Any]:
        """The event rows (with ``id``) not seen before; the last EVENT_ID_OVERLAP ids are
        remembered, as event ids may commit out of order too."""
        fresh = [row for row in rows if row.id not in self._event_ids]
        if rows:
            self.after_event_id = max(self.after_event_id, max(row.id for row in rows))
        floor = self.after_event_id - EVENT_ID_OVERLAP
        self._event_ids = {i for i in self._event_ids if i > floor}
        self._event_ids.update(row.id for row in fresh if row.id > floor)
        return fresh

    def refold(self, hour: datetime, rows: Sequence[Sequence[Any]], uuids: Iterable[str]) -> None:
        """Replace ``uuids``' samples of ``hour`` (held here) by all of theirs in ``rows``."""
        fold = self.folds[hour]
        slots = np.array([self.slot(u) for u in uuids], np.int64)
        fold.reset(slots)
        self.dirty[hour].update(slots.tolist())
        if rows:
            columns = list(zip(*rows, strict=True))
            ts = np.fromiter(((t - _EPOCH) // _US for t in columns[3]), np.int64, len(rows))
            slot = np.fromiter((self.slot(u) for u in columns[1]), np.int64, len(rows))
            node = np.asarray(columns[2], np.int64)
            values = {name: columns[4 + j] for j, name in enumerate(FOLD_COLUMNS)}
            fold.fold(SampleChunk.from_columns(slot, ts, node, values))

    def note_xids(self, xids: Mapping[tuple[str, datetime], list[int]]) -> None:
        """The Xid codes per (GPU, hour) of the hours held; GPU-hours whose counts changed since
        they were last written become dirty."""
        counts: dict[datetime, dict[int, tuple[int, ...]]] = defaultdict(dict)
        for (uuid, hour), codes in xids.items():
            if hour in self.folds and uuid in self._slots:
                counts[hour][self._slots[uuid]] = self._categories(codes)
        for hour, fold in self.folds.items():
            now = counts.get(hour, {})
            before = self._xids[hour]
            changed = {s for s in set(now) | set(before) if now.get(s) != before.get(s)}
            present = set(fold.slots().tolist())
            self.dirty[hour].update(changed & present)
            self._xids[hour] = now

    def _categories(self, codes: Iterable[int]) -> tuple[int, ...]:
        counts = dict.fromkeys(GPU_CATEGORIES, 0)
        for code in codes:
            category = self.catalog.lookup(code).category
            if category in counts:
                counts[category] += 1
        return tuple(counts[c] for c in GPU_CATEGORIES)

    def rows(self, hour: datetime, slots: Iterable[int]) -> tuple[list[dict[str, Any]], list[str]]:
        """(``gpu_hourly`` rows of ``slots`` in ``hour``, UUIDs whose counters need exact
        integers: roll those up from the database instead)."""
        fold = self.folds[hour]
        wanted = np.array(sorted(set(slots)), np.int64)
        wanted = wanted[np.isin(wanted, fold.slots())]
        inexact = fold.inexact(wanted)
        exact = [self._uuids[s] for s in wanted[inexact].tolist()]
        wanted = wanted[~inexact]
        xids = self._xids[hour]
        zero = (0,) * len(GPU_CATEGORIES)
        out = []
        for s, row in zip(wanted.tolist(), fold.rows(wanted), strict=True):
            counts = xids.get(s, zero)
            row.update({f"xid_{c}": n for c, n in zip(GPU_CATEGORIES, counts, strict=True)})
            out.append({"gpu_uuid": self._uuids[s], "hour": hour, **row})
        return out, exact

    def forget_before(self, hour: datetime) -> None:
        """Drop the hours before ``hour`` (written for the last time) and raise the floor."""
        for at in [h for h in self.folds if h < hour]:
            del self.folds[at]
            self.dirty.pop(at, None)
            self._xids.pop(at, None)
        self.floor = max(self.floor, hour)
