"""Every benchmark in ``benchmarks/`` still runs (issue 36): each script's ``--smoke`` mode.

A smoke run is the script's own code path at toy sizes (seconds), with its own checks (stored
equals acknowledged, round trips exact, every trial finished); here it must end with status 0
and print its figures. How long anything took is the benchmarks' business, never checked here.

Scripts run in this process (``runpy``, as ``python benchmarks/<name>.py --smoke`` would):
a process of their own would pay two to four seconds of imports each. The environment is given
back after each, as the conftest gives back the garbage collector's thresholds.

Not here: ``benchmarks/fleet_scale.py`` (tests/integration/test_fleet_scale_smoke.py) and the
helper modules the scripts import (``serverproc``, ``procstats``, ``rawhttp``, ``scale_*``).
"""

from __future__ import annotations

import os
import runpy
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest

from tests.conftest import REPO

BENCHMARKS = REPO / "benchmarks"


@dataclass(frozen=True)
class Smoke:
    script: str
    prints: str  # what every run of it prints, with its figures
    args: tuple[str, ...] = ()  # "{postgres}": this run's PostgreSQL URL; "{tmp}": a directory
    needs: tuple[str, ...] = ()  # "postgres", "slurm", "shared"
    slow: bool = False  # starts servers or agents of its own

    def __str__(self) -> str:
        return self.script


PG = ("postgres",)
SMOKES = [
    Smoke("agent", "Xid line -> server event", slow=True),
    Smoke("background_scale", "| steady", ("--database-url", "{postgres}"), PG, slow=True),
    Smoke("drain_budget", "| 28 | model | 1 % |", needs=("shared",)),
    Smoke("evictions", "killed agent -> eviction pending", slow=True),
    Smoke("fleet_page", "pictures alone (node states, map, 30 days' trends, risk bands)"),
    Smoke("host_error_evictions", "both (2 trials)", slow=True),
    Smoke("ib_collector", '"cpu_ms_per_collection"', needs=("shared",)),
    Smoke("ingest", "stored", ("--only", "postgres", "--database-url", "{postgres}"), PG, True),
    Smoke("ingest_tls", "| tls | fresh |", slow=True),
    Smoke("leader_takeover", '"trials": 1', ("--postgres", "{postgres}"), PG, slow=True),
    Smoke("metrics", "| default page: first scrape |", slow=True),
    Smoke("models", "| Weibull refit,"),
    Smoke("node_clocks", "node_clocks", ("--admin-url", "{postgres}"), PG),
    Smoke("notice_savings", "rules+model:"),
    Smoke("notices", "Xid line -> notice at the job's StepReporter (2 trials", slow=True),
    Smoke("port_events", "per port reading:"),
    Smoke("push_interval", "| nvml-fixture | 60 s |"),
    Smoke("quarter", "repeat offenders"),
    Smoke("remote_write", "| remote write |", ("--database-url", "{postgres}"), PG, slow=True),
    Smoke("report", "| **compute + HTML** |", ("--db", "{tmp}/report.db")),
    Smoke("risk", "GET /v1/risk?horizon=24h&limit=50", slow=True),
    Smoke("risk_render", "GPUs, horizons"),
    Smoke("risk_scoring", "shared"),
    Smoke("sample_blocks", "round trip exact"),
    Smoke("slurm_drain", "Xid line -> Slurm State has DRAIN", needs=("slurm",), slow=True),
    Smoke("refit_scale", "| run_refit (", ("--database-url", "{postgres}"), PG),
    Smoke("served_landmark", "| seed | part | H (d) |"),
    Smoke("sim_budget", "| rules + risk, after |"),
    Smoke("snapshot_codec", "B per GPU"),
    Smoke("stragglers", "| hw-8 | 2 |"),
    Smoke("titan_learners", "| xgb_cox |", needs=("shared",)),
    Smoke("titan_models", "| model | dev AUC |", needs=("shared",)),
    Smoke("urgent_lane", '"latency"', ("--database-url", "{postgres}"), PG, slow=True),
    Smoke("validation", "| 48 | 2 |"),
    Smoke("webhooks", "steady: 5 alerts"),
]


def _require_slurm() -> None:
    missing = [tool for tool in ("slurmctld", "scontrol", "munge") if not shutil.which(tool)]
    if not missing:
        return
    reason = f"not installed: {', '.join(missing)}; run scripts/ensure-slurm.sh (Debian, root)"
    if os.environ.get("FLEETWATCH_REQUIRE_SLURM") == "1":
        pytest.fail(f"Slurm is required for this run: {reason}")
    pytest.skip(reason)


def _clocks() -> dict[str, object]:
    """Each loaded fleetwatch module's ``utcnow``, by module name."""
    return {
        name: module.utcnow
        for name, module in list(sys.modules.items())
        if name.startswith("fleetwatch") and hasattr(module, "utcnow")
    }


def test_every_benchmark_has_a_smoke_run() -> None:
    helpers = {"fleet_scale", "serverproc", "procstats", "rawhttp"}
    scripts = {
        path.stem
        for path in BENCHMARKS.glob("*.py")
        if path.stem not in helpers and not path.stem.startswith("scale_")
    }
    assert scripts == {smoke.script for smoke in SMOKES}


@pytest.mark.parametrize(
    "smoke",
    [
        pytest.param(
            s,
            marks=[pytest.mark.postgres] * ("postgres" in s.needs) + [pytest.mark.slow] * s.slow,
            id=str(s),
        )
        for s in SMOKES
    ],
)
def test_benchmark_smoke(
    smoke: Smoke,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if "shared" in smoke.needs:
        request.getfixturevalue("shared_dir")
    if "slurm" in smoke.needs:
        _require_slurm()
    postgres = request.getfixturevalue("postgres_url") if "postgres" in smoke.needs else ""
    script = BENCHMARKS / f"{smoke.script}.py"
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    argv = [
        a.replace("{postgres}", postgres).replace("{tmp}", str(tmp_path))
        for a in (*smoke.args, "--smoke")
    ]
    monkeypatch.setattr(sys, "argv", [str(script), *argv])
    clocks = _clocks()
    with mock.patch.dict(os.environ):
        try:
            runpy.run_path(str(script), run_name="__main__")
        except SystemExit as exit:
            assert exit.code in (0, None), f"{script.name} --smoke ended with {exit.code!r}"
    out = capsys.readouterr().out
    assert smoke.prints in out, out[-4000:]
    # A script that swaps a clock in must give it back: the next test in this process would
    # otherwise read a simulated "now" (benchmarks/quarter.py once did).
    swapped = [name for name, clock in _clocks().items() if clocks.get(name, clock) is not clock]
    assert swapped == [], f"{smoke.script} left a clock behind in {swapped}"
