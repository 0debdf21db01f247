"""The weekly report's figures against an independent plain-Python computation on the same rows."""

from __future__ import annotations

import csv
import math
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.unit.reports.conftest import END, NOW, START, WEEK, WEIBULL

import fleetwatch.rules
from fleetwatch.config import ServerSettings
from fleetwatch.reports.weekly import HEADLINE
from fleetwatch.reports.weeks import IsoWeek, parse_week
from fleetwatch.server.db.session import Database
from fleetwatch.server.repo.report_rows import compute_weekly

H = 3600.0
DAY = timedelta(hours=24)


def _h(a: datetime, b: datetime) -> float:
    return (b - a).total_seconds() / H


def _ov(a: datetime, b: datetime | None, lo: datetime = START, hi: datetime = END) -> float:
    x, y = max(a, lo), min(b or hi, hi)
    return max(_h(x, y), 0.0)


def _catalog() -> dict[int, dict[str, str]]:
    path = Path(fleetwatch.rules.__file__).parent / "xid_catalog.csv"
    with path.open() as f:
        return {int(r["xid"]): r for r in csv.DictReader(f)}


def _expected(rows: dict[str, list[dict[str, Any]]], settings: ServerSettings) -> dict[str, Any]:
    lts, ev = rows["lifetimes"], rows["evictions"]
    node_id = {n["name"]: n["id"] for n in rows["nodes"]}
    fails = [lt for lt in lts if lt["end_kind"] == "failure" and START <= lt["removed_at"] < END]
    exposure = sum(_ov(lt["installed_at"], lt["removed_at"]) for lt in lts)
    repl = []
    for f in fails:
        nxt = [x["installed_at"] for x in lts if x["location"] == f["location"]
               and f["removed_at"] <= x["installed_at"] < END]  # fmt: skip
        if nxt:
            repl.append(_h(f["removed_at"], min(nxt)))
    drains = [e for e in ev if not e["dry_run"] and e["completed_at"]
              and START <= e["completed_at"] < END]  # fmt: skip
    unplanned = [f for f in fails if not any(
        node_id[e["node"]] == f["node_id"] and abs(e["completed_at"] - f["removed_at"]) <= DAY
        for e in drains)]  # fmt: skip
    node_exposure = sum(_ov(n["first_seen"], n["last_seen"]) for n in rows["nodes"])
    back = [_h(e["completed_at"], e["returned_at"]) for e in ev if not e["dry_run"]
            and e["returned_at"] and START <= e["returned_at"] < END]  # fmt: skip
    cat = _catalog()
    fatal = [
        (e["node_id"], e["ts"])
        for e in rows["events"]
        if e["kind"] == "gpu_lost" or (e["kind"] == "xid" and cat[e["xid"]]["severity"] == "fatal")
    ]
    fatal += [(lt["node_id"], lt["removed_at"]) for lt in lts if lt["end_kind"] == "failure"]
    confirmed = sum(any(n == node_id[d["node"]] and abs(ts - d["completed_at"]) <= DAY
                        for n, ts in fatal) for d in drains)  # fmt: skip
    per_node = {n["id"]: sum(g["node_id"] == n["id"] for g in rows["gpus"]) for n in rows["nodes"]}
    lost_drain = sum(per_node[node_id[e["node"]]] * _ov(e["completed_at"], e["returned_at"])
                     for e in ev if not e["dry_run"] and e["completed_at"])  # fmt: skip
    lost_fail = 0.0
    for f in (lt for lt in lts if lt["end_kind"] == "failure"):
        if START - timedelta(days=7) <= f["removed_at"] < END:
            nxt = [x["installed_at"] for x in lts if x["location"] == f["location"]
                   and f["removed_at"] <= x["installed_at"] < END]  # fmt: skip
            limit = f["removed_at"] + timedelta(days=7)  # then taken as decommissioned
            lost_fail += _ov(f["removed_at"], min([*nxt, limit]))
    energy = 0.0
    for uuid in {s["gpu_uuid"] for s in rows["samples"]}:
        ss = sorted((s for s in rows["samples"] if s["gpu_uuid"] == uuid), key=lambda s: s["ts"])
        for a, b in zip(ss, ss[1:], strict=False):
            if a["energy_mj"] is not None and b["energy_mj"] is not None:
                energy += (
                    b["energy_mj"] - a["energy_mj"]
                    if b["energy_mj"] >= a["energy_mj"]
                    else b["energy_mj"]
                )
            else:
                energy += a["power_w"] * (b["ts"] - a["ts"]).total_seconds() * 1000
    in_service = [lt for lt in lts if lt["installed_at"] <= START
                  and (lt["removed_at"] is None or lt["removed_at"] > START)]  # fmt: skip
    lam, rho = WEIBULL["lambda"], WEIBULL["rho"]
    p = [1 - math.exp((a / lam) ** rho - ((a + 7) / lam) ** rho)
         for a in (_h(lt["installed_at"], START) / 24 for lt in in_service)]  # fmt: skip
    mtbf = exposure / len(fails)
    mttr = sum(repl) / len(repl)
    node_mtbf = node_exposure / (len(drains) + len(unplanned))
    node_mttr = sum(back) / len(back)
    lost = lost_fail + lost_drain
    return {
        "gpu_mtbf_h": mtbf, "gpu_mttr_h": mttr, "gpu_availability": mtbf / (mtbf + mttr),
        "node_mtbf_h": node_mtbf, "node_mttr_h": node_mttr,
        "node_availability": node_mtbf / (node_mtbf + node_mttr), "gpu_failures": len(fails),
        "node_outages": len(drains) + len(unplanned), "drains": len(drains),
        "false_drain_rate": (len(drains) - confirmed) / len(drains),
        "goodput_ratio": (exposure + lost_fail - lost) / (exposure + lost_fail),
        "gpu_hours_lost": lost, "usd_lost": lost * settings.gpu_hour_usd,
        "energy_kwh": energy / 3.6e9, "stragglers": 3,
        "expected_failures": sum(p), "actual_failures": sum(lt in fails for lt in in_service),
        "xid_category": {"hardware": 1, "application": 2, "memory": 1},
    }  # fmt: skip


