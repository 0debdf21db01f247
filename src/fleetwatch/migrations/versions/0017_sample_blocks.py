"""Samples as blocks: one row per GPU per push, its ticks' fields compressed

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04 06:00:00.000000

Issue 12, "storage with a lifecycle": ``gpu_samples`` (a row per GPU per tick, about 347 bytes
with its indexes on PostgreSQL) becomes ``gpu_sample_blocks``: a row per GPU per push, the
ticks' fields compressed (:mod:`fleetwatch.server.db.sample_blocks`). On PostgreSQL it is
partitioned by day of ``ts0`` (a partition for every day that has samples, today and the next
three days, and a DEFAULT partition); primary key (id, ts0); BRIN index on ts0.

Every sample is kept: each GPU's rows, in time order, become blocks of at most 360 ticks and an
hour, split where the node or its boot changes and at UTC midnight; values keep what the row
table held (reals were already 7 significant digits on PostgreSQL; on SQLite, which kept them
as doubles, they are now rounded to 7 significant digits as well). Blocks are numbered anew, so the rollups'
read position (a sample id in ``leader_state``) is dropped: the next rollups pass recomputes the
recent hours, as on a fresh start. The conversion reads and writes every sample in the
migration's transaction, logging its progress every million rows: plan the upgrade like any
table rewrite (about a minute per 10 million rows was measured on a 2-core machine; see
benchmarks/HISTORY.md). Downgrade decodes the blocks back into a 0016 ``gpu_samples`` table, with new
ids.

The conversion uses this package's block codec: the layout is versioned in each block
(``BLOCK_FORMAT``), so a later codec still reads what this revision wrote.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from alembic import op

from fleetwatch.server.db.sample_blocks import decode_blocks, encode_blocks
from fleetwatch.telemetry import SAMPLE_FIELD_NAMES

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

logger = logging.getLogger("alembic.runtime.migration")

_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_DAYS_AHEAD = 3
_READ_ROWS = 50_000  # sample rows read at a time
_RUN_ROWS = 3_600  # rows of one GPU encoded at a time (ten blocks of 360 ticks)
_PROGRESS_ROWS = 1_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_NAMES = ", ".join(SAMPLE_FIELD_NAMES)
_BLOCK_COLUMNS = ("gpu_id", "node_id", "boot", "ts0", "ts1", "n", "data")


def _is_postgres() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def _to_us(ts: datetime) -> int:
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return (ts - _EPOCH) // _US


def _from_us(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


def _literal(day: date) -> str:
    return f"'{day:%Y-%m-%d} 00:00:00+00'"


def _create_blocks_table(postgres: bool) -> None:
    op.create_table(
        "gpu_sample_blocks",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column(
            "ts0", sa.DateTime(timezone=True), nullable=False, comment="the block's first tick"
        ),
        sa.Column(
            "ts1", sa.DateTime(timezone=True), nullable=False, comment="the block's last tick"
        ),
        sa.Column("gpu_id", sa.Integer(), nullable=False, comment="gpus.id"),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column(
            "boot",
            sa.Integer(),
            nullable=True,
            comment="node_boots.id: the node's boot when sampled",
        ),
        sa.Column("n", sa.SmallInteger(), nullable=False, comment="ticks in the block"),
        sa.Column(
            "data", sa.LargeBinary(), nullable=False, comment="the ticks' fields, compressed"
        ),
        # PostgreSQL: the primary key comes after the copy (one index build, not 1 row at a time).
        *([] if postgres else [sa.PrimaryKeyConstraint("id", name="pk_gpu_sample_blocks")]),
        postgresql_partition_by="RANGE (ts0)",
    )


def _block_indexes(postgres: bool) -> None:
    if postgres:
        op.execute(
            "ALTER TABLE gpu_sample_blocks ADD CONSTRAINT pk_gpu_sample_blocks PRIMARY KEY (id, ts0)"
        )
    op.create_index("ix_gpu_sample_blocks_gpu_id_ts0", "gpu_sample_blocks", ["gpu_id", "ts0"])
    op.create_index(
        "ix_gpu_sample_blocks_ts0", "gpu_sample_blocks", ["ts0"], postgresql_using="brin"
    )


def _partition_blocks(days: set[date]) -> None:
    op.execute("CREATE TABLE gpu_sample_blocks_default PARTITION OF gpu_sample_blocks DEFAULT")
    for day in sorted(days):
        op.execute(
            f"CREATE TABLE gpu_sample_blocks_p{day:%Y%m%d} PARTITION OF gpu_sample_blocks "
            f"FOR VALUES FROM ({_literal(day)}) TO ({_literal(day + timedelta(days=1))})"
        )


def _sample_rows(conn: sa.Connection) -> Iterator[Sequence[Any]]:
    """Every row of gpu_samples, by GPU then time: (gpu_id, node_id, boot, ts, *fields)."""
    query = sa.text(
        f"SELECT gpu_id, node_id, boot, ts, {_NAMES} FROM gpu_samples ORDER BY gpu_id, ts, id"
    ).columns(ts=sa.DateTime(timezone=True))
    result = conn.execute(query.execution_options(yield_per=_READ_ROWS))
    for rows in result.partitions():
        yield from rows


def _write_blocks(conn: sa.Connection, run: list[Sequence[Any]]) -> int:
    """Blocks of one run of rows (one GPU, node and boot); return the rows written."""
    gpu_id, node_id, boot = run[0][0], run[0][1], run[0][2]
    blocks = encode_blocks(
        [gpu_id] * len(run), [_to_us(row[3]) for row in run], [tuple(row[4:]) for row in run]
    )
    params = [
        {
            "gpu_id": gpu_id,
            "node_id": node_id,
            "boot": boot,
            "ts0": _from_us(b.ts0_us),
            "ts1": _from_us(b.ts1_us),
            "n": b.n,
            "data": b.data,
        }
        for b in blocks
    ]
    table = sa.table(
        "gpu_sample_blocks",
        *(sa.column(name) for name in _BLOCK_COLUMNS),
    )
    statement = sa.insert(table).values(
        {
            name: sa.bindparam(name, type_=sa.DateTime(timezone=True))
            if name in ("ts0", "ts1")
            else sa.bindparam(name, type_=sa.LargeBinary() if name == "data" else None)
            for name in _BLOCK_COLUMNS
        }
    )
    conn.execute(statement, params)
    return sum(b.n for b in blocks)


def _convert(conn: sa.Connection) -> int:
    """Write every sample of gpu_samples as blocks; return the rows converted. The rows are
    read in this transaction (a second connection would not see its tables), ``_READ_ROWS`` at a
    time, and each run of one GPU, node and boot written as it ends."""
    converted = reported = 0
    run: list[Sequence[Any]] = []
    for row in _sample_rows(conn):
        if run and (tuple(row[:3]) != tuple(run[0][:3]) or len(run) >= _RUN_ROWS):
            converted += _write_blocks(conn, run)
            run = []
            if converted - reported >= _PROGRESS_ROWS:
                logger.info("0017: %d samples written as blocks", converted)
                reported = converted
        run.append(row)
    if run:
        converted += _write_blocks(conn, run)
    return converted


def upgrade() -> None:
    postgres = _is_postgres()
    conn = op.get_bind()
    _create_blocks_table(postgres)
    if postgres:
        days = set(
            conn.execute(
                sa.text("SELECT DISTINCT CAST(ts AT TIME ZONE 'UTC' AS date) FROM gpu_samples")
            ).scalars()
        )
        today = datetime.now(UTC).date()
        _partition_blocks(days | {today + timedelta(days=n) for n in range(_DAYS_AHEAD + 1)})
        op.execute("CREATE SEQUENCE gpu_sample_blocks_id_seq OWNED BY gpu_sample_blocks.id")
        op.execute(
            "ALTER TABLE gpu_sample_blocks ALTER COLUMN id "
            "SET DEFAULT nextval('gpu_sample_blocks_id_seq')"
        )
    # Every row converted while the table is read whole: nothing writes to it meanwhile (the
    # migration holds it), and the rows are counted against what was written.
    if postgres:
        op.execute("LOCK TABLE gpu_samples IN SHARE MODE")
    expected = int(conn.execute(sa.text("SELECT count(*) FROM gpu_samples")).scalar_one())
    converted = _convert(conn)
    if converted != expected:
        raise RuntimeError(f"gpu_samples holds {expected} samples but {converted} were converted")
    logger.info("0017: %d samples written as blocks", converted)
    op.drop_table("gpu_samples")  # with its indexes, and on PostgreSQL its partitions
    _block_indexes(postgres)
    # The rollups' read position was a gpu_samples id; blocks are numbered anew.
    op.execute("DELETE FROM leader_state WHERE name = 'rollups'")


def downgrade() -> None:
    postgres = _is_postgres()
    conn = op.get_bind()
    previous = importlib.import_module(
        "fleetwatch.migrations.versions.0007_samples_for_size_and_retention"
    )
    fields = previous._FIELDS  # noqa: SLF001 - the 0007 table's columns, declared there once
    wide = previous._WIDE  # noqa: SLF001
    op.create_table(
        "gpu_samples",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        *previous._field_columns(True, fields[:wide]),  # noqa: SLF001
        sa.Column("gpu_id", sa.Integer(), nullable=False, comment="gpus.id"),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column(
            "boot",
            sa.Integer(),
            nullable=True,
            comment="node_boots.id: the node's boot when sampled",
        ),
        *previous._field_columns(True, fields[wide:]),  # noqa: SLF001
        *([] if postgres else [sa.PrimaryKeyConstraint("id", name="pk_gpu_samples")]),
        postgresql_partition_by="RANGE (ts)",
    )
    if postgres:
        days = set(
            conn.execute(
                sa.text(
                    "SELECT DISTINCT CAST(ts0 AT TIME ZONE 'UTC' AS date) FROM gpu_sample_blocks"
                )
            ).scalars()
        )
        today = datetime.now(UTC).date()
        days |= {today + timedelta(days=n) for n in range(_DAYS_AHEAD + 1)}
        previous._partition_by_day(days)  # noqa: SLF001
        op.execute("CREATE SEQUENCE gpu_samples_id_seq OWNED BY gpu_samples.id")
        op.execute(
            "ALTER TABLE gpu_samples ALTER COLUMN id SET DEFAULT nextval('gpu_samples_id_seq')"
        )
    columns = ("ts", "gpu_id", "node_id", "boot", *SAMPLE_FIELD_NAMES)
    table = sa.table("gpu_samples", *(sa.column(name) for name in columns))
    insert = sa.insert(table).values(
        {
            name: sa.bindparam(name, type_=sa.DateTime(timezone=True) if name == "ts" else None)
            for name in columns
        }
    )
    blocks = sa.text(
        "SELECT id, gpu_id, node_id, boot, ts0, n, data FROM gpu_sample_blocks ORDER BY id"
    ).columns(ts0=sa.DateTime(timezone=True), data=sa.LargeBinary())
    result = conn.execute(blocks.execution_options(yield_per=5_000))
    for chunk in result.partitions():
        chunk = list(chunk)
        rows = decode_blocks(
            [_to_us(b.ts0) for b in chunk], [b.n for b in chunk], [b.data for b in chunk]
        )
        params = []
        for i in range(rows.size):
            b = chunk[int(rows.block[i])]
            values: dict[str, Any] = {}
            for j, name in enumerate(SAMPLE_FIELD_NAMES):
                if rows.absent[j][i]:
                    values[name] = None
                else:
                    item = rows.raw[j][i].item()
                    values[name] = bool(item) if rows.raw[j].dtype.kind == "u" else item
            params.append(
                {
                    "ts": _from_us(int(rows.ts_us[i])),
                    "gpu_id": b.gpu_id,
                    "node_id": b.node_id,
                    "boot": b.boot,
                    **values,
                }
            )
        if params:
            conn.execute(insert, params)
    op.drop_table("gpu_sample_blocks")
    if postgres:
        op.execute("ALTER TABLE gpu_samples ADD CONSTRAINT pk_gpu_samples PRIMARY KEY (id, ts)")
    op.create_index("ix_gpu_samples_gpu_id_ts", "gpu_samples", ["gpu_id", "ts"])
    op.create_index("ix_gpu_samples_ts", "gpu_samples", ["ts"], postgresql_using="brin")
    op.execute("DELETE FROM leader_state WHERE name = 'rollups'")
