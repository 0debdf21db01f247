"""Storing one validated batch, atomically: all of it or none of it.

Order inside the transaction: node, then the batch id (so a replay stops before writing anything),
then GPU identities, samples (bulk, :mod:`~fleetwatch.server.ingest.sample_writer`), latest state,
events, network adapter ports (:mod:`~fleetwatch.server.repo.ports`). A duplicate batch rolls
back whatever it touched, so a replay changes nothing, not even the node's last_seen.

A GPU belongs to one node. When a batch declares a GPU stored under another node, that node's
last report of it decides: within ``live_intervals`` of that node's intervals (the window after
which a silent node counts as unreachable), two nodes report one UUID at once (a cloned UUID, a
misconfigured agent): the batch is refused with 409 and a ``gpu_uuid_conflict`` event is stored
on the owning node, at most one an hour per GPU and reporting node. Silent for longer, the GPU
moved: it changes node and a ``gpu_moved`` event on the new node says from where. Pushes that
claim one GPU at the same moment are decided one after the other, as if they had come in turn:
the GPU rows are locked as they are read, and a GPU that a concurrent push registered first
(the INSERT's RETURNING says which) belongs to that push's node. One claimant owns the GPU; the
others get the 409 of a sequential claim and store nothing.

On PostgreSQL routine pushes are usually stored several at once by
:mod:`~fleetwatch.server.ingest.group_store`, which leaves everything unusual to this function.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, DateTime, bindparam, func, insert, select, text, update
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import SQLAlchemyError

from fleetwatch.errors import BatchConflict, GpuClaimed, InvalidInput
from fleetwatch.rules.thresholds import HealthThresholds
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import events, gpus, ingest_batches, nodes
from fleetwatch.server.ingest.batch_view import BatchView, GpuView, SampleView, push_lag_s
from fleetwatch.server.ingest.sample_writer import LearnedKeys, write_samples
from fleetwatch.server.repo.gpus import LATEST_MIG_KEY
from fleetwatch.server.repo.ports import port_readings, store_ports

__all__ = ["DuplicateBatch", "IngestResult", "WrittenBatch", "store_batch", "write_batch"]

logger = logging.getLogger(__name__)

# How often the same GPU and reporting node may add a gpu_uuid_conflict event: the agent retries
# nothing it was refused, but a cloned node sends a new batch every interval.
_CONFLICT_EVENT_EVERY = timedelta(hours=1)

IDENTITY_FIELDS = ("index", "serial", "pci_bus_id", "name", "driver_version", "vbios_version")

# Statements built once: building and hashing a SQLAlchemy statement per batch costs more CPU than
# running it.
# Locked (PostgreSQL; SQLite has one writer): who owns a GPU decides whether the batch may store
# under it, so no other push may change the owner until this one commits; a second claimant
# waits here, then reads the first one's owner. FOR NO KEY UPDATE, as for nodes: it does not wait
# for transactions that merely reference the GPUs. In uuid order, so that two pushes naming the
# same GPUs wait for each other instead of deadlocking.
_SELECT_KNOWN_GPUS = (
    select(gpus.c.uuid, gpus.c.node_id, gpus.c.last_seen, *(gpus.c[k] for k in IDENTITY_FIELDS))
    .where(gpus.c.uuid.in_(bindparam("uuids", expanding=True)))
    .order_by(gpus.c.uuid)
    .with_for_update(key_share=True)
)
_SELECT_NODE = (
    select(nodes.c.id, nodes.c.boot_id)
    .where(nodes.c.name == bindparam("b_name"))
    .with_for_update(key_share=True)
)
_INSERT_NODE = {
    "postgresql": pg_insert(nodes).on_conflict_do_nothing(index_elements=["name"]),
    "sqlite": sqlite_insert(nodes).on_conflict_do_nothing(index_elements=["name"]),
}
# RETURNING: which GPUs this push registered. The others were registered at the same moment by
# a push that committed first (ON CONFLICT waited for it), and belong to its node.
_INSERT_GPUS = {
    name: insert_(gpus).on_conflict_do_nothing(index_elements=["uuid"]).returning(gpus.c.uuid)
    for name, insert_ in (("postgresql", pg_insert), ("sqlite", sqlite_insert))
}
_NODE_FIELDS = ("labels", "interval_s", "agent_version", "last_seen", "lag_s")
_UPDATE_NODE = (
    update(nodes)
    .where(nodes.c.id == bindparam("b_id"))
    .values({k: bindparam(k) for k in _NODE_FIELDS})
)
_UPDATE_NODE_BOOT = _UPDATE_NODE.values(boot_id=bindparam("boot_id"))
# PostgreSQL: lock, read and update the node in one statement (RETURNING sees the row before the
# update through the locked sub-select). FOR NO KEY UPDATE (key_share): it serialises the pushes
# of one node as FOR UPDATE would, but does not wait for transactions that only hold the node's
# key (a background pass inserting rows that reference nodes takes KEY SHARE on every node it
# names, for as long as its transaction lasts: with FOR UPDATE every push of those nodes waited).
# The boot id only fills in where none was stored: a changed one (a reboot) is set by a second
# statement once the batch is known to be newer.
_OLD_NODE = (
    select(nodes.c.id, nodes.c.boot_id)
    .where(nodes.c.name == bindparam("b_name"))
    .with_for_update(key_share=True)
    .subquery("old")
)
_LOCK_UPDATE_NODE = (
    update(nodes)
    .where(nodes.c.id == _OLD_NODE.c.id)
    .values(
        {
            **{k: bindparam(k) for k in _NODE_FIELDS},
            "boot_id": func.coalesce(
                _OLD_NODE.c.boot_id, bindparam("boot_id", type_=nodes.c.boot_id.type)
            ),
        }
    )
    .returning(nodes.c.id, _OLD_NODE.c.boot_id)
)
_SET_BOOT = (
    update(nodes).where(nodes.c.id == bindparam("b_id")).values(boot_id=bindparam("boot_id"))
)
_CLAIM_BATCH = {
    name: insert_(ingest_batches)
    .on_conflict_do_nothing(index_elements=["batch_id"])
    .returning(ingest_batches.c.batch_id)
    for name, insert_ in (("postgresql", pg_insert), ("sqlite", sqlite_insert))
}
# PostgreSQL: every GPU of the batch in one statement (one plan, one round trip) instead of one
# execution per GPU.
# The GPUs travel as one jsonb array (a text[] of JSON would be escaped value by value in
# Python); each timestamp as its ISO text with offset, which timestamptz reads back exactly. The
# uuid list lets the planner find the rows by index: it guesses 100 rows for the recordset and
# would otherwise hash-join against a scan of every GPU.
_UPDATE_LATEST_PG = text(
    "UPDATE gpus SET latest_ts = v.ts, latest = v.latest, last_seen = :b_now "
    "FROM jsonb_to_recordset(:b_rows) AS v(uuid text, ts timestamptz, latest jsonb) "
    "WHERE gpus.uuid = ANY(CAST(:b_uuids AS text[])) AND gpus.uuid = v.uuid "
    "AND (gpus.latest_ts IS NULL OR gpus.latest_ts <= v.ts)"
).bindparams(bindparam("b_rows", type_=JSONB), bindparam("b_now", type_=DateTime(timezone=True)))
_UPDATE_LATEST = (
    update(gpus)
    .where(
        gpus.c.uuid == bindparam("b_uuid"),
        (gpus.c.latest_ts.is_(None)) | (gpus.c.latest_ts <= bindparam("b_ts")),
    )
    .values(latest_ts=bindparam("b_ts"), latest=bindparam("b_latest"), last_seen=bindparam("b_now"))
)


@dataclass(frozen=True)
class IngestResult:
    samples: int
    events: int
    duplicate: bool
    node_id: int | None = None
    # A port went down or flapped past its limit (rules.port_events): judge and plan now.
    urgent_ports: bool = False


class DuplicateBatch(Exception):
    """Raised inside the transaction to roll it back when the batch id was already stored."""


def store_batch(
    db: Database,
    batch: BatchView,
    *,
    content_sha256: str,
    now: datetime,
    live_intervals: float = 3.0,
    thresholds: HealthThresholds | None = None,
) -> IngestResult:
    """Store ``batch`` and commit, or raise and store nothing.

    ``live_intervals``: how many of its intervals a node may stay silent about a GPU and still
    own it (the server's ``unreachable_after_intervals``); see the module's docstring.
    """
    try:
        with db.write() as conn:
            written = write_batch(
                conn,
                db,
                batch,
                content_sha256=content_sha256,
                now=now,
                live_intervals=live_intervals,
                thresholds=thresholds,
            )
        written.committed()
    except DuplicateBatch:
        return IngestResult(samples=0, events=0, duplicate=True)
    except GpuClaimed as exc:
        _record_claims(db, exc, batch.batch_id, now)
        raise
    return written.result


@dataclass(frozen=True)
class WrittenBatch:
    """A batch written inside a transaction not yet committed."""

    result: IngestResult
    learned: LearnedKeys

    def committed(self) -> None:
        """Call once the transaction committed: its GPU and boot keys may be reused."""
        self.learned.remember()


def write_batch(
    conn: Connection,
    db: Database,
    batch: BatchView,
    *,
    content_sha256: str,
    now: datetime,
    live_intervals: float = 3.0,
    thresholds: HealthThresholds | None = None,
) -> WrittenBatch:
    """Write ``batch`` in the caller's transaction (:func:`store_batch` commits one of its
    own; Prometheus remote write stores its batches beside its bookkeeping). Raises
    :class:`DuplicateBatch` for a batch id stored before, and :class:`GpuClaimed`: the caller
    must then roll back."""
    node_id = _upsert_node(conn, batch, now)
    _claim_batch_id(conn, batch, node_id, content_sha256, now)
    node_gpus = _upsert_gpus(conn, batch, node_id, now, live_intervals)
    learned = write_samples(conn, db, batch.samples, node_id, batch.node.boot_id, now=now)
    update_latest(conn, batch.samples, now, mig_layouts(batch))
    _insert_events(conn, batch, node_id, node_gpus, now)
    # Older batch views (and the BatchView protocol) have no ports: absent is none.
    ports = port_readings(getattr(batch, "ports", None))
    stored_ports = store_ports(
        conn,
        ports,
        node_id=node_id,
        boot_id=batch.node.boot_id,
        now=now,
        thresholds=thresholds,
        batch_id=batch.batch_id,
    )
    result = IngestResult(
        samples=len(batch.samples),
        events=len(batch.events),
        duplicate=False,
        node_id=node_id,
        urgent_ports=stored_ports.urgent,
    )
    return WrittenBatch(result, learned)


def _upsert_node(conn: Connection, batch: BatchView, now: datetime) -> int:
    info = batch.node
    fields = {
        "labels": info.labels,
        # Every silence window (unreachable, missing GPUs, GPU owners) counts in these: a node
        # that pushes several collections at once is silent for its push interval between them.
        "interval_s": info.report_interval_s,
        "agent_version": info.agent_version,
        "last_seen": now,
        "lag_s": push_lag_s(batch, now),
    }
    if conn.dialect.name == "postgresql":
        node_id, stored_boot = _lock_update_node(conn, info.name, fields, info.boot_id, now)
    else:
        node_id, stored_boot = _select_update_node(conn, info.name, fields, info.boot_id, now)
    rebooted = stored_boot is not None and info.boot_id is not None and stored_boot != info.boot_id
    if rebooted and _older_than_node_state(conn, batch, node_id):
        # A spooled batch from before the reboot, replayed after newer ones: it must not switch
        # the node back to its old boot, nor announce a reboot that is already known.
        rebooted = False
    elif rebooted:
        conn.execute(_SET_BOOT, {"b_id": node_id, "boot_id": info.boot_id})
    if rebooted:
        # Volatile counters restart from zero after a reboot; the event marks where.
        conn.execute(
            insert(events).values(
                node_id=node_id,
                kind="node_boot",
                ts=now,
                received_at=now,
                message="node rebooted (boot_id changed)",
                batch_id=batch.batch_id,
                details={"previous_boot_id": stored_boot, "boot_id": info.boot_id},
            )
        )
    return node_id


def _lock_update_node(
    conn: Connection, name: str, fields: dict[str, Any], boot_id: str | None, now: datetime
) -> tuple[int, str | None]:
    """PostgreSQL: the node's id and stored boot id, its fields updated, in one statement; a
    stored boot id is kept (the caller sets a new one)."""
    params = {"b_name": name, "boot_id": boot_id, **fields}
    row = conn.execute(_LOCK_UPDATE_NODE, params).first()
    if row is None:
        # Two first batches of a new node may race (retries, replicas): ON CONFLICT lets the
        # second wait for the first and then find its row, instead of failing on the unique name.
        conn.execute(
            _INSERT_NODE[conn.dialect.name],
            {"name": name, "first_seen": now, "boot_id": boot_id, **fields},
        )
        row = conn.execute(_LOCK_UPDATE_NODE, params).one()
    return int(row[0]), row[1]


def _select_update_node(
    conn: Connection, name: str, fields: dict[str, Any], boot_id: str | None, now: datetime
) -> tuple[int, str | None]:
    """SQLite (no RETURNING of the row before an update): the same as
    :func:`_lock_update_node`, in a SELECT and an UPDATE."""
    row = conn.execute(_SELECT_NODE, {"b_name": name}).first()
    if row is None:
        conn.execute(
            _INSERT_NODE[conn.dialect.name],
            {"name": name, "first_seen": now, "boot_id": boot_id, **fields},
        )
        row = conn.execute(_SELECT_NODE, {"b_name": name}).one()
    if row.boot_id is None and boot_id is not None:
        conn.execute(_UPDATE_NODE_BOOT, {"b_id": row.id, "boot_id": boot_id, **fields})
    else:
        conn.execute(_UPDATE_NODE, {"b_id": row.id, **fields})
    return int(row.id), row.boot_id


def _older_than_node_state(conn: Connection, batch: BatchView, node_id: int) -> bool:
    """Whether every reading in ``batch`` predates the node's newest stored sample."""
    stamps = [s.ts for s in batch.samples] + [e.ts for e in batch.events]
    if not stamps:
        return False
    newest_stored = conn.execute(
        select(func.max(gpus.c.latest_ts)).where(gpus.c.node_id == node_id)
    ).scalar()
    return newest_stored is not None and max(stamps) < newest_stored


