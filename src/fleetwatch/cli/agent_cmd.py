"""``fleetwatch agent``: the node agent. ``--once --dry-run`` is what to run first on a node."""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import click

from fleetwatch.cli.tls_options import client_tls_options
from fleetwatch.config import load_agent_settings

__all__ = ["agent"]

logger = logging.getLogger(__name__)


@click.command()
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, path_type=Path),
    help="TOML file with the same keys as the settings",
)
@click.option("--server-url", help="FleetWatch server, e.g. https://fleetwatch.example:8400")
@click.option("--token", help="Agent token (prefer --token-file or FLEETWATCH_AGENT_TOKEN)")
@click.option("--token-file", type=click.Path(path_type=Path))
@click.option("--node-name", help="Default: the hostname")
@click.option("--label", "labels", multiple=True, help="key=value, repeatable")
@click.option("--interval", "interval_s", type=float, help="Seconds between collections [10]")
@click.option(
    "--push-interval",
    "push_interval_s",
    type=float,
    help="Seconds between pushes; collections in between wait in the spool, Xids go at once "
    "(0: push every collection) [60]",
)
@click.option("--collectors", help="nvml,dcgm-exporter,nvidia-smi,kernel-log,infiniband,sim")
@click.option("--spool-dir", type=click.Path(path_type=Path))
@click.option("--spool-max-bytes", type=int)
@click.option(
    "--poison-after",
    "poison_after_s",
    type=float,
    help="Seconds of plain 500s (server otherwise up) before a batch is set aside [600]",
)
@client_tls_options(shared_env=False)
@click.option(
    "--allow-insecure-http",
    is_flag=True,
    default=None,
    help="Send the token over plain http:// to another machine (refused otherwise; loopback "
    "is always allowed) [env FLEETWATCH_AGENT_ALLOW_INSECURE_HTTP]",
)
@click.option("--dcgm-url", help="dcgm-exporter /metrics URL or file")
@click.option("--nvidia-smi", "nvidia_smi", help="Command, or a file with its XML output")
@click.option("--kernel-log", help="auto, kmsg, journal, or a file to follow")
@click.option(
    "--infiniband-root",
    type=click.Path(path_type=Path),
    help="Adapter ports' sysfs tree [/sys/class/infiniband]",
)
@click.option("--sim-spec", type=click.Path(exists=True, path_type=Path))
@click.option("--metrics-port", type=int, help="Serve the agent's own /metrics here")
@click.option("--once", is_flag=True, help="Collect once, push, exit")
@click.option("--dry-run", is_flag=True, help="With --once: print the batch as JSON, send nothing")
def agent(
    config_file: Path | None, labels: tuple[str, ...], once: bool, dry_run: bool, **flags: Any
) -> None:
    """Collect GPU telemetry on this node and push it to the server."""
    if labels:
        flags["labels"] = ",".join(labels)
    settings = load_agent_settings(config_file, **flags)
    if dry_run:
        _dry_run(settings)
        return
    from fleetwatch.agent.factory import build_agent
    from fleetwatch.agent.selfmetrics import AgentMetrics

    if once:
        # One collection, one batch, as ever: nothing is staged and no push interval declared.
        settings = settings.model_copy(update={"push_interval_s": 0.0})
    metrics = AgentMetrics()
    if settings.metrics_port:
        metrics.serve(settings.metrics_port)
    node_agent = build_agent(settings, metrics)
    if once:
        try:
            node_agent.spool_collection(node_agent.collect())
            node_agent.drain_once()
            waiting, _ = node_agent.spool_depth()
        finally:
            node_agent.close()
        if waiting:
            raise click.ClickException(
                f"{waiting} batch(es) left in the spool: server unreachable?"
            )
        click.echo("pushed", err=True)
        return
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    node_agent.run(stop)


def _dry_run(settings: Any) -> None:
    from fleetwatch.agent.collectors.base import merge_readings
    from fleetwatch.agent.factory import build_collectors, node_info, utc_clock
    from fleetwatch.agent.loop import build_batch
    from fleetwatch.errors import CollectorError

    now = utc_clock()
    collections = []
    for collector in build_collectors(settings, keep_state=False):
        try:
            collections.append(collector.collect(now))
        except CollectorError as exc:
            click.echo(f"collector {collector.name} failed: {exc}", err=True)
        finally:
            collector.close()
    batch = build_batch(node_info(settings), merge_readings(collections))
    sys.stdout.write(json.dumps(json.loads(batch.model_dump_json(exclude_none=True)), indent=2))
    sys.stdout.write("\n")
