"""Samples stored as blocks: one row per GPU per push, its ticks' fields as compressed columns.

A row per GPU per tick cost about 347 bytes on PostgreSQL (a 24-byte tuple header and a line
pointer, 8 bytes for every counter however slowly it moves, two B-tree entries) and one COPY row
and two index insertions per tick; at 100,000 GPUs every 10 s that is most of what storing cost.
A block holds ``n`` ticks of one GPU from one batch, so the row's header, keys and index entries
are paid once per push instead of once per tick, and a counter that does not move costs almost
nothing after compression (Prometheus' chunks work the same way per series).

``data`` is zlib over a fixed layout (little-endian), so that many blocks of the same ``n``
decode at once in numpy:

- one byte: the format (:data:`BLOCK_FORMAT`);
- the tick times, ``n`` int64 microsecond deltas (the first from ``ts0``, so 0);
- which fields were not reported, one uint64 per tick (bit ``j``: field ``j`` of
  :data:`~fleetwatch.telemetry.SAMPLE_FIELDS` is absent);
- each field's ``n`` values, grouped by storage type in :data:`~fleetwatch.telemetry.\
SAMPLE_FIELDS` order within a group: the integers (counters, the throttle bitmask) as int64
  deltas from the tick before (an absent value repeats the one before, so its delta is 0); the
  reals as float32 (7 significant digits, as the ``real`` columns of the row table held them);
  the doubles (framebuffer sizes, unbounded on the wire) as float64; the small integers as int16;
  the flags as one byte;
- every group's bytes transposed into byte planes (all first bytes, then all second bytes, ...):
  the high bytes of slowly moving values repeat, which zlib finds.

Values come back exactly as stored: integers and flags exactly, reals as the float64 of the
decimal PostgreSQL would print for the float32 (:func:`~fleetwatch.server.db.real_values.\
as_printed`: 55.3, not 55.29999923706055), doubles exactly, times to the microsecond.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fleetwatch.server.db.real_values import as_printed
from fleetwatch.server.db.sample_columns import copy_type
from fleetwatch.telemetry import SAMPLE_FIELDS

__all__ = [
    "BLOCK_FORMAT",
    "MAX_BLOCK_TICKS",
    "DecodedRows",
    "EncodedBlock",
    "decode_blocks",
    "encode_blocks",
]

BLOCK_FORMAT = 1
# A block never holds more ticks than this, nor ticks further apart than MAX_BLOCK_SPAN_US (an
# agent's spool replaying hours of one GPU becomes several blocks), nor ticks of two UTC days:
# each block lies within one day partition, and a reader of a time range finds every block that
# may hold rows of it by its first tick (``ts0 > since - MAX_BLOCK_SPAN_US``).
MAX_BLOCK_TICKS = 360
MAX_BLOCK_SPAN_US = 3_600 * 1_000_000
_DAY_US = 86_400 * 1_000_000
# zlib's fastest level: 15 us a block of six ticks against 22 at the default level, for 7 % more
# bytes (36.7 against 34.3 a row on benchmarks/ingest.py's fleet).
_ZLIB_LEVEL = 1

# The storage group of each field (the row table's column types), and the numpy dtype it is
# stored as.
_GROUPS: tuple[tuple[str, str], ...] = (
    ("int8", "<i8"),
    ("float4", "<f4"),
    ("float8", "<f8"),
    ("int2", "<i2"),
    ("bool", "u1"),
)
_KIND = [copy_type(spec) for spec in SAMPLE_FIELDS]
GROUP_FIELDS: tuple[tuple[int, ...], ...] = tuple(
    tuple(j for j, kind in enumerate(_KIND) if kind == group) for group, _ in _GROUPS
)
_FIELD_COUNT = len(SAMPLE_FIELDS)
assert _FIELD_COUNT <= 64, "the null mask is one uint64 per tick"
assert sorted(j for fields in GROUP_FIELDS for j in fields) == list(range(_FIELD_COUNT))


@dataclass(frozen=True, slots=True)
class EncodedBlock:
    """One block, as a row of the blocks table holds it (times in microseconds since the Unix
    epoch)."""

    gpu_key: int
    ts0_us: int
    ts1_us: int
    n: int
    data: bytes


@dataclass(frozen=True, slots=True)
class DecodedRows:
    """The rows of some blocks, one array per column, in block order and each block's ticks in
    time order. ``block``: the position of each row's block in the blocks given. ``values``: per
    field, float64 with NaN where not reported; ``raw``: per field, the value as stored, 0 where
    not reported (int64, int16, uint8 for flags, float64; a real as its printed decimal's
    float64); ``absent``: per field, the mask."""

    block: NDArray[np.int64]
    ts_us: NDArray[np.int64]
    values: list[NDArray[np.float64]]
    raw: list[NDArray[Any]]
    absent: list[NDArray[np.bool_]]

    @property
    def size(self) -> int:
        return int(self.ts_us.size)


def encode_blocks(
    gpu_keys: Sequence[int], ts_us: Sequence[int], rows: Sequence[Sequence[Any]]
) -> list[EncodedBlock]:
    """The blocks of one batch's samples: sample ``i`` of GPU ``gpu_keys[i]`` at ``ts_us[i]`` with
    field values ``rows[i]`` (in :data:`SAMPLE_FIELDS` order, ``None`` where not reported). One
    block per GPU, its ticks in time order (ties as given), split where a block would pass
    :data:`MAX_BLOCK_TICKS` ticks or a UTC midnight. Blocks of the same length are laid out
    together in numpy; only the compression is per block."""
    if not rows:
        return []
    keys = np.asarray(gpu_keys, np.int64)
    times = np.asarray(ts_us, np.int64)
    table = np.array(rows, dtype=object)
    if table.ndim != 2 or table.shape != (keys.size, _FIELD_COUNT):
        raise ValueError(f"each of the {keys.size} rows needs {_FIELD_COUNT} values")
    order = np.lexsort((times, keys))  # by GPU, then time; stable for ties
    keys, times, table = keys[order], times[order], table[order]
    absent: NDArray[np.bool_] = table == None  # noqa: E711 - elementwise, over Python objects
    groups = [_group_values(table, absent, fields, dtype) for fields, (_, dtype) in _GROUP_SPECS]
    bits = (absent.astype(np.uint64) << _BIT_SHIFTS).sum(axis=1, dtype=np.uint64)
    starts, stops = _block_bounds(keys, times)
    lengths = stops - starts
    out: list[EncodedBlock | None] = [None] * starts.size
    for n in np.unique(lengths).tolist():
        picked = np.flatnonzero(lengths == n)
        at = starts[picked][:, None] + np.arange(n)[None, :]  # blocks x ticks
        payloads = _layout(times[at], bits[at], absent[at], [g[at] for g in groups])
        for row, i in enumerate(picked.tolist()):
            first, last = int(times[starts[i]]), int(times[stops[i] - 1])
            data = zlib.compress(payloads[row], _ZLIB_LEVEL)
            out[i] = EncodedBlock(int(keys[starts[i]]), first, last, n, data)
    return [block for block in out if block is not None]


_GROUP_SPECS = tuple(zip(GROUP_FIELDS, _GROUPS, strict=True))
_BIT_SHIFTS = np.arange(_FIELD_COUNT, dtype=np.uint64)


def _group_values(
    table: NDArray[Any], absent: NDArray[np.bool_], fields: tuple[int, ...], dtype: str
) -> NDArray[Any]:
    """The group's columns (rows x fields) in its storage dtype, 0 where absent."""
    picked = np.where(absent[:, fields], 0, table[:, fields])
    if dtype == "<i8":
        return picked.astype(np.int64)
    if dtype == "u1":
        return picked.astype(np.bool_).astype(np.uint8)
    return picked.astype(np.float64).astype(dtype)


