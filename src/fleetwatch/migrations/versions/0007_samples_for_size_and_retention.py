"""gpu_samples for size and retention: small GPU and boot keys, narrower types, daily partitions

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03 09:00:00.000000

Issue 12, "storage with a lifecycle":

- ``gpus`` gains an integer primary key ``id`` (existing GPUs numbered by first_seen, then uuid);
  ``uuid`` stays unique.
- ``node_boots`` numbers each (node, boot id); filled from the boot ids the samples carry.
- ``gpu_samples`` is rebuilt: ``gpu_id`` and ``boot`` (4 bytes each) instead of the UUID and boot
  id strings; real and smallint where they hold every value the wire accepts
  (:mod:`fleetwatch.server.db.sample_columns`); columns widest first. On PostgreSQL it is
  partitioned by day: a partition for every day that has rows, today and the next three days,
  and a DEFAULT partition; primary key (id, ts); BRIN index on ts. Every row is copied with its
  id (the readers that continue from a sample id carry on); values stored as real keep 7
  significant digits (24-bit mantissa).

The copy takes a while on a large table (it rewrites every row, in the migration's transaction):
plan the upgrade like any table rewrite. Downgrade rebuilds the 0006 table (the rounding stays).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_DAYS_AHEAD = 3

# (name, type from 0007, type before, comment), in the 0007 table's order: widest first.
_FIELDS: tuple[tuple[str, sa.types.TypeEngine[Any], sa.types.TypeEngine[Any], str], ...] = (
    (
        "energy_mj",
        sa.BigInteger(),
        sa.BigInteger(),
        "Energy consumed since the driver loaded (millijoules)",
    ),
    (
        "clocks_event_reasons",
        sa.BigInteger(),
        sa.BigInteger(),
        "Clocks event (throttle) reasons, NVML bitmask (bitmask)",
    ),
    (
        "power_violation_us",
        sa.BigInteger(),
        sa.BigInteger(),
        "Time throttled by the power limit (microseconds)",
    ),
    (
        "thermal_violation_us",
        sa.BigInteger(),
        sa.BigInteger(),
        "Time throttled by thermal limits (microseconds)",
    ),
    ("fb_used_mib", sa.Float(), sa.Float(), "Framebuffer used (mebibytes)"),
    ("fb_total_mib", sa.Float(), sa.Float(), "Framebuffer total (mebibytes)"),
    (
        "ecc_sbe_volatile_total",
        sa.BigInteger(),
        sa.BigInteger(),
        "Single-bit ECC errors since driver load (errors)",
    ),
    (
        "ecc_dbe_volatile_total",
        sa.BigInteger(),
        sa.BigInteger(),
        "Double-bit ECC errors since driver load (errors)",
    ),
    (
        "ecc_sbe_aggregate_total",
        sa.BigInteger(),
        sa.BigInteger(),
        "Single-bit ECC errors over the GPU's life (errors)",
    ),
    (
        "ecc_dbe_aggregate_total",
        sa.BigInteger(),
        sa.BigInteger(),
        "Double-bit ECC errors over the GPU's life (errors)",
    ),
    ("retired_pages_sbe", sa.BigInteger(), sa.BigInteger(), "Pages retired for SBE (pages)"),
    ("retired_pages_dbe", sa.BigInteger(), sa.BigInteger(), "Pages retired for DBE (pages)"),
    (
        "remapped_rows_correctable",
        sa.BigInteger(),
        sa.BigInteger(),
        "Rows remapped for correctable errors (rows)",
    ),
    (
        "remapped_rows_uncorrectable",
        sa.BigInteger(),
        sa.BigInteger(),
        "Rows remapped for uncorrectable errors (rows)",
    ),
    (
        "nvlink_crc_flit_errors_total",
        sa.BigInteger(),
        sa.BigInteger(),
        "NVLink flow-control CRC errors, all links (errors)",
    ),
    (
        "nvlink_crc_data_errors_total",
        sa.BigInteger(),
        sa.BigInteger(),
        "NVLink data CRC errors, all links (errors)",
    ),
    (
        "nvlink_replay_errors_total",
        sa.BigInteger(),
        sa.BigInteger(),
        "NVLink replays, all links (errors)",
    ),
    (
        "nvlink_recovery_errors_total",
        sa.BigInteger(),
        sa.BigInteger(),
        "NVLink recoveries, all links (errors)",
    ),
    ("pcie_replay_total", sa.BigInteger(), sa.BigInteger(), "PCIe replays (replays)"),
    ("gpu_temp_c", sa.REAL(), sa.Float(), "GPU die temperature (celsius)"),
    ("memory_temp_c", sa.REAL(), sa.Float(), "HBM temperature (celsius)"),
    ("power_w", sa.REAL(), sa.Float(), "Board power draw (watts)"),
    ("power_limit_w", sa.REAL(), sa.Float(), "Enforced power limit (watts)"),
    ("sm_clock_mhz", sa.REAL(), sa.Float(), "SM clock (megahertz)"),
    ("mem_clock_mhz", sa.REAL(), sa.Float(), "Memory clock (megahertz)"),
    ("fan_speed_pct", sa.REAL(), sa.Float(), "Fan speed (percent)"),
    ("gpu_util_pct", sa.REAL(), sa.Float(), "GPU utilisation (percent)"),
    ("mem_copy_util_pct", sa.REAL(), sa.Float(), "Memory copy utilisation (percent)"),
    ("pcie_link_gen", sa.SmallInteger(), sa.Float(), "Current PCIe link generation (generation)"),
    ("pcie_link_width", sa.SmallInteger(), sa.Float(), "Current PCIe link width (lanes)"),
    (
        "gpu_recovery_action",
        sa.SmallInteger(),
        sa.Float(),
        "Driver's recovery action (0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain+reset) (enum)",
    ),
    (
        "retired_pages_pending",
        sa.Boolean(),
        sa.Boolean(),
        "A page retirement waits for a reset (bool)",
    ),
    (
        "remapped_rows_pending",
        sa.Boolean(),
        sa.Boolean(),
        "A row remap waits for a GPU reset (bool)",
    ),
    ("remapped_rows_failure", sa.Boolean(), sa.Boolean(), "A row remap failed (bool)"),
)
_WIDE = 19  # _FIELDS[:_WIDE] are 8 bytes wide: they come before the 4-byte keys
_NAMES = ", ".join(name for name, *_ in _FIELDS)
_FROM_S = ", ".join(f"s.{name}" for name, *_ in _FIELDS)


def _is_postgres() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def _field_columns(
    new: bool, fields: Sequence[tuple[str, sa.types.TypeEngine[Any], sa.types.TypeEngine[Any], str]]
) -> list[sa.Column[Any]]:
    return [
        sa.Column(name, now if new else before, nullable=True, comment=comment)
        for name, now, before, comment in fields
    ]


def _gpus_columns(with_id: bool) -> list[sa.Column[Any]]:
    id_column = (
        [sa.Column("id", sa.Integer(), autoincrement=True, nullable=False)] if with_id else []
    )
    return [
        *id_column,
        sa.Column("uuid", sa.String(length=128), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("serial", sa.String(length=64), nullable=True),
        sa.Column("pci_bus_id", sa.String(length=16), nullable=True),
        sa.Column("name", sa.String(length=128), nullable=True),
        sa.Column("driver_version", sa.String(length=64), nullable=True),
        sa.Column("vbios_version", sa.String(length=64), nullable=True),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("latest_ts", sa.DateTime(timezone=True), nullable=True),
        sa.Column("latest", _JSON, nullable=True),
    ]


_GPU_INDEXES = (
    ("ix_gpus_last_seen", "last_seen"),
    ("ix_gpus_node_id", "node_id"),
    ("ix_gpus_serial", "serial"),
)
_GPU_COPIED = 'uuid, node_id, "index", serial, pci_bus_id, name, driver_version, vbios_version, first_seen, last_seen, latest_ts, latest'


def _rebuild_gpus_sqlite(with_id: bool) -> None:
    """SQLite changes no primary key in place: a new table, the rows copied, the old one dropped."""
    keys = (
        [
            sa.PrimaryKeyConstraint("id", name="pk_gpus"),
            sa.UniqueConstraint("uuid", name="uq_gpus_uuid"),
        ]
        if with_id
        else [sa.PrimaryKeyConstraint("uuid", name="pk_gpus")]
    )
    op.create_table(
        "_gpus_0007",
        *_gpus_columns(with_id),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], name="fk_gpus_node_id_nodes"),
        *keys,
    )
    numbered = "row_number() OVER (ORDER BY first_seen, uuid), " if with_id else ""
    op.execute(
        f"INSERT INTO _gpus_0007 ({'id, ' if with_id else ''}{_GPU_COPIED}) SELECT {numbered}{_GPU_COPIED} FROM gpus"
    )
    op.drop_table("gpus")  # and its indexes
    op.rename_table("_gpus_0007", "gpus")
    for name, column in _GPU_INDEXES:
        op.create_index(name, "gpus", [column])


def _gpus_integer_key() -> None:
    if not _is_postgres():
        _rebuild_gpus_sqlite(with_id=True)
        return
    op.execute("ALTER TABLE gpus ADD COLUMN id integer")
    op.execute("CREATE SEQUENCE gpus_id_seq AS integer OWNED BY gpus.id")
    op.execute(
        "UPDATE gpus SET id = n.rn FROM (SELECT uuid, row_number() OVER (ORDER BY first_seen, uuid) AS rn FROM gpus) n "
        "WHERE gpus.uuid = n.uuid"
    )
    op.execute("SELECT setval('gpus_id_seq', COALESCE((SELECT max(id) FROM gpus), 0) + 1, false)")
    op.execute(
        "ALTER TABLE gpus ALTER COLUMN id SET DEFAULT nextval('gpus_id_seq'), ALTER COLUMN id SET NOT NULL"
    )
    op.execute("ALTER TABLE gpus DROP CONSTRAINT pk_gpus")
    op.execute("ALTER TABLE gpus ADD CONSTRAINT pk_gpus PRIMARY KEY (id)")
    op.execute("ALTER TABLE gpus ADD CONSTRAINT uq_gpus_uuid UNIQUE (uuid)")


def _gpus_uuid_key() -> None:
    if not _is_postgres():
        _rebuild_gpus_sqlite(with_id=False)
        return
    op.execute("ALTER TABLE gpus DROP CONSTRAINT uq_gpus_uuid")
    op.execute("ALTER TABLE gpus DROP CONSTRAINT pk_gpus")
    op.execute("ALTER TABLE gpus ADD CONSTRAINT pk_gpus PRIMARY KEY (uuid)")
    op.execute("ALTER TABLE gpus DROP COLUMN id")  # and its sequence


def _days_with_rows(table: str) -> set[date]:
    rows = op.get_bind().execute(
        sa.text(f"SELECT DISTINCT CAST(ts AT TIME ZONE 'UTC' AS date) FROM {table}")
    )
    return {row[0] for row in rows}


def _literal(day: date) -> str:
    return f"'{day:%Y-%m-%d} 00:00:00+00'"


def _partition_by_day(days: set[date]) -> None:
    op.execute("CREATE TABLE gpu_samples_default PARTITION OF gpu_samples DEFAULT")
    for day in sorted(days):
        op.execute(
            f"CREATE TABLE gpu_samples_p{day:%Y%m%d} PARTITION OF gpu_samples "
            f"FOR VALUES FROM ({_literal(day)}) TO ({_literal(day + timedelta(days=1))})"
        )


def _count(table: str) -> int:
    return int(op.get_bind().execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one())


def _check_copied(old: str, new: str) -> None:
    before, after = _count(old), _count(new)
    if before != after:
        raise RuntimeError(
            f"{old} holds {before} samples but {after} were copied: samples name a GPU that is "
            "not in gpus (rows deleted by hand?); register those GPUs and upgrade again"
        )


def _hand_over_sequence(old: str, new: str) -> None:
    """The ids continue from the old table's: the new table takes over its sequence."""
    op.execute(f"ALTER TABLE {new} ALTER COLUMN id SET DEFAULT nextval('gpu_samples_id_seq')")
    op.execute(f"ALTER SEQUENCE gpu_samples_id_seq OWNED BY {new}.id")
    op.execute(f"ALTER TABLE {old} ALTER COLUMN id DROP DEFAULT")


