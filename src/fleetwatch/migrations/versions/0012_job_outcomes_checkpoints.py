"""jobs: start, end and outcome; job_checkpoints; job_restarts

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 17:15:00.000000

Issue 14, "jobs and their outcome": a job says when it started and ended and how (completed,
failed, cancelled), how long each checkpoint took, and when it restarted from one and how much
work it redid. Four nullable columns on ``jobs`` (existing rows read as jobs that said nothing of
their start or end) and two new tables; downgrade drops them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.add_column("jobs", sa.Column("started_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("jobs", sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "jobs",
        sa.Column(
            "outcome",
            sa.String(length=16),
            nullable=True,
            comment="completed | failed | cancelled; null while running",
        ),
    )
    op.add_column(
        "jobs",
        sa.Column(
            "end_reason", sa.Text(), nullable=True, comment="the job's own words on why it ended"
        ),
    )
    op.create_table(
        "job_checkpoints",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=128), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("duration_s", sa.Float(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_checkpoints")),
        sa.UniqueConstraint(
            "job_id", "started_at", name=op.f("uq_job_checkpoints_job_id_started_at")
        ),
    )
    op.create_index("ix_job_checkpoints_started_at", "job_checkpoints", ["started_at"])
    op.create_table(
        "job_restarts",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=128), nullable=False),
        sa.Column("resumed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "interrupted_at",
            sa.DateTime(timezone=True),
            nullable=True,
            comment="when the job stopped, if it says",
        ),
        sa.Column("from_step", sa.BigInteger(), nullable=True),
        sa.Column(
            "lost_steps",
            sa.BigInteger(),
            nullable=True,
            comment="steps done since the checkpoint, redone",
        ),
        sa.Column(
            "lost_s", sa.Float(), nullable=True, comment="seconds of work redone, if the job says"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_restarts")),
        sa.UniqueConstraint("job_id", "resumed_at", name=op.f("uq_job_restarts_job_id_resumed_at")),
    )
    op.create_index("ix_job_restarts_resumed_at", "job_restarts", ["resumed_at"])


def downgrade() -> None:
    op.drop_index("ix_job_restarts_resumed_at", table_name="job_restarts")
    op.drop_table("job_restarts")
    op.drop_index("ix_job_checkpoints_started_at", table_name="job_checkpoints")
    op.drop_table("job_checkpoints")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("end_reason")
        batch.drop_column("outcome")
        batch.drop_column("ended_at")
        batch.drop_column("started_at")