def _claim_batch_id(
    conn: Connection, batch: BatchView, node_id: int, content_sha256: str, now: datetime
) -> None:
    values = {
        "batch_id": batch.batch_id,
        "node_id": node_id,
        "received_at": now,
        "content_sha256": content_sha256,
        "samples": len(batch.samples),
        "events": len(batch.events),
    }
    # ON CONFLICT DO NOTHING: a concurrent replay waits for the first to commit, then finds it.
    claimed = conn.execute(_CLAIM_BATCH[conn.dialect.name], values).first()
    if claimed is not None:
        return
    stored = conn.execute(
        select(ingest_batches.c.content_sha256).where(ingest_batches.c.batch_id == batch.batch_id)
    ).scalar_one()
    if stored != content_sha256:
        raise BatchConflict(batch.batch_id)
    raise DuplicateBatch


def _upsert_gpus(
    conn: Connection, batch: BatchView, node_id: int, now: datetime, live_intervals: float
) -> dict[str, str]:
    """Register or update the batch's GPUs; return this node's GPUs as pci_bus_id -> uuid when an
    event of the batch names a PCI slot and no GPU (empty otherwise: nothing else reads it)."""
    declared = {gpu.uuid: gpu for gpu in batch.gpus}
    referenced = {s.uuid for s in batch.samples} | {e.uuid for e in batch.events if e.uuid}
    known = _known_gpus(conn, declared.keys() | referenced)
    # Registered before the owners are checked: a GPU another push registered at the same moment
    # is known only once that push committed, and is then checked as any other node's GPU.
    known.update(_register_gpus(conn, declared, known, node_id, now))
    _check_references(batch, declared, known, node_id)
    _check_owners(conn, batch, known, node_id, now, live_intervals)

    changed = []
    for uuid, gpu in declared.items():
        identity = identity_of(gpu)
        row = known.get(uuid)
        if row is not None and (
            row.node_id != node_id or any(getattr(row, k) != v for k, v in identity.items())
        ):
            changed.append({"b_uuid": uuid, "node_id": node_id, **identity})
    if changed:
        conn.execute(
            update(gpus)
            .where(gpus.c.uuid == bindparam("b_uuid"))
            .values(node_id=bindparam("node_id"), **{k: bindparam(k) for k in IDENTITY_FIELDS}),
            changed,
        )
    if not any(e.pci_bus_id and not e.uuid for e in batch.events):
        return {}  # the map serves only events that name a PCI slot and no GPU
    by_pci = {
        row.pci_bus_id: row.uuid
        for row in conn.execute(
            select(gpus.c.uuid, gpus.c.pci_bus_id).where(gpus.c.node_id == node_id)
        )
        if row.pci_bus_id
    }
    return by_pci


