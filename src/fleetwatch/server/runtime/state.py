"""What a leader job remembers between passes, kept in ``leader_state``.

A job writes its state in its pass's own transaction, so a new leader continues exactly where the
old one committed: nothing is redone twice, nothing skipped.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from fleetwatch.server.db.tables import leader_state

__all__ = ["load_state", "save_state"]


def load_state(conn: Connection, name: str) -> dict[str, Any] | None:
    """What background job ``name`` saved in its last committed pass (None: nothing yet)."""
    value = conn.execute(select(leader_state.c.value).where(leader_state.c.name == name)).scalar()
    return dict(value) if value is not None else None


def save_state(conn: Connection, name: str, value: dict[str, Any], now: datetime) -> None:
    """Replace job ``name``'s state; it commits (or rolls back) with the pass's transaction."""
    new = (pg_insert if conn.dialect.name == "postgresql" else sqlite_insert)(leader_state)
    new = new.values(name=name, value=value, updated_at=now)
    upsert = new.on_conflict_do_update(
        index_elements=["name"], set_={"value": new.excluded.value, "updated_at": now}
    )
    conn.execute(upsert)
