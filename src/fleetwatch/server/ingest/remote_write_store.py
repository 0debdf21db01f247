"""Storing a remote-write request: stage its pieces, turn last-Xid changes into events, once.

Prometheus sends each series of a scrape when its shard's batch is due, so the fields of one
GPU's scrape come in several requests, and it resends whatever was not acknowledged (a retry
after a 5xx, a WAL replay after a restart). Each piece is therefore staged in
``remote_write_staging`` under (GPU, scrape time): the request's transaction merges it into the
pending fields, less those already stored (the row's ``stored_mask``), and commits before the
answer. :mod:`fleetwatch.server.upkeep.remote_write_seal` later writes each complete scrape as
one sample, through the agent's own path (:func:`~fleetwatch.server.ingest.store.write_batch`),
and sets its fields in the mask. A field of a GPU at an instant is so stored once, whichever
request brings it and however often. The rows are read ``FOR UPDATE`` on PostgreSQL, so the
sealer cannot seal a row between this transaction's read of it and its write.

``DCGM_FI_DEV_XID_ERRORS`` is the code of the GPU's last Xid: a new non-zero code is an Xid
event, stored at once (it may drain the node: the router hands it to the urgent lane) rather
than at the seal. The code last seen is kept per GPU in ``remote_write_state``; the first one
seen of a GPU is only a baseline (it may be days old), the same code again is the same Xid, and
a return to 0 (DCGM restarted) is no event.

An HA pair of Prometheus servers (the same ``cluster`` label, different ``__replica__``) sends
every series twice with different timestamps. As Cortex and Mimir do, one replica per cluster
is stored: the one stored last, until it has been silent for ``remote_write_ha_failover_s``.
"""

from __future__ import annotations

import logging
import uuid as uuid_module
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, func, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from fleetwatch.config import ServerSettings
from fleetwatch.errors import GpuClaimed
from fleetwatch.remote_write.node_exporter import EdacReading, edac_event, map_node_exporter
from fleetwatch.rules.thresholds import HealthThresholds
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import (
    remote_write_replicas,
    remote_write_staging,
    remote_write_state,
)
from fleetwatch.server.ingest.batch_structs import BatchStruct, EventStruct, GpuStruct, NodeStruct
from fleetwatch.server.ingest.remote_write_readings import (
    HaReplica,
    RequestReadings,
    XidObservation,
)
from fleetwatch.server.ingest.store import WrittenBatch, write_batch
from fleetwatch.telemetry import SAMPLE_FIELD_NAMES

__all__ = [
    "PORT_KEY_PREFIX",
    "RemoteWriteStored",
    "field_mask",
    "node_batch",
    "store_request",
    "write_node_batch",
]

PORT_KEY_PREFIX = "port:"

logger = logging.getLogger(__name__)

_MAX_CONTROLLER = 10**6  # a memory controller's number in a state key: bounds the key's length
_FIELD_BIT = {name: 1 << i for i, name in enumerate(SAMPLE_FIELD_NAMES)}
_XID_MESSAGE = "reported by dcgm-exporter (DCGM_FI_DEV_XID_ERRORS) through Prometheus remote write"


def field_mask(names: Iterable[str]) -> int:
    """The stored-fields mask of ``names``."""
    mask = 0
    for name in names:
        mask |= _FIELD_BIT[name]
    return mask


@dataclass
class RemoteWriteStored:
    samples: Counter[str] = field(default_factory=Counter)  # outcome -> samples
    events: list[tuple[str, EventStruct]] = field(default_factory=list)  # (node, event) stored
    written: list[WrittenBatch] = field(default_factory=list)


