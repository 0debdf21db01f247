"""columns bounded by the wire: derived keys as text, copied fields as long as ingest allows

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 02:50:00.000000

A node name may be 253 characters, so ``node:<name>:unreachable`` (270) overflowed
``alerts.dedup_key`` and every later alert pass failed on PostgreSQL. Widened:

- ``alerts.dedup_key`` to text (derived from node names, UUIDs and rule names);
- ``alerts.cluster`` to 256 (a label value, up to 256 at ingest);
- ``gpu_lifetimes.serial`` to 128 (the serial, or the UUID of a GPU without one);
- ``gpu_lifetimes.location`` to text (``<node>/<slot>`` when observed);
- ``webhook_subscriptions.secret`` to text (its length means nothing; it may be stored encrypted).

Downgrading fails on PostgreSQL if a longer value is stored (rather than cut it silently).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (table, column, old type, new type, nullable)
_CHANGES: tuple[tuple[str, str, sa.types.TypeEngine[str], sa.types.TypeEngine[str], bool], ...] = (
    ("alerts", "dedup_key", sa.String(length=256), sa.Text(), False),
    ("alerts", "cluster", sa.String(length=128), sa.String(length=256), True),
    ("gpu_lifetimes", "serial", sa.String(length=64), sa.String(length=128), False),
    ("gpu_lifetimes", "location", sa.String(length=128), sa.Text(), True),
    ("webhook_subscriptions", "secret", sa.String(length=256), sa.Text(), True),
)


def _alter(downgrade: bool) -> None:
    tables: dict[str, list[tuple[str, sa.types.TypeEngine[str], sa.types.TypeEngine[str], bool]]]
    tables = {}
    for table, column, old, new, nullable in _CHANGES:
        frm, to = (new, old) if downgrade else (old, new)
        tables.setdefault(table, []).append((column, frm, to, nullable))
    for table, columns in tables.items():
        # batch: SQLite cannot ALTER a column's type and rebuilds the table; PostgreSQL alters.
        with op.batch_alter_table(table) as batch:
            for column, frm, to, nullable in columns:
                batch.alter_column(column, existing_type=frm, type_=to, existing_nullable=nullable)


def upgrade() -> None:
    _alter(downgrade=False)


def downgrade() -> None:
    _alter(downgrade=True)
