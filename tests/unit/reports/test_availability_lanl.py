"""The availability figures on LANL's 1996-2005 failure log (LA-UR-05-7318), against an
independent pandas sweep.

Per system: each record is an outage of node ``nodenum`` from ``Prob Started`` to ``Prob Fixed``;
the nodes are ``0 .. nodes-1`` and any other number the log names; the period runs from the first
problem's start to one minute after the last fix. :func:`compute_availability` merges intervals;
the check instead sweeps +1 / -1 events per node in pandas and measures where the count is above
zero. There is no planned downtime in the log, so both availabilities must agree.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from fleetwatch.reports.availability import FleetPeriod, Outage, SlaTargets, compute_availability

SYSTEMS = (2, 16, 18, 19, 20)
FMT = "%m/%d/%Y %H:%M"


@pytest.fixture(scope="module")
def lanl(shared_dir: Path) -> Any:
    import pandas as pd

    path = shared_dir / "fixtures/failure_datasets/LA-UR-05-7318-failure-data-1996-2005.csv"
    if not path.exists():
        pytest.skip(f"{path} not found")
    frame = pd.read_csv(path)
    frame = frame[frame["System"].isin(SYSTEMS)].copy()
    frame["start"] = pd.to_datetime(frame["Prob Started"], format=FMT, utc=True)
    frame["fixed"] = pd.to_datetime(frame["Prob Fixed"], format=FMT, utc=True)
    return frame


def _sweep(frame: Any, node_count: int, since: Any, until: Any) -> dict[str, float]:
    """Down hours, outage episodes and their mean length, by sweeping start/end events."""
    import pandas as pd

    starts = pd.DataFrame({"node": frame["nodenum"], "t": frame["start"], "d": 1})
    ends = pd.DataFrame({"node": frame["nodenum"], "t": frame["fixed"], "d": -1})
    ev = pd.concat([starts, ends]).sort_values(["node", "t", "d"], ascending=[True, True, False])
    ev["open"] = ev.groupby("node")["d"].cumsum()
    ev["next_t"] = ev.groupby("node")["t"].shift(-1)
    down = ev[ev["open"] > 0]
    down_h = ((down["next_t"] - down["t"]).dt.total_seconds() / 3600).sum()
    prev_open = ev.groupby("node")["open"].shift(1).fillna(0)
    began = ev[(prev_open == 0) & (ev["open"] > 0)]
    ended = ev[(prev_open > 0) & (ev["open"] == 0)]
    lengths = (ended["t"].to_numpy() - began["t"].to_numpy()) / pd.Timedelta(hours=1)
    exposure = node_count * (until - since).total_seconds() / 3600
    up = exposure - down_h
    return {
        "exposure": exposure,
        "down": down_h,
        "episodes": len(began),
        "mttr": float(lengths.mean()),
        "availability": up / exposure,
        "mtbf": up / len(began),
    }


@pytest.mark.parametrize("system", SYSTEMS)
def test_lanl_availability_matches_an_event_sweep(lanl: Any, system: int) -> None:
    frame = lanl[lanl["System"] == system]
    since = frame["start"].min().to_pydatetime()
    until = frame["fixed"].max().to_pydatetime() + timedelta(minutes=1)
    names = {int(n) for n in frame["nodenum"]} | set(range(int(frame["nodes"].max())))
    outages = [
        Outage(str(int(r.nodenum)), r.start.to_pydatetime(), r.fixed.to_pydatetime(), "lanl")
        for r in frame.itertuples()
    ]
    p = FleetPeriod(since, until, {str(n): {} for n in names}, outages=outages)
    fleet = compute_availability(p, SlaTargets(0.999, 15.0), by=())["fleet"]
    ref = _sweep(frame, len(names), since, until)
    assert fleet["node_hours"] == pytest.approx(ref["exposure"], rel=1e-12)
    assert fleet["unplanned_down_h"] == pytest.approx(ref["down"], rel=1e-9)
    assert fleet["planned_down_h"] == 0
    assert fleet["infrastructure_availability"] == pytest.approx(ref["availability"], rel=1e-12)
    assert fleet["workload_availability"] == fleet["infrastructure_availability"]
    assert fleet["failures"] == fleet["repairs"] == ref["episodes"]
    assert fleet["mtbf_h"] == pytest.approx(ref["mtbf"], rel=1e-9)
    assert fleet["mttr_h"] == pytest.approx(ref["mttr"], rel=1e-9)
    # Overlapping records of one node are one outage: fewer episodes than records on system 2.
    if system == 2:
        assert ref["episodes"] < len(frame)
