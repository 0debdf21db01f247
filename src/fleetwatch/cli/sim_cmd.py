"""``fleetwatch sim``: make a simulated fleet, and write it out as real sources would."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

__all__ = ["sim"]


def _problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'spec'}: {err['msg']}" for err in exc.errors()
    )


def _utc(value: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise click.BadParameter(f"not an ISO 8601 time: {value!r}") from exc
    if parsed.tzinfo is None:
        raise click.BadParameter("give a time zone, e.g. 2026-01-01T00:00:00Z")
    return parsed.astimezone(UTC)


@click.group()
def sim() -> None:
    """Simulated fleet: a spec with known ground truth, and files real collectors can follow."""


@sim.command()
@click.option("--nodes", default=16, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--gpus", default=8, show_default=True, type=click.IntRange(1, 16), help="Per node")
@click.option("--seed", default=1, show_default=True, type=click.IntRange(0))
@click.option(
    "--speed",
    default=1.0,
    show_default=True,
    type=click.FloatRange(0, min_open=True),
    help="Simulated seconds per real second (3600: an hour a second)",
)
@click.option("--horizon-days", default=365.0, show_default=True, type=click.FloatRange(0, 36500))
@click.option(
    "--monthly-failure-prob",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    help="Reference GPU's monthly failure probability (default 0.01: ~2 %/month fleet-wide)",
)
@click.option(
    "--start",
    help="Simulated start (ISO 8601). Default: far enough back that simulated time never "
    "passes the real clock during the horizon.",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for fleet.json, ground_truth.json and ground_truth_lifetimes.csv",
)
def init(
    nodes: int,
    gpus: int,
    seed: int,
    speed: float,
    horizon_days: float,
    monthly_failure_prob: float | None,
    start: str | None,
    out: Path,
) -> None:
    """Write a fleet spec and its ground truth."""
    from fleetwatch.sim.fleet import SimFleet
    from fleetwatch.sim.spec import FleetSpec

    now = datetime.now(UTC)
    fields: dict[str, Any] = {"nodes": nodes, "gpus_per_node": gpus}
    if monthly_failure_prob is not None:
        fields["failures"] = {"monthly_failure_prob": monthly_failure_prob}
    try:
        if start is None:
            spec = FleetSpec.live(
                seed=seed, real_start=now, speed=speed, horizon_days=horizon_days, **fields
            )
        else:
            spec = FleetSpec.model_validate(
                {
                    "seed": seed,
                    "start": _utc(start),
                    "real_start": now,
                    "speed": speed,
                    "horizon_days": horizon_days,
                }
                | fields
            )
    except ValidationError as exc:
        raise click.UsageError(f"invalid fleet: {_problems(exc)}") from exc
    out.mkdir(parents=True, exist_ok=True)
    spec.save(out / "fleet.json")
    fleet = SimFleet(spec)
    truth_path, csv_path = fleet.write_ground_truth(out / "ground_truth.json")
    summary = fleet.ground_truth()["summary"]
    click.echo(
        f"{spec.nodes} nodes x {spec.gpus_per_node} GPUs, seed {spec.seed}, "
        f"{spec.start.isoformat()} + {spec.horizon_days:g} days at speed {spec.speed:g}: "
        f"{summary['failed']} of {summary['gpus']} GPUs fail "
        f"({100 * summary['failures_per_gpu_month']:.1f} % per GPU-month)"
    )
    click.echo(f"spec: {out / 'fleet.json'}\nground truth: {truth_path}, {csv_path}")


@sim.command()
@click.option(
    "--spec",
    "spec_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="fleet.json from `sim init`",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Writes <out>/<node>/dcgm.prom and appends <out>/<node>/kern.log",
)
@click.option(
    "--duration",
    type=click.FloatRange(0),
    help="Stop after this many real seconds (default: until Ctrl-C; 0: write once)",
)
@click.option(
    "--interval", default=10.0, show_default=True, type=click.FloatRange(0.01), help="Seconds"
)
@click.option("--node", "nodes", multiple=True, help="Only this node (repeatable; default all)")
@click.option("--from-start", is_flag=True, help="Write the kernel log from the simulated start")
def emit(
    spec_path: Path,
    out: Path,
    duration: float | None,
    interval: float,
    nodes: tuple[str, ...],
    from_start: bool,
) -> None:
    """Keep per-node dcgm-exporter scrapes, kernel logs and /sys/class/infiniband trees current,
    for real collectors."""
    from fleetwatch.sim.emit import run_emitter
    from fleetwatch.sim.fleet import SimFleet
    from fleetwatch.sim.spec import FleetSpec

    try:
        spec = FleetSpec.load(spec_path)
    except ValidationError as exc:
        raise click.UsageError(f"{spec_path} is not a fleet spec: {_problems(exc)}") from exc
    fleet = SimFleet(spec)
    unknown = sorted(set(nodes) - set(fleet.node_names()))
    if unknown:
        raise click.UsageError(f"no such node(s) in {spec_path}: {', '.join(unknown)}")
    try:
        ticks = run_emitter(
            fleet,
            out,
            interval_s=interval,
            duration_s=duration,
            nodes=nodes,
            from_start=from_start,
        )
    except KeyboardInterrupt:
        return
    click.echo(f"wrote {ticks} tick(s) for {len(nodes) or spec.nodes} node(s) under {out}")
