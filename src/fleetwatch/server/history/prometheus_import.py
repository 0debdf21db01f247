"""``fleetwatch import prometheus``: a month of dcgm-exporter history from Prometheus, as the
hourly rollups (``gpu_hourly``) the risk models read, so that they start with history.

How it reads: the metric names FleetWatch maps that Prometheus holds, each queried with
``/api/v1/query_range`` every ``step`` over whole hours, a chunk of hours at a time (at most a
day, and never more than Prometheus' 11,000 points per series). The values of a node at one
step are one scrape, mapped as remote write maps them (:mod:`.prometheus_rollups`).

Why rollups and not raw samples: the server's rollup computation,
:func:`~fleetwatch.models.telemetry_features.rollup_hour`, takes readings, so the import folds
each GPU-hour with it directly. Writing the month as raw samples instead would store data that
retention (``raw_retention_days``, 14 days by default) deletes again at once, and the rollup job
never recomputes an hour older than 7 days, so the older hours would need this computation
anyway; raw samples would also stand for the GPUs' newest state and in the weekly report's
energy figures, which a 5-minute resampling of Prometheus' data should not.

How imported hours relate to the server's own:

- Only whole hours before the current one are imported (a partial hour would stay partial).
- A GPU-hour is written only where ``gpu_hourly`` has no row for it and the server holds no raw
  sample of that GPU in that hour: rollups of the server's own samples always win, and are never
  overwritten. Importing twice therefore writes nothing the second time, and an interrupted
  import is completed by running it again.
- The rollup job recomputes whole hours from raw samples within its reach (at each server start
  the hours from two before the newest rollup on; after a late spool replay up to 7 days back).
  An imported GPU-hour in that reach whose GPU has no raw samples there is dropped by such a
  pass; import before the server starts receiving the fleet's data, or accept that the last
  few imported hours may go.

GPUs new to FleetWatch are registered with the identity their series carry (UUID, index,
model name, PCI bus id, driver ...): a new node through the ingest path
(:func:`~fleetwatch.server.ingest.store.write_batch`, with no samples, as last seen at its
first step in the import), a new GPU of a known node by inserting its row (a batch would
overwrite the known node's labels and interval). A known GPU is left where it is. Xid events are
not written: an Xid counted from the last-Xid series counts in its hour's rollup only.
"""

from __future__ import annotations

import logging
import math
import uuid as uuid_module
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import msgspec
from sqlalchemy import Connection, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from fleetwatch.agent.parsers.dcgm_exporter import is_dcgm_metric
from fleetwatch.errors import InvalidInput
from fleetwatch.models.telemetry_features import HourRollup
from fleetwatch.remote_write.wire import Series
from fleetwatch.rules.xid_catalog import XidCatalog
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import gpu_hourly, gpu_sample_blocks, gpus, nodes
from fleetwatch.server.history.prometheus_api import MAX_POINTS_PER_SERIES, PrometheusApi
from fleetwatch.server.history.prometheus_rollups import ChunkRollups, XidState, rollups_of
from fleetwatch.server.ingest.batch_structs import BatchStruct, GpuStruct, NodeStruct
from fleetwatch.server.ingest.store import IDENTITY_FIELDS, WrittenBatch, write_batch

__all__ = ["ImportPlan", "ImportSummary", "import_prometheus", "plan_import"]

logger = logging.getLogger(__name__)

_HOUR = timedelta(hours=1)
_MAX_CHUNK_HOURS = 24  # a day of the fleet's series in memory at a time
_IN_LIST = 500  # UUIDs per IN (...)


@dataclass(frozen=True)
class ImportPlan:
    start: datetime  # an hour's start
    end: datetime  # an hour's start, after ``start``: [start, end) is imported
    step_s: float
    chunk_hours: int

    def chunks(self) -> list[tuple[datetime, datetime]]:
        out = []
        at = self.start
        while at < self.end:
            out.append((at, min(at + self.chunk_hours * _HOUR, self.end)))
            at = out[-1][1]
        return out


