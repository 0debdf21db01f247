"""Sealing staged remote-write scrapes: each complete GPU scrape becomes one stored sample.

A staged row is complete once no piece of it came for ``remote_write_settle_s`` (Prometheus
sends each shard's batch within ``batch_send_deadline``, 5 s by default). The sealer takes such
rows, oldest first, writes each node's as one batch through the agent's path
(:func:`~fleetwatch.server.ingest.store.write_batch`: blocks, latest state, GPU ownership) and
records their fields as stored, in one transaction: a scrape is stored and marked, or neither.
``FOR UPDATE SKIP LOCKED`` lets every server process seal at once without taking a row twice.

A process that has just started waits one settle time more before sealing anything: pieces that
Prometheus held back while no server answered arrive in the first seconds after the start, and a
row must not be sealed before they join it. Rows stay (fields as a mask, nothing pending) for
``remote_write_dedup_window_s``, so that a piece resent later is recognised, then are deleted.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, bindparam, delete, null, select, text, update
from sqlalchemy.dialects.postgresql import JSONB

from fleetwatch.config import ServerSettings
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import remote_write_staging
from fleetwatch.server.ingest.batch_structs import BatchStruct, GpuStruct, SampleStruct
from fleetwatch.server.ingest.group_store import GroupedBatch, write_group
from fleetwatch.server.ingest.remote_write_store import (
    PORT_KEY_PREFIX,
    field_mask,
    node_batch,
    write_node_batch,
)
from fleetwatch.server.ingest.sample_writer import LearnedKeys
from fleetwatch.server.ingest.store import WrittenBatch

__all__ = ["RemoteWriteSealer"]

logger = logging.getLogger(__name__)

# Rows sealed per transaction: a backlog (a restart's replay) is sealed in bounded steps.
_ROWS_PER_PASS = 20_000

_MARK_STORED = (
    update(remote_write_staging)
    .where(
        remote_write_staging.c.key == bindparam("b_key"),
        remote_write_staging.c.ts == bindparam("b_ts"),
    )
    .values(
        stored_mask=remote_write_staging.c.stored_mask.op("|")(bindparam("b_mask")),
        pending=null(),
        received_at=null(),
    )
)


def _stored_mask(row: Any) -> dict[str, Any]:
    """The row's key and the bits its pending fields add to its mask (a port's: all)."""
    mask = -1 if row.key.startswith(PORT_KEY_PREFIX) else field_mask(row.pending)
    return {"b_key": row.key, "b_ts": row.ts, "b_mask": mask}


def _port_reading(row: Any) -> dict[str, Any]:
    """A staged port row as the wire's port reading (its counters nested again)."""
    port: dict[str, Any] = {**row.identity, "ts": row.ts}
    for name, value in row.pending.items():
        group, dot, counter = name.partition(".")
        if dot:
            port.setdefault(group, {})[counter] = value
        else:
            port[name] = value
    return port


def _batch(node: str, rows: list[Any], settings: ServerSettings) -> BatchStruct:
    """A node's settled rows as the batch an agent would have pushed."""
    identities: dict[str, dict[str, Any]] = {}
    samples, ports = [], []
    for row in sorted(rows, key=lambda r: r.ts):
        if row.key.startswith(PORT_KEY_PREFIX):
            ports.append(_port_reading(row))
            continue
        identities[row.key] = row.identity  # the newest scrape's identity wins
        samples.append(SampleStruct(uuid=row.key, ts=row.ts, **row.pending))
    return node_batch(
        node,
        settings,
        gpus=[GpuStruct(uuid=uuid, **identity) for uuid, identity in identities.items()],
        samples=samples,
        ports=ports or None,
    )


