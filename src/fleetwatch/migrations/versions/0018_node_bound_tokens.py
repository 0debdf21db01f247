"""api_tokens.node_pattern: an agent token speaks only for its nodes

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06 18:00:00.000000

Issue 37, item 4: an agent token may be bound to a node name or shell pattern (``fleetwatch
token create --scope agent --node 'gpu-*'``); a batch, validation or job event for any other node
is refused (403). Nullable, no default: every existing token stays unbound (it may speak for any
node, as before), and adding it rewrites no table on PostgreSQL or SQLite.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "api_tokens",
        sa.Column(
            "node_pattern",
            sa.String(253),
            nullable=True,
            comment="agent tokens: the nodes it may speak for (a name or shell pattern); null: any",
        ),
    )


def downgrade() -> None:
    # Not batch mode: SQLite (3.35 and later) drops a column in place. A bound token becomes an
    # unbound one: downgrade only where that is acceptable, or revoke bound tokens first.
    op.drop_column("api_tokens", "node_pattern")
