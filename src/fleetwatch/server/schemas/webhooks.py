"""Webhook subscriptions, their deliveries, and alerts, as the API shows them."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from fleetwatch.server.schemas.fields import Text

__all__ = [
    "AlertPublic",
    "AlertsPublic",
    "DeliveriesPublic",
    "DeliveryPublic",
    "TestQueued",
    "WebhookCreate",
    "WebhookFilters",
    "WebhookPublic",
    "WebhooksPublic",
]

Kind = Literal["generic", "slack", "pagerduty", "alertmanager"]
Severity = Literal["info", "warning", "critical", "fatal"]


class WebhookFilters(BaseModel):
    min_severity: Severity = Field(default="warning", description="send alerts at least this bad")
    clusters: list[Text] | None = Field(
        default=None, description="only nodes whose label cluster is one of these"
    )
    kinds: list[Text] | None = Field(
        default=None,
        description="only these alert kinds: xid, health, host, unreachable, straggler, "
        "drain_budget, wear_out, repeat_offender, fleet_silence, unreadable_evidence (a node's "
        "events the rules skipped as unreadable, or a rule family that failed on it)",
    )
    weekly_report: bool = Field(default=False, description="also send the weekly report")


class WebhookCreate(BaseModel):
    name: Text = Field(min_length=1, max_length=128)
    kind: Kind
    url: Text = Field(min_length=1, description="http(s) URL; Alertmanager: its base URL")
    secret: Text | None = Field(
        default=None,
        max_length=256,
        description="HMAC key (generic, signs each delivery); the routing key (pagerduty). "
        "Stored encrypted; at most 256 bytes (UTF-8)",
    )
    filters: WebhookFilters = Field(default_factory=WebhookFilters)


class WebhookPublic(BaseModel):
    id: int
    name: str
    kind: Kind
    url: str
    has_secret: bool = Field(description="the secret itself is never returned")
    filters: dict[str, Any]
    enabled: bool
    created_at: datetime


class WebhooksPublic(BaseModel):
    count: int
    data: list[WebhookPublic]


class DeliveryPublic(BaseModel):
    id: int
    alert_id: int | None
    event: Literal["trigger", "resolve", "report"]
    idempotency_key: str
    state: Literal["pending", "delivered", "dead"]
    attempts: int
    next_attempt_at: datetime
    last_error: str | None
    created_at: datetime
    delivered_at: datetime | None


class DeliveriesPublic(BaseModel):
    count: int
    data: list[DeliveryPublic]


class TestQueued(BaseModel):
    delivery_id: int
    idempotency_key: str


class AlertPublic(BaseModel):
    id: int
    dedup_key: str
    state: Literal["firing", "resolved"]
    kind: str
    rule: str | None
    severity: str
    node: str | None
    gpu_index: int | None
    gpu_uuid: str | None
    serial: str | None
    slot: str | None = Field(description="PCI bus id")
    cluster: str | None
    summary: str
    action: str | None = Field(description="the recommended action, from the Xid catalogue")
    evidence: dict[str, Any]
    occurrences: int
    started_at: datetime
    updated_at: datetime
    resolved_at: datetime | None


class AlertsPublic(BaseModel):
    count: int
    data: list[AlertPublic]
