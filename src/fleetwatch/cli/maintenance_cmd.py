"""``fleetwatch maintenance add|list|end``: maintenance windows through the server's API."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import click

from fleetwatch.cli.api_call import SERVER_OPTION, call_api, token_option

__all__ = ["maintenance"]

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(m|h|d|w)$", re.ASCII)
_UNIT_SECONDS = {"m": 60, "h": 3600, "d": 86400, "w": 604800}

_TOKEN = token_option("Token with scope scheduler or admin (read for list) [env FLEETWATCH_TOKEN]")


def _instant(value: str, option: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not an ISO 8601 time, e.g. 2026-12-02T06:00:00Z", param_hint=option
        ) from None
    if parsed.tzinfo is None:
        raise click.BadParameter(
            f"{value!r} needs a UTC offset, e.g. 2026-12-02T06:00:00Z", param_hint=option
        )
    return parsed.astimezone(UTC)


def _end(value: str, start: datetime) -> datetime:
    """An ISO 8601 time, or a duration after the start (90m, 4h, 2d)."""
    match = _DURATION.match(value.strip())
    if match is not None:
        return start + timedelta(seconds=float(match[1]) * _UNIT_SECONDS[match[2]])
    return _instant(value, "--end")


@click.group()
def maintenance() -> None:
    """Maintenance windows: planned downtime (no unreachable alert, no eviction, no failure)."""


@maintenance.command("add")
@click.option("--node", "nodes", multiple=True, help="A node in the window (repeatable)")
@click.option("--selector", help="Instead of --node: label=value[,label=value], e.g. rack=r12")
@click.option("--start", help="ISO 8601 time with an offset (default: now)")
@click.option("--end", help="ISO 8601 time, or a duration after the start: 90m, 4h, 2d")
@click.option("--until-ended", is_flag=True, help="No end: until `fleetwatch maintenance end`")
@click.option("--reason", required=True, help="Why (shown on the fleet page and /v1/nodes)")
@SERVER_OPTION
@_TOKEN
def add(
    nodes: tuple[str, ...],
    selector: str | None,
    start: str | None,
    end: str | None,
    until_ended: bool,
    reason: str,
    server_url: str,
    token: str,
) -> None:
    """Open a window over nodes (--node, repeatable) or a label selector (--selector)."""
    if bool(nodes) == (selector is not None):
        raise click.UsageError("give --node (one or more) or --selector, not both")
    if (end is None) == (not until_ended):
        raise click.UsageError("give --end or --until-ended (exactly one)")
    starts_at = _instant(start, "--start") if start is not None else None
    body: dict[str, Any] = {"reason": reason}
    if nodes:
        body["nodes"] = list(nodes)
    else:
        body["selector"] = selector
    if starts_at is not None:
        body["starts_at"] = starts_at.isoformat()
    if end is not None:
        body["ends_at"] = _end(end, starts_at or datetime.now(UTC)).isoformat()
    made = call_api(server_url, token, "POST", "/v1/maintenance", json=body)
    until = made["ends_at"] or "until ended"
    click.echo(
        f"maintenance window {made['id']} ({made['state']}) over {_what(made)}: "
        f"{made['starts_at']} to {until}"
    )


@maintenance.command("list")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(["upcoming", "active", "ended", "cancelled"]),
    help="Only this state (repeatable; default: upcoming and active)",
)
@click.option("--all", "show_all", is_flag=True, help="Every window, ended ones too")
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON")
@SERVER_OPTION
@_TOKEN
def list_(
    states: tuple[str, ...], show_all: bool, as_json: bool, server_url: str, token: str
) -> None:
    """List windows, newest first."""
    params: dict[str, Any] = {}
    if not show_all:
        params["state"] = list(states) or ["upcoming", "active"]
    found = call_api(server_url, token, "GET", "/v1/maintenance", params=params)
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    for w in found["data"]:
        until = w["ends_at"] or "until ended"
        click.echo(
            f"{w['id']}\t{w['state']}\t{_what(w)}\t{w['starts_at']}\t{until}\t"
            f"{w['created_by']}\t{w['reason']}"
        )


@maintenance.command("end")
@click.argument("window_id", type=click.IntRange(min=1))
@SERVER_OPTION
@_TOKEN
def end_(window_id: int, server_url: str, token: str) -> None:
    """End a window now (cancel it, if it has not begun)."""
    ended = call_api(server_url, token, "DELETE", f"/v1/maintenance/{window_id}")
    click.echo(f"maintenance window {ended['id']} {ended['state']} at {ended['ended_at']}")


def _what(window: dict[str, Any]) -> str:
    if window.get("nodes") is not None:
        return ",".join(window["nodes"])
    selector = window.get("selector") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
