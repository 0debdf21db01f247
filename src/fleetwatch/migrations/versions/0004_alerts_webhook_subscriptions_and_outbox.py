"""alerts, webhook subscriptions and outbox

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 08:43:47.586217
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("dedup_key", sa.String(length=256), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False, comment="firing | resolved"),
        sa.Column(
            "kind",
            sa.String(length=32),
            nullable=False,
            comment="verdict | unreachable | straggler | ...",
        ),
        sa.Column("severity", sa.String(length=16), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=True),
        sa.Column("gpu_uuid", sa.String(length=128), nullable=True),
        sa.Column("serial", sa.String(length=64), nullable=True),
        sa.Column("slot", sa.String(length=64), nullable=True),
        sa.Column("cluster", sa.String(length=128), nullable=True),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=True),
        sa.Column(
            "evidence",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column(
            "occurrences", sa.Integer(), nullable=False, comment="times seen while firing (floods)"
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alerts")),
    )
    op.create_index("ix_alerts_dedup_key_state", "alerts", ["dedup_key", "state"], unique=False)
    op.create_index("ix_alerts_state", "alerts", ["state"], unique=False)
    op.create_table(
        "webhook_subscriptions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column(
            "kind",
            sa.String(length=16),
            nullable=False,
            comment="generic|slack|pagerduty|alertmanager",
        ),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column(
            "secret",
            sa.String(length=256),
            nullable=True,
            comment="HMAC-SHA256 key (generic) or routing key (pagerduty)",
        ),
        sa.Column(
            "filters",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
            comment="min_severity, clusters, kinds, weekly_report",
        ),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_subscriptions")),
        sa.UniqueConstraint("name", name=op.f("uq_webhook_subscriptions_name")),
    )
    op.create_table(
        "webhook_outbox",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("subscription_id", sa.Integer(), nullable=False),
        sa.Column("alert_id", sa.Integer(), nullable=True),
        sa.Column(
            "event", sa.String(length=16), nullable=False, comment="trigger | resolve | report"
        ),
        sa.Column("idempotency_key", sa.String(length=256), nullable=False),
        sa.Column(
            "payload",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "state", sa.String(length=16), nullable=False, comment="pending | delivered | dead"
        ),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["alert_id"], ["alerts.id"], name=op.f("fk_webhook_outbox_alert_id_alerts")
        ),
        sa.ForeignKeyConstraint(
            ["subscription_id"],
            ["webhook_subscriptions.id"],
            name=op.f("fk_webhook_outbox_subscription_id_webhook_subscriptions"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_outbox")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_webhook_outbox_idempotency_key")),
    )
    op.create_index(
        "ix_webhook_outbox_state_next_attempt_at",
        "webhook_outbox",
        ["state", "next_attempt_at"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_webhook_outbox_state_next_attempt_at", table_name="webhook_outbox")
    op.drop_table("webhook_outbox")
    op.drop_table("webhook_subscriptions")
    op.drop_index("ix_alerts_state", table_name="alerts")
    op.drop_index("ix_alerts_dedup_key_state", table_name="alerts")
    op.drop_table("alerts")
