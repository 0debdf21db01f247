"""maintenance_windows: planned downtime over named nodes or a label selector

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 17:10:00.000000

Issue 14, "maintenance windows": while a window covers a node, its silence, reboots and resets
are planned (no unreachable verdict, alert or eviction). One new table; downgrade drops it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "maintenance_windows",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column(
            "nodes",
            _JSON,
            nullable=True,
            comment="node names; null when a selector names the nodes",
        ),
        sa.Column(
            "selector",
            _JSON,
            nullable=True,
            comment="label -> value, all must match; null when nodes are named",
        ),
        sa.Column("starts_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "ends_at", sa.DateTime(timezone=True), nullable=True, comment="null: until ended"
        ),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column(
            "key",
            sa.Text(),
            nullable=True,
            comment="an adapter's own id for it, e.g. slurm:<reservation>",
        ),
        sa.Column("created_by", sa.String(length=128), nullable=False, comment="the token name"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "ended_at",
            sa.DateTime(timezone=True),
            nullable=True,
            comment="when it was ended early (or called off)",
        ),
        sa.Column("ended_by", sa.String(length=128), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_maintenance_windows")),
    )
    op.create_index(
        "ix_maintenance_windows_ended_at", "maintenance_windows", ["ended_at"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_maintenance_windows_ended_at", table_name="maintenance_windows")
    op.drop_table("maintenance_windows")
