"""The shared snapshot's row in ``fleet_snapshots``: written by the leader, read by the others."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, extract, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from fleetwatch.server.db.tables import fleet_snapshots

__all__ = ["FLEET", "StoredHead", "read_body", "read_head", "write_snapshot"]

FLEET = "fleet"  # the one snapshot shared today: the whole fleet's assessment


@dataclass(frozen=True)
class StoredHead:
    """What a follower reads before deciding to fetch the body (the body stays on disk)."""

    seq: int
    format: int
    whole_at: datetime
    age_s: float  # since publication, by the database's clock
    gpus: int


def write_snapshot(
    conn: Connection, body: bytes, *, format: int, whole_at: datetime, gpus: int
) -> int:
    """Replace the stored snapshot with ``body``; its sequence number (one more each time)."""
    new = (pg_insert if conn.dialect.name == "postgresql" else sqlite_insert)(fleet_snapshots)
    new = new.values(
        name=FLEET,
        seq=1,
        format=format,
        whole_at=whole_at,
        published_at=func.now(),
        gpus=gpus,
        body=body,
    )
    upsert = new.on_conflict_do_update(
        index_elements=["name"],
        set_={
            "seq": fleet_snapshots.c.seq + 1,
            "format": new.excluded.format,
            "whole_at": new.excluded.whole_at,
            "published_at": new.excluded.published_at,
            "gpus": new.excluded.gpus,
            "body": new.excluded.body,
        },
    ).returning(fleet_snapshots.c.seq)
    return int(conn.execute(upsert).scalar_one())


def read_head(conn: Connection) -> StoredHead | None:
    """The stored snapshot's sequence number, format, judging time, age and size (None: none)."""
    age = extract("epoch", func.now() - fleet_snapshots.c.published_at)
    row = conn.execute(
        select(
            fleet_snapshots.c.seq,
            fleet_snapshots.c.format,
            fleet_snapshots.c.whole_at,
            age.label("age_s"),
            fleet_snapshots.c.gpus,
        ).where(fleet_snapshots.c.name == FLEET)
    ).first()
    if row is None:
        return None
    return StoredHead(row.seq, row.format, row.whole_at, float(row.age_s), row.gpus)


def read_body(conn: Connection) -> tuple[int, bytes] | None:
    """The stored snapshot's sequence number and body (None: none)."""
    row = conn.execute(
        select(fleet_snapshots.c.seq, fleet_snapshots.c.body).where(fleet_snapshots.c.name == FLEET)
    ).first()
    return None if row is None else (row.seq, bytes(row.body))