def _block_bounds(
    keys: NDArray[np.int64], times: NDArray[np.int64]
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """[start, stop) of each block over rows sorted by GPU and time."""
    days = times // _DAY_US
    cuts = np.flatnonzero((keys[1:] != keys[:-1]) | (days[1:] != days[:-1])) + 1
    edges = np.concatenate(([0], cuts, [keys.size])).astype(np.int64)
    starts, stops = edges[:-1], edges[1:]
    spans = times[stops - 1] - times[starts]
    long = (stops - starts > MAX_BLOCK_TICKS) | (spans > MAX_BLOCK_SPAN_US)
    if not long.any():  # every push of a running fleet
        return starts, stops
    bounds: list[tuple[int, int]] = []
    for start, stop, split in zip(starts.tolist(), stops.tolist(), long.tolist(), strict=True):
        if not split:
            bounds.append((start, stop))
            continue
        first = start
        for i in range(start + 1, stop):
            if i - first >= MAX_BLOCK_TICKS or times[i] - times[first] > MAX_BLOCK_SPAN_US:
                bounds.append((first, i))
                first = i
        bounds.append((first, stop))
    pairs = np.asarray(bounds, np.int64)
    return pairs[:, 0], pairs[:, 1]


def _layout(
    times: NDArray[np.int64],
    bits: NDArray[np.uint64],
    absent: NDArray[np.bool_],
    groups: list[NDArray[Any]],
) -> NDArray[np.uint8]:
    """The uncompressed payloads of blocks of one length: one row of bytes per block (inputs:
    blocks x ticks, and blocks x ticks x fields for the groups)."""
    count = times.shape[0]
    deltas = np.diff(times, axis=1, prepend=times[:, :1])
    parts = [np.full((count, 1), BLOCK_FORMAT, np.uint8), _planes(deltas), _planes(bits)]
    for g, values in enumerate(groups):
        columns = values.transpose(0, 2, 1)  # blocks x fields x ticks
        if g == 0:  # integers: deltas along the ticks, an absent value carrying the one before
            carried = _carried(columns, absent[:, :, GROUP_FIELDS[0]].transpose(0, 2, 1))
            columns = np.diff(carried, axis=2, prepend=np.zeros_like(carried[:, :, :1]))
        parts.append(_planes(columns.reshape(count, -1)))
    return np.concatenate(parts, axis=1)


def _carried(columns: NDArray[np.int64], absent: NDArray[np.bool_]) -> NDArray[np.int64]:
    """Each absent value replaced by the present one before it along the last axis (0 before
    any)."""
    if not absent.any():
        return columns
    ticks = np.arange(columns.shape[-1])
    last = np.where(absent, -1, ticks)
    np.maximum.accumulate(last, axis=-1, out=last)
    carried = np.take_along_axis(columns, np.maximum(last, 0), axis=-1)
    return np.where(last < 0, 0, carried)


def _planes(values: NDArray[Any]) -> NDArray[np.uint8]:
    """Per block (row), its values' bytes little-endian in planes: all first bytes, then all
    second bytes, ..."""
    dtype = values.dtype.newbyteorder("<") if values.dtype.itemsize > 1 else values.dtype
    values = np.ascontiguousarray(values, dtype=dtype)
    count, width = values.shape[0], values.dtype.itemsize
    as_bytes = values.view(np.uint8).reshape(count, -1, width)
    return as_bytes.transpose(0, 2, 1).reshape(count, -1)


def _unplanes(raw: NDArray[np.uint8], dtype: str, count: int) -> NDArray[Any]:
    """``raw`` (blocks x planes) back into blocks x ``count`` values of ``dtype``."""
    width = np.dtype(dtype).itemsize
    if width == 1:
        return raw.view(dtype).reshape(raw.shape[0], count)
    shaped = raw.reshape(raw.shape[0], width, count).transpose(0, 2, 1)
    return np.ascontiguousarray(shaped).view(dtype).reshape(raw.shape[0], count)


def decode_blocks(
    ts0_us: Sequence[int],
    ns: Sequence[int],
    datas: Sequence[bytes],
    fields: Sequence[int] | None = None,
) -> DecodedRows:
    """The rows of the blocks (``ts0_us``, ``ns`` and ``datas`` as stored), blocks of the same
    ``n`` decoded together. ``fields``: the positions in :data:`SAMPLE_FIELDS` to decode, in the
    order ``values``, ``raw`` and ``absent`` then hold them (default: every field, in order). A
    reader of a few fields asks for those alone: every field of a chunk of 120,000 rows as
    float64 and as stored is about 60 MB, built and dropped per chunk."""
    wanted = list(range(_FIELD_COUNT)) if fields is None else [int(j) for j in fields]
    positions: dict[int, list[int]] = {}
    for k, j in enumerate(wanted):
        positions.setdefault(j, []).append(k)
    counts = np.asarray(ns, np.int64)
    total = int(counts.sum())
    offsets = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
    ts = np.empty(total, np.int64)
    bits = np.empty(total, np.uint64)
    raw: list[NDArray[Any]] = [np.empty(total, _dtype_of(j)) for j in wanted]
    starts = np.asarray(ts0_us, np.int64)
    for n in np.unique(counts).tolist():
        picked = np.flatnonzero(counts == n)
        payload = [zlib.decompress(datas[i]) for i in picked.tolist()]
        if any(p[0] != BLOCK_FORMAT for p in payload):
            raise ValueError(
                f"sample block in an unknown format (this server reads {BLOCK_FORMAT})"
            )
        data = np.frombuffer(b"".join(payload), np.uint8).reshape(len(picked), -1)
        del payload
        at = (offsets[picked][:, None] + np.arange(n)[None, :]).reshape(-1)
        cursor = 1
        deltas, cursor = _section(data, cursor, "<i8", n)
        ts[at] = (np.cumsum(deltas, axis=1) + starts[picked][:, None]).reshape(-1)
        mask, cursor = _section(data, cursor, "<u8", n)
        bits[at] = mask.reshape(-1)
        for g, (group, (_, dtype)) in enumerate(_GROUP_SPECS):
            if not group:
                continue
            chosen = [(k, j) for k, j in enumerate(group) if j in positions]
            if not chosen:  # a group no field was asked of: skip its bytes
                cursor += np.dtype(dtype).itemsize * n * len(group)
                continue
            values, cursor = _section(data, cursor, dtype, n * len(group))
            values = values.reshape(len(picked), len(group), n)
            for k, j in chosen:
                column = values[:, k, :]
                if g == 0:  # int64 deltas from the tick before
                    column = np.cumsum(column, axis=1)
                for into in positions[j]:
                    raw[into][at] = column.reshape(-1)
        if cursor != data.shape[1]:
            raise ValueError(f"sample block of {n} ticks: {data.shape[1]} bytes, expected {cursor}")
    absent = [((bits >> np.uint64(j)) & np.uint64(1)).astype(np.bool_) for j in wanted]
    values_out: list[NDArray[np.float64]] = []
    for k, j in enumerate(wanted):
        column = raw[k]
        column[absent[k]] = 0
        if _KIND[j] == "float4":  # read as the decimal PostgreSQL printed for a real column
            column = raw[k] = as_printed(column)
        floats = column.astype(np.float64)
        floats[absent[k]] = np.nan
        values_out.append(floats)
    block = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    return DecodedRows(block=block, ts_us=ts, values=values_out, raw=raw, absent=absent)


def _dtype_of(j: int) -> str:
    for fields, (_, dtype) in _GROUP_SPECS:
        if j in fields:
            return dtype
    raise AssertionError(j)


def _section(
    data: NDArray[np.uint8], cursor: int, dtype: str, count: int
) -> tuple[NDArray[Any], int]:
    """``count`` values of ``dtype`` per block from byte ``cursor`` of each block's payload."""
    width = np.dtype(dtype).itemsize
    end = cursor + width * count
    return _unplanes(data[:, cursor:end], dtype, count), end
