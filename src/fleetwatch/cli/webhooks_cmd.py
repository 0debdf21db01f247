"""``fleetwatch webhook add|list|remove|test``: manage alert webhooks through the server's API."""

from __future__ import annotations

import json
from typing import Any

import click

from fleetwatch.cli.api_call import SERVER_OPTION, call_api, token_option

__all__ = ["webhook"]

_TOKEN = token_option("Token with scope admin (prefer env FLEETWATCH_TOKEN)")


@click.group()
def webhook() -> None:
    """Alert webhooks: generic (signed JSON), slack, pagerduty, alertmanager."""


@webhook.command("add")
@click.argument("name")
@click.option(
    "--kind",
    type=click.Choice(["generic", "slack", "pagerduty", "alertmanager"]),
    required=True,
)
@click.option("--url", required=True, help="Receiver URL (Alertmanager: its base URL)")
@click.option(
    "--secret",
    help="HMAC key (generic) or routing key (pagerduty); stored encrypted, at most 256 bytes",
)
@click.option(
    "--min-severity",
    type=click.Choice(["info", "warning", "critical", "fatal"]),
    default="warning",
    show_default=True,
)
@click.option("--cluster", "clusters", multiple=True, help="Only this cluster (repeatable)")
@click.option("--alert-kind", "kinds", multiple=True, help="Only this alert kind (repeatable)")
@click.option("--weekly-report", is_flag=True, help="Also send the weekly report")
@SERVER_OPTION
@_TOKEN
def add(
    name: str,
    kind: str,
    url: str,
    secret: str | None,
    min_severity: str,
    clusters: tuple[str, ...],
    kinds: tuple[str, ...],
    weekly_report: bool,
    server_url: str,
    token: str,
) -> None:
    """Subscribe a webhook to alerts."""
    filters: dict[str, Any] = {"min_severity": min_severity, "weekly_report": weekly_report}
    if clusters:
        filters["clusters"] = list(clusters)
    if kinds:
        filters["kinds"] = list(kinds)
    body = {"name": name, "kind": kind, "url": url, "secret": secret, "filters": filters}
    made = call_api(server_url, token, "POST", "/v1/webhooks", json=body)
    click.echo(f"webhook {made['id']} ({made['name']}, {made['kind']}) added")


@webhook.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON")
@SERVER_OPTION
@_TOKEN
def list_(as_json: bool, server_url: str, token: str) -> None:
    """List webhook subscriptions."""
    found = call_api(server_url, token, "GET", "/v1/webhooks")
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    for row in found["data"]:
        filters = ",".join(f"{k}={v}" for k, v in sorted(row["filters"].items()))
        click.echo(f"{row['id']}\t{row['name']}\t{row['kind']}\t{row['url']}\t{filters}")


@webhook.command("remove")
@click.argument("webhook_id", type=int)
@SERVER_OPTION
@_TOKEN
def remove(webhook_id: int, server_url: str, token: str) -> None:
    """Remove a webhook and its queued deliveries."""
    gone = call_api(server_url, token, "DELETE", f"/v1/webhooks/{webhook_id}")
    click.echo(f"webhook {gone['id']} ({gone['name']}) removed")


@webhook.command("test")
@click.argument("webhook_id", type=int)
@SERVER_OPTION
@_TOKEN
def test(webhook_id: int, server_url: str, token: str) -> None:
    """Queue a test delivery; see it with GET /v1/webhooks/ID/deliveries."""
    queued = call_api(server_url, token, "POST", f"/v1/webhooks/{webhook_id}/test")
    click.echo(f"test delivery {queued['delivery_id']} queued ({queued['idempotency_key']})")
