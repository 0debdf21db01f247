"""Reading samples: the blocks that may hold the rows asked for, decoded into columns.

Every reader of telemetry comes here (the judge, the rollups, the lifecycle, the samples API,
stragglers' evidence, the weekly report): :func:`read_samples` finds the blocks by GPU, node,
time or block id, decodes them in numpy (:mod:`fleetwatch.server.db.sample_blocks`) and hands
back :class:`SampleChunk` columns, rows outside the bounds asked for dropped. On PostgreSQL the
blocks are fetched through psycopg's binary cursor (no SQLAlchemy row per block); on SQLite
through SQLAlchemy.

Blocks are found by their first tick: a block holds at most an hour of ticks
(:data:`~fleetwatch.server.db.sample_blocks.MAX_BLOCK_SPAN_US`), so every block with a row at or
after ``since`` starts after ``since`` less an hour, which the ``(gpu_id, ts0)`` index and the
BRIN index on ``ts0`` find.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import Connection, func, select

from fleetwatch.server.db.sample_blocks import MAX_BLOCK_SPAN_US, DecodedRows, decode_blocks
from fleetwatch.server.db.tables import gpu_sample_blocks
from fleetwatch.telemetry import SAMPLE_FIELD_NAMES

__all__ = [
    "CHUNK_BLOCKS",
    "SampleChunk",
    "count_samples",
    "from_us",
    "newest_block_id",
    "newest_samples",
    "read_samples",
    "sample_rows",
    "to_us",
]

# Blocks fetched and decoded at a time: about 120,000 rows at six ticks a block.
CHUNK_BLOCKS = 20_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_SPAN = timedelta(microseconds=MAX_BLOCK_SPAN_US)
_FIELD_INDEX = {name: j for j, name in enumerate(SAMPLE_FIELD_NAMES)}
_BLOCK_COLUMNS = ("id", "gpu_id", "node_id", "boot", "ts0", "n", "data")


def to_us(ts: datetime) -> int:
    """Microseconds since the epoch, exactly; a naive ``ts`` is UTC (SQLite's)."""
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return (ts - _EPOCH) // _US


def from_us(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


@dataclass(frozen=True, slots=True)
class SampleChunk:
    """Sample rows, one array per column. ``ids``: the id of each row's block (every row of a
    block shares it); ``boots``: ``node_boots.id``, -1 for none; ``values``: per field asked
    for, float64 with NaN where not reported; ``raw``: the value as stored, 0 where not reported
    (an integer float64 cannot hold exactly stays exact here)."""

    ids: NDArray[np.int64]
    gpu_ids: NDArray[np.int64]
    node_ids: NDArray[np.int64]
    ts_us: NDArray[np.int64]  # since the Unix epoch
    boots: NDArray[np.int64]
    values: list[NDArray[np.float64]]
    raw: list[NDArray[Any]]

    @property
    def size(self) -> int:
        return int(self.ts_us.size)

    def take(self, rows: NDArray[Any]) -> SampleChunk:
        """The chunk's ``rows`` (a mask, or positions in the order wanted)."""
        return SampleChunk(
            ids=self.ids[rows],
            gpu_ids=self.gpu_ids[rows],
            node_ids=self.node_ids[rows],
            ts_us=self.ts_us[rows],
            boots=self.boots[rows],
            values=[column[rows] for column in self.values],
            raw=[column[rows] for column in self.raw],
        )

    def in_time_order(self) -> SampleChunk:
        """The rows sorted by time (rows of one time in the order they came)."""
        return self.take(np.argsort(self.ts_us, kind="stable"))


def count_samples(conn: Connection) -> int:
    """Samples stored (the ticks of every block)."""
    found = conn.execute(select(func.sum(gpu_sample_blocks.c.n))).scalar()
    return 0 if found is None else int(found)


def newest_block_id(conn: Connection) -> int | None:
    """The newest block's id (None: no samples)."""
    found = conn.execute(select(func.max(gpu_sample_blocks.c.id))).scalar()
    return None if found is None else int(found)


def read_samples(
    conn: Connection,
    fields: Sequence[str],
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    before: datetime | None = None,
    after_id: int | None = None,
    gpu_ids: Sequence[int] | None = None,
    node_ids: Sequence[int] | None = None,
    chunk: int = CHUNK_BLOCKS,
) -> Iterator[SampleChunk]:
    """The sample rows with ``ts >= since``, ``ts <= until`` and ``ts < before`` (each bound
    optional), of blocks after block id ``after_id``, of ``gpu_ids`` and of ``node_ids``;
    ``fields`` in the order asked for. Blocks come ``chunk`` at a time, in id order after an id,
    otherwise in order of their first tick; each chunk's rows in time order. Call within a
    transaction when reading more than one chunk (the reads after the first see the same
    snapshot only there)."""
    picked = [_FIELD_INDEX[name] for name in fields]
    low = after_id
    newest = newest_block_id(conn) if after_id is not None else None
    if after_id is not None and (newest is None or newest <= after_id):
        return
    last: tuple[datetime, int] | None = None
    while True:
        if after_id is not None:
            assert low is not None and newest is not None
            if low >= newest:
                return
            high = min(low + chunk, newest)
            blocks = _fetch(conn, since, until, before, gpu_ids, node_ids, (low, high), None, None)
            low = high
            if not blocks:
                following = _next_id(conn, high)  # a gap (dropped days): on to the next id
                low = newest if following is None else max(high, following - 1)
                continue
        else:
            blocks = _fetch(conn, since, until, before, gpu_ids, node_ids, None, last, chunk)
            if not blocks:
                return
            last = (blocks[-1][4], int(blocks[-1][0]))
        out = _chunk_of(blocks, picked, since, until, before)
        if out.size:
            yield out
        if after_id is None and len(blocks) < chunk:
            return


def sample_rows(chunk: SampleChunk) -> list[tuple[Any, ...]]:
    """The chunk's rows as Python values: (ts, gpu_id, node_id, boot or None, *its fields), a field
    not reported as None, integers as int, flags as bool, the rest as float. For the readers
    that handle a few rows (the API, a job's evidence, the lifecycle)."""
    columns: list[list[Any]] = [
        [from_us(us) for us in chunk.ts_us.tolist()],
        chunk.gpu_ids.tolist(),
        chunk.node_ids.tolist(),
        [None if b < 0 else b for b in chunk.boots.tolist()],
    ]
    for values, raw in zip(chunk.values, chunk.raw, strict=True):
        python = raw.astype(np.bool_).tolist() if raw.dtype == np.uint8 else raw.tolist()
        missing = np.isnan(values).tolist()
        columns.append([None if m else v for v, m in zip(python, missing, strict=True)])
    return list(zip(*columns, strict=True))


def _fetch(
    conn: Connection,
    since: datetime | None,
    until: datetime | None,
    before: datetime | None,
    gpu_ids: Sequence[int] | None,
    node_ids: Sequence[int] | None,
    id_range: tuple[int, int] | None,
    after: tuple[datetime, int] | None,
    limit: int | None,
) -> list[tuple[Any, ...]]:
    """Blocks as (id, gpu_id, node_id, boot, ts0, n, data) tuples, by first tick then id."""
    b = gpu_sample_blocks.c
    query = select(*(b[name] for name in _BLOCK_COLUMNS))
    if since is not None:
        query = query.where(b.ts0 >= since - _SPAN, b.ts1 >= since)
    if until is not None:
        query = query.where(b.ts0 <= until)
    if before is not None:
        query = query.where(b.ts0 < before)
    if gpu_ids is not None:
        query = query.where(b.gpu_id.in_(sorted(set(gpu_ids))))
    if node_ids is not None:
        query = query.where(b.node_id.in_(sorted(set(node_ids))))
    if id_range is not None:
        query = query.where(b.id > id_range[0], b.id <= id_range[1])
    else:
        if after is not None:
            query = query.where((b.ts0 > after[0]) | ((b.ts0 == after[0]) & (b.id > after[1])))
        query = query.order_by(b.ts0, b.id)
    if limit is not None:
        query = query.limit(limit)
    return [tuple(row) for row in conn.execute(query)]


def _next_id(conn: Connection, after: int) -> int | None:
    b = gpu_sample_blocks.c
    found = conn.execute(select(func.min(b.id)).where(b.id > after)).scalar()
    return None if found is None else int(found)


def _chunk_of(
    blocks: list[tuple[Any, ...]],
    picked: list[int],
    since: datetime | None,
    until: datetime | None,
    before: datetime | None,
) -> SampleChunk:
    ids, gpu_ids, node_ids, boots, ts0, ns, datas = zip(*blocks, strict=True)
    rows: DecodedRows = decode_blocks([to_us(t) for t in ts0], ns, datas, picked)
    per_block = rows.block

    def spread(column: tuple[Any, ...]) -> NDArray[np.int64]:
        return np.asarray(column, np.int64)[per_block]

    chunk = SampleChunk(
        ids=spread(ids),
        gpu_ids=spread(gpu_ids),
        node_ids=spread(node_ids),
        ts_us=rows.ts_us,
        boots=spread(tuple(-1 if b is None else b for b in boots)),
        values=rows.values,
        raw=rows.raw,
    )
    keep = np.ones(chunk.size, np.bool_)
    if since is not None:
        keep &= chunk.ts_us >= to_us(since)
    if until is not None:
        keep &= chunk.ts_us <= to_us(until)
    if before is not None:
        keep &= chunk.ts_us < to_us(before)
    if not keep.all():
        chunk = chunk.take(keep)
    return chunk.in_time_order()


def newest_samples(
    conn: Connection,
    fields: Sequence[str],
    *,
    gpu_id: int,
    since: datetime | None = None,
    before: datetime | None = None,
    limit: int,
) -> SampleChunk | None:
    """The ``limit`` newest samples of one GPU with ``since <= ts < before``, oldest first
    (None: none). Blocks are read newest first until no block left can hold a newer sample than
    the ``limit``-th newest found: one that begins before the oldest block read ends within an
    hour of it."""
    picked = [_FIELD_INDEX[name] for name in fields]
    b = gpu_sample_blocks.c
    query = select(*(b[name] for name in _BLOCK_COLUMNS)).where(b.gpu_id == gpu_id)
    if since is not None:
        query = query.where(b.ts0 >= since - _SPAN, b.ts1 >= since)
    if before is not None:
        query = query.where(b.ts0 < before)
    query = query.order_by(b.ts0.desc(), b.id.desc())
    page = max(16, limit // 4)
    found: list[SampleChunk] = []
    rows = 0
    offset = 0
    while True:
        blocks = [tuple(row) for row in conn.execute(query.offset(offset).limit(page))]
        offset += len(blocks)
        if blocks:
            chunk = _chunk_of(blocks, picked, since, None, before)
            found.append(chunk)
            rows += chunk.size
        if len(blocks) < page:
            break
        if rows >= limit:
            newest = np.sort(np.concatenate([c.ts_us for c in found]))[-limit]
            if to_us(blocks[-1][4]) + MAX_BLOCK_SPAN_US < newest:
                break
    if not rows:
        return None
    merged = SampleChunk(
        ids=np.concatenate([c.ids for c in found]),
        gpu_ids=np.concatenate([c.gpu_ids for c in found]),
        node_ids=np.concatenate([c.node_ids for c in found]),
        ts_us=np.concatenate([c.ts_us for c in found]),
        boots=np.concatenate([c.boots for c in found]),
        values=[np.concatenate([c.values[j] for c in found]) for j in range(len(picked))],
        raw=[np.concatenate([c.raw[j] for c in found]) for j in range(len(picked))],
    ).in_time_order()
    return merged.take(np.arange(max(0, merged.size - limit), merged.size))
