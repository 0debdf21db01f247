"""fleet_snapshots: the leader's fleet assessment, shared with the other processes

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02 19:00:00.000000

Issue 12, background work at 100,000 GPUs: every server process judged the whole fleet for
itself (about 30 s of one core each, every assessment interval), so an ``--role api`` process
spent most of its interpreter on judging rather than on ingest. The leader now stores each
whole-fleet assessment here and the other processes adopt it. The body is compressed by the
server already, so PostgreSQL is told not to compress it again (``STORAGE EXTERNAL``: out of
line, uncompressed).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "fleet_snapshots",
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False, comment="one more on each publication"),
        sa.Column(
            "format", sa.SmallInteger(), nullable=False, comment="the body's encoding version"
        ),
        sa.Column(
            "whole_at",
            sa.DateTime(timezone=True),
            nullable=False,
            comment="when the whole fleet was judged",
        ),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False, comment="zlib-compressed msgpack"),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_fleet_snapshots")),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE fleet_snapshots ALTER COLUMN body SET STORAGE EXTERNAL")


def downgrade() -> None:
    op.drop_table("fleet_snapshots")
