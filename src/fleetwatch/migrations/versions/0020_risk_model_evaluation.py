"""risk_models.evaluation: each refit's held-out comparison with the version in service

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-08 10:00:00.000000

Issue 40: a refit is promoted only if it scores at least as well as the version in service on
the most recent held-out window; one that loses is stored with the new status ``rejected`` and
never serves. Nullable, no default: versions stored before have no evaluation, and adding it
rewrites no table on PostgreSQL or SQLite. Existing ``ok`` versions stay ``ok``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def _comment(new: str, old: str) -> None:
    # SQLite keeps no column comments (and cannot alter a column in place).
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column(
            "risk_models",
            "status",
            existing_type=sa.String(16),
            existing_nullable=False,
            comment=new,
            existing_comment=old,
        )


def upgrade() -> None:
    op.add_column("risk_models", sa.Column("evaluation", _JSON, nullable=True))
    _comment("ok | failed | rejected", "ok | failed")


def downgrade() -> None:
    # A rejected version never served; as ``failed`` it stays listed, out of service, with why.
    op.execute(
        "UPDATE risk_models SET status = 'failed', "
        "error = 'rejected: scored worse than the version in service' WHERE status = 'rejected'"
    )
    _comment("ok | failed", "ok | failed | rejected")
    # Not batch mode: SQLite (3.35 and later) drops a column in place.
    op.drop_column("risk_models", "evaluation")
