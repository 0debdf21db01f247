"""risk models, hourly telemetry rollups, fleet-wide events (events.node_id nullable)

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 07:47:53.330326
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gpu_hourly",
        sa.Column("gpu_uuid", sa.String(length=128), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column(
            "span_s",
            sa.Float(),
            nullable=False,
            comment="first to last sample",
        ),
        sa.Column("temp_p95_c", sa.Float(), nullable=True),
        sa.Column("temp_max_c", sa.Float(), nullable=True),
        sa.Column(
            "throttle_reported",
            sa.Integer(),
            nullable=False,
            comment="samples with reasons",
        ),
        sa.Column(
            "throttled",
            sa.Integer(),
            nullable=False,
            comment="of those, HW/thermal/power throttled",
        ),
        sa.Column(
            "sbe_errors", sa.Float(), nullable=True, comment="increase of the aggregate SBE counter"
        ),
        sa.Column(
            "nvlink_errors",
            sa.Float(),
            nullable=True,
            comment="increase of NVLink CRC + replay + recovery counters",
        ),
        sa.Column(
            "pcie_replays", sa.Float(), nullable=True, comment="increase of the PCIe replay counter"
        ),
        sa.Column(
            "remapped_rows",
            sa.BigInteger(),
            nullable=True,
            comment="correctable + uncorrectable, newest",
        ),
        sa.Column("xid_hardware", sa.Integer(), nullable=False),
        sa.Column("xid_memory", sa.Integer(), nullable=False),
        sa.Column("xid_interconnect", sa.Integer(), nullable=False),
        sa.Column("xid_power_thermal", sa.Integer(), nullable=False),
        sa.Column("xid_driver_firmware", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("gpu_uuid", "hour", name=op.f("pk_gpu_hourly")),
    )
    op.create_index("ix_gpu_hourly_hour", "gpu_hourly", ["hour"], unique=False)
    op.create_table(
        "risk_models",
        sa.Column("version", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("trained_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "trigger", sa.String(length=16), nullable=False, comment="schedule | manual | startup"
        ),
        sa.Column("status", sa.String(length=16), nullable=False, comment="ok | failed"),
        sa.Column(
            "params",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column(
            "metrics",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("version", name=op.f("pk_risk_models")),
    )
    op.create_index(op.f("ix_risk_models_trained_at"), "risk_models", ["trained_at"], unique=False)
    # batch mode: SQLite cannot alter a column in place, it copies the table.
    with op.batch_alter_table("events") as batch:
        batch.alter_column("node_id", existing_type=sa.INTEGER(), nullable=True)


def downgrade() -> None:
    # Fleet-wide events have no node and cannot survive the NOT NULL constraint coming back.
    op.execute("DELETE FROM events WHERE node_id IS NULL")
    with op.batch_alter_table("events") as batch:
        batch.alter_column("node_id", existing_type=sa.INTEGER(), nullable=False)
    op.drop_index(op.f("ix_risk_models_trained_at"), table_name="risk_models")
    op.drop_table("risk_models")
    op.drop_index("ix_gpu_hourly_hour", table_name="gpu_hourly")
    op.drop_table("gpu_hourly")