def _known_gpus(conn: Connection, uuids: Iterable[str]) -> dict[str, Any]:
    """The stored GPUs among ``uuids``, locked until the transaction ends (PostgreSQL)."""
    return {row.uuid: row for row in conn.execute(_SELECT_KNOWN_GPUS, {"uuids": sorted(uuids)})}


def _register_gpus(
    conn: Connection,
    declared: dict[str, GpuView],
    known: dict[str, Any],
    node_id: int,
    now: datetime,
) -> dict[str, Any]:
    """Insert the declared GPUs nobody stored yet under ``node_id``; return those that another
    push registered first (ON CONFLICT waited for its commit), as stored by it.

    Only the INSERT's own answer says who registered a GPU: every claimant of a new GPU read it
    as unknown, and without this each stored its samples under the one row the first created."""
    new_rows = [
        {"uuid": uuid, "node_id": node_id, "first_seen": now, "last_seen": now, **identity_of(gpu)}
        for uuid, gpu in declared.items()
        if uuid not in known
    ]
    if not new_rows:
        return {}
    inserted = set(conn.execute(_INSERT_GPUS[conn.dialect.name], new_rows).scalars())
    taken = {row["uuid"] for row in new_rows} - inserted
    if not taken:
        return {}
    # Committed by now, and locked by this read like the rest (GPUs are never deleted).
    found = _known_gpus(conn, taken)
    if found.keys() != taken:
        raise RuntimeError(f"GPUs neither inserted nor found: {sorted(taken - found.keys())}")
    return found


