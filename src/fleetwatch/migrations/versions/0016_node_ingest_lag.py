"""nodes.lag_s: how late each node's newest push was stored

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03 11:00:00.000000

Issue 12: a server behind on ingest stored some pushes minutes late and drained their healthy
nodes as unreachable. Each push now records the seconds from its newest reading to its storing,
and the fleet's median of them moves every unreachable deadline out (server.concepts.ingest_lag).
Nullable, no default: existing nodes have none until their next push, and adding it rewrites no
table on PostgreSQL or SQLite.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("nodes", sa.Column("lag_s", sa.Float(), nullable=True))


def downgrade() -> None:
    # Not batch mode: SQLite (3.35 and later) drops a column in place, where batch mode's copy
    # of the table would drop ``nodes`` under the foreign keys that name it.
    op.drop_column("nodes", "lag_s")
