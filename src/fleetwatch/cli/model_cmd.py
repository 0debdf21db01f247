"""``fleetwatch model``: survival models of GPU lifetimes, judged on what came after a cutoff.

``model backtest`` fits the landmark model (gradient-boosted P(failure within H) from the fleet
at past month starts, :mod:`fleetwatch.models.landmark_risk`) only on what was known before
``--cutoff``, scores every unit in service at the cutoff for each ``--horizon`` and compares it
with three baselines: today's Weibull AFT (location and history covariates), age-only Weibull
and location-only AFT (see :mod:`fleetwatch.models.backtest`). ``model sim-backtest`` flags
GPUs of a simulated fleet daily by telemetry-covariate risk, by the rules and by both, and scores
them against the simulator's ground truth (see :mod:`fleetwatch.models.sim_backtest`).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    # numpy and pandas come with the models extra; `fleetwatch` itself must start without them
    # (an agent-only install lists this command too).
    import numpy as np
    import pandas as pd
    from numpy.typing import NDArray

__all__ = ["model"]

_NAMES = ("model", "aft", "age_only", "location_only")
_TITAN_COLUMNS = ("SN", "location", "insert", "remove", "event")


def _progress(message: str) -> None:
    click.echo(f"[model backtest] {message}", err=True)


def _parse_cutoff(value: str) -> pd.Timestamp:
    import pandas as pd

    try:
        cut = pd.Timestamp(value)
    except (ValueError, TypeError, OverflowError) as exc:
        raise click.ClickException(
            f"--cutoff {value!r} is not a date; give one like 2017-01-01"
        ) from exc
    if cut is pd.NaT or pd.isna(cut):
        raise click.ClickException(f"--cutoff {value!r} is not a date; give one like 2017-01-01")
    if cut.tzinfo is not None:
        cut = cut.tz_convert("UTC").tz_localize(None)
    return cut


def _check_horizons(horizons: Sequence[float]) -> list[float]:
    if not horizons:
        raise click.ClickException("give at least one --horizon (days), e.g. --horizon 180")
    bad = [h for h in horizons if not (math.isfinite(h) and h > 0)]
    if bad:
        raise click.ClickException(f"--horizon must be a positive number of days, got {bad[0]}")
    return list(dict.fromkeys(horizons))


def read_inventory(path: Path) -> pd.DataFrame:
    """Inventory records from a CSV: Titan's ``gc_full.csv`` or the record columns themselves.

    Raises ``click.ClickException`` with one line if the file cannot be read or lacks columns.
    """
    import pandas as pd

    from fleetwatch.models.features import RECORD_COLUMNS, read_titan

    if not path.is_file():
        raise click.ClickException(f"inventory file {str(path)!r} does not exist or is not a file")
    try:
        header = pd.read_csv(path, nrows=0).columns
        if all(c in header for c in _TITAN_COLUMNS):
            records = read_titan(path)
        elif all(c in header for c in RECORD_COLUMNS):
            records = pd.read_csv(path, dtype={"serial": str, "location": str, "event": str})
            for col in ("inserted", "removed"):
                records[col] = pd.to_datetime(records[col], format="ISO8601")
            records["event"] = records["event"].where(records["event"].notna(), None)
        else:
            raise click.ClickException(
                f"inventory {str(path)!r} has columns {list(header)}; need Titan's "
                f"{list(_TITAN_COLUMNS)} or {list(RECORD_COLUMNS)}"
            )
    except click.ClickException:
        raise
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise click.ClickException(f"cannot read inventory {str(path)!r}: {first}") from exc
    if records["removed"].notna().sum() == 0:
        raise click.ClickException(f"inventory {str(path)!r} has no records with a removal time")
    return records


def _check_window(records: pd.DataFrame, cut: pd.Timestamp, horizons: Sequence[float]) -> None:
    import pandas as pd

    first, last = records["inserted"].min(), records["removed"].max()
    if not first < cut:
        raise click.ClickException(
            f"--cutoff {cut.date()} is not after the first insertion in the data ({first}); "
            "nothing was known before it"
        )
    end = cut + pd.Timedelta(days=max(horizons))
    if end > last:
        raise click.ClickException(
            f"--cutoff {cut.date()} + {max(horizons):g} days ({end}) is past the end of the "
            f"data ({last}); choose an earlier cutoff or a shorter horizon"
        )


def precision_at(risk: NDArray[np.float64], label: NDArray[np.bool_], k: int) -> float:
    """Share of failures among the ``k`` riskiest units (stable order on ties)."""
    import numpy as np

    k = min(k, len(risk))
    if k <= 0:
        return math.nan
    top = np.argsort(-risk, kind="stable")[:k]
    return float(label[top].mean())


def _table(risks: pd.DataFrame, metrics: dict[str, object], k1: int) -> list[str]:
    """Rows of the printed metrics table for one horizon."""
    import numpy as np

    from fleetwatch.models.backtest import ECE_BINS, Metrics

    label = risks["label"].to_numpy(dtype=bool)
    rows: list[tuple[str, list[float]]] = []
    got = {n: m for n, m in metrics.items() if isinstance(m, Metrics)}
    rows.append(("AUC", [got[n].auc for n in _NAMES]))
    rows.append(("average precision", [got[n].average_precision for n in _NAMES]))
    rows.append((f"ECE ({ECE_BINS} equal-count bins)", [got[n].ece for n in _NAMES]))
    k100 = got["model"].k
    rows.append((f"precision@{k100}", [got[n].precision_at_k for n in _NAMES]))
    rows.append(
        (
            f"precision@{k1} (1%)",
            [precision_at(risks[n].to_numpy(dtype=np.float64), label, k1) for n in _NAMES],
        )
    )
    rows.append(("concordance", [got[n].concordance for n in _NAMES]))
    width = max(len(r[0]) for r in rows)
    widths = [max(8, len(n)) for n in _NAMES]

    def line(first: str, cells: Sequence[str]) -> str:
        return f"{first:<{width}}" + "".join(
            f"  {c:>{w}}" for c, w in zip(cells, widths, strict=True)
        )

    lines = [line("metric", _NAMES)]
    for name, vals in rows:
        lines.append(line(name, [f"{v:.3f}" if math.isfinite(v) else "nan" for v in vals]))
    return lines


def _suffix(horizon: float, primary: bool) -> str:
    return "" if primary else f"_{horizon:g}d"


@click.group()
def model() -> None:
    """Survival models of GPU lifetimes: backtests against what happened after a cutoff."""


@model.command()
@click.option(
    "--inventory",
    "inventory",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="Inventory CSV: Titan's gc_full.csv (SN,location,insert,remove,...) or "
    "serial,location,inserted,removed,event",
)
@click.option("--cutoff", required=True, help="Fit only on what was known before this date")
@click.option(
    "--horizon",
    "horizons",
    required=True,
    multiple=True,
    type=float,
    help="Days after the cutoff to score (repeatable; the first is the CSV's 'risk')",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="CSV with one row per unit in service at the cutoff",
)
@click.option(
    "--penalizer",
    default=0.01,
    show_default=True,
    type=float,
    help="Elastic-net strength of the AFT baseline",
)
def backtest(
    inventory: Path, cutoff: str, horizons: tuple[float, ...], out: Path, penalizer: float
) -> None:
    """Fit before --cutoff, score each --horizon, compare with the AFT, age-only and location-only.

    The CSV has serial, age_days, risk (the landmark model's P(failure within the horizon)),
    failed_in_window, days_to_failure, risk_aft, risk_age_only and risk_location_only for the
    first horizon, and the same columns suffixed ``_<H>d`` for each further horizon.
    """
    import pandas as pd

    from fleetwatch.errors import ModelError
    from fleetwatch.models.backtest import LandmarkModel, default_model
    from fleetwatch.models.backtest import backtest as run_backtest
    from fleetwatch.models.landmarks import FeatureCache

    cut = _parse_cutoff(cutoff)
    hs = _check_horizons(horizons)
    if not (math.isfinite(penalizer) and penalizer >= 0):
        raise click.ClickException(f"--penalizer must be >= 0, got {penalizer}")
    if out.exists() and out.is_dir():
        raise click.ClickException(f"--out {str(out)!r} is a directory; give a file name")
    started = time.perf_counter()
    _progress(f"reading {inventory}")
    records = read_inventory(inventory)
    _progress(f"{len(records)} records, {records['serial'].nunique()} units")
    _check_window(records, cut, hs)

    table = pd.DataFrame()
    lines: list[str] = []
    cache: FeatureCache = {}  # landmark covariates do not depend on the horizon
    fitted: dict[tuple[object, ...], LandmarkModel] = {}  # one model for every horizon
    for i, horizon in enumerate(hs):
        _progress(f"horizon {i + 1}/{len(hs)}: {horizon:g} days, fitting model and baselines")
        t0 = time.perf_counter()
        try:
            result = run_backtest(
                records,
                cut,
                horizon,
                lambda: default_model().set_params(horizons=tuple(hs)),
                k=100,
                cache=cache,
                aft_penalizer=penalizer,
                fitted=fitted,
            )
        except (ValueError, ModelError) as exc:
            raise click.ClickException(str(exc).splitlines()[0]) from exc
        _progress(f"horizon {horizon:g} days done in {time.perf_counter() - t0:.1f} s")
        risks = result.risks
        sfx = _suffix(horizon, i == 0)
        if i == 0:
            table = pd.DataFrame({"age_days": risks["age_days"]}, index=risks.index)
            table.index.name = "serial"
        table[f"risk{sfx}"] = risks["model"]
        table[f"failed_in_window{sfx}"] = risks["label"].astype(bool)
        table[f"days_to_failure{sfx}"] = risks["days_to_failure"]
        table[f"risk_aft{sfx}"] = risks["aft"]
        table[f"risk_age_only{sfx}"] = risks["age_only"]
        table[f"risk_location_only{sfx}"] = risks["location_only"]
        m = result.metrics["model"]
        k1 = max(1, round(0.01 * m.n))
        lines.append("")
        lines.append(
            f"cutoff {cut.date()}, horizon {horizon:g} days: {m.n} units in service, "
            f"{m.n_failures} failed in the window "
            f"(model trained on {result.n_train} unit-landmark rows whose {horizon:g} days had "
            f"passed, {result.n_train_failures} of them with a failure)"
        )
        lines.extend(_table(risks, dict(result.metrics), k1))

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(out, float_format="%.6g")
    except OSError as exc:
        raise click.ClickException(f"cannot write --out {str(out)!r}: {exc.strerror}") from exc
    _progress(f"wrote {len(table)} rows to {out} in {time.perf_counter() - started:.1f} s")
    click.echo("\n".join(lines[1:]))


@model.command("sim-backtest")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0), help="Fleet seed")
@click.option("--nodes", default=40, show_default=True, type=click.IntRange(1), help="8 GPUs each")
@click.option(
    "--days", default=180.0, show_default=True, type=click.FloatRange(min=1), help="Horizon"
)
@click.option(
    "--cutoff-day",
    default=90.0,
    show_default=True,
    type=float,
    help="Train on what was known before this day; evaluate daily after it",
)
@click.option(
    "--budget", default=5, show_default=True, type=click.IntRange(1), help="GPUs drained per day"
)
@click.option(
    "--monthly-failure-prob",
    default=0.04,
    show_default=True,
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    help="Reference GPU's failure probability per month (the simulator's default is 0.01)",
)
@click.option(
    "--no-precursors",
    is_flag=True,
    help="Same fleet with no warning signs before failures (what the model gains from them)",
)
@click.option(
    "--out",
    default=None,
    type=click.Path(path_type=Path, file_okay=False),
    help="Directory for lead_times.csv, lead_times.png and drain_budget.csv",
)
def sim_backtest(
    seed: int,
    nodes: int,
    days: float,
    cutoff_day: float,
    budget: int,
    monthly_failure_prob: float,
    no_precursors: bool,
    out: Path | None,
) -> None:
    """Model vs rules-only vs rules+model on a simulated fleet with precursor telemetry.

    Prints precision at the daily drain budget, recall at 24 h and 7 days, lead-time
    percentiles and false flags per day for each method, then the weekly drain budget (k =
    0.1 %, 0.5 %, 1 % of the fleet a week: precision, recall, median lead time) of the model,
    an age-only and a random ranking.
    """
    from fleetwatch.errors import ModelError
    from fleetwatch.models.sim_backtest import (
        METHODS,
        default_spec,
        run_sim_backtest,
        without_precursors,
        write_report,
    )

    spec = default_spec(seed, nodes=nodes, days=days, monthly_failure_prob=monthly_failure_prob)
    if no_precursors:
        spec = without_precursors(spec)
    with click.progressbar(length=nodes, label="simulating nodes", file=sys.stderr) as bar:
        try:
            result = run_sim_backtest(
                spec, cutoff_day=cutoff_day, budget=budget, progress=bar.update
            )
        except (ValueError, ModelError) as exc:
            raise click.ClickException(str(exc).splitlines()[0]) from exc
    train = result.train
    click.echo(
        f"{result.n_gpus} GPUs, seed {seed}, cutoff day {cutoff_day:g}, "
        f"{result.eval_days} evaluation days, {result.n_failures} failures in evaluation "
        f"({int(result.failures['precursors'].sum())} with precursors); trained on "
        f"{len(train)} GPUs ({int(train['event'].sum())} failures); budget {budget}/day; "
        f"{result.wall_s:.1f} s"
    )
    rows = [
        ("precision@budget", "precision", ".3f"),
        ("recall@24h", "recall_24h", ".3f"),
        ("recall@7d", "recall_7d", ".3f"),
        ("lead p10 (h)", "lead_p10_h", ".1f"),
        ("lead p50 (h)", "lead_p50_h", ".1f"),
        ("lead p90 (h)", "lead_p90_h", ".1f"),
        ("false flags/day", "false_flags_per_day", ".2f"),
        ("flagged GPU-days", "flagged_gpu_days", "d"),
    ]
    width = max(len(r[0]) for r in rows)
    click.echo(f"{'metric':<{width}}" + "".join(f"  {m:>11}" for m in METHODS))
    for label, attr, fmt in rows:
        cells = []
        for m in METHODS:
            value = getattr(result.metrics[m], attr)
            cells.append(
                "nan" if isinstance(value, float) and math.isnan(value) else f"{value:{fmt}}"
            )
        click.echo(f"{label:<{width}}" + "".join(f"  {c:>11}" for c in cells))
    rank = result.ranking
    click.echo(
        f"model 7-day risk over {rank.n} GPU-days ({rank.n_failures} fail within 7 days): "
        f"AUC {rank.auc:.3f}, average precision {rank.average_precision:.3f}"
    )
    from fleetwatch.models.sim_budget import budget_lines, sim_budget

    click.echo("\n".join(budget_lines(sim_budget(result))))
    if out is not None:
        try:
            paths = write_report(result, out)
        except OSError as exc:
            raise click.ClickException(f"cannot write --out {str(out)!r}: {exc.strerror}") from exc
        click.echo("wrote " + ", ".join(str(p) for p in paths))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(model())
