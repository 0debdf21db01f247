"""Webhook subscriptions (admin) and the alerts they deliver (read)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request

from fleetwatch.server.db.base import utcnow
from fleetwatch.server.deps import AdminAuth, DatabaseDep, ReadAuth
from fleetwatch.server.repo.webhooks import (
    Webhook,
    create_webhook,
    delete_webhook,
    list_alerts,
    list_deliveries,
    list_webhooks,
    queue_test,
)
from fleetwatch.server.schemas.common import error_responses
from fleetwatch.server.schemas.fields import RowId
from fleetwatch.server.schemas.webhooks import (
    AlertPublic,
    AlertsPublic,
    DeliveriesPublic,
    DeliveryPublic,
    TestQueued,
    WebhookCreate,
    WebhookPublic,
    WebhooksPublic,
)

__all__ = ["router"]

router = APIRouter()


def _wake_outbox(request: Request) -> None:
    waker = getattr(request.app.state, "outbox_waker", None)
    if waker is not None:
        waker.poke()


def _public(webhook: Webhook) -> WebhookPublic:
    return WebhookPublic.model_validate(webhook, from_attributes=True)


@router.post(
    "/webhooks",
    response_model=WebhookPublic,
    status_code=201,
    tags=["webhooks"],
    responses=error_responses(described={409: "A webhook with this name exists"}),
    summary="Subscribe a webhook (generic, slack, pagerduty, alertmanager) to alerts",
)
def add_webhook(
    body: WebhookCreate, request: Request, db: DatabaseDep, _token: AdminAuth
) -> WebhookPublic:
    with db.write() as conn:
        made = create_webhook(conn, body, now=utcnow(), secrets=request.app.state.secret_box)
    return _public(made)


@router.get(
    "/webhooks",
    response_model=WebhooksPublic,
    tags=["webhooks"],
    summary="Webhook subscriptions (secrets are never returned)",
)
def read_webhooks(db: DatabaseDep, _token: AdminAuth) -> WebhooksPublic:
    with db.read() as conn:
        found = list_webhooks(conn)
    return WebhooksPublic(count=len(found), data=[_public(w) for w in found])


@router.delete(
    "/webhooks/{webhook_id}",
    response_model=WebhookPublic,
    tags=["webhooks"],
    responses=error_responses(404),
    summary="Remove a subscription and its queued deliveries",
)
def remove_webhook(webhook_id: RowId, db: DatabaseDep, _token: AdminAuth) -> WebhookPublic:
    with db.write() as conn:
        removed = delete_webhook(conn, webhook_id)
    return _public(removed)


@router.post(
    "/webhooks/{webhook_id}/test",
    response_model=TestQueued,
    status_code=202,
    tags=["webhooks"],
    responses=error_responses(404),
    summary="Queue a test delivery to this webhook",
)
def test_webhook(
    webhook_id: RowId, request: Request, db: DatabaseDep, _token: AdminAuth
) -> TestQueued:
    with db.write() as conn:
        queued = queue_test(conn, webhook_id, now=utcnow())
    _wake_outbox(request)
    return TestQueued.model_validate(queued, from_attributes=True)


@router.get(
    "/webhooks/{webhook_id}/deliveries",
    response_model=DeliveriesPublic,
    tags=["webhooks"],
    responses=error_responses(404),
    summary="This webhook's deliveries, newest first",
)
def read_deliveries(
    webhook_id: RowId,
    db: DatabaseDep,
    _token: AdminAuth,
    state: Annotated[Literal["pending", "delivered", "dead"] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
) -> DeliveriesPublic:
    with db.read() as conn:
        found = list_deliveries(conn, webhook_id, state=state, limit=limit)
    return DeliveriesPublic(
        count=len(found),
        data=[DeliveryPublic.model_validate(row, from_attributes=True) for row in found],
    )


@router.get(
    "/alerts",
    response_model=AlertsPublic,
    tags=["alerts"],
    summary="Alerts, newest first; state=firing is what is wrong now",
)
def read_alerts(
    db: DatabaseDep,
    _token: ReadAuth,
    state: Annotated[Literal["firing", "resolved"] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
) -> AlertsPublic:
    with db.read() as conn:
        found = list_alerts(conn, state=state, limit=limit)
    return AlertsPublic(count=len(found), data=[AlertPublic.model_validate(a) for a in found])
