"""initial schema

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-30 05:13:40.211633
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:

    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column(
            "token_id", sa.String(length=16), nullable=False, comment="public part of the token"
        ),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("secret_sha256", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("token_id", name=op.f("uq_api_tokens_token_id")),
    )
    op.create_table(
        "gpu_samples",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("gpu_uuid", sa.String(length=128), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("boot_id", sa.String(length=64), nullable=True),
        sa.Column("gpu_temp_c", sa.Float(), nullable=True, comment="GPU die temperature (celsius)"),
        sa.Column("memory_temp_c", sa.Float(), nullable=True, comment="HBM temperature (celsius)"),
        sa.Column("power_w", sa.Float(), nullable=True, comment="Board power draw (watts)"),
        sa.Column(
            "power_limit_w", sa.Float(), nullable=True, comment="Enforced power limit (watts)"
        ),
        sa.Column(
            "energy_mj",
            sa.BigInteger(),
            nullable=True,
            comment="Energy consumed since the driver loaded (millijoules)",
        ),
        sa.Column("sm_clock_mhz", sa.Float(), nullable=True, comment="SM clock (megahertz)"),
        sa.Column("mem_clock_mhz", sa.Float(), nullable=True, comment="Memory clock (megahertz)"),
        sa.Column(
            "clocks_event_reasons",
            sa.BigInteger(),
            nullable=True,
            comment="Clocks event (throttle) reasons, NVML bitmask (bitmask)",
        ),
        sa.Column(
            "power_violation_us",
            sa.BigInteger(),
            nullable=True,
            comment="Time throttled by the power limit (microseconds)",
        ),
        sa.Column(
            "thermal_violation_us",
            sa.BigInteger(),
            nullable=True,
            comment="Time throttled by thermal limits (microseconds)",
        ),
        sa.Column("fan_speed_pct", sa.Float(), nullable=True, comment="Fan speed (percent)"),
        sa.Column("gpu_util_pct", sa.Float(), nullable=True, comment="GPU utilisation (percent)"),
        sa.Column(
            "mem_copy_util_pct",
            sa.Float(),
            nullable=True,
            comment="Memory copy utilisation (percent)",
        ),
        sa.Column("fb_used_mib", sa.Float(), nullable=True, comment="Framebuffer used (mebibytes)"),
        sa.Column(
            "fb_total_mib", sa.Float(), nullable=True, comment="Framebuffer total (mebibytes)"
        ),
        sa.Column(
            "pcie_link_gen",
            sa.Float(),
            nullable=True,
            comment="Current PCIe link generation (generation)",
        ),
        sa.Column(
            "pcie_link_width", sa.Float(), nullable=True, comment="Current PCIe link width (lanes)"
        ),
        sa.Column(
            "ecc_sbe_volatile_total",
            sa.BigInteger(),
            nullable=True,
            comment="Single-bit ECC errors since driver load (errors)",
        ),
        sa.Column(
            "ecc_dbe_volatile_total",
            sa.BigInteger(),
            nullable=True,
            comment="Double-bit ECC errors since driver load (errors)",
        ),
        sa.Column(
            "ecc_sbe_aggregate_total",
            sa.BigInteger(),
            nullable=True,
            comment="Single-bit ECC errors over the GPU's life (errors)",
        ),
        sa.Column(
            "ecc_dbe_aggregate_total",
            sa.BigInteger(),
            nullable=True,
            comment="Double-bit ECC errors over the GPU's life (errors)",
        ),
        sa.Column(
            "retired_pages_sbe",
            sa.BigInteger(),
            nullable=True,
            comment="Pages retired for SBE (pages)",
        ),
        sa.Column(
            "retired_pages_dbe",
            sa.BigInteger(),
            nullable=True,
            comment="Pages retired for DBE (pages)",
        ),
        sa.Column(
            "retired_pages_pending",
            sa.Boolean(),
            nullable=True,
            comment="A page retirement waits for a reset (bool)",
        ),
        sa.Column(
            "remapped_rows_correctable",
            sa.BigInteger(),
            nullable=True,
            comment="Rows remapped for correctable errors (rows)",
        ),
        sa.Column(
            "remapped_rows_uncorrectable",
            sa.BigInteger(),
            nullable=True,
            comment="Rows remapped for uncorrectable errors (rows)",
        ),
        sa.Column(
            "remapped_rows_pending",
            sa.Boolean(),
            nullable=True,
            comment="A row remap waits for a GPU reset (bool)",
        ),
        sa.Column(
            "remapped_rows_failure",
            sa.Boolean(),
            nullable=True,
            comment="A row remap failed (bool)",
        ),
        sa.Column(
            "nvlink_crc_flit_errors_total",
            sa.BigInteger(),
            nullable=True,
            comment="NVLink flow-control CRC errors, all links (errors)",
        ),
        sa.Column(
            "nvlink_crc_data_errors_total",
            sa.BigInteger(),
            nullable=True,
            comment="NVLink data CRC errors, all links (errors)",
        ),
        sa.Column(
            "nvlink_replay_errors_total",
            sa.BigInteger(),
            nullable=True,
            comment="NVLink replays, all links (errors)",
        ),
        sa.Column(
            "nvlink_recovery_errors_total",
            sa.BigInteger(),
            nullable=True,
            comment="NVLink recoveries, all links (errors)",
        ),
        sa.Column(
            "pcie_replay_total", sa.BigInteger(), nullable=True, comment="PCIe replays (replays)"
        ),
        sa.Column(
            "gpu_recovery_action",
            sa.Float(),
            nullable=True,
            comment="Driver's recovery action (0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain+reset) (enum)",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpu_samples")),
    )
    with op.batch_alter_table("gpu_samples", schema=None) as batch_op:
        batch_op.create_index("ix_gpu_samples_gpu_uuid_ts", ["gpu_uuid", "ts"], unique=False)
        batch_op.create_index("ix_gpu_samples_ts", ["ts"], unique=False)

    op.create_table(
        "nodes",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column(
            "labels",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("interval_s", sa.Float(), nullable=False),
        sa.Column("agent_version", sa.String(length=64), nullable=True),
        sa.Column("boot_id", sa.String(length=64), nullable=True),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_nodes")),
        sa.UniqueConstraint("name", name=op.f("uq_nodes_name")),
    )
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_nodes_last_seen"), ["last_seen"], unique=False)

    op.create_table(
        "events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=128), nullable=True),
        sa.Column("pci_bus_id", sa.String(length=16), nullable=True),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("xid", sa.Integer(), nullable=True),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("pid", sa.BigInteger(), nullable=True),
        sa.Column("process", sa.String(length=256), nullable=True),
        sa.Column(
            "details",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("batch_id", sa.String(length=128), nullable=True),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], name=op.f("fk_events_node_id_nodes")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index("ix_events_gpu_uuid_ts", ["gpu_uuid", "ts"], unique=False)
        batch_op.create_index("ix_events_kind_xid", ["kind", "xid"], unique=False)
        batch_op.create_index("ix_events_node_id_ts", ["node_id", "ts"], unique=False)
        batch_op.create_index("ix_events_ts", ["ts"], unique=False)

    op.create_table(
        "gpu_lifetimes",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("serial", sa.String(length=64), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=128), nullable=True),
        sa.Column("node_id", sa.Integer(), nullable=True),
        sa.Column("location", sa.String(length=128), nullable=True),
        sa.Column("sku", sa.String(length=128), nullable=True),
        sa.Column("installed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("removed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "end_kind",
            sa.String(length=16),
            nullable=True,
            comment="failure | repair | retirement; null while in service",
        ),
        sa.Column("cause", sa.Text(), nullable=True),
        sa.Column(
            "evidence",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column(
            "source", sa.String(length=16), nullable=False, comment="observed | operator | import"
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_gpu_lifetimes_node_id_nodes")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpu_lifetimes")),
    )
    with op.batch_alter_table("gpu_lifetimes", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_gpu_lifetimes_serial"), ["serial"], unique=False)

    op.create_table(
        "gpus",
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
        sa.Column(
            "latest",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], name=op.f("fk_gpus_node_id_nodes")),
        sa.PrimaryKeyConstraint("uuid", name=op.f("pk_gpus")),
    )
    with op.batch_alter_table("gpus", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_gpus_last_seen"), ["last_seen"], unique=False)
        batch_op.create_index(batch_op.f("ix_gpus_node_id"), ["node_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_gpus_serial"), ["serial"], unique=False)

    op.create_table(
        "ingest_batches",
        sa.Column("batch_id", sa.String(length=128), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("content_sha256", sa.String(length=64), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("events", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_ingest_batches_node_id_nodes")
        ),
        sa.PrimaryKeyConstraint("batch_id", name=op.f("pk_ingest_batches")),
    )
    with op.batch_alter_table("ingest_batches", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_ingest_batches_received_at"), ["received_at"], unique=False
        )


def downgrade() -> None:

    with op.batch_alter_table("ingest_batches", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ingest_batches_received_at"))

    op.drop_table("ingest_batches")
    with op.batch_alter_table("gpus", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_gpus_serial"))
        batch_op.drop_index(batch_op.f("ix_gpus_node_id"))
        batch_op.drop_index(batch_op.f("ix_gpus_last_seen"))

    op.drop_table("gpus")
    with op.batch_alter_table("gpu_lifetimes", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_gpu_lifetimes_serial"))

    op.drop_table("gpu_lifetimes")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index("ix_events_ts")
        batch_op.drop_index("ix_events_node_id_ts")
        batch_op.drop_index("ix_events_kind_xid")
        batch_op.drop_index("ix_events_gpu_uuid_ts")

    op.drop_table("events")
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_nodes_last_seen"))

    op.drop_table("nodes")
    with op.batch_alter_table("gpu_samples", schema=None) as batch_op:
        batch_op.drop_index("ix_gpu_samples_ts")
        batch_op.drop_index("ix_gpu_samples_gpu_uuid_ts")

    op.drop_table("gpu_samples")
    op.drop_table("api_tokens")