@dataclass
class ImportSummary:
    names: list[str] = field(default_factory=list)  # the metric names read
    series: int = 0  # distinct series read
    samples: int = 0  # GPU samples (one GPU at one step) mapped
    gpus: set[str] = field(default_factory=set)
    nodes: set[str] = field(default_factory=set)
    registered: int = 0  # GPUs new to FleetWatch
    hours_written: int = 0
    hours_kept: int = 0  # GPU-hours the server already had (a rollup or raw samples)
    refused: dict[str, int] = field(default_factory=dict)  # outcome -> values not read


def plan_import(*, since: datetime, now: datetime, step_s: float) -> ImportPlan:
    """The whole hours from ``since``'s hour to the current one (excluded), read every
    ``step_s`` seconds."""
    if not 1 <= step_s <= 3600:
        raise InvalidInput(f"step must be between 1 s and 1 h, got {step_s:g} s")
    start = since.replace(minute=0, second=0, microsecond=0)
    end = now.replace(minute=0, second=0, microsecond=0)
    if start >= end:
        raise InvalidInput(f"nothing to import: {since:%Y-%m-%d %H:%M} is within the current hour")
    # Points per series in a chunk, its last one included: hours * 3600 / step + 1.
    fitting = math.floor((MAX_POINTS_PER_SERIES - 1) * step_s / 3600)
    return ImportPlan(start, end, step_s, max(1, min(_MAX_CHUNK_HOURS, fitting)))


def import_prometheus(
    api: PrometheusApi,
    db: Database,
    plan: ImportPlan,
    *,
    node_labels: Sequence[str],
    catalog: XidCatalog,
    progress: Callable[[int, int, datetime, ImportSummary], None] = lambda *args: None,
) -> ImportSummary:
    """Import ``plan``'s hours (see the module's docstring); ``progress(done, chunks, end,
    summary)`` is called after each chunk, with the end of the hours imported so far."""
    summary = ImportSummary()
    summary.names = [n for n in api.metric_names(plan.start, plan.end) if is_dcgm_metric(n)]
    logger.info("prometheus import: %d dcgm-exporter metric names", len(summary.names))
    seen_series: set[frozenset[tuple[str, str]]] = set()
    xid_state: XidState = {}
    refused: defaultdict[str, int] = defaultdict(int)
    chunks = plan.chunks()
    for done, (start, end) in enumerate(chunks, 1):
        series: list[Series] = []
        last = end - timedelta(milliseconds=1)  # the next chunk's first step is its own
        for name in summary.names:
            series.extend(api.query_range(f'{{__name__="{name}"}}', start, last, plan.step_s))
        seen_series.update(frozenset(s.labels.items()) for s in series)
        chunk = rollups_of(series, node_labels=node_labels, catalog=catalog, xid_state=xid_state)
        summary.samples += chunk.samples
        for outcome, n in chunk.refused.items():
            refused[outcome] += n
        batches: list[WrittenBatch] = []
        with db.write() as conn:
            summary.registered += _register(conn, db, chunk, plan.step_s, batches)
            written, kept = _write_rollups(conn, chunk.rollups, start, end)
        for batch in batches:
            batch.committed()
        summary.hours_written += written
        summary.hours_kept += kept
        summary.gpus.update(chunk.gpus)
        summary.nodes.update(seen.node for seen in chunk.gpus.values())
        progress(done, len(chunks), end, summary)
    summary.series = len(seen_series)
    summary.refused = dict(refused)
    return summary


def _register(
    conn: Connection, db: Database, chunk: ChunkRollups, step_s: float, batches: list[WrittenBatch]
) -> int:
    """Register the GPUs of ``chunk`` FleetWatch does not know; return how many. The batches
    written go to ``batches``, to be marked committed once the transaction is."""
    seen = chunk.gpus
    known = _known_uuids(conn, list(seen))
    new_by_node: dict[str, list[GpuStruct]] = defaultdict(list)
    for uuid, gpu in sorted(seen.items()):
        if uuid not in known:
            new_by_node[gpu.node].append(msgspec.convert({"uuid": uuid, **gpu.identity}, GpuStruct))
    if not new_by_node:
        return 0
    first_hour: dict[str, datetime] = {}
    for rollup in chunk.rollups:
        first_hour.setdefault(rollup.gpu_uuid, rollup.hour)
    node_ids: dict[str, int] = {
        row.name: row.id
        for row in conn.execute(
            select(nodes.c.name, nodes.c.id).where(nodes.c.name.in_(list(new_by_node)))
        )
    }
    for node, new in new_by_node.items():
        first = min(first_hour[g.uuid] for g in new)
        if node in node_ids:
            _insert_gpus(conn, node_ids[node], new, first)
            continue
        batch_id = f"prom-import-{uuid_module.uuid4().hex}"
        batch = BatchStruct(
            batch_id=batch_id, node=NodeStruct(name=node, interval_s=step_s), gpus=new
        )
        batches.append(write_batch(conn, db, batch, content_sha256=batch_id, now=first))
        logger.info("prometheus import: registered node %s with %d GPUs", node, len(new))
    return sum(len(new) for new in new_by_node.values())