def store_request(
    db: Database,
    readings: RequestReadings,
    settings: ServerSettings,
    now: datetime,
    thresholds: HealthThresholds | None = None,
) -> RemoteWriteStored:
    """Stage ``readings`` and store their events, in one transaction; commit before returning."""
    stored = RemoteWriteStored()
    with db.write() as conn:
        if readings.ha is not None and not _elected(conn, readings.ha, settings, now):
            stored.samples["replica_dropped"] += _sample_count(readings)
            return stored
        _lock_nodes(conn, readings)
        pieces = [
            _Piece(p.uuid, p.node, p.ts, p.identity, p.values, is_gpu=True) for p in readings.pieces
        ]
        events = _xid_events(conn, readings.xids)
        for node, samples in readings.node_series.items():
            mapped = map_node_exporter(samples)
            stored.samples["invalid"] += len(mapped.skipped)
            pieces.extend(_port_piece(node, port) for port in mapped.ports)
            events.extend(_edac_events(conn, node, mapped.edac))
        _stage(conn, pieces, now, stored)
        _write_events(conn, db, events, settings, now, thresholds, stored)
    for written in stored.written:
        written.committed()
    return stored


@dataclass(frozen=True)
class _Piece:
    """A piece of a staged reading: a GPU's (key: its UUID) or a port's (``port:...``)."""

    key: str
    node: str
    ts: datetime
    identity: dict[str, Any]
    values: dict[str, Any]
    is_gpu: bool


@dataclass(frozen=True)
class _NodeEvent:
    node: str
    event: EventStruct
    gpu: GpuStruct | None = None


def _port_piece(node: str, port: dict[str, Any]) -> _Piece:
    """A port reading as a piece: its counters flattened (``counters.symbol_error``), so that
    pieces merge field by field."""
    values: dict[str, Any] = {}
    for name, value in port.items():
        if name in ("device", "port", "ts"):
            continue
        if isinstance(value, dict):
            values.update({f"{name}.{k}": v for k, v in value.items()})
        else:
            values[name] = value
    identity = {"device": port["device"], "port": port["port"]}
    key = f"{PORT_KEY_PREFIX}{node}:{port['device']}:{port['port']}"
    return _Piece(key, node, port["ts"], identity, values, is_gpu=False)


# Requests writing the same nodes' rows take turns, in node order. Row locks alone could not
# order them: a request locks the rows that exist (SELECT ... FOR UPDATE), then the ones its
# upsert creates, so two requests could each hold a row the other's upsert wanted (a deadlock
# under load, answered 503 and retried). The sealer takes no such lock: it only takes rows no
# request holds (SKIP LOCKED), and a request takes node rows only after its staging.
_LOCK_NODES = text(
    "SELECT pg_advisory_xact_lock(hashtextextended('fleetwatch.remote_write:' || n, 0)) "
    "FROM unnest(CAST(:nodes AS text[])) WITH ORDINALITY AS t(n, i)"
)


def _lock_nodes(conn: Connection, readings: RequestReadings) -> None:
    if conn.dialect.name != "postgresql":
        return  # SQLite has one writer at a time
    nodes = {p.node for p in readings.pieces} | {x.node for x in readings.xids}
    nodes |= set(readings.node_series)
    if nodes:
        conn.execute(_LOCK_NODES, {"nodes": sorted(nodes)})


def _sample_count(readings: RequestReadings) -> int:
    """The sample fields of a request (what a dropped replica's request would have stored)."""
    return (
        sum(len(p.values) for p in readings.pieces)
        + len(readings.xids)
        + sum(len(s) for s in readings.node_series.values())
    )


def _elected(conn: Connection, ha: HaReplica, settings: ServerSettings, now: datetime) -> bool:
    """Whether ``ha``'s replica is the one stored for its cluster (electing it when the stored
    one has been silent for the failover time, or none was)."""
    table = remote_write_replicas
    row = conn.execute(
        select(table.c.replica, table.c.last_seen)
        .where(table.c.cluster == ha.cluster)
        .with_for_update()
    ).first()
    if row is None:
        insert_ = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
        inserted = conn.execute(
            insert_(table)
            .values(cluster=ha.cluster, replica=ha.replica, last_seen=now)
            .on_conflict_do_nothing(index_elements=["cluster"])
            .returning(table.c.cluster)
        ).first()
        if inserted is not None:
            return True
        return _elected(conn, ha, settings, now)  # elected at the same moment by the other
    failover = timedelta(seconds=settings.remote_write_ha_failover_s)
    if row.replica != ha.replica and row.last_seen > now - failover:
        return False
    if row.replica != ha.replica:
        logger.warning(
            "remote write: cluster %s fails over from replica %s (silent since %s) to %s",
            ha.cluster,
            row.replica,
            row.last_seen.isoformat(),
            ha.replica,
        )
    conn.execute(
        update(table).where(table.c.cluster == ha.cluster).values(replica=ha.replica, last_seen=now)
    )
    return True


