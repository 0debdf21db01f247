"""``fleetwatch prometheus``: what a Prometheus already running needs to feed FleetWatch."""

from __future__ import annotations

from pathlib import Path

import click

from fleetwatch.remote_write.series_names import keep_regex

__all__ = ["prometheus"]


@click.group()
def prometheus() -> None:
    """Feed FleetWatch from the Prometheus that already scrapes dcgm-exporter."""


@prometheus.command("remote-write-config")
@click.option(
    "--url",
    required=True,
    help="FleetWatch's base URL as Prometheus reaches it, e.g. https://fleetwatch:8400",
)
@click.option(
    "--credentials-file",
    type=click.Path(path_type=Path),
    default=Path("/etc/prometheus/fleetwatch.token"),
    show_default=True,
    help="File holding an agent-scope token (fleetwatch token create --scope agent)",
)
@click.option(
    "--ca-file",
    type=click.Path(path_type=Path),
    help="CA certificate FleetWatch's TLS certificate chains to (when FleetWatch serves TLS)",
)
@click.option(
    "--exact",
    is_flag=True,
    help="Keep exactly the series FleetWatch reads (a long regex) instead of their prefixes",
)
def remote_write_config(
    url: str, credentials_file: Path, ca_file: Path | None, exact: bool
) -> None:
    """Print the ``remote_write`` block to add to prometheus.yml: only the series FleetWatch
    reads leave Prometheus."""
    # Written out rather than dumped: the base install has no YAML library, and a block an
    # operator pastes reads best in the order prometheus.yml's documentation uses.
    lines = [
        "remote_write:",
        f"  - url: {_quoted(url.rstrip('/') + '/api/v1/write')}",
        "    authorization:",
        f"      credentials_file: {_quoted(str(credentials_file))}",
    ]
    if ca_file is not None:
        lines += ["    tls_config:", f"      ca_file: {_quoted(str(ca_file))}"]
    lines += [
        "    write_relabel_configs:",
        "      - source_labels: [__name__]",
        f"        regex: {_quoted(keep_regex(exact=exact))}",
        "        action: keep",
    ]
    click.echo("\n".join(lines))


def _quoted(text: str) -> str:
    """``text`` as a single-quoted YAML scalar (a quote inside is doubled)."""
    return "'" + text.replace("'", "''") + "'"
