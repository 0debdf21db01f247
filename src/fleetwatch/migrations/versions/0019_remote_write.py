"""Prometheus remote write: staged pieces of samples, last values of event series, HA replicas

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06 20:30:00.000000

Issue 38: ``POST /api/v1/write``. Three new tables (server/db/tables.py says what each holds);
nothing existing changes.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "remote_write_staging",
        sa.Column("key", sa.String(400), nullable=False),
        sa.Column("ts", _TS, nullable=False),
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("identity", _JSON, nullable=False),
        sa.Column(
            "pending", _JSON, nullable=True, comment="fields waiting to be stored; null: none"
        ),
        sa.Column(
            "stored_mask", sa.BigInteger(), nullable=False, comment="fields stored, one bit each"
        ),
        sa.Column("received_at", _TS, nullable=True),
        sa.PrimaryKeyConstraint("key", "ts", name=op.f("pk_remote_write_staging")),
    )
    op.create_index("ix_remote_write_staging_received_at", "remote_write_staging", ["received_at"])
    op.create_index("ix_remote_write_staging_ts", "remote_write_staging", ["ts"])
    op.create_table(
        "remote_write_state",
        sa.Column("key", sa.String(400), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.Column("ts", _TS, nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_remote_write_state")),
    )
    op.create_table(
        "remote_write_replicas",
        sa.Column("cluster", sa.String(256), nullable=False),
        sa.Column("replica", sa.String(256), nullable=False),
        sa.Column("last_seen", _TS, nullable=False),
        sa.PrimaryKeyConstraint("cluster", name=op.f("pk_remote_write_replicas")),
    )


def downgrade() -> None:
    op.drop_table("remote_write_replicas")
    op.drop_table("remote_write_state")
    op.drop_index("ix_remote_write_staging_ts", table_name="remote_write_staging")
    op.drop_index("ix_remote_write_staging_received_at", table_name="remote_write_staging")
    op.drop_table("remote_write_staging")
