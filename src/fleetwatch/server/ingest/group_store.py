"""Many routine batches in one PostgreSQL transaction (group commit).

Under load nearly every push is routine: a known node on the boot it had, its known GPUs as
they were, samples and nothing else. Stored one transaction each, such a push costs about eight
statement round trips, each with its share of driver, SQLAlchemy and PostgreSQL work per
statement; that, not the rows, is most of what a push costs. The pushes waiting at one moment
share one transaction here instead, every stage running once for the whole group: one statement
locks the nodes, one claims the batch ids, one reads the GPUs, one COPY writes every sample
block, one updates every node and one every GPU's latest state. What is stored is what each
push's own :func:`~fleetwatch.server.ingest.store.store_batch` would have stored, row for row.

A batch that is not routine is left out: a node or GPU new to the database, a reboot, a GPU
whose identity changed or that another node owns, an unknown GPU, a batch id already stored or
twice in the group, its node twice in the group. Whatever it claimed is withdrawn in the same
transaction, and the caller stores it with ``store_batch`` after the group commits, so that
every refusal, conflict and rare case is decided by the one code path that decides it alone.
Batches with events or network ports are never grouped (:func:`is_routine`): they are rare,
and urgent ones must not wait for a group.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, DateTime, bindparam, text
from sqlalchemy.dialects.postgresql import JSONB

from fleetwatch.server.db.session import Database
from fleetwatch.server.ingest.batch_view import BatchView, push_lag_s
from fleetwatch.server.ingest.sample_writer import (
    LearnedKeys,
    block_rows,
    boot_key,
    copy_blocks,
    keys_of,
)
from fleetwatch.server.ingest.store import (
    IngestResult,
    identity_of,
    mig_layouts,
    update_latest,
)

__all__ = ["GroupedBatch", "is_routine", "store_group", "write_group"]

_TS = DateTime(timezone=True)

# Locked in id order: two groups (two server processes) sharing nodes then wait for each other
# instead of deadlocking. FOR NO KEY UPDATE, as store_batch locks one node: it does not wait for
# background transactions that merely reference the nodes (their KEY SHARE locks).
_LOCK_NODES = text(
    "SELECT id, name, boot_id FROM nodes WHERE name = ANY(CAST(:names AS text[])) "
    "ORDER BY id FOR NO KEY UPDATE"
)
_CLAIM = text(
    "INSERT INTO ingest_batches (batch_id, node_id, received_at, content_sha256, samples, events) "
    "SELECT b, n, :now, h, s, 0 FROM unnest(CAST(:ids AS text[]), CAST(:node_ids AS int[]), "
    "CAST(:hashes AS text[]), CAST(:counts AS int[])) AS u(b, n, h, s) "
    "ON CONFLICT (batch_id) DO NOTHING RETURNING batch_id"
).bindparams(bindparam("now", type_=_TS))
_WITHDRAW = text("DELETE FROM ingest_batches WHERE batch_id = ANY(CAST(:ids AS text[]))")
_KNOWN_GPUS = text(
    'SELECT id, uuid, node_id, "index", serial, pci_bus_id, name, driver_version, vbios_version '
    "FROM gpus WHERE uuid = ANY(CAST(:uuids AS text[]))"
)
# The node ids beside the recordset let the planner find the rows by index (it guesses 100 rows
# for a recordset), as the latest-state update does.
_UPDATE_NODES = text(
    "UPDATE nodes SET labels = v.labels, interval_s = v.interval_s, "
    "agent_version = v.agent_version, last_seen = :now, lag_s = v.lag_s "
    "FROM jsonb_to_recordset(:rows) AS v(id int, labels jsonb, interval_s float8, "
    "agent_version text, lag_s float8) "
    "WHERE nodes.id = ANY(CAST(:node_ids AS int[])) AND nodes.id = v.id"
).bindparams(bindparam("rows", type_=JSONB), bindparam("now", type_=_TS))


@dataclass(frozen=True)
class GroupedBatch:
    """A validated batch and the SHA-256 of its body (what a replay is compared by)."""

    batch: BatchView
    content_sha256: str


def is_routine(batch: BatchView) -> bool:
    """Whether ``batch`` may be grouped at all: samples, and no events or ports."""
    return bool(batch.samples) and not batch.events and not getattr(batch, "ports", None)


@dataclass
class _Member:
    item: GroupedBatch
    node_id: int
    gpu_ids: dict[str, int]
    boot: int | None = None  # node_boots.id of the batch's boot


def store_group(
    db: Database, items: Sequence[GroupedBatch], *, now: datetime
) -> list[IngestResult | None]:
    """Store the routine batches of ``items`` in one transaction and commit; per item, its
    result, or None for a batch left to :func:`~fleetwatch.server.ingest.store.store_batch`.

    Raises whatever the transaction raised, having stored nothing: the caller then stores every
    item on its own. PostgreSQL only."""
    learned = LearnedKeys(db)
    with db.write() as conn:
        results = write_group(conn, db, items, now=now, learned=learned)
    learned.remember()
    return results


def write_group(
    conn: Connection,
    db: Database,
    items: Sequence[GroupedBatch],
    *,
    now: datetime,
    learned: LearnedKeys,
) -> list[IngestResult | None]:
    """:func:`store_group` in the caller's transaction (the remote-write sealer stores its
    scrapes beside its own bookkeeping); ``learned`` remembers the keys once it commits."""
    members = _routine_members(conn, db, items, now, learned)
    if members:
        _write(conn, members, now)
    stored = {id(m.item): m for m in members}
    return [
        IngestResult(
            samples=len(item.batch.samples), events=0, duplicate=False, node_id=member.node_id
        )
        if (member := stored.get(id(item))) is not None
        else None
        for item in items
    ]


def _routine_members(
    conn: Connection,
    db: Database,
    items: Sequence[GroupedBatch],
    now: datetime,
    learned: LearnedKeys,
) -> list[_Member]:
    """Lock the nodes, claim the batch ids and keep the items that are routine (see the module's
    docstring); claims of the others are withdrawn."""
    routine = [item for item in items if is_routine(item.batch)]
    if not routine:
        return []
    names = sorted({item.batch.node.name for item in routine})
    stored_nodes = {
        row.name: (int(row.id), row.boot_id) for row in conn.execute(_LOCK_NODES, {"names": names})
    }
    candidates: list[tuple[GroupedBatch, int]] = []
    seen_nodes: set[str] = set()
    seen_ids: set[str] = set()
    for item in routine:
        batch = item.batch
        node = stored_nodes.get(batch.node.name)
        if node is None:
            continue
        if batch.node.name in seen_nodes or batch.batch_id in seen_ids:
            continue
        node_id, stored_boot = node
        if batch.node.boot_id is not None and batch.node.boot_id != stored_boot:
            continue  # a reboot, or a node's first boot id: store_batch records it
        seen_nodes.add(batch.node.name)
        seen_ids.add(batch.batch_id)
        candidates.append((item, node_id))
    if not candidates:
        return []
    claimed = _claim(conn, candidates, now)
    candidates = [(item, node_id) for item, node_id in candidates if item.batch.batch_id in claimed]
    known = _known_gpus(conn, candidates)
    keys = keys_of(db)
    members: list[_Member] = []
    for item, node_id in candidates:
        gpu_ids = _routine_gpus(item.batch, node_id, known)
        if gpu_ids is None:
            continue
        learned.gpus.update(gpu_ids)
        members.append(_Member(item, node_id, gpu_ids))
    withdrawn = claimed - {m.item.batch.batch_id for m in members}
    if withdrawn:
        conn.execute(_WITHDRAW, {"ids": sorted(withdrawn)})
    # Boot keys last: only routine members need one, and a known boot is cached (no statement).
    for member in members:
        boot_id = member.item.batch.node.boot_id
        if boot_id is not None:
            member.boot = boot_key(conn, keys, member.node_id, boot_id, now, learned)
    return members


def _claim(
    conn: Connection, candidates: Sequence[tuple[GroupedBatch, int]], now: datetime
) -> set[str]:
    """The batch ids claimed now (ids stored before are not: store_batch answers for them)."""
    params = {
        "ids": [item.batch.batch_id for item, _ in candidates],
        "node_ids": [node_id for _, node_id in candidates],
        "hashes": [item.content_sha256 for item, _ in candidates],
        "counts": [len(item.batch.samples) for item, _ in candidates],
        "now": now,
    }
    return {row[0] for row in conn.execute(_CLAIM, params)}


def _known_gpus(conn: Connection, candidates: Sequence[tuple[GroupedBatch, int]]) -> dict[str, Any]:
    uuids = {gpu.uuid for item, _ in candidates for gpu in item.batch.gpus}
    uuids.update(s.uuid for item, _ in candidates for s in item.batch.samples)
    if not uuids:
        return {}
    return {row.uuid: row for row in conn.execute(_KNOWN_GPUS, {"uuids": sorted(uuids)})}


def _routine_gpus(batch: BatchView, node_id: int, known: dict[str, Any]) -> dict[str, int] | None:
    """uuid -> gpus.id of every GPU the batch declares or samples, when each is known, this
    node's, and declared as stored; None when any is not (store_batch registers, moves,
    updates or refuses it)."""
    gpu_ids: dict[str, int] = {}
    for gpu in batch.gpus:
        row = known.get(gpu.uuid)
        if row is None or row.node_id != node_id:
            return None
        if any(getattr(row, key) != value for key, value in identity_of(gpu).items()):
            return None
        gpu_ids[gpu.uuid] = int(row.id)
    for sample in batch.samples:
        if sample.uuid not in gpu_ids:
            row = known.get(sample.uuid)
            if row is None or row.node_id != node_id:
                return None
            gpu_ids[sample.uuid] = int(row.id)
    return gpu_ids


def _write(conn: Connection, members: Sequence[_Member], now: datetime) -> None:
    batches = [m.item.batch for m in members]
    node_rows = [
        {
            "id": m.node_id,
            "labels": dict(batch.node.labels),
            # As store_batch: every silence window counts in the node's report interval.
            "interval_s": batch.node.report_interval_s,
            "agent_version": batch.node.agent_version,
            "lag_s": push_lag_s(batch, now),
        }
        for m, batch in zip(members, batches, strict=True)
    ]
    conn.execute(
        _UPDATE_NODES,
        {"rows": node_rows, "node_ids": [m.node_id for m in members], "now": now},
    )
    copy_blocks(conn, _block_rows(members))
    mig: dict[str, dict[str, Any]] = {}
    for batch in batches:
        mig.update(mig_layouts(batch))
    update_latest(conn, [s for batch in batches for s in batch.samples], now, mig)


def _block_rows(members: Sequence[_Member]) -> Iterator[tuple[Any, ...]]:
    """The COPY rows of every member's sample blocks, as store_batch's writer builds them."""
    for m in members:
        yield from block_rows(m.item.batch.samples, m.gpu_ids, m.node_id, m.boot)