def _check_owners(
    conn: Connection,
    batch: BatchView,
    known: dict[str, Any],
    node_id: int,
    now: datetime,
    live_intervals: float,
) -> None:
    """Refuse GPUs another node reports right now; record those that moved here."""
    elsewhere = [
        (i, gpu.uuid, known[gpu.uuid])
        for i, gpu in enumerate(batch.gpus)
        if gpu.uuid in known and known[gpu.uuid].node_id != node_id
    ]
    if not elsewhere:
        return
    owners = {
        row.id: row
        for row in conn.execute(
            select(nodes.c.id, nodes.c.name, nodes.c.interval_s).where(
                nodes.c.id.in_({row.node_id for _, _, row in elsewhere})
            )
        )
    }
    problems: list[dict[str, Any]] = []
    claims: list[tuple[str, str, str]] = []
    moves: list[dict[str, Any]] = []
    for i, uuid, row in elsewhere:
        owner = owners[row.node_id]
        # Never below 0: a concurrent claimant's clock reading may predate the owner's last report.
        silent = max(0.0, (now - row.last_seen).total_seconds())
        window = owner.interval_s * live_intervals
        if silent < window:
            problems.append(
                {
                    "loc": ["body", "gpus", i, "uuid"],
                    "msg": f"GPU {uuid} is reported by node {owner.name!r} too, last "
                    f"{silent:.0f} s ago (less than {window:g} s): a cloned GPU UUID or a "
                    "misconfigured agent",
                }
            )
            claims.append((uuid, batch.node.name, owner.name))
        else:
            moves.append(
                {
                    "node_id": node_id,
                    "gpu_uuid": uuid,
                    "kind": "gpu_moved",
                    "ts": now,
                    "received_at": now,
                    "message": f"GPU moved from node {owner.name} (silent about it for "
                    f"{silent:.0f} s) to node {batch.node.name}",
                    "batch_id": batch.batch_id,
                    "details": {
                        "from_node": owner.name,
                        "to_node": batch.node.name,
                        "last_seen_on_from_node": row.last_seen.isoformat(),
                    },
                }
            )
    if problems:
        listed = ", ".join(f"{uuid} (node {owner})" for uuid, _, owner in claims[:5])
        raise GpuClaimed(
            f"{len(problems)} GPU(s) of this batch are reported by other nodes right now: "
            f"{listed}; nothing was stored",
            problems[:50],
            claims,
        )
    if moves:
        conn.execute(insert(events), moves)


