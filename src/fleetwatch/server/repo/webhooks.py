"""Webhook subscriptions, their deliveries, and alerts: reads and writes."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol
from urllib.parse import urlsplit

from sqlalchemy import Connection, Row, delete, insert, select

from fleetwatch.errors import Conflict, InvalidInput, NotFound
from fleetwatch.notify.webhooks import alert_document
from fleetwatch.server.db.secret_box import SecretBox
from fleetwatch.server.db.tables import alerts, webhook_outbox, webhook_subscriptions

__all__ = [
    "QueuedTest",
    "Webhook",
    "WebhookRequest",
    "create_webhook",
    "delete_webhook",
    "enqueue",
    "list_alerts",
    "list_deliveries",
    "list_webhooks",
    "queue_test",
]


class _Filters(Protocol):
    def model_dump(self, *, exclude_none: bool) -> dict[str, Any]: ...


class WebhookRequest(Protocol):
    """What subscribes a webhook (the API's ``WebhookCreate``)."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def url(self) -> str: ...
    @property
    def secret(self) -> str | None: ...
    @property
    def filters(self) -> _Filters: ...


@dataclass(frozen=True)
class Webhook:
    """A subscription as it may be shown: whether it has a secret, never the secret."""

    id: int
    name: str
    kind: str
    url: str
    has_secret: bool
    filters: dict[str, Any]
    enabled: bool
    created_at: datetime


@dataclass(frozen=True)
class QueuedTest:
    delivery_id: int
    idempotency_key: str


def _webhook(row: Row[Any]) -> Webhook:
    return Webhook(
        id=row.id,
        name=row.name,
        kind=row.kind,
        url=row.url,
        has_secret=bool(row.secret),
        filters=row.filters or {},
        enabled=row.enabled,
        created_at=row.created_at,
    )


def create_webhook(
    conn: Connection, body: WebhookRequest, *, now: datetime, secrets: SecretBox
) -> Webhook:
    """Store a subscription; its secret encrypted with the server's newest key."""
    parts = urlsplit(body.url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InvalidInput(
            "url must be an http:// or https:// URL with a host",
            [{"loc": ["body", "url"], "msg": "needs scheme http or https and a host"}],
        )
    if body.kind == "pagerduty" and not body.secret:
        raise InvalidInput(
            "a pagerduty webhook needs secret: the integration's routing key",
            [{"loc": ["body", "secret"], "msg": "required for kind pagerduty (routing key)"}],
        )
    sealed = secrets.seal(body.secret) if body.secret else None
    taken = conn.execute(
        select(webhook_subscriptions.c.id).where(webhook_subscriptions.c.name == body.name)
    ).first()
    if taken is not None:
        raise Conflict(f"a webhook named {body.name!r} exists (id {taken.id})")
    new_id = conn.execute(
        insert(webhook_subscriptions)
        .values(
            name=body.name,
            kind=body.kind,
            url=body.url,
            secret=sealed,
            filters=body.filters.model_dump(exclude_none=True),
            enabled=True,
            created_at=now,
        )
        .returning(webhook_subscriptions.c.id)
    ).scalar_one()
    return get_webhook(conn, new_id)


def get_webhook(conn: Connection, webhook_id: int) -> Webhook:
    row = conn.execute(
        select(webhook_subscriptions).where(webhook_subscriptions.c.id == webhook_id)
    ).first()
    if row is None:
        raise NotFound("webhook", str(webhook_id))
    return _webhook(row)


def list_webhooks(conn: Connection) -> list[Webhook]:
    rows = conn.execute(select(webhook_subscriptions).order_by(webhook_subscriptions.c.id))
    return [_webhook(row) for row in rows]


def delete_webhook(conn: Connection, webhook_id: int) -> Webhook:
    """Remove the subscription and its deliveries, pending ones included."""
    found = get_webhook(conn, webhook_id)
    conn.execute(delete(webhook_outbox).where(webhook_outbox.c.subscription_id == webhook_id))
    conn.execute(delete(webhook_subscriptions).where(webhook_subscriptions.c.id == webhook_id))
    return found


def queue_test(conn: Connection, webhook_id: int, *, now: datetime) -> QueuedTest:
    """Queue a test alert (kind ``test``, severity info) to this subscription, whatever its
    filters."""
    get_webhook(conn, webhook_id)
    key = f"test:s{webhook_id}:{uuid.uuid4().hex}"
    doc = alert_document(
        {
            "id": 0,
            "dedup_key": f"test:{webhook_id}",
            "state": "firing",
            "kind": "test",
            "severity": "info",
            "node": None,
            "gpu_uuid": None,
            "serial": None,
            "slot": None,
            "cluster": None,
            "summary": "FleetWatch test delivery: this webhook works",
            "action": "none",
            "evidence": {"rule": "test"},
            "occurrences": 1,
            "started_at": now,
            "updated_at": now,
            "resolved_at": None,
        }
    )
    made = enqueue(
        conn,
        subscription_id=webhook_id,
        alert_id=None,
        event="trigger",
        key=key,
        payload={"alerts": [doc], "ends_in_s": 300.0},
        now=now,
    )
    assert made is not None  # a fresh uuid
    return QueuedTest(delivery_id=made, idempotency_key=key)


def list_deliveries(
    conn: Connection, webhook_id: int, *, state: str | None, limit: int
) -> list[Row[Any]]:
    """Newest first."""
    get_webhook(conn, webhook_id)
    query = select(webhook_outbox).where(webhook_outbox.c.subscription_id == webhook_id)
    if state is not None:
        query = query.where(webhook_outbox.c.state == state)
    rows = conn.execute(query.order_by(webhook_outbox.c.id.desc()).limit(limit))
    return list(rows)


def list_alerts(conn: Connection, *, state: str | None, limit: int) -> list[dict[str, Any]]:
    """Newest first, as alert documents (:func:`~fleetwatch.notify.webhooks.alert_document`)."""
    query = select(alerts)
    if state is not None:
        query = query.where(alerts.c.state == state)
    rows = conn.execute(query.order_by(alerts.c.id.desc()).limit(limit))
    return [alert_document(row._mapping) for row in rows]


def enqueue(
    conn: Connection,
    *,
    subscription_id: int,
    alert_id: int | None,
    event: str,
    key: str,
    payload: dict[str, Any],
    now: datetime,
) -> int | None:
    """Add a delivery unless one with this idempotency key exists; its id, or None."""
    found = conn.execute(
        select(webhook_outbox.c.id).where(webhook_outbox.c.idempotency_key == key)
    ).first()
    if found is not None:
        return None
    return int(
        conn.execute(
            insert(webhook_outbox)
            .values(
                subscription_id=subscription_id,
                alert_id=alert_id,
                event=event,
                idempotency_key=key,
                payload=payload,
                state="pending",
                attempts=0,
                next_attempt_at=now,
                created_at=now,
            )
            .returning(webhook_outbox.c.id)
        ).scalar_one()
    )
