"""jobs, stragglers, evictions

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 08:08:14.393534
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "evictions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column(
            "reason_kind", sa.String(length=16), nullable=False, comment="rule | risk | straggler"
        ),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column(
            "evidence",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("expected_saving_usd", sa.Float(), nullable=True),
        sa.Column("dry_run", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("claimed_by", sa.String(length=128), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("returned_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True, comment="rejection reason or return note"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_evictions")),
    )
    op.create_index("ix_evictions_node_state", "evictions", ["node", "state"], unique=False)
    op.create_index("ix_evictions_state", "evictions", ["state"], unique=False)
    op.create_table(
        "job_steps",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("job_id", sa.String(length=128), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("duration_ms", sa.Float(), nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "stage", sa.Integer(), nullable=True, comment="pipeline stage, when the job says"
        ),
        sa.Column(
            "dp_group",
            sa.Integer(),
            nullable=True,
            comment="data-parallel group, when the job says",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_steps")),
    )
    op.create_index("ix_job_steps_job_id_ts", "job_steps", ["job_id", "ts"], unique=False)
    op.create_index("ix_job_steps_ts", "job_steps", ["ts"], unique=False)
    op.create_table(
        "jobs",
        sa.Column("job_id", sa.String(length=128), nullable=False),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ranks", sa.Integer(), nullable=False),
        sa.Column(
            "nodes",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
            comment="node names the job reported from",
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_jobs")),
    )
    op.create_index(op.f("ix_jobs_last_seen"), "jobs", ["last_seen"], unique=False)
    op.create_table(
        "node_slowness",
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column(
            "score", sa.Float(), nullable=False, comment="EWMA of the node's step-time ratio"
        ),
        sa.Column("windows", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("node", name=op.f("pk_node_slowness")),
    )
    op.create_table(
        "stragglers",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=128), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False, comment="hardware | workload"),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("windows", sa.Integer(), nullable=False, comment="consecutive slow windows"),
        sa.Column(
            "ratio", sa.Float(), nullable=False, comment="node median step / job median step"
        ),
        sa.Column(
            "evidence",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stragglers")),
    )
    op.create_index("ix_stragglers_job_id_node", "stragglers", ["job_id", "node"], unique=False)
    op.create_index("ix_stragglers_node_ended_at", "stragglers", ["node", "ended_at"], unique=False)
    op.create_table(
        "eviction_audit",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("eviction_id", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("from_state", sa.String(length=16), nullable=True),
        sa.Column("to_state", sa.String(length=16), nullable=False),
        sa.Column(
            "actor", sa.String(length=128), nullable=False, comment="planner, or the token name"
        ),
        sa.Column(
            "detail",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.ForeignKeyConstraint(
            ["eviction_id"], ["evictions.id"], name=op.f("fk_eviction_audit_eviction_id_evictions")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_eviction_audit")),
    )
    op.create_index(
        op.f("ix_eviction_audit_eviction_id"), "eviction_audit", ["eviction_id"], unique=False
    )
    op.create_index(op.f("ix_eviction_audit_ts"), "eviction_audit", ["ts"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_eviction_audit_ts"), table_name="eviction_audit")
    op.drop_index(op.f("ix_eviction_audit_eviction_id"), table_name="eviction_audit")
    op.drop_table("eviction_audit")
    op.drop_index("ix_stragglers_node_ended_at", table_name="stragglers")
    op.drop_index("ix_stragglers_job_id_node", table_name="stragglers")
    op.drop_table("stragglers")
    op.drop_table("node_slowness")
    op.drop_index(op.f("ix_jobs_last_seen"), table_name="jobs")
    op.drop_table("jobs")
    op.drop_index("ix_job_steps_ts", table_name="job_steps")
    op.drop_index("ix_job_steps_job_id_ts", table_name="job_steps")
    op.drop_table("job_steps")
    op.drop_index("ix_evictions_state", table_name="evictions")
    op.drop_index("ix_evictions_node_state", table_name="evictions")
    op.drop_table("evictions")