@pytest.fixture
def report(db: Database, settings: ServerSettings, fleet_rows: Any) -> dict[str, Any]:
    with db.read() as conn:
        return compute_weekly(conn, parse_week(WEEK), settings=settings, now=NOW).to_dict()


def test_weekly_headline_matches_independent_computation(
    report: dict[str, Any], fleet_rows: Any, settings: ServerSettings
) -> None:
    want = _expected(fleet_rows, settings)
    for key in HEADLINE:
        assert report["headline"][key] == pytest.approx(want[key], rel=1e-9), key


def test_weekly_hand_figures(report: dict[str, Any]) -> None:
    # Worked by hand from the fixture's docstrings: 2 GPU failures, one replaced after 24 h;
    # drains of 30 h and 4 h returned; 3 drains of which n3's is unconfirmed.
    head = report["headline"]
    assert head["gpu_failures"] == 2 and head["gpu_mttr_h"] == pytest.approx(24.0)
    assert head["node_mttr_h"] == pytest.approx(17.0)
    assert head["drains"] == 3 and head["false_drain_rate"] == pytest.approx(1 / 3)
    assert head["node_outages"] == 4  # 3 drains + n2's failure with no drain within 24 h
    assert report["reliability"]["node"]["exposure_h"] == pytest.approx(168 * 2 + 84)
    assert report["goodput"]["lost_to_drains_gpu_h"] == pytest.approx(2 * (30 + 4 + 12))
    assert report["goodput"]["lost_to_failures_gpu_h"] == pytest.approx(24 + 48)


