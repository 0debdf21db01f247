"""PostgreSQL advisory locks: one pass of a fleet-wide job at a time, across every process.

Every key lives in :class:`LockKey`, so two jobs never share one by accident; the values are
fixed (processes of different releases on one database must agree on them). Three kinds of hold:

- :func:`try_transaction_lock`: the job's transaction skips its pass when another process holds
  the key (rollups, lifetimes, alerts, planner, stragglers: the next tick catches up);
- :func:`transaction_lock`: waits for the key (a lifetime import, a lifecycle sync);
- :func:`session_lock`: held across transactions, released before the connection goes back to the
  pool (a refit reads, fits for minutes, then writes).

On SQLite one process serves the database and its writers queue, so every lock is granted at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from enum import IntEnum

from sqlalchemy import Connection, Engine, text

__all__ = ["LockKey", "session_lock", "transaction_lock", "try_transaction_lock"]


class LockKey(IntEnum):
    """The advisory lock keys, ASCII tags of their jobs."""

    LEADER = 0x46575F4C454144  # "FW_LEAD": held by the leader's session (runtime/leader.py)
    ROLLUPS = 0x46575F524F4C  # "FW_ROL"
    LIFETIME_IMPORT = 0x46575F4C4946  # "FW_LIF": imports of lifetime records
    LIFECYCLE_PASS = 0x46575F4C4946 + 1  # the lifecycle job's pass: skipped while one runs
    LIFECYCLE = 0x46575F4C4359  # "FW_LCY": every lifecycle sync, the job's or another caller's
    ALERTS = 0x46575F414C52  # "FW_ALR"
    PLANNER = 0x46575F504C4E  # "FW_PLN"
    STRAGGLERS = 0x46575F535452  # "FW_STR"
    REFIT = 0x46575F524649  # "FW_RFI"
    RETENTION = 0x46575F524554  # "FW_RET": the retention pass (partitions, deletes)
    NOTICES = 0x46575F4E4F54  # "FW_NOT": job notices (act/notices.py), one writer at a time


def _is_postgres(conn: Connection) -> bool:
    return conn.dialect.name == "postgresql"


def try_transaction_lock(conn: Connection, key: LockKey) -> bool:
    """Whether this transaction holds ``key`` now (until it ends); never waits."""
    if not _is_postgres(conn):
        return True
    query = text("SELECT pg_try_advisory_xact_lock(:key)")
    return bool(conn.execute(query, {"key": int(key)}).scalar())


def transaction_lock(conn: Connection, key: LockKey) -> None:
    """Hold ``key`` until this transaction ends, waiting for another holder to finish."""
    if _is_postgres(conn):
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": int(key)})


@contextmanager
def session_lock(engine: Engine, key: LockKey) -> Iterator[bool]:
    """Yield whether this process holds ``key`` for the block (on a connection of its own)."""
    if engine.dialect.name != "postgresql":
        yield True
        return
    with engine.connect() as conn:
        got = bool(
            conn.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": int(key)}).scalar()
        )
        conn.commit()
        try:
            yield got
        finally:
            if got:
                # A session lock outlives transactions: it must be released before the
                # connection goes back to the pool.
                conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": int(key)})
                conn.commit()
