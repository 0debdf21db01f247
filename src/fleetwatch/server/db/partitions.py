"""``gpu_sample_blocks``' daily partitions on PostgreSQL: listing, creating, dropping.

The table is partitioned by range of ``ts0`` (a block's first tick; a block never crosses a UTC
midnight, so all its ticks lie in that day), one partition per UTC day named
``gpu_sample_blocks_pYYYYMMDD`` (``[day 00:00, next day 00:00)``), plus
``gpu_sample_blocks_default``, the DEFAULT partition, which takes any block no day partition
covers: ingest never fails for want of
a partition (a spool replayed after a long outage, a clock far off). The retention job
(:mod:`fleetwatch.server.upkeep.retention`) creates days ahead, moves rows out of the DEFAULT
partition into their day's partition, and drops days past retention.

Creating a day moves its rows out of the DEFAULT partition in the same transaction: PostgreSQL
refuses a new partition while the DEFAULT one holds rows of its range. The DEFAULT partition is
locked first, so that no ingest slips a row of that day in between; every DDL statement runs
under ``lock_timeout``, so that a long query holding the table makes the step fail (and be
retried next pass) instead of queueing every ingest behind it.

Every writer of samples first takes the DEFAULT partition (:data:`HOLD_DEFAULT_SQL`) before its
COPY. A COPY fixes the list of partitions it routes by when it starts: one that started while a
day was being created waited on the DEFAULT partition with rows of that day, and once the day was
attached PostgreSQL refused them ("violates partition constraint", a 500 for the push). Taken
first, the lock makes the writer wait for the creation to commit before its COPY starts, and a
creation wait for the writer's transaction to end.

Partitions named otherwise (an operator's own) are listed but never created nor dropped here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from sqlalchemy import Connection, text

__all__ = [
    "DEFAULT_PARTITION",
    "HOLD_DEFAULT_SQL",
    "PARTITIONED_TABLE",
    "Partitions",
    "create_day",
    "create_default",
    "day_bounds",
    "default_days",
    "default_rows",
    "drop_day",
    "is_partition_name",
    "list_partitions",
    "partition_name",
    "set_lock_timeout",
]

PARTITIONED_TABLE = "gpu_sample_blocks"
DEFAULT_PARTITION = "gpu_sample_blocks_default"
PARTITION_KEY = "ts0"
# One statement, whether or not the DEFAULT partition exists (an operator may have dropped it;
# the retention job puts it back): ingest must not fail for want of it.
HOLD_DEFAULT_SQL = (
    f"DO $$ BEGIN IF to_regclass('{DEFAULT_PARTITION}') IS NOT NULL THEN "
    f"LOCK TABLE {DEFAULT_PARTITION} IN ROW EXCLUSIVE MODE; END IF; END $$"
)
_DAY_NAME = re.compile(r"^gpu_sample_blocks_p(\d{8})$")


def partition_name(day: date) -> str:
    return f"{PARTITIONED_TABLE}_p{day:%Y%m%d}"


def is_partition_name(name: str) -> bool:
    """Whether ``name`` is one of the tables this module makes (Alembic's comparison of the
    schema skips them: they are data, not schema)."""
    return name == DEFAULT_PARTITION or _DAY_NAME.match(name) is not None


def day_bounds(day: date) -> tuple[datetime, datetime]:
    """The UTC instants a day's partition covers, ``[start, end)``."""
    start = datetime.combine(day, time(0), tzinfo=UTC)
    return start, start + timedelta(days=1)


def _literal(instant: datetime) -> str:
    # Partition bounds are DDL, which takes no bind parameters; the value is ours, not input.
    return f"'{instant.astimezone(UTC):%Y-%m-%d %H:%M:%S}+00'"


@dataclass(frozen=True)
class Partitions:
    """The partitions of ``gpu_sample_blocks`` now."""

    days: tuple[date, ...]  # day partitions, oldest first
    has_default: bool
    others: tuple[str, ...] = ()  # partitions this module did not name: left alone

    @property
    def count(self) -> int:
        return len(self.days) + int(self.has_default) + len(self.others)


def set_lock_timeout(conn: Connection, seconds: float) -> None:
    """Give up on a lock after ``seconds`` for the rest of this transaction."""
    conn.execute(text(f"SET LOCAL lock_timeout = '{int(seconds * 1000)}ms'"))


def list_partitions(conn: Connection) -> Partitions:
    names = conn.execute(
        text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = CAST(:table AS regclass)"
        ),
        {"table": PARTITIONED_TABLE},
    ).scalars()
    days: list[date] = []
    others: list[str] = []
    has_default = False
    for name in names:
        if name == DEFAULT_PARTITION:
            has_default = True
        elif match := _DAY_NAME.match(name):
            days.append(datetime.strptime(match.group(1), "%Y%m%d").date())
        else:
            others.append(name)
    return Partitions(tuple(sorted(days)), has_default, tuple(sorted(others)))


def default_days(conn: Connection) -> list[date]:
    """The UTC days of the rows in the DEFAULT partition (usually none), oldest first."""
    rows = conn.execute(
        text(
            f"SELECT DISTINCT CAST({PARTITION_KEY} AT TIME ZONE 'UTC' AS date) AS day "
            f"FROM {DEFAULT_PARTITION} ORDER BY day"
        )
    ).scalars()
    return list(rows)


def create_day(conn: Connection, day: date) -> int:
    """Create ``day``'s partition, moving its rows out of the DEFAULT partition into it; return
    the rows moved. Call in a transaction of its own (it locks the DEFAULT partition to its end).
    """
    name = partition_name(day)
    start, end = day_bounds(day)
    conn.execute(text(f"LOCK TABLE {DEFAULT_PARTITION} IN ACCESS EXCLUSIVE MODE"))
    conn.execute(text(f"CREATE TABLE {name} (LIKE {PARTITIONED_TABLE} INCLUDING DEFAULTS)"))
    moved = conn.execute(
        text(
            f"WITH moved AS (DELETE FROM {DEFAULT_PARTITION} "
            f"WHERE {PARTITION_KEY} >= :start AND {PARTITION_KEY} < :end RETURNING *) "
            f"INSERT INTO {name} SELECT * FROM moved"
        ),
        {"start": start, "end": end},
    ).rowcount
    # The CHECK lets ATTACH skip scanning the new table for rows outside the range.
    conn.execute(
        text(
            f"ALTER TABLE {name} ADD CONSTRAINT {name}_range "
            f"CHECK ({PARTITION_KEY} >= {_literal(start)} AND {PARTITION_KEY} < {_literal(end)})"
        )
    )
    conn.execute(
        text(
            f"ALTER TABLE {PARTITIONED_TABLE} ATTACH PARTITION {name} "
            f"FOR VALUES FROM ({_literal(start)}) TO ({_literal(end)})"
        )
    )
    conn.execute(text(f"ALTER TABLE {name} DROP CONSTRAINT {name}_range"))
    return int(moved or 0)


def create_default(conn: Connection) -> None:
    """Create the DEFAULT partition (the migration does; this puts back one dropped by hand)."""
    conn.execute(text(f"CREATE TABLE {DEFAULT_PARTITION} PARTITION OF {PARTITIONED_TABLE} DEFAULT"))


def default_rows(conn: Connection) -> int:
    return int(conn.execute(text(f"SELECT count(*) FROM {DEFAULT_PARTITION}")).scalar_one())


def drop_day(conn: Connection, day: date) -> None:
    """Drop ``day``'s partition with its rows (the retention job checks the day is past)."""
    conn.execute(text(f"DROP TABLE {partition_name(day)}"))