def _insert_gpus(conn: Connection, node_id: int, new: list[GpuStruct], seen: datetime) -> None:
    rows = [
        {
            "uuid": gpu.uuid,
            "node_id": node_id,
            "first_seen": seen,
            "last_seen": seen,
            **{k: getattr(gpu, k) for k in IDENTITY_FIELDS},
        }
        for gpu in new
    ]
    insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    conn.execute(insert(gpus).on_conflict_do_nothing(index_elements=["uuid"]), rows)


def _known_uuids(conn: Connection, uuids: list[str]) -> set[str]:
    out: set[str] = set()
    for i in range(0, len(uuids), _IN_LIST):
        query = select(gpus.c.uuid).where(gpus.c.uuid.in_(uuids[i : i + _IN_LIST]))
        out.update(conn.execute(query).scalars())
    return out


def _write_rollups(
    conn: Connection, rollups: list[HourRollup], start: datetime, end: datetime
) -> tuple[int, int]:
    """Insert the rollups of GPU-hours the server has nothing of; return (written, kept)."""
    uuids = sorted({r.gpu_uuid for r in rollups})
    ids: dict[str, tuple[int, int]] = {}  # uuid -> (gpus.id, node_id)
    taken: set[tuple[str, datetime]] = set()
    for i in range(0, len(uuids), _IN_LIST):
        some = uuids[i : i + _IN_LIST]
        query = select(gpus.c.uuid, gpus.c.id, gpus.c.node_id).where(gpus.c.uuid.in_(some))
        ids.update({row.uuid: (row.id, row.node_id) for row in conn.execute(query)})
        hourly = select(gpu_hourly.c.gpu_uuid, gpu_hourly.c.hour).where(
            gpu_hourly.c.gpu_uuid.in_(some), gpu_hourly.c.hour >= start, gpu_hourly.c.hour < end
        )
        taken.update((row.gpu_uuid, row.hour) for row in conn.execute(hourly))
    taken |= _hours_with_samples(conn, ids, start, end)
    rows: list[dict[str, Any]] = []
    for rollup in rollups:
        if (rollup.gpu_uuid, rollup.hour) not in taken:
            rows.append({**rollup.as_row(), "node_id": ids[rollup.gpu_uuid][1]})
    if rows:
        insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
        statement = insert(gpu_hourly).on_conflict_do_nothing(index_elements=["gpu_uuid", "hour"])
        for i in range(0, len(rows), _IN_LIST):
            conn.execute(statement, rows[i : i + _IN_LIST])
    return len(rows), len(rollups) - len(rows)


def _hours_with_samples(
    conn: Connection, ids: dict[str, tuple[int, int]], start: datetime, end: datetime
) -> set[tuple[str, datetime]]:
    """(GPU UUID, hour) pairs in [start, end) holding raw samples of the server's own; a block
    spans at most an hour, so its first and last ticks name its hours."""
    uuid_of = {gpu_id: uuid for uuid, (gpu_id, _) in ids.items()}
    b = gpu_sample_blocks.c
    out: set[tuple[str, datetime]] = set()
    gpu_ids = sorted(uuid_of)
    for i in range(0, len(gpu_ids), _IN_LIST):
        query = select(b.gpu_id, b.ts0, b.ts1).where(
            b.gpu_id.in_(gpu_ids[i : i + _IN_LIST]), b.ts0 >= start - _HOUR, b.ts0 < end
        )
        for gpu_id, ts0, ts1 in conn.execute(query):
            for ts in (ts0, ts1):
                out.add((uuid_of[gpu_id], ts.replace(minute=0, second=0, microsecond=0)))
    return out
