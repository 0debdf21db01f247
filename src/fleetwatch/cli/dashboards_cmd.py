"""``fleetwatch dashboards``: Grafana dashboards as code."""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["dashboards"]


@click.group()
def dashboards() -> None:
    """Grafana dashboards generated from code (needs the [dashboards] extra)."""


@dashboards.command()
@click.option(
    "--out",
    default=Path("dashboards/grafana"),
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Grafana directory; the JSON files go into its dashboards/ folder",
)
def build(out: Path) -> None:
    """Write every FleetWatch dashboard as JSON (reproducible: same code, same bytes)."""
    from fleetwatch.dashboards import write_all

    for path in write_all(out):
        click.echo(str(path))
