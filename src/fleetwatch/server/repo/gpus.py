"""Reading GPUs and their samples, as records the API's ``GpuSummary``, ``GpuDetail`` and
``SamplesPublic`` validate."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, Select, select

from fleetwatch.errors import InvalidInput, NotFound
from fleetwatch.rules.rates import CounterReading, counter_rates
from fleetwatch.server.db.tables import gpus, node_boots, nodes
from fleetwatch.server.repo.events import list_events
from fleetwatch.server.repo.sample_reader import newest_samples, sample_rows
from fleetwatch.telemetry import SAMPLE_FIELD_NAMES, SAMPLE_FIELDS

__all__ = [
    "LATEST_MIG_KEY",
    "get_gpu",
    "gpu_summary_query",
    "list_gpus",
    "list_samples",
    "summary_from_row",
]

# gpus.latest holds the newest sample's fields and, under this key (no sample field has this
# name), the MIG layout the GPU declared with it; the API shows it as GpuSummary.mig.
LATEST_MIG_KEY = "mig"

_COUNTERS = frozenset(spec.name for spec in SAMPLE_FIELDS if spec.kind == "counter")


def gpu_summary_query() -> Select[Any]:
    return select(gpus, nodes.c.name.label("node_name")).join(nodes, nodes.c.id == gpus.c.node_id)


def summary_from_row(row: Row[Any]) -> dict[str, Any]:
    values = dict(row.latest or {})
    mig = values.pop(LATEST_MIG_KEY, None)
    latest = {"ts": row.latest_ts, "values": values} if row.latest_ts else None
    return {
        "uuid": row.uuid,
        "index": row.index,
        "serial": row.serial,
        "pci_bus_id": row.pci_bus_id,
        "name": row.name,
        "driver_version": row.driver_version,
        "vbios_version": row.vbios_version,
        "node": row.node_name,
        "first_seen": row.first_seen,
        "last_seen": row.last_seen,
        "latest": latest,
        "mig": mig,
    }


def list_gpus(
    conn: Connection, *, node: str | None = None, limit: int = 10_000
) -> list[dict[str, Any]]:
    query = gpu_summary_query().order_by(nodes.c.name, gpus.c.index).limit(limit)
    if node is not None:
        query = query.where(nodes.c.name == node)
    return [summary_from_row(row) for row in conn.execute(query)]


def get_gpu(conn: Connection, *, uuid: str, recent_events: int = 20) -> dict[str, Any]:
    row = conn.execute(gpu_summary_query().where(gpus.c.uuid == uuid)).first()
    if row is None:
        raise NotFound("GPU", uuid)
    return {
        **summary_from_row(row),
        "recent_events": list_events(conn, gpu_uuid=uuid, limit=recent_events),
    }


def parse_fields(raw: str | None) -> list[str]:
    if not raw:
        return list(SAMPLE_FIELD_NAMES)
    wanted = [f.strip() for f in raw.split(",") if f.strip()]
    unknown = [f for f in wanted if f not in SAMPLE_FIELD_NAMES]
    if unknown:
        raise InvalidInput(
            f"unknown field(s): {', '.join(unknown)}",
            [{"loc": ["query", "fields"], "msg": f"unknown field {f!r}"} for f in unknown],
        )
    return wanted


def _boot_ids(conn: Connection, keys: set[int]) -> dict[int, str]:
    """The boot id of each ``node_boots`` key."""
    if not keys:
        return {}
    query = select(node_boots.c.id, node_boots.c.boot_id).where(node_boots.c.id.in_(sorted(keys)))
    return {row.id: row.boot_id for row in conn.execute(query)}


def list_samples(
    conn: Connection,
    *,
    uuid: str,
    fields: list[str],
    since: datetime | None,
    until: datetime | None,
    limit: int,
    rates: bool,
) -> dict[str, Any]:
    """Oldest first, so that rates read naturally; ``limit`` keeps the newest samples."""
    gpu_id = conn.execute(select(gpus.c.id).where(gpus.c.uuid == uuid)).scalar()
    if gpu_id is None:
        raise NotFound("GPU", uuid)
    chunk = newest_samples(conn, fields, gpu_id=gpu_id, since=since, before=until, limit=limit)
    rows = [] if chunk is None else sample_rows(chunk)
    boot_ids = _boot_ids(conn, {row[3] for row in rows if row[3] is not None})
    points: list[dict[str, Any]] = [
        {
            "ts": row[0],
            "boot_id": None if row[3] is None else boot_ids.get(row[3]),
            "values": {f: v for f, v in zip(fields, row[4:], strict=True) if v is not None},
        }
        for row in rows
    ]
    derived = None
    if rates:
        derived = {
            f: counter_rates(
                [CounterReading(p["ts"], p["boot_id"], p["values"].get(f)) for p in points]
            )
            for f in fields
            if f in _COUNTERS
        }
    return {"uuid": uuid, "fields": fields, "data": points, "count": len(points), "rates": derived}
