"""node_ports.health: what each port remembers for the port rules

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05 09:00:00.000000

Issue 13, "network health rules": the port rules need a port's normal rate and width (the highest
it has shown while up) and the start and base counters of its current error window
(:mod:`fleetwatch.rules.port_events`). One nullable JSON column: existing rows read as ports that
remember nothing yet, and downgrade drops it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.add_column("node_ports", sa.Column("health", _JSON, nullable=True))


def downgrade() -> None:
    op.drop_column("node_ports", "health")
