"""One hour's rollups of many GPUs, folded from their samples chunk by chunk with numpy.

:func:`~fleetwatch.models.telemetry_features.rollup_hour` folds one GPU's hour in Python, about
a millisecond per GPU-hour of 360 samples: 100 s for an hour of a 100,000-GPU fleet, every time
the hour is recomputed. An :class:`HourFold` keeps, per GPU (a small integer *slot*), what
``rollup_hour`` needs to continue where it stopped: counts, first and last sample time, each
counter's running increase and last reading, the newest remapped-row count, and the hour's
temperatures as a multiset (for the exact nearest-rank p95). Folding a GPU's samples in several
chunks, each in time order and after the previous one, gives what ``rollup_hour`` gives on all
of them at once; ``tests/unit/models/test_hour_folds.py`` holds the two together.

A chunk that would put a GPU's samples out of time order is not folded: :meth:`HourFold.fold`
returns those slots, and the caller recomputes them from all their samples (:meth:`reset`, then
one fold). Counter arithmetic is exact in float64 while every partial sum stays below 2**53; a
GPU whose readings could break that is marked :meth:`inexact`, and the caller rolls it up with
``rollup_hour`` on Python integers instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fleetwatch.rules.thresholds import HealthThresholds

__all__ = ["FOLD_COLUMNS", "HourFold", "SampleChunk", "sample_arrays"]

_NVLINK = (
    "nvlink_crc_flit_errors_total",
    "nvlink_crc_data_errors_total",
    "nvlink_replay_errors_total",
    "nvlink_recovery_errors_total",
)
FOLD_COLUMNS = (
    "gpu_temp_c",
    "clocks_event_reasons",
    "ecc_sbe_aggregate_total",
    *_NVLINK,
    "pcie_replay_total",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
)
"""The sample fields a rollup reads."""

_COUNTERS = ("sbe", "nvlink", "pcie")
_THROTTLE_MASK = HealthThresholds().throttle_mask  # as rollup_hour counts "throttled"
_EXACT = float(2**53)


class SampleChunk:
    """Samples of one hour as arrays, sorted by (slot, time): NaN where a field is absent.

    Build with :meth:`from_columns` from the values a query returned (None: not reported).
    """

    def __init__(
        self,
        slot: NDArray[np.int64],
        ts: NDArray[np.int64],
        node: NDArray[np.int64],
        values: Mapping[str, NDArray[np.float64]],
        reasons: NDArray[np.int64],
    ) -> None:
        self.slot, self.ts, self.node, self.values, self.reasons = slot, ts, node, values, reasons

    @classmethod
    def from_columns(
        cls,
        slot: NDArray[np.int64],
        ts: NDArray[np.int64],
        node: NDArray[np.int64],
        columns: Mapping[str, Any],
    ) -> SampleChunk:
        """``columns``: per name of :data:`FOLD_COLUMNS` a sequence of values (None allowed),
        in the order of ``slot``, ``ts`` (microseconds) and ``node``; sorted here."""
        return cls.from_arrays(slot, ts, node, *sample_arrays(columns))

    @classmethod
    def from_arrays(
        cls,
        slot: NDArray[np.int64],
        ts: NDArray[np.int64],
        node: NDArray[np.int64],
        values: Mapping[str, NDArray[np.float64]],
        reasons: NDArray[np.int64],
    ) -> SampleChunk:
        """:meth:`from_columns` for columns already arrays: ``values`` float64 with NaN where
        a field is absent, ``reasons`` the throttle bit masks with 0 there; sorted here."""
        order = np.lexsort((ts, slot))  # stable: equal times keep the order they were read in
        sorted_values = {name: values[name][order] for name in FOLD_COLUMNS}
        return cls(slot[order], ts[order], node[order], sorted_values, reasons[order])

    def __len__(self) -> int:
        return int(self.slot.size)

    def take(self, keep: NDArray[np.bool_]) -> SampleChunk:
        values = {name: v[keep] for name, v in self.values.items()}
        return SampleChunk(
            self.slot[keep], self.ts[keep], self.node[keep], values, self.reasons[keep]
        )


def sample_arrays(
    columns: Mapping[str, Any],
) -> tuple[dict[str, NDArray[np.float64]], NDArray[np.int64]]:
    """The :data:`FOLD_COLUMNS` of ``columns`` (sequences of values, None: not reported) as
    float64 arrays with NaN for None, and the throttle masks as int64 with 0 for None."""
    values = {name: _floats(columns[name]) for name in FOLD_COLUMNS}
    raw = np.array(columns["clocks_event_reasons"], dtype=object)
    raw[raw == None] = 0  # noqa: E711 - elementwise, not identity
    return values, raw.astype(np.int64)


def _floats(column: Any) -> NDArray[np.float64]:
    raw = np.array(column, dtype=object)
    missing: NDArray[np.bool_] = raw == None  # noqa: E711 - elementwise, not identity
    if missing.any():
        raw[missing] = np.nan
    return raw.astype(np.float64)


def _segments(slot: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Start and end (exclusive) of each run of equal slots."""
    first = np.ones(slot.size, dtype=bool)
    first[1:] = slot[1:] != slot[:-1]
    starts = np.flatnonzero(first)
    return starts, np.append(starts[1:], slot.size)