def upgrade() -> None:
    postgres = _is_postgres()
    _gpus_integer_key()
    op.create_table(
        "node_boots",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("boot_id", sa.String(length=64), nullable=False),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_node_boots_node_id_nodes")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_node_boots")),
        sa.UniqueConstraint("node_id", "boot_id", name=op.f("uq_node_boots_node_id_boot_id")),
    )
    op.execute(
        "INSERT INTO node_boots (node_id, boot_id, first_seen) "
        "SELECT node_id, boot_id, min(ts) FROM gpu_samples WHERE boot_id IS NOT NULL "
        "GROUP BY node_id, boot_id ORDER BY min(ts), node_id, boot_id"
    )

    op.drop_index("ix_gpu_samples_gpu_uuid_ts", table_name="gpu_samples")
    op.drop_index("ix_gpu_samples_ts", table_name="gpu_samples")
    op.rename_table("gpu_samples", "gpu_samples_0006")
    if postgres:
        op.execute("ALTER TABLE gpu_samples_0006 DROP CONSTRAINT pk_gpu_samples")
    op.create_table(
        "gpu_samples",
        sa.Column("id", _BIG_ID, autoincrement=not postgres, nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        *_field_columns(True, _FIELDS[:_WIDE]),
        sa.Column("gpu_id", sa.Integer(), nullable=False, comment="gpus.id"),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column(
            "boot",
            sa.Integer(),
            nullable=True,
            comment="node_boots.id: the node's boot when sampled",
        ),
        *_field_columns(True, _FIELDS[_WIDE:]),
        # PostgreSQL: the primary key comes after the copy (one index build, not 1 row at a time).
        *([] if postgres else [sa.PrimaryKeyConstraint("id", name="pk_gpu_samples")]),
        postgresql_partition_by="RANGE (ts)",
    )
    if postgres:
        _hand_over_sequence("gpu_samples_0006", "gpu_samples")
        today = datetime.now(UTC).date()
        ahead = {today + timedelta(days=n) for n in range(_DAYS_AHEAD + 1)}
        _partition_by_day(_days_with_rows("gpu_samples_0006") | ahead)
    op.execute(
        f"INSERT INTO gpu_samples (id, ts, gpu_id, node_id, boot, {_NAMES}) "
        f"SELECT s.id, s.ts, g.id, s.node_id, b.id, {_FROM_S} FROM gpu_samples_0006 s "
        "JOIN gpus g ON g.uuid = s.gpu_uuid "
        "LEFT JOIN node_boots b ON b.node_id = s.node_id AND b.boot_id = s.boot_id"
    )
    _check_copied("gpu_samples_0006", "gpu_samples")
    op.drop_table("gpu_samples_0006")
    if postgres:
        op.execute("ALTER TABLE gpu_samples ADD CONSTRAINT pk_gpu_samples PRIMARY KEY (id, ts)")
    op.create_index("ix_gpu_samples_gpu_id_ts", "gpu_samples", ["gpu_id", "ts"])
    op.create_index("ix_gpu_samples_ts", "gpu_samples", ["ts"], postgresql_using="brin")


def downgrade() -> None:
    postgres = _is_postgres()
    op.drop_index("ix_gpu_samples_gpu_id_ts", table_name="gpu_samples")
    op.drop_index("ix_gpu_samples_ts", table_name="gpu_samples")
    if postgres:
        op.execute("ALTER TABLE gpu_samples DROP CONSTRAINT pk_gpu_samples")
    op.rename_table("gpu_samples", "gpu_samples_0007")
    op.create_table(
        "gpu_samples",
        sa.Column("id", _BIG_ID, autoincrement=not postgres, nullable=False),
        sa.Column("gpu_uuid", sa.String(length=128), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("boot_id", sa.String(length=64), nullable=True),
        *_field_columns(False, _FIELDS),
        *([] if postgres else [sa.PrimaryKeyConstraint("id", name="pk_gpu_samples")]),
    )
    if postgres:
        _hand_over_sequence("gpu_samples_0007", "gpu_samples")
    op.execute(
        f"INSERT INTO gpu_samples (id, gpu_uuid, node_id, ts, boot_id, {_NAMES}) "
        f"SELECT s.id, g.uuid, s.node_id, s.ts, b.boot_id, {_FROM_S} FROM gpu_samples_0007 s "
        "JOIN gpus g ON g.id = s.gpu_id "
        "LEFT JOIN node_boots b ON b.id = s.boot"
    )
    _check_copied("gpu_samples_0007", "gpu_samples")
    op.drop_table("gpu_samples_0007")  # on PostgreSQL with its partitions
    if postgres:
        op.execute("ALTER TABLE gpu_samples ADD CONSTRAINT pk_gpu_samples PRIMARY KEY (id)")
    op.create_index("ix_gpu_samples_gpu_uuid_ts", "gpu_samples", ["gpu_uuid", "ts"])
    op.create_index("ix_gpu_samples_ts", "gpu_samples", ["ts"])
    op.drop_table("node_boots")
    _gpus_uuid_key()
