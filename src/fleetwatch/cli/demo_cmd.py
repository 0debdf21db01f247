"""``fleetwatch demo``: run the product locally on its embedded default."""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["demo"]


@click.command()
@click.option(
    "--port", default=8400, show_default=True, help="Preferred port (a free one if taken)"
)
@click.option("--data-dir", default="var/demo", show_default=True, type=click.Path(path_type=Path))
@click.option("--nodes", default=4, show_default=True, help="Simulated nodes, 8 GPUs each")
@click.option("--interval", default=2.0, show_default=True, help="Seconds between pushes")
@click.option("--duration", type=float, help="Stop after this many seconds (default: Ctrl-C)")
def demo(port: int, data_dir: Path, nodes: int, interval: float, duration: float | None) -> None:
    """Start the server on SQLite, create tokens, feed it a live simulated fleet."""
    from fleetwatch.demo import run_demo

    run_demo(port=port, data_dir=data_dir, interval_s=interval, duration_s=duration, nodes=nodes)
