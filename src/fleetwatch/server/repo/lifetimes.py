"""GPU lifetimes: bulk import of historical records, listing, and operator-recorded endings.

Re-importing is idempotent: a record whose ``(serial, installed_at, source)`` is already stored
is skipped and counted, never duplicated or overwritten. The rule is checked here, per chunk, not
by a database constraint; on PostgreSQL an advisory lock keeps two imports from racing (SQLite
writers already take turns behind :class:`~fleetwatch.server.db.session.Database`'s lock).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from typing import Any

from sqlalchemy import Connection, Row, select, update

from fleetwatch.errors import InvalidInput, NotFound
from fleetwatch.inventory import EndKind, LifetimeRecord
from fleetwatch.server.db.tables import gpu_lifetimes, gpus
from fleetwatch.server.runtime.locks import LockKey, transaction_lock

__all__ = [
    "ImportCounts",
    "import_lifetimes",
    "list_lifetimes",
    "record_lifetime_end",
]

CHUNK_ROWS = 1000


@dataclass(frozen=True)
class ImportCounts:
    inserted: int
    already_stored: int


def _stored_keys(
    conn: Connection, chunk: list[LifetimeRecord], source: str
) -> set[tuple[str, datetime]]:
    serials = {r.serial for r in chunk}
    query = select(gpu_lifetimes.c.serial, gpu_lifetimes.c.installed_at).where(
        gpu_lifetimes.c.source == source, gpu_lifetimes.c.serial.in_(serials)
    )
    return {(row.serial, row.installed_at) for row in conn.execute(query)}


def import_lifetimes(
    conn: Connection,
    records: Iterable[LifetimeRecord],
    *,
    source: str = "import",
    chunk_rows: int = CHUNK_ROWS,
    progress: Callable[[int], None] | None = None,
) -> ImportCounts:
    """Insert ``records`` in chunks, skipping any whose (serial, installed_at, source) is stored.

    Duplicates inside ``records`` count as already stored after the first. ``progress`` is called
    with the size of each chunk once it is written.
    """
    transaction_lock(conn, LockKey.LIFETIME_IMPORT)
    inserted = skipped = 0
    seen: set[tuple[str, datetime]] = set()
    iterator = iter(records)
    while chunk := list(islice(iterator, chunk_rows)):
        stored = _stored_keys(conn, chunk, source)
        rows = []
        for record in chunk:
            key = (record.serial, record.installed_at)
            if key in stored or key in seen:
                skipped += 1
                continue
            seen.add(key)
            rows.append(
                {
                    "serial": record.serial,
                    "location": record.location,
                    "installed_at": record.installed_at,
                    "removed_at": record.removed_at,
                    "end_kind": record.end_kind,
                    "cause": record.cause,
                    "evidence": record.evidence,
                    "source": source,
                }
            )
        if rows:
            conn.execute(gpu_lifetimes.insert(), rows)
            inserted += len(rows)
        if progress is not None:
            progress(len(chunk))
    return ImportCounts(inserted=inserted, already_stored=skipped)


def list_lifetimes(
    conn: Connection,
    *,
    serial: str | None = None,
    end_kind: str | None = None,
    limit: int = 1000,
) -> list[Row[Any]]:
    """Lifetimes in install order (oldest first), optionally for one serial or one end kind."""
    query = select(gpu_lifetimes)
    if serial is not None:
        query = query.where(gpu_lifetimes.c.serial == serial)
    if end_kind is not None:
        query = query.where(gpu_lifetimes.c.end_kind == end_kind)
    query = query.order_by(
        gpu_lifetimes.c.serial, gpu_lifetimes.c.installed_at, gpu_lifetimes.c.id
    ).limit(limit)
    return list(conn.execute(query))


def record_lifetime_end(
    conn: Connection,
    *,
    serial: str,
    kind: EndKind,
    at: datetime,
    cause: str | None = None,
    installed_at: datetime | None = None,
    evidence: dict[str, Any] | None = None,
) -> Row[Any]:
    """End a GPU's current stint with an operator's failure, repair or retirement.

    The stint closed is the serial's newest open lifetime installed at or before ``at``. Without
    one, a new ``operator`` lifetime is written, installed at ``installed_at`` if given, else at
    the first sighting of a GPU with that serial; with neither, :class:`NotFound`.
    """
    if installed_at is not None and installed_at > at:
        raise InvalidInput(
            f"installed_at {installed_at.isoformat()} is after the event at {at.isoformat()}",
            [{"loc": ["body", "installed_at"], "msg": "after the event time"}],
        )
    open_row = conn.execute(
        select(gpu_lifetimes)
        .where(
            gpu_lifetimes.c.serial == serial,
            gpu_lifetimes.c.removed_at.is_(None),
            gpu_lifetimes.c.installed_at <= at,
        )
        .order_by(gpu_lifetimes.c.installed_at.desc(), gpu_lifetimes.c.id.desc())
        .limit(1)
    ).first()
    ending = {"removed_at": at, "end_kind": kind, "cause": cause}
    if open_row is not None:
        merged = {**(open_row.evidence or {}), **(evidence or {})} or None
        conn.execute(
            update(gpu_lifetimes)
            .where(gpu_lifetimes.c.id == open_row.id)
            .values(**ending, evidence=merged)
        )
        lifetime_id = open_row.id
    else:
        gpu = conn.execute(
            select(gpus.c.uuid, gpus.c.node_id, gpus.c.name, gpus.c.first_seen)
            .where(gpus.c.serial == serial)
            .order_by(gpus.c.first_seen.desc())
            .limit(1)
        ).first()
        start = installed_at if installed_at is not None else gpu.first_seen if gpu else None
        if start is None or start > at:
            raise NotFound("open lifetime or GPU with serial", serial)
        lifetime_id = conn.execute(
            gpu_lifetimes.insert()
            .values(
                serial=serial,
                gpu_uuid=gpu.uuid if gpu is not None else None,
                node_id=gpu.node_id if gpu is not None else None,
                sku=gpu.name if gpu is not None else None,
                installed_at=start,
                evidence=evidence,
                source="operator",
                **ending,
            )
            .returning(gpu_lifetimes.c.id)
        ).scalar_one()
    return conn.execute(select(gpu_lifetimes).where(gpu_lifetimes.c.id == lifetime_id)).one()