def test_weekly_sections_match(report: dict[str, Any], fleet_rows: Any, settings: Any) -> None:
    want = _expected(fleet_rows, settings)
    assert report["interruptions"]["xid_category"] == want["xid_category"]
    assert report["interruptions"]["failure_component"] == {"DBE": 1, "unknown": 1}
    assert report["interruptions"]["eviction_reason_kind"] == {"risk": 1, "straggler": 1, "rule": 1}
    cal = report["calibration"]
    assert cal["model_version"] == 1
    assert cal["expected"] == pytest.approx(want["expected_failures"], rel=1e-9)
    assert cal["actual"] == want["actual_failures"] == 2
    assert report["energy"]["intervals_from_counter"] == 3
    assert report["energy"]["intervals_from_power"] == 1
    assert report["goodput"]["reporting_gpu_h"] == 6
    assert report["stragglers"]["worst_nodes"][0] == {"node": "n3", "count": 2, "max_ratio": 1.6}
    offenders = report["offenders"]
    assert offenders["node"][:2] == [{"key": "n1", "count": 2}, {"key": "n2", "count": 2}]
    assert offenders["rack"][0] == {"key": "r1", "count": 4}
    assert offenders["sku"][0]["key"] == "H100" and offenders["sku"][0]["count"] == 2


def test_weekly_deltas_against_previous_week(report: dict[str, Any]) -> None:
    deltas = report["deltas"]
    assert set(deltas) == set(HEADLINE)
    # Last week: SN-prev failed; one 6 h drain of n1 returned; one straggler.
    assert deltas["gpu_failures"] == {"previous": 1, "delta": 1}
    assert deltas["node_mttr_h"] == {"previous": pytest.approx(6.0), "delta": pytest.approx(11.0)}
    assert deltas["stragglers"] == {"previous": 1, "delta": 2}


def test_weekly_sla_and_survival(report: dict[str, Any]) -> None:
    sla = report["sla"]
    assert sla["availability_target"] == 0.99 and sla["mttr_target_h"] == 24.0
    assert sla["mttr_met"] is True  # 17 h
    assert sla["availability_met"] is (report["headline"]["node_availability"] >= 0.99)
    assert sla["repairs_within_target"] == pytest.approx(0.5)  # 4 h yes, 30 h no
    km = report["survival"]
    assert set(km) == {"A100", "H100"}
    assert km["A100"]["n"] == 4 and km["A100"]["failures"] == 1
    assert km["H100"]["failures"] == 3
    assert 0 < km["H100"]["survival_at_days"]["365"] < 1


def test_weekly_json_schema(report: dict[str, Any]) -> None:
    import json

    assert set(report) == {
        "week", "start", "end", "generated_at", "headline", "reliability", "interruptions",
        "goodput", "energy", "drains", "calibration", "offenders", "survival", "stragglers",
        "deltas", "sla", "availability", "notice_savings", "fleet_states", "days",
        "drain_budget",
    }  # fmt: skip
    assert report["week"] == WEEK and report["start"] == START.isoformat()
    json.dumps(report, allow_nan=False)


def test_weekly_empty_database(db: Database, settings: ServerSettings) -> None:
    with db.read() as conn:
        report = compute_weekly(conn, parse_week(WEEK), settings=settings, now=NOW).to_dict()
    assert report["headline"]["gpu_failures"] == 0
    assert report["headline"]["gpu_mtbf_h"] is None
    assert report["calibration"]["expected"] is None


@pytest.mark.parametrize("text", ["2026-48", "2026-W54", "2021-W53", "x"])
def test_parse_week_refuses(text: str) -> None:
    from fleetwatch.errors import InvalidInput

    with pytest.raises(InvalidInput) as info:
        parse_week(text)
    assert info.value.detail[0]["loc"] == ["query", "week"]


def test_iso_week_bounds() -> None:
    week = parse_week("2026-W48")
    assert (week.start, week.end) == (START, END)
    assert str(week.previous()) == "2026-W47"
    assert str(parse_week("2027-W01").previous()) == "2026-W53"
    assert (
        IsoWeek.last_complete(START + timedelta(hours=5), timedelta(hours=6))
        == parse_week("2026-W47").previous()
    )
    assert IsoWeek.last_complete(START + timedelta(hours=7), timedelta(hours=6)) == parse_week(
        "2026-W47"
    )