def _mark_stored(conn: Connection, rows: Sequence[Any]) -> None:
    """The rows' pending fields set in their masks, nothing pending: one statement on
    PostgreSQL (a statement per row cost more than storing the samples)."""
    marks = [_stored_mask(row) for row in rows]
    if conn.dialect.name == "postgresql":
        conn.execute(
            _MARK_STORED_PG,
            {
                "b_rows": [
                    {"key": m["b_key"], "ts": m["b_ts"].isoformat(), "mask": m["b_mask"]}
                    for m in marks
                ]
            },
        )
    else:
        conn.execute(_MARK_STORED, marks)


_MARK_STORED_PG = text(
    "UPDATE remote_write_staging AS s SET stored_mask = s.stored_mask | v.mask, "
    "pending = NULL, received_at = NULL "
    "FROM jsonb_to_recordset(:b_rows) AS v(key text, ts timestamptz, mask bigint) "
    "WHERE s.key = v.key AND s.ts = v.ts"
).bindparams(bindparam("b_rows", type_=JSONB))


class RemoteWriteSealer:
    """One pass: seal what settled; the job runs it every second or so."""

    def __init__(
        self,
        db: Database,
        settings: ServerSettings,
        *,
        clock: Callable[[], datetime] = utcnow,
        counted: Callable[[str, int], None] = lambda outcome, n: None,
    ) -> None:
        self.db = db
        self.settings = settings
        self.clock = clock
        self.counted = counted
        self.started = clock()

    def run_once(self) -> int:
        """Seal what has settled; the number of fields stored (a GPU sample's, a port's)."""
        now = self.clock()
        settle = timedelta(seconds=self.settings.remote_write_settle_s)
        if now - self.started < settle:
            return 0
        learned = LearnedKeys(self.db)
        written: list[WrittenBatch] = []
        with self.db.write() as conn:
            rows = conn.execute(
                select(
                    remote_write_staging.c.key,
                    remote_write_staging.c.ts,
                    remote_write_staging.c.node,
                    remote_write_staging.c.identity,
                    remote_write_staging.c.pending,
                )
                .where(remote_write_staging.c.received_at < now - settle)
                .order_by(remote_write_staging.c.received_at)
                .limit(_ROWS_PER_PASS)
                .with_for_update(skip_locked=True)
            ).all()
            by_node: dict[str, list[Any]] = defaultdict(list)
            for row in rows:
                by_node[row.node].append(row)
            batches = {
                node: _batch(node, node_rows, self.settings) for node, node_rows in by_node.items()
            }
            alone = sorted(batches)
            if conn.dialect.name == "postgresql" and batches:
                # Routine scrapes (known nodes and GPUs, no ports) share one set of statements,
                # as an agent's routine pushes do (group commit); the rest go one node at a time.
                items = [GroupedBatch(batch, batch.batch_id) for batch in batches.values()]
                results = write_group(conn, self.db, items, now=now, learned=learned)
                alone = sorted(
                    item.batch.node.name
                    for item, result in zip(items, results, strict=True)
                    if result is None
                )
            stored = sum(len(row.pending) for row in rows)  # in fields, as staged
            for node in alone:
                one = self._write_node(conn, batches[node], now)
                if one is None:
                    stored -= sum(len(row.pending) for row in by_node[node])
                else:
                    written.append(one)
            if rows:
                _mark_stored(conn, rows)
            self._forget(conn, now)
        learned.remember()
        for one in written:
            one.committed()
        if stored:
            self.counted("stored", stored)
        return stored

    def _write_node(
        self, conn: Connection, batch: BatchStruct, now: datetime
    ) -> WrittenBatch | None:
        written = write_node_batch(conn, self.db, batch, self.settings, now)
        if written is None:  # marked as stored anyway, or every pass would try it again
            self.counted("conflict", len(batch.samples) + len(batch.ports or ()))
        return written

    def _forget(self, conn: Connection, now: datetime) -> None:
        """Rows older than the dedup window: nothing older is accepted, so none is resent."""
        window = timedelta(seconds=self.settings.remote_write_dedup_window_s)
        conn.execute(
            delete(remote_write_staging).where(
                remote_write_staging.c.ts < now - window,
                remote_write_staging.c.received_at.is_(None),
            )
        )
