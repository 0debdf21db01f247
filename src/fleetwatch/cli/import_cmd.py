"""``fleetwatch import``: history from elsewhere, straight into the database (as ``fleetwatch
inventory import`` does), without a running server."""

from __future__ import annotations

from datetime import datetime

import click

from fleetwatch.cli.server_cmds import _open_database, database_option
from fleetwatch.errors import InvalidInput

__all__ = ["import_group"]


@click.group("import")
def import_group() -> None:
    """Import history from other systems."""


@import_group.command("prometheus")
@click.option(
    "--url",
    required=True,
    envvar="FLEETWATCH_PROMETHEUS_URL",
    help="Prometheus' base URL, e.g. http://prometheus:9090  [env FLEETWATCH_PROMETHEUS_URL]",
)
@click.option(
    "--since",
    default="30d",
    show_default=True,
    help="How far back: a duration (30d, 12h, 2w) or an ISO 8601 time (naive = UTC).",
)
@click.option(
    "--step",
    default="5m",
    show_default=True,
    help="Resolution: one reading per GPU every STEP (1s to 1h).",
)
@database_option
@click.option(
    "--bearer-token",
    envvar="FLEETWATCH_PROMETHEUS_BEARER_TOKEN",
    help="Token for Prometheus' API, if it asks for one  [env FLEETWATCH_PROMETHEUS_BEARER_TOKEN]",
)
@click.option(
    "--node-label",
    "node_labels",
    multiple=True,
    help="Label naming a series' node, first present wins; repeatable  "
    "[default the server's remote_write_node_labels: Hostname, instance]",
)
@click.option("--timeout", default=60.0, show_default=True, help="Seconds per Prometheus query.")
def prometheus_cmd(
    url: str,
    since: str,
    step: str,
    database_url: str | None,
    bearer_token: str | None,
    node_labels: tuple[str, ...],
    timeout: float,
) -> None:
    """Import dcgm-exporter's history from Prometheus as hourly rollups (the risk models'
    covariates). Hours the server has data of are kept; importing again writes nothing new."""
    import httpx

    from fleetwatch.config import load_server_settings
    from fleetwatch.rules.overrides import load_rules
    from fleetwatch.server.db.base import utcnow
    from fleetwatch.server.history.prometheus_api import PrometheusApi
    from fleetwatch.server.history.prometheus_import import (
        ImportSummary,
        import_prometheus,
        plan_import,
    )
    from fleetwatch.server.timeparse import parse_duration, parse_instant

    now = utcnow()
    try:
        start = parse_instant(since, name="since", now=now) or now
    except InvalidInput as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    try:
        step_s = parse_duration(step, name="step").total_seconds()
        plan = plan_import(since=start, now=now, step_s=step_s)
    except InvalidInput as exc:
        raise click.UsageError(str(exc)) from None
    settings = load_server_settings(database_url=database_url)
    catalog, _ = load_rules(settings.rules_file)
    labels = list(node_labels) or settings.remote_write_node_labels
    headers = {"Authorization": f"Bearer {bearer_token}"} if bearer_token else {}

    def progress(done: int, chunks: int, end: datetime, summary: ImportSummary) -> None:
        click.echo(
            f"[{done}/{chunks}] up to {end:%Y-%m-%d %H:%M}Z: {len(summary.gpus)} GPUs, "
            f"{summary.hours_written} GPU-hours written",
            err=True,
        )

    click.echo(
        f"importing {plan.start:%Y-%m-%d %H:%M}Z to {plan.end:%Y-%m-%d %H:%M}Z every "
        f"{step_s:g} s from {url}",
        err=True,
    )
    database = _open_database(database_url)
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=timeout) as client:
            summary = import_prometheus(
                PrometheusApi(client),
                database,
                plan,
                node_labels=labels,
                catalog=catalog,
                progress=progress,
            )
    finally:
        database.dispose()
    refused = sum(summary.refused.values())
    click.echo(
        f"{summary.series} series of {len(summary.names)} metrics read, {len(summary.gpus)} GPUs "
        f"on {len(summary.nodes)} nodes ({summary.registered} new), {summary.hours_written} "
        f"GPU-hours written, {summary.hours_kept} kept as the server had them"
        + (f", {refused} values not read ({_counts(summary.refused)})" if refused else "")
    )


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