def _record_claims(db: Database, claimed: GpuClaimed, batch_id: str, now: datetime) -> None:
    """Store a gpu_uuid_conflict event per claim (after the batch rolled back), so operators see
    cloned UUIDs on the owning node; at most one an hour per GPU and reporting node."""
    try:
        with db.write() as conn:
            for uuid, reporter, owner in claimed.claims:
                recent = conn.execute(
                    select(events.c.details).where(
                        events.c.kind == "gpu_uuid_conflict",
                        events.c.gpu_uuid == uuid,
                        events.c.ts >= now - _CONFLICT_EVENT_EVERY,
                    )
                ).scalars()
                if any((d or {}).get("reported_by") == reporter for d in recent):
                    continue
                owner_id = conn.execute(select(nodes.c.id).where(nodes.c.name == owner)).scalar()
                conn.execute(
                    insert(events).values(
                        node_id=owner_id,
                        gpu_uuid=uuid,
                        kind="gpu_uuid_conflict",
                        ts=now,
                        received_at=now,
                        message=f"GPU {uuid} of node {owner} is also reported by node {reporter} "
                        "(cloned UUID or misconfigured agent); that node's batches get 409",
                        batch_id=batch_id,
                        details={"uuid": uuid, "owned_by": owner, "reported_by": reporter},
                    )
                )
    except SQLAlchemyError:
        # The 409 is the answer that matters; the event is a courtesy that must not turn it
        # into a 500.
        logger.warning("could not record gpu_uuid_conflict events", exc_info=True)


