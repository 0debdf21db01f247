"""The storage lifecycle: raw samples for ``raw_retention_days``, hourly rollups far longer.

One pass of the leader's ``retention`` job (every ``retention_interval_s``), with ``cutoff`` =
now - ``raw_retention_days``:

- **PostgreSQL**: day partitions of ``gpu_sample_blocks`` are created for today and
  :data:`DAYS_AHEAD` days ahead, and for every day after the cutoff with blocks in the DEFAULT
  partition (a spool replayed after an outage longer than the days ahead; the blocks move into
  their day). Day partitions whose whole day is before the cutoff are dropped, which frees their
  disk at once; the day the cutoff falls in stays until it is wholly past, so raw samples live
  up to one day longer than ``raw_retention_days``. Blocks whose last tick is before the cutoff
  are deleted from the DEFAULT partition (a late replay of a day already dropped).
- **SQLite**: blocks whose last tick is before the cutoff are deleted, :data:`CHUNK_ROWS` per
  transaction. Each chunk
  takes the writer lock on its own, so an ingest waits for one chunk at most; the freed pages
  are reused by new rows, so the file stops growing once retention is reached.
- **Both**: ``gpu_hourly`` rows before now - ``rollup_retention_days`` are deleted in chunks,
  and so are the batch ids of ``ingest_batches`` received before now - ``max_past_age_s`` -
  ``max_future_skew_s`` - a day: a replay of such a batch is refused for its readings' age
  before its id could be missed (a push a minute from 12,500 nodes is 18 million ids a day).

A sample with its time at or after the cutoff is never deleted (a block goes only once its last tick
is past: a block holds at most an hour, so a sample outlives the cutoff by an hour at most). Events,
verdicts, evictions, GPU lifetimes and boots are kept. Each DDL step is its own short transaction
under a lock timeout, so that a long query on the table makes the step fail and be retried next pass
instead of holding every ingest behind it. The pass holds :attr:`LockKey.RETENTION`: two processes
never run one at once.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Table, column, delete, select, table, tuple_

from fleetwatch.config import ServerSettings
from fleetwatch.server.db import partitions
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import gpu_hourly, gpu_sample_blocks, ingest_batches
from fleetwatch.server.runtime.locks import LockKey, session_lock
from fleetwatch.server.runtime.metric_families import ServerMetrics

__all__ = ["CHUNK_ROWS", "DAYS_AHEAD", "RetentionJob", "RetentionPass", "delete_in_chunks"]

logger = logging.getLogger(__name__)

DAYS_AHEAD = 3
CHUNK_ROWS = 5_000
LOCK_TIMEOUT_S = 2.0

# The DEFAULT partition, addressed alone: a DELETE through gpu_sample_blocks would also reach the
# day partition the cutoff falls in, which is dropped whole later instead.
_DEFAULT = table(
    partitions.DEFAULT_PARTITION,
    column("id", gpu_sample_blocks.c.id.type),
    column("ts1", gpu_sample_blocks.c.ts1.type),
)
_TABLE = "gpu_sample_blocks"  # the label of the raw samples' table on /metrics


@dataclass(frozen=True)
class RetentionPass:
    """What one pass did."""

    cutoff: datetime  # raw samples before it were due
    samples_deleted: int = 0  # sample blocks
    hourly_deleted: int = 0
    batch_ids_deleted: int = 0
    created: tuple[date, ...] = ()
    dropped: tuple[date, ...] = ()
    moved: int = 0  # blocks moved out of the DEFAULT partition into a new day partition
    partitions: int | None = None  # after the pass (PostgreSQL)
    default_rows: int | None = None  # left in the DEFAULT partition (PostgreSQL)


def delete_in_chunks(
    db: Database, target: Table | Any, keys: list[Any], expired: ColumnElement[bool], chunk: int
) -> int:
    """Delete the rows of ``target`` that match ``expired``, ``chunk`` at a time, each chunk in
    a transaction of its own; return how many."""
    chosen = select(*keys).where(expired).limit(chunk)
    match = keys[0].in_(chosen) if len(keys) == 1 else tuple_(*keys).in_(chosen)
    total = 0
    while True:
        with db.write() as conn:
            deleted = conn.execute(delete(target).where(match)).rowcount
        total += deleted
        if deleted < chunk:
            return total


class RetentionJob:
    """The leader's retention pass (see the module's docstring); ``now`` may be injected."""

    def __init__(
        self,
        db: Database,
        *,
        raw_retention: timedelta,
        rollup_retention: timedelta,
        batch_id_retention: timedelta | None = None,
        metrics: ServerMetrics | None = None,
        days_ahead: int = DAYS_AHEAD,
        chunk_rows: int = CHUNK_ROWS,
        lock_timeout_s: float = LOCK_TIMEOUT_S,
    ) -> None:
        self.db = db
        self.raw_retention = raw_retention
        self.rollup_retention = rollup_retention
        self.batch_id_retention = batch_id_retention or timedelta(days=31)
        self.metrics = metrics
        self.days_ahead = days_ahead
        self.chunk_rows = chunk_rows
        self.lock_timeout_s = lock_timeout_s

    @classmethod
    def from_settings(
        cls, db: Database, settings: ServerSettings, metrics: ServerMetrics | None = None
    ) -> RetentionJob:
        return cls(
            db,
            raw_retention=timedelta(days=settings.raw_retention_days),
            rollup_retention=timedelta(days=settings.rollup_retention_days),
            batch_id_retention=timedelta(
                seconds=settings.max_past_age_s + settings.max_future_skew_s, days=1
            ),
            metrics=metrics,
        )

    def __call__(self, now: datetime | None = None) -> RetentionPass | None:
        """One pass; None when another process is running one."""
        now = now or datetime.now(UTC)
        started = time.monotonic()
        with session_lock(self.db.engine, LockKey.RETENTION) as held:
            if not held:
                return None
            if self.db.is_sqlite:
                done = RetentionPass(
                    now - self.raw_retention, samples_deleted=self._delete_raw(now)
                )
            else:
                done = self._maintain_partitions(now)
            done = replace(
                done,
                hourly_deleted=self._delete_rollups(now),
                batch_ids_deleted=self._delete_batch_ids(now),
            )
        self._record(done, now, time.monotonic() - started)
        if any((done.samples_deleted, done.hourly_deleted, done.batch_ids_deleted)) or (
            done.created or done.dropped
        ):
            logger.info(
                "retention: %d sample blocks, %d hourly rollups and %d batch ids deleted, %d day "
                "partitions dropped, %d created (%d blocks moved out of the DEFAULT partition)",
                done.samples_deleted,
                done.hourly_deleted,
                done.batch_ids_deleted,
                len(done.dropped),
                len(done.created),
                done.moved,
            )
        return done

    def _delete_raw(self, now: datetime) -> int:
        b = gpu_sample_blocks.c
        expired = b.ts1 < now - self.raw_retention
        return delete_in_chunks(self.db, gpu_sample_blocks, [b.id], expired, self.chunk_rows)

    def _delete_rollups(self, now: datetime) -> int:
        keys = [gpu_hourly.c.gpu_uuid, gpu_hourly.c.hour]
        expired = gpu_hourly.c.hour < now - self.rollup_retention
        return delete_in_chunks(self.db, gpu_hourly, keys, expired, self.chunk_rows)

    def _delete_batch_ids(self, now: datetime) -> int:
        keys = [ingest_batches.c.batch_id]
        expired = ingest_batches.c.received_at < now - self.batch_id_retention
        return delete_in_chunks(self.db, ingest_batches, keys, expired, self.chunk_rows)

    def _maintain_partitions(self, now: datetime) -> RetentionPass:
        cutoff = now - self.raw_retention
        with self.db.read() as conn:
            existing = partitions.list_partitions(conn)
            stray = partitions.default_days(conn) if existing.has_default else []
        if not existing.has_default:
            self._ddl(partitions.create_default)
            logger.warning("retention: the DEFAULT partition of %s was missing; created", _TABLE)
        today = now.astimezone(UTC).date()
        wanted = {today + timedelta(days=n) for n in range(self.days_ahead + 1)}
        wanted |= {day for day in stray if partitions.day_bounds(day)[1] > cutoff}
        created, moved = [], 0
        for day in sorted(wanted - set(existing.days)):
            moved += self._ddl(lambda conn, day=day: partitions.create_day(conn, day))
            created.append(day)
        dropped = [day for day in existing.days if partitions.day_bounds(day)[1] <= cutoff]
        for day in dropped:
            self._ddl(lambda conn, day=day: partitions.drop_day(conn, day))
        deleted = delete_in_chunks(
            self.db, _DEFAULT, [_DEFAULT.c.id], _DEFAULT.c.ts1 < cutoff, self.chunk_rows
        )
        with self.db.read() as conn:
            after = partitions.list_partitions(conn)
            left = partitions.default_rows(conn)
        return RetentionPass(
            cutoff,
            samples_deleted=deleted,
            created=tuple(created),
            dropped=tuple(dropped),
            moved=moved,
            partitions=after.count,
            default_rows=left,
        )

    def _ddl(self, step: Any) -> int:
        with self.db.write() as conn:
            partitions.set_lock_timeout(conn, self.lock_timeout_s)
            return int(step(conn) or 0)

    def _record(self, done: RetentionPass, now: datetime, seconds: float) -> None:
        m = self.metrics
        if m is None:
            return
        m.retention_rows_deleted.labels(table=_TABLE).inc(done.samples_deleted)
        m.retention_rows_deleted.labels(table="gpu_hourly").inc(done.hourly_deleted)
        m.retention_rows_deleted.labels(table="ingest_batches").inc(done.batch_ids_deleted)
        m.retention_cutoff.labels(table=_TABLE).set(done.cutoff.timestamp())
        m.retention_cutoff.labels(table="gpu_hourly").set((now - self.rollup_retention).timestamp())
        if done.partitions is not None:
            m.retention_partitions_dropped.labels(table=_TABLE).inc(len(done.dropped))
            m.partitions_created.labels(table=_TABLE).inc(len(done.created))
            m.partitions.labels(table=_TABLE).set(done.partitions)
            m.partition_default_rows.labels(table=_TABLE).set(done.default_rows or 0)
        m.retention_last_run.set(now.timestamp())
        m.retention_duration.set(seconds)
