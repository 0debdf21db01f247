"""job_notices; jobs.notice_risk_threshold, jobs.notice_horizon_h

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 18:00:00.000000

Issue 15, "the job hears it first": notices the server derives for each running job (a drain
pending on one of its nodes, a GPU taken out by a rule, a node risk over the job's threshold, and
their clearing), stored so that a rank that reconnects reads what it missed. Two nullable columns
on ``jobs`` hold the threshold and horizon a job chose at start (null: the server's defaults).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.add_column(
        "jobs",
        sa.Column(
            "notice_risk_threshold",
            sa.Float(),
            nullable=True,
            comment="P(failure) that opens a risk notice",
        ),
    )
    op.add_column(
        "jobs",
        sa.Column(
            "notice_horizon_h",
            sa.Float(),
            nullable=True,
            comment="hours the risk notice looks ahead",
        ),
    )
    op.create_table(
        "job_notices",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=128), nullable=False),
        sa.Column(
            "kind",
            sa.String(length=16),
            nullable=False,
            comment="drain_pending | gpu_out | risk | cleared",
        ),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column(
            "gpu",
            sa.String(length=124),
            nullable=True,
            comment="GPU UUID, when the notice is about one GPU",
        ),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column(
            "evidence",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column(
            "action",
            sa.String(length=32),
            nullable=False,
            comment="checkpoint_now | checkpoint_and_exit | continue",
        ),
        sa.Column("opened_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "cleared_at",
            sa.DateTime(timezone=True),
            nullable=True,
            comment="set when the notice no longer holds",
        ),
        sa.Column(
            "clears",
            sa.BigInteger(),
            nullable=True,
            comment="for a cleared notice: the id of the notice it clears",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_notices")),
    )
    op.create_index("ix_job_notices_job_id_id", "job_notices", ["job_id", "id"])
    op.create_index("ix_job_notices_cleared_at", "job_notices", ["cleared_at"])


def downgrade() -> None:
    op.drop_index("ix_job_notices_cleared_at", table_name="job_notices")
    op.drop_index("ix_job_notices_job_id_id", table_name="job_notices")
    op.drop_table("job_notices")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("notice_horizon_h")
        batch.drop_column("notice_risk_threshold")