def _grow(array: NDArray[Any], size: int, fill: Any) -> NDArray[Any]:
    out = np.full(size, fill, dtype=array.dtype)
    out[: array.size] = array
    return out


class HourFold:
    """The rollups of one hour so far, per slot (see the module doc)."""

    def __init__(self, hour: datetime) -> None:
        self.hour = hour
        self._n = 0
        self.count = np.zeros(0, np.int64)
        self.first = np.zeros(0, np.int64)
        self.last = np.zeros(0, np.int64)
        self.node = np.zeros(0, np.int64)
        self.reported = np.zeros(0, np.int64)
        self.throttled = np.zeros(0, np.int64)
        self.total = {c: np.zeros(0, np.float64) for c in _COUNTERS}
        self.reading = {c: np.zeros(0, np.float64) for c in _COUNTERS}
        self.remapped = np.zeros(0, np.float64)
        self.largest = np.zeros(0, np.float64)  # the largest counter reading, for exactness
        # The hour's temperatures, a multiset: unique (slot, value) pairs with their counts.
        self._t_slot = np.zeros(0, np.int64)
        self._t_value = np.zeros(0, np.float64)
        self._t_count = np.zeros(0, np.int64)
        self._pending: list[tuple[NDArray[np.int64], NDArray[np.float64]]] = []
        self._pending_n = 0

    def _reserve(self, size: int) -> None:
        if size <= self._n:
            return
        size = max(size, 2 * self._n)
        for name in ("count", "first", "last", "node", "reported", "throttled"):
            setattr(self, name, _grow(getattr(self, name), size, 0))
        for c in _COUNTERS:
            self.total[c] = _grow(self.total[c], size, np.nan)
            self.reading[c] = _grow(self.reading[c], size, np.nan)
        self.remapped = _grow(self.remapped, size, np.nan)
        self.largest = _grow(self.largest, size, 0.0)
        self._n = size

    def slots(self) -> NDArray[np.int64]:
        """Every slot with at least one sample this hour."""
        return np.flatnonzero(self.count[: self._n] > 0)

    def inexact(self, slots: NDArray[np.int64]) -> NDArray[np.bool_]:
        """Per slot: whether float64 may not have summed its counters exactly."""
        return self.count[slots] * 4.0 * self.largest[slots] >= _EXACT

    def reset(self, slots: NDArray[np.int64]) -> None:
        """Forget ``slots``' samples (to fold all of them again)."""
        slots = slots[slots < self._n]
        for name in ("count", "first", "last", "node", "reported", "throttled"):
            getattr(self, name)[slots] = 0
        for c in _COUNTERS:
            self.total[c][slots] = np.nan
            self.reading[c][slots] = np.nan
        self.remapped[slots] = np.nan
        self.largest[slots] = 0.0
        self._consolidate()
        gone = np.isin(self._t_slot, slots)
        self._t_slot, self._t_value = self._t_slot[~gone], self._t_value[~gone]
        self._t_count = self._t_count[~gone]

    def fold(self, chunk: SampleChunk) -> NDArray[np.int64]:
        """Fold ``chunk`` (this hour's samples, sorted by slot and time) in; return the slots
        not folded because a sample is older than one already folded (recompute those)."""
        if not len(chunk):
            return np.zeros(0, np.int64)
        starts, ends = _segments(chunk.slot)
        slots = chunk.slot[starts]
        self._reserve(int(slots.max()) + 1)
        behind = (self.count[slots] > 0) & (chunk.ts[starts] < self.last[slots])
        if behind.any():
            late = np.repeat(behind, ends - starts)
            rest = self.fold(chunk.take(~late)) if not late.all() else np.zeros(0, np.int64)
            return np.union1d(slots[behind], rest)
        fresh = self.count[slots] == 0
        self.first[slots] = np.where(fresh, chunk.ts[starts], self.first[slots])
        self.last[slots] = chunk.ts[ends - 1]
        self.node[slots] = chunk.node[ends - 1]
        self.count[slots] += ends - starts
        values = chunk.values
        reported = ~np.isnan(values["clocks_event_reasons"])
        self.reported[slots] += np.add.reduceat(reported.astype(np.int64), starts)
        hit = reported & ((chunk.reasons & _THROTTLE_MASK) != 0)
        self.throttled[slots] += np.add.reduceat(hit.astype(np.int64), starts)
        self._fold_temperatures(chunk.slot, values["gpu_temp_c"])
        nvlink = np.zeros(len(chunk), np.float64)
        nvlink_known = np.zeros(len(chunk), dtype=bool)
        for name in _NVLINK:  # in rollup_hour's order: float sums round alike
            known = ~np.isnan(values[name])
            nvlink = np.where(known, nvlink + np.where(known, values[name], 0.0), nvlink)
            nvlink_known |= known
        counters = {
            "sbe": values["ecc_sbe_aggregate_total"],
            "nvlink": np.where(nvlink_known, nvlink, np.nan),
            "pcie": values["pcie_replay_total"],
        }
        for c, series in counters.items():
            self._fold_counter(c, chunk.slot, series)
        corr, uncorr = values["remapped_rows_correctable"], values["remapped_rows_uncorrectable"]
        present = ~np.isnan(corr) | ~np.isnan(uncorr)
        remapped = np.where(np.isnan(corr), 0.0, corr) + np.where(np.isnan(uncorr), 0.0, uncorr)
        self._keep_last(self.remapped, chunk.slot, remapped, present)
        readings = np.stack([np.abs(values[name]) for name in FOLD_COLUMNS[2:]])
        largest = np.fmax.reduceat(np.nanmax(np.nan_to_num(readings), axis=0), starts)
        self.largest[slots] = np.maximum(self.largest[slots], largest)
        return np.zeros(0, np.int64)

    def _fold_counter(self, c: str, slot: NDArray[np.int64], series: NDArray[np.float64]) -> None:
        """rollup_hour's ``_increase``: a drop is a reset (the new reading counts)."""
        known = ~np.isnan(series)
        if not known.any():
            return
        value, where = series[known], slot[known]
        starts, _ = _segments(where)
        previous = np.empty_like(value)
        previous[1:] = value[:-1]
        previous[starts] = self.reading[c][where[starts]]  # NaN: the hour's first reading
        paired = ~np.isnan(previous)
        increase = np.where(value >= previous, value - previous, value)
        increase = np.where(paired, increase, 0.0)
        slots = where[starts]
        any_pair = np.logical_or.reduceat(paired, starts)
        added = np.add.reduceat(increase, starts)
        before = self.total[c][slots]
        self.total[c][slots] = np.where(
            any_pair, np.where(np.isnan(before), 0.0, before) + added, before
        )
        self._keep_last(self.reading[c], slot, series, known)

    @staticmethod
    def _keep_last(
        target: NDArray[np.float64],
        slot: NDArray[np.int64],
        value: NDArray[np.float64],
        present: NDArray[np.bool_],
    ) -> None:
        """``target[s]`` = the last present value of slot ``s`` in the chunk, if any."""
        if present.any():
            where = slot[present]
            _, ends = _segments(where)
            target[where[ends - 1]] = value[present][ends - 1]

    def _fold_temperatures(self, slot: NDArray[np.int64], temps: NDArray[np.float64]) -> None:
        known = ~np.isnan(temps)
        if known.any():
            self._pending.append((slot[known], temps[known]))
            self._pending_n += int(known.sum())
            if self._pending_n > max(1_000_000, self._t_slot.size):
                self._consolidate()  # amortised: merged when the pending pairs double it

    def _consolidate(self) -> None:
        """Merge the pending temperatures into the multiset."""
        if not self._pending:
            return
        t_slot = np.concatenate([self._t_slot, *(s for s, _ in self._pending)])
        t_value = np.concatenate([self._t_value, *(v for _, v in self._pending)])
        t_count = np.concatenate((self._t_count, np.ones(self._pending_n, np.int64)))
        self._pending, self._pending_n = [], 0
        order = np.lexsort((t_value, t_slot))
        t_slot, t_value, t_count = t_slot[order], t_value[order], t_count[order]
        new = np.ones(t_slot.size, dtype=bool)
        new[1:] = (t_slot[1:] != t_slot[:-1]) | (t_value[1:] != t_value[:-1])
        starts = np.flatnonzero(new)
        self._t_slot, self._t_value = t_slot[starts], t_value[starts]
        self._t_count = np.add.reduceat(t_count, starts)

    def _temperatures(
        self, slots: NDArray[np.int64]
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(nearest-rank p95, max) per slot; NaN for a slot without temperatures."""
        self._consolidate()
        p95 = np.full(slots.size, np.nan)
        top = np.full(slots.size, np.nan)
        if not self._t_slot.size:
            return p95, top
        starts, ends = _segments(self._t_slot)
        have = self._t_slot[starts]
        cumulative = np.cumsum(self._t_count)
        before = np.where(starts > 0, cumulative[starts - 1], 0)
        n = cumulative[ends - 1] - before
        rank = np.maximum(0, np.ceil(0.95 * n).astype(np.int64) - 1)
        at = np.searchsorted(cumulative, before + rank, side="right")
        position = np.searchsorted(have, slots)
        found = (position < have.size) & (have[np.minimum(position, have.size - 1)] == slots)
        p95[found] = self._t_value[at[position[found]]]
        top[found] = self._t_value[ends[position[found]] - 1]
        return p95, top

    def rows(self, slots: NDArray[np.int64]) -> list[dict[str, Any]]:
        """``HourRollup`` columns (without gpu_uuid, node_id and the Xid counts) per slot, as
        Python values, with ``node_id`` of each slot's newest sample."""
        p95, top = self._temperatures(slots)
        count = self.count[slots]
        remapped = self.remapped[slots]
        span = np.where(count > 1, (self.last[slots] - self.first[slots]) / 1e6, 0.0)
        columns: dict[str, list[Any]] = {
            "samples": count.tolist(),
            "span_s": span.tolist(),
            "temp_p95_c": _or_none(p95),
            "temp_max_c": _or_none(top),
            "throttle_reported": self.reported[slots].tolist(),
            "throttled": self.throttled[slots].tolist(),
            "sbe_errors": _or_none(self.total["sbe"][slots]),
            "nvlink_errors": _or_none(self.total["nvlink"][slots]),
            "pcie_replays": _or_none(self.total["pcie"][slots]),
            "remapped_rows": [None if v is None else int(v) for v in _or_none(remapped)],
            "node_id": self.node[slots].tolist(),
        }
        names = list(columns)
        return [dict(zip(names, row, strict=True)) for row in zip(*columns.values(), strict=True)]


def _or_none(values: NDArray[np.float64]) -> list[float | None]:
    return [None if v != v else v for v in values.tolist()]
