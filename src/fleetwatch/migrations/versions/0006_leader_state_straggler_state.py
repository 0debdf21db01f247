"""leader state and straggler detector state in the database

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 09:00:00.000000

State that must survive a leader change (issue 11) moves out of the leader's memory:

- ``leader_state``: one JSON value per background job (the planner's risk streaks and drain
  budget episode, the rollups' newest sample id);
- ``straggler_state``: per training job, the straggler detector after the windows judged so far.

Both start empty: on an existing database the first pass of each job behaves as a fresh leader
did before (the straggler detector replays a job's recent windows once).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "leader_state",
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("value", _JSON, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_leader_state")),
    )
    op.create_table(
        "straggler_state",
        sa.Column("job_id", sa.String(length=128), nullable=False),
        sa.Column(
            "next_start",
            sa.DateTime(timezone=True),
            nullable=False,
            comment="the first window not judged yet",
        ),
        sa.Column(
            "detector", _JSON, nullable=False, comment="window index, runs and ratios per node"
        ),
        sa.Column(
            "ratios", _JSON, nullable=False, comment="node ratios of the newest judged window"
        ),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_straggler_state")),
    )


def downgrade() -> None:
    op.drop_table("straggler_state")
    op.drop_table("leader_state")