def identity_of(gpu: GpuView) -> dict[str, Any]:
    return {key: getattr(gpu, key) for key in IDENTITY_FIELDS}


def _check_references(
    batch: BatchView, declared: dict[str, GpuView], known: dict[str, Any], node_id: int
) -> None:
    def usable(uuid: str) -> bool:
        return uuid in declared or (uuid in known and known[uuid].node_id == node_id)

    problems: list[dict[str, Any]] = []
    for i, sample in enumerate(batch.samples):
        if not usable(sample.uuid):
            problems.append(
                {
                    "loc": ["body", "samples", i, "uuid"],
                    "msg": f"unknown GPU {sample.uuid}: list it in 'gpus'",
                }
            )
    for i, event in enumerate(batch.events):
        if event.uuid and not usable(event.uuid):
            problems.append(
                {
                    "loc": ["body", "events", i, "uuid"],
                    "msg": f"unknown GPU {event.uuid}: list it in 'gpus'",
                }
            )
    if problems:
        raise InvalidInput(
            f"{len(problems)} item(s) reference GPUs this node never declared; nothing was stored",
            problems[:50],
        )


def mig_layouts(batch: BatchView) -> dict[str, dict[str, Any]]:
    """GPU uuid -> its declared MIG mode and instances (only MIG-enabled GPUs declare one): JSON
    from the server's structs, a pydantic ``MigIdentity`` from tools and tests."""
    layouts = {}
    for gpu in batch.gpus:
        mig = getattr(gpu, "mig", None)
        if isinstance(mig, dict):
            layouts[gpu.uuid] = mig
        elif mig is not None:
            layouts[gpu.uuid] = mig.model_dump(exclude_none=True)
    return layouts


def update_latest(
    conn: Connection, samples: Sequence[SampleView], now: datetime, mig: dict[str, dict[str, Any]]
) -> None:
    """The newest sample of each GPU into ``gpus.latest``, with the GPU's MIG layout beside it
    (under :data:`LATEST_MIG_KEY`: the table has no identity JSON column, and a MIG layout, like
    the sample, is the GPU's newest state; it changes without the GPU changing slot)."""
    newest: dict[str, SampleView] = {}
    for sample in samples:
        current = newest.get(sample.uuid)
        if current is None or sample.ts >= current.ts:
            newest[sample.uuid] = sample
    if not newest:
        return
    latest = {
        uuid: s.values() | ({LATEST_MIG_KEY: mig[uuid]} if uuid in mig else {})
        for uuid, s in newest.items()
    }
    # Replayed old batches must not overwrite fresher state: only move latest_ts forward.
    if conn.dialect.name == "postgresql":
        conn.execute(
            _UPDATE_LATEST_PG,
            {
                "b_rows": [
                    {"uuid": uuid, "ts": s.ts.isoformat(), "latest": latest[uuid]}
                    for uuid, s in newest.items()
                ],
                "b_uuids": list(newest),
                "b_now": now,
            },
        )
        return
    conn.execute(
        _UPDATE_LATEST,
        [
            {"b_uuid": uuid, "b_ts": s.ts, "b_latest": latest[uuid], "b_now": now}
            for uuid, s in newest.items()
        ],
    )


def _insert_events(
    conn: Connection, batch: BatchView, node_id: int, node_gpus: dict[str, str], now: datetime
) -> None:
    if not batch.events:
        return
    conn.execute(
        insert(events),
        [
            {
                "node_id": node_id,
                # The kernel log names a PCI slot, not a GPU: map it through the node's inventory.
                "gpu_uuid": e.uuid or (node_gpus.get(e.pci_bus_id) if e.pci_bus_id else None),
                "pci_bus_id": e.pci_bus_id,
                "kind": e.kind,
                "xid": e.xid,
                "ts": e.ts,
                "received_at": now,
                "message": e.message,
                "pid": e.pid,
                "process": e.process,
                "details": e.details,
                "batch_id": batch.batch_id,
            }
            for e in batch.events
        ],
    )