def _stage(
    conn: Connection, pieces: list[_Piece], now: datetime, stored: RemoteWriteStored
) -> None:
    """Merge the pieces' fields not stored before into their staged rows."""
    if not pieces:
        return
    merged: dict[tuple[str, datetime], _Piece] = {}
    for piece in pieces:  # one row per key in one statement: fold repeats of a piece first
        key = (piece.key, piece.ts)
        old = merged.get(key)
        if old is not None:
            identity, values = old.identity | piece.identity, old.values | piece.values
            piece = replace(piece, identity=identity, values=values)
        merged[key] = piece
    table = remote_write_staging
    known = {
        (row.key, row.ts): row
        for row in conn.execute(
            select(table.c.key, table.c.ts, table.c.stored_mask, table.c.pending)
            .where(
                table.c.key.in_({key for key, _ in merged}),
                table.c.ts.between(min(ts for _, ts in merged), max(ts for _, ts in merged)),
            )
            .order_by(table.c.key, table.c.ts)  # locked in one order: concurrent requests wait
            .with_for_update()
        )
    }
    rows = []
    for key, piece in merged.items():
        row = known.get(key)
        values = piece.values
        if row is not None:
            values = _not_stored(piece, row.stored_mask, row.pending or {})
            stored.samples["duplicate"] += len(piece.values) - len(values)
            if not values:
                continue
        stored.samples["staged"] += len(values)
        rows.append(
            {
                "key": piece.key,
                "ts": piece.ts,
                "node": piece.node,
                "identity": piece.identity,
                "pending": values,
                "stored_mask": 0,
                "received_at": now,
            }
        )
    if rows:
        rows.sort(key=lambda row: (row["key"], row["ts"]))  # new rows too, in the lock order
        conn.execute(_upsert(conn.dialect.name), rows)


def _not_stored(piece: _Piece, stored_mask: int, pending: dict[str, Any]) -> dict[str, Any]:
    """The piece's fields neither stored nor pending with the same value. A port reading is
    stored whole (its mask all ones): any field of it coming after is a resent one."""
    return {
        name: value
        for name, value in piece.values.items()
        if pending.get(name) != value
        and not (stored_mask & _FIELD_BIT[name] if piece.is_gpu else stored_mask)
    }


def _upsert(dialect: str) -> Any:
    table = remote_write_staging
    statement: Any
    merge_pending: Any
    merge_identity: Any
    if dialect == "postgresql":
        statement = pg_insert(table)
        excluded = statement.excluded
        merge_pending = func.coalesce(table.c.pending, func.jsonb_build_object()).op("||")(
            excluded.pending
        )
        merge_identity = table.c.identity.op("||")(excluded.identity)
    else:
        statement = sqlite_insert(table)
        excluded = statement.excluded
        merge_pending = func.json_patch(func.coalesce(table.c.pending, "{}"), excluded.pending)
        merge_identity = func.json_patch(table.c.identity, excluded.identity)
    return statement.on_conflict_do_update(
        index_elements=["key", "ts"],
        set_={
            "pending": merge_pending,
            "identity": merge_identity,
            "node": excluded.node,
            "received_at": excluded.received_at,
        },
    )


def _advance(
    conn: Connection, observations: list[tuple[str, datetime, int]]
) -> list[tuple[int, int | None]]:
    """Walk each key's observed values (key, ts, value) in time order past its stored last
    value: (index of the observation, the value before it, None for a key's first) for each
    one newer than what was seen; the last values are updated."""
    if not observations:
        return []
    table = remote_write_state
    last = {
        row.key: (row.value, row.ts)
        for row in conn.execute(
            select(table.c.key, table.c.value, table.c.ts)
            .where(table.c.key.in_({key for key, _, _ in observations}))
            .order_by(table.c.key)
            .with_for_update()
        )
    }
    steps = []
    for index in sorted(range(len(observations)), key=lambda i: observations[i][1]):
        key, ts, value = observations[index]
        previous = last.get(key)
        if previous is not None and ts <= previous[1]:
            continue  # resent, or older than what was seen: already judged
        steps.append((index, None if previous is None else previous[0]))
        last[key] = (value, ts)
    insert_: Any = pg_insert(table) if conn.dialect.name == "postgresql" else sqlite_insert(table)
    conn.execute(
        insert_.on_conflict_do_update(
            index_elements=["key"],
            set_={"value": insert_.excluded.value, "ts": insert_.excluded.ts},
        ),
        [{"key": key, "value": value, "ts": ts} for key, (value, ts) in sorted(last.items())],
    )
    return steps


