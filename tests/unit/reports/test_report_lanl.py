"""The report's MTBF and MTTR functions on LANL's 1996-2005 failure log (LA-UR-05-7318), checked
against an independent pandas computation.

Per system: failures = records; MTTR = mean(Prob Fixed - Prob Started); the exposure window runs
from the first problem's start to the last problem's fix; system MTBF = window / failures and
node MTBF = nodes x window / failures.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from fleetwatch.reports.reliability import availability, hours, mtbf_hours, mttr_hours

SYSTEMS = (2, 16, 18, 19, 20)
FMT = "%m/%d/%Y %H:%M"


@pytest.fixture(scope="module")
def lanl(shared_dir: Path) -> Path:
    path = shared_dir / "fixtures/failure_datasets/LA-UR-05-7318-failure-data-1996-2005.csv"
    if not path.exists():
        pytest.skip(f"{path} not found")
    return path


def _ours(path: Path) -> dict[int, dict[str, float]]:
    import csv

    rows: dict[int, list[tuple[datetime, datetime]]] = {s: [] for s in SYSTEMS}
    nodes: dict[int, int] = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            system = int(row["System"])
            if system in rows:
                start = datetime.strptime(row["Prob Started"], FMT).replace(tzinfo=UTC)
                fixed = datetime.strptime(row["Prob Fixed"], FMT).replace(tzinfo=UTC)
                rows[system].append((start, fixed))
                nodes[system] = int(float(row["nodes"]))
    out = {}
    for system, repairs in rows.items():
        window = hours(min(s for s, _ in repairs), max(f for _, f in repairs))
        mtbf = mtbf_hours(window, len(repairs))
        node_mtbf = mtbf_hours(window * nodes[system], len(repairs))
        mttr = mttr_hours(repairs)
        assert mtbf is not None and node_mtbf is not None and mttr is not None
        a = availability(node_mtbf, mttr)
        assert a is not None
        out[system] = {"mtbf_h": mtbf, "node_mtbf_h": node_mtbf, "mttr_h": mttr, "a": a}
    return out


def test_lanl_mtbf_mttr_match_pandas(lanl: Path) -> None:
    import pandas as pd

    frame = pd.read_csv(lanl)
    frame = frame[frame["System"].isin(SYSTEMS)]
    start = pd.to_datetime(frame["Prob Started"], format=FMT)
    fixed = pd.to_datetime(frame["Prob Fixed"], format=FMT)
    frame = frame.assign(
        start=start, fixed=fixed, repair_h=(fixed - start).dt.total_seconds() / 3600
    )
    g = frame.groupby("System").agg(
        n=("start", "size"), nodes=("nodes", "max"), nodes_min=("nodes", "min"),
        first=("start", "min"), last=("fixed", "max"), mttr=("repair_h", "mean"),
    )  # fmt: skip
    assert (g["nodes"] == g["nodes_min"]).all()  # one node count per system
    window = (g["last"] - g["first"]).dt.total_seconds() / 3600
    ours = _ours(lanl)
    for system in SYSTEMS:
        assert ours[system]["mtbf_h"] == pytest.approx(window[system] / g.n[system], rel=1e-12)
        assert ours[system]["node_mtbf_h"] == pytest.approx(
            window[system] * g.nodes[system] / g.n[system], rel=1e-12
        )
        assert ours[system]["mttr_h"] == pytest.approx(g.mttr[system], rel=1e-12)
    # Recorded in the report (rounded): system 2, the largest record.
    assert round(ours[2]["mtbf_h"], 2) == round(window[2] / g.n[2], 2)
