"""The weekly report's one line per table: read off the table's own figures."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from fleetwatch.reports.advice import section_advice


def _report(**changes: Any) -> Any:
    quiet: dict[str, Any] = {
        "fleet_states": [{"node": "n1", "state": "healthy"}],
        "sla": {"availability_met": True, "mttr_met": True},
        "availability": {"jobs": {"interrupted_by_hardware": 0}},
        "notice_savings": {"jobs": []},
        "deltas": {"gpu_mtbf_h": {"previous": 1000.0, "delta": 0.0}},
        "goodput": {"lost_to_failures_gpu_h": 0.0, "lost_to_drains_gpu_h": 0.0},
        "drains": {"performed": 0},
        "interruptions": {"by_component": {}},
        "calibration": {"expected": 1.0, "actual": 1, "gpus": 100},
        "offenders": {"repeat": [], "node": []},
        "survival": {},
        "stragglers": {"worst_nodes": []},
    }
    return SimpleNamespace(**(quiet | changes))


def test_a_quiet_week_says_there_is_nothing_to_do() -> None:
    lines = section_advice(_report())
    assert "nothing to do" in lines["fleet"] and "nothing to do" in lines["sla"]
    assert lines["drains"] == "No drain this week."


def test_a_bad_week_points_at_what_to_look_at() -> None:
    lines = section_advice(
        _report(
            fleet_states=[{"node": "n1", "state": "healthy"}, {"node": "n7", "state": "out"}],
            sla={"availability_met": False, "mttr_met": True},
            deltas={
                "gpu_mtbf_h": {"previous": 1000.0, "delta": -500.0},
                "gpu_failures": {"previous": 1, "delta": 3},
            },  # fmt: skip
            drains={"performed": 4, "unconfirmed": 3},
            calibration={"expected": 1.0, "actual": 9, "gpus": 100},
            offenders={"repeat": [{"node": "n7"}], "node": []},
            survival={
                "H100": {"survival_at_days": {"90": 0.97}},
                "A100": {"survival_at_days": {"90": 0.91}},
            },  # fmt: skip
        )
    )
    assert "n7" in lines["fleet"]
    assert lines["sla"].startswith("Missed availability")
    assert "1,000 h to 500 h" in lines["reliability"]
    assert "More gpu failures" in lines["deltas"]
    assert lines["drains"].startswith("3 of 4 drains")
    assert "under-predicts" in lines["calibration"]
    assert "repeat_offender" in lines["offenders"]
    assert lines["survival"].startswith("A100")
