"""``server.concepts.planned``: selectors, which window covers a node now, and when silence counts
again after one. Pure: windows built by hand, no database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleetwatch.server.concepts.planned import (
    Planned,
    WindowRow,
    parse_selector,
    stands_in_maintenance,
)
from fleetwatch.server.judge.judging import Verdict

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
H = timedelta(hours=1)
LABELS = {
    "a": {"rack": "r12", "row": "3"},
    "b": {"rack": "r12", "row": "4"},
    "c": {"rack": "r13"},
}


def _window(
    i: int,
    start: float,
    end: float | None,
    *,
    ended: float | None = None,
    nodes: list[str] | None = None,
    selector: dict[str, str] | None = None,
) -> WindowRow:
    return WindowRow(
        id=i,
        nodes=nodes,
        selector=selector,
        starts_at=T0 + start * H,
        ends_at=T0 + end * H if end is not None else None,
        ended_at=T0 + ended * H if ended is not None else None,
        reason=f"w{i}",
    )


def test_parse_selector_reads_every_label_and_refuses_what_is_not_one() -> None:
    assert parse_selector("rack=r12") == {"rack": "r12"}
    assert parse_selector(" rack = r12 , row=3 ") == {"rack": "r12", "row": "3"}
    for bad in ("rack", "=r12", "rack=", "rack=r1,", "9rack=r1", "rack=r1,rack=r2"):
        with pytest.raises(ValueError):
            parse_selector(bad)


def test_planned_selector_needs_every_label_and_the_longest_window_is_shown() -> None:
    windows = [
        _window(1, 0, 2, selector={"rack": "r12", "row": "3"}),
        _window(2, 0, None, nodes=["a", "ghost"]),  # until ended: shown for a
        _window(3, 5, 6, nodes=["c"]),  # not begun
    ]
    planned = Planned.build(windows, LABELS, T0 + 1 * H)
    assert set(planned.active) == {"a", "ghost"}
    window = planned.window("a")
    assert window is not None and window.id == 2 and window.ends_at is None
    assert not planned.covers("b") and not planned.covers("c")


def test_planned_silence_counts_from_the_last_end_and_a_called_off_window_never_applies() -> None:
    windows = [
        _window(1, 0, 3, nodes=["a"], ended=1),  # ended early, at 1 h
        _window(2, 0, 2, nodes=["a"]),  # ended on time, at 2 h
        _window(3, 4, 5, nodes=["b"], ended=3),  # called off before it began
    ]
    planned = Planned.build(windows, LABELS, T0 + 3 * H)
    assert planned.active == {}
    assert planned.ended == {"a": T0 + 2 * H}
    assert planned.listen_from("a", T0) == T0 + 2 * H
    assert planned.listen_from("a", T0 + 5 * H) == T0 + 5 * H  # a later process start wins
    assert planned.listen_from("b", None) is None
    assert not Planned.build(windows, LABELS, T0 + 4.5 * H).covers("b")


def _verdict(rule: str, severity: str, *, kind: str = "xid", **evidence: str) -> Verdict:
    return Verdict(kind, rule, severity, "reboot_node", True, "test", T0, T0,  # type: ignore[arg-type]
                   evidence=evidence)  # fmt: skip


def test_only_a_hardware_fault_stands_in_maintenance() -> None:
    assert stands_in_maintenance(_verdict("xid79_fallen_off_bus", "fatal"))
    assert stands_in_maintenance(_verdict("aer_gpu_uncorrected", "critical", kind="host"))
    assert not stands_in_maintenance(_verdict("gpu_lost", "critical", kind="health"))
    assert not stands_in_maintenance(_verdict("gpu_missing", "critical", kind="health"))
    assert not stands_in_maintenance(
        _verdict("port_down", "critical", kind="host", component="network")
    )
    assert not stands_in_maintenance(_verdict("xid13", "warning"))  # takes nothing out