def _xid_events(conn: Connection, observations: list[XidObservation]) -> list[_NodeEvent]:
    """A GPU's new non-zero last-Xid code is an Xid event (the first code seen is a baseline)."""
    steps = _advance(conn, [(f"xid:{o.uuid}", o.ts, o.code) for o in observations])
    events = []
    for index, previous in steps:
        seen = observations[index]
        if previous is None or seen.code in (0, previous):
            continue
        event = EventStruct(
            kind="xid", ts=seen.ts, uuid=seen.uuid, xid=seen.code, message=_XID_MESSAGE
        )
        events.append(_NodeEvent(seen.node, event, GpuStruct(uuid=seen.uuid, **seen.identity)))
    return events


def _edac_events(conn: Connection, node: str, readings: list[EdacReading]) -> list[_NodeEvent]:
    """A rise of a memory controller's EDAC count is an ``edac`` event, as the agent's. Only the
    controllers' totals: a csrow's errors are in its controller's total too."""
    totals = [r for r in readings if r.csrow is None and 0 <= r.controller < _MAX_CONTROLLER]
    steps = _advance(
        conn, [(f"edac:{node}:{r.controller}:{r.kind}", r.ts, r.value) for r in totals]
    )
    events = []
    for index, previous in steps:
        event = edac_event(previous, totals[index])
        if event is not None:
            events.append(_NodeEvent(node, EventStruct(**event)))
    return events


def _write_events(
    conn: Connection,
    db: Database,
    events: list[_NodeEvent],
    settings: ServerSettings,
    now: datetime,
    thresholds: HealthThresholds | None,
    stored: RemoteWriteStored,
) -> None:
    """Each node's events as one batch, as an agent would send them."""
    by_node: dict[str, list[_NodeEvent]] = defaultdict(list)
    for one in events:
        by_node[one.node].append(one)
    for node, node_events in sorted(by_node.items()):
        gpus = {e.gpu.uuid: e.gpu for e in node_events if e.gpu is not None}
        batch = node_batch(
            node, settings, gpus=list(gpus.values()), events=[e.event for e in node_events]
        )
        written = write_node_batch(conn, db, batch, settings, now, thresholds)
        if written is None:
            stored.samples["conflict"] += len(node_events)
            continue
        stored.written.append(written)
        stored.events.extend((node, e.event) for e in node_events)


def node_batch(node: str, settings: ServerSettings, **parts: Any) -> BatchStruct:
    """A node's readings as the batch its agent would have pushed. Its id is new each time:
    what Prometheus resends is told apart by the staged rows, not by batch ids."""
    return BatchStruct(
        batch_id=f"rw-{uuid_module.uuid4().hex}",
        node=NodeStruct(name=node, interval_s=settings.remote_write_scrape_interval_s),
        **parts,
    )


def write_node_batch(
    conn: Connection,
    db: Database,
    batch: BatchStruct,
    settings: ServerSettings,
    now: datetime,
    thresholds: HealthThresholds | None = None,
) -> WrittenBatch | None:
    """``batch`` written in a savepoint of the caller's transaction; None, having written
    nothing of it, when another node reports its GPUs right now (the agent's 409)."""
    savepoint = conn.begin_nested()
    try:
        written = write_batch(
            conn,
            db,
            batch,
            content_sha256=batch.batch_id,
            now=now,
            live_intervals=settings.unreachable_after_intervals,
            thresholds=thresholds,
        )
    except GpuClaimed as exc:
        savepoint.rollback()
        logger.warning("remote write: readings of %s not stored: %s", batch.node.name, exc)
        return None
    savepoint.commit()
    return written
