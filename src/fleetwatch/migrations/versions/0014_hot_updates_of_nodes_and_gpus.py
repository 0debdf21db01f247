"""nodes and gpus: no index on last_seen, room on each page (HOT updates)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01 22:00:00.000000

Issue 12, a lean ingest path: every push updates its node's row and each of its GPUs' rows
(``last_seen``, the newest sample). With ``last_seen`` indexed, PostgreSQL cannot update those
rows in place (a heap-only tuple, HOT): each update writes a new entry into every index of the
table. No reader needs the index: the readers of ``last_seen`` ask for most of the fleet (the
nodes and GPUs heard from lately), which a scan of 12,500 nodes or 100,000 GPUs answers as fast.
``fillfactor`` leaves room on each page for the new version of a row, which HOT also needs;
pages written from now on keep it (SQLite has neither notion: the index alone is dropped there).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FILLFACTOR = {"nodes": 50, "gpus": 50}


def upgrade() -> None:
    op.drop_index("ix_nodes_last_seen", table_name="nodes")
    op.drop_index("ix_gpus_last_seen", table_name="gpus")
    if op.get_bind().dialect.name == "postgresql":
        for table, fillfactor in _FILLFACTOR.items():
            op.execute(f"ALTER TABLE {table} SET (fillfactor = {fillfactor})")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in _FILLFACTOR:
            op.execute(f"ALTER TABLE {table} RESET (fillfactor)")
    op.create_index("ix_gpus_last_seen", "gpus", ["last_seen"], unique=False)
    op.create_index("ix_nodes_last_seen", "nodes", ["last_seen"], unique=False)
