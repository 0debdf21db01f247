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
@click.option("--nodes", default=16, show_default=True, help="Simulated nodes (one agent each)")
@click.option("--gpus", default=8, show_default=True, help="GPUs per node")
@click.option("--interval", default=2.0, show_default=True, help="Seconds between agent pushes")
@click.option("--speed", default=14400.0, show_default=True, help="Simulated seconds per second")
@click.option("--seed", default=1, show_default=True)
@click.option("--duration", type=float, help="Stop after this many seconds (default: Ctrl-C)")
@click.option(
    "--story/--no-story",
    default=True,
    show_default=True,
    help="Play the scripted story: a maintenance window, a job failing on a fatal Xid, the "
    "node evicted, refused return, validated and returned, availability before and after",
)
@click.option(
    "--story-window", default=180.0, show_default=True, help="The story's maintenance window (s)"
)
def demo(
    port: int,
    data_dir: Path,
    nodes: int,
    gpus: int,
    interval: float,
    speed: float,
    seed: int,
    duration: float | None,
    story: bool,
    story_window: float,
) -> None:
    """Start the server on SQLite with a live simulated fleet of real agent processes."""
    from fleetwatch.demo import DemoOptions, run_demo

    run_demo(
        DemoOptions(
            port=port,
            data_dir=data_dir,
            nodes=nodes,
            gpus=gpus,
            interval_s=interval,
            speed=speed,
            seed=seed,
            duration_s=duration,
            story=story,
            story_window_s=story_window,
        )
    )
