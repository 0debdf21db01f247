"""node_ports: each network adapter port of a node as last read, with its counters' rates

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04 09:00:00.000000

Issue 13, "network collector": the agent's ``infiniband`` collector sends InfiniBand and RoCE
ports (wire ``Batch.ports``); the server keeps the newest reading of each (node, device, port)
and the per-second rates of its counters since the reading before. A new table: nothing existing
changes, and downgrade drops it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "node_ports",
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("device", sa.String(length=64), nullable=False),
        sa.Column("port", sa.SmallInteger(), nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("boot_id", sa.String(length=64), nullable=True),
        sa.Column("link_layer", sa.String(length=32), nullable=True),
        sa.Column("node_guid", sa.String(length=19), nullable=True),
        sa.Column("netdev", sa.String(length=15), nullable=True),
        sa.Column("state", sa.String(length=32), nullable=True),
        sa.Column("state_code", sa.SmallInteger(), nullable=True),
        sa.Column("phys_state", sa.String(length=32), nullable=True),
        sa.Column("phys_state_code", sa.SmallInteger(), nullable=True),
        sa.Column("rate_gbps", sa.Float(), nullable=True),
        sa.Column("link_width", sa.SmallInteger(), nullable=True),
        sa.Column("link_speed", sa.String(length=16), nullable=True),
        sa.Column("counters", _JSON, nullable=True),
        sa.Column("hw_counters", _JSON, nullable=True),
        sa.Column("rates", _JSON, nullable=True),
        sa.Column("rates_since", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_node_ports_node_id_nodes")
        ),
        sa.PrimaryKeyConstraint("node_id", "device", "port", name=op.f("pk_node_ports")),
    )


def downgrade() -> None:
    op.drop_table("node_ports")
