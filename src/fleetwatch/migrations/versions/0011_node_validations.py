"""node_validations, evictions.repeat_of: the return-to-service gate

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 17:00:00.000000

Issue 14, item 4: a node evicted for a hardware reason returns only after a passing
``fleetwatch validate`` newer than its eviction. ``node_validations`` keeps each pushed result;
``evictions.repeat_of`` marks a hardware eviction within ``repeat_offender_days`` of the node's
previous return (the id of the eviction it had returned from). Downgrade drops both.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
_BIGID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "node_validations",
        sa.Column("id", _BIGID, primary_key=True, autoincrement=True),
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "started_at", sa.DateTime(timezone=True), nullable=False, comment="the node's clock"
        ),
        sa.Column(
            "finished_at", sa.DateTime(timezone=True), nullable=False, comment="the node's clock"
        ),
        sa.Column("passed", sa.Boolean(), nullable=False),
        sa.Column("failed", _JSON, nullable=False, comment="labels of the failed checks"),
        sa.Column("checks", _JSON, nullable=False),
        sa.Column("tools", _JSON, nullable=False, comment="fleetwatch, driver, dcgm versions"),
        sa.Column("dcgm_level", sa.SmallInteger(), nullable=True),
        sa.Column("duration_s", sa.Float(), nullable=False),
        sa.Column("pushed_by", sa.String(128), nullable=False, comment="the token name"),
    )
    op.create_index(
        "ix_node_validations_node_received", "node_validations", ["node", "received_at"]
    )
    op.add_column(
        "evictions",
        sa.Column(
            "repeat_of",
            sa.Integer(),
            nullable=True,
            comment="a hardware eviction within repeat_offender_days of this node's last "
            "return: the eviction it returned from",
        ),
    )


def downgrade() -> None:
    op.drop_column("evictions", "repeat_of")
    op.drop_index("ix_node_validations_node_received", table_name="node_validations")
    op.drop_table("node_validations")
