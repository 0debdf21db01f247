"""Interruptions by component in the weekly report, against an independent count.

Host-error and network port rows are added to the small fleet of ``conftest``, with ``details``
read by the agent's parsers from real kernel-log captures (port rows: as the server derives
them); every row carries the component a person assigns it (``want``), and the expected counts
are recomputed from those labels in plain Python.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert
from tests.unit.reports.conftest import END, NOW, START, WEEK, t

from fleetwatch.agent.parsers.kernel_events import parse_kernel_events
from fleetwatch.config import ServerSettings
from fleetwatch.reports.components import COMPONENTS
from fleetwatch.reports.render import render_html
from fleetwatch.reports.weeks import parse_week
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import events
from fleetwatch.server.repo.report_rows import compute_weekly

CAPTURES = Path(__file__).resolve().parents[2] / "fixtures" / "kernel_log_captures"
SHARED = Path(__file__).resolve().parents[3].parent / "shared" / "fixtures"


def _details(path: Path, kind: str, severity: str, nth: int = 0) -> dict[str, Any]:
    if not path.is_file():
        pytest.skip(f"fixture not found: {path}")
    found = [
        e.details
        for e in parse_kernel_events(path.read_text(errors="replace"), year_hint=2024).events
        if e.kind == kind and e.details and e.details.get("severity") == severity
    ]
    return dict(found[nth])


def _host_rows() -> list[dict[str, Any]]:
    fm = (
        SHARED / "nvswitch_fabric/gpud__fabricmanager-log_ERROR-lines_SXid20034-12028-multicast.log"
    )
    aer = CAPTURES / "lkml-2024-01-11_aer-corrected-nonfatalerr_fatal-tlp-malftlp.log"
    skx = CAPTURES / "lkml-2021-08-12_einj-ghes-recoverable_edac-skx-ue_icelake.log"
    panic = CAPTURES / "lkml-2025-11-07_mce-exception-pcc-panic_indented.log"
    sxid_fatal, sxid_minor = _details(fm, "sxid", "fatal"), _details(fm, "sxid", "non_fatal")
    aer_fatal, aer_corr = _details(aer, "pcie_aer", "fatal"), _details(aer, "pcie_aer", "corrected")
    mce_mem, edac_ue = _details(skx, "mce", "uncorrected", 1), _details(skx, "edac", "uncorrected")
    mce_cpu = _details(panic, "mce", "fatal")
    rows = [
        # n1: one fabric fault on two switches 2 s apart -> 1 nvlink; a memory UE decoded twice
        # (MCE and EDAC) -> 1 memory; a non-fatal SXid -> nothing.
        (1, None, "sxid", sxid_fatal, t(24, 5), "nvlink"),
        (1, None, "sxid", sxid_fatal, t(24, 5) + timedelta(seconds=2), "nvlink"),
        (1, None, "sxid", sxid_minor, t(24, 9), None),
        (1, None, "mce", mce_mem, t(26, 2), "memory"),
        (1, None, "edac", edac_ue, t(26, 2) + timedelta(seconds=1), "memory"),
        # n2: an uncorrected AER on its GPU 0 -> gpu (its Xid 79 four days later is another);
        # a corrected AER -> nothing.
        (2, "GPU-n2-0", "pcie_aer", aer_fatal, t(25, 1), "gpu"),
        (2, "GPU-n2-0", "pcie_aer", aer_corr, t(25, 2), None),
        # n2: an EDAC UE burst that began before the week -> not this week's.
        (2, None, "edac", edac_ue, START - timedelta(minutes=30), "memory"),
        (2, None, "edac", edac_ue, START + timedelta(minutes=10), "memory"),
        # n3: an uncorrected AER on no GPU and, a day later, a CPU machine-check panic -> host x2.
        (3, None, "pcie_aer", aer_fatal, t(27, 1), "host"),
        (3, None, "mce", mce_cpu, t(28, 1), "host"),
    ]
    rows += _port_rows()
    return [
        {"node_id": n, "gpu_uuid": g, "kind": k, "details": d, "ts": ts, "received_at": ts,
         "want": want}
        for n, g, k, d, ts, want in rows
    ]  # fmt: skip


def _port(severity: str, **more: Any) -> dict[str, Any]:
    """Details as the server derives them from port readings (rules.port_events)."""
    return {"device": "mlx5_0", "port": 1, "netdev": "ib0", "link_layer": "InfiniBand",
            "severity": severity, **more}  # fmt: skip


def _port_rows() -> list[tuple[Any, ...]]:
    flap = {"increase": 1, "limit": 3, "window_s": 3600.0}
    return [
        # n1: a port goes down, its link_downed rises with it -> 1 network interruption; it
        # comes back slower (degraded) -> nothing.
        (1, None, "port_down", _port("critical", state="DOWN"), t(26, 14), "network"),
        (1, None, "port_flap", _port("critical", in_window=3, **flap), t(26, 14) + timedelta(
            seconds=10), "network"),
        (1, None, "port_degraded", _port("warning", rate_gbps=200.0), t(26, 15), None),
        # n2: two flaps below the limit -> nothing; a flapping link on two days -> network x2.
        (2, None, "port_flap", _port("warning", in_window=1, **flap), t(24, 3), None),
        (2, None, "port_flap", _port("warning", in_window=2, **flap), t(24, 4), None),
        (2, None, "port_flap", _port("critical", in_window=3, **flap), t(25, 3), "network"),
        (2, None, "port_flap", _port("critical", in_window=3, **flap), t(27, 3), "network"),
        # n3: symbol errors and a port back up -> nothing.
        (3, None, "port_errors", _port("warning", counter="symbol_error"), t(27, 4), None),
        (3, None, "port_up", _port("info"), t(27, 5), None),
    ]  # fmt: skip


def _expected(fleet_events: list[dict[str, Any]], host: list[dict[str, Any]]) -> dict[str, Any]:
    """Plain count: labelled rows per node and component, a new interruption after a gap of more
    than an hour, counted when it starts inside the week."""
    # The conftest fleet's Xids, labelled by hand from the catalogue: 79 (fallen off the bus)
    # and 48 (DBE) take the GPU out; 13 is the application's.
    xid_component = {79: "gpu", 48: "gpu", 13: None}
    labelled = [(e["node_id"], xid_component[e["xid"]], e["ts"]) for e in fleet_events
                if e["kind"] == "xid"]  # fmt: skip
    labelled += [(e["node_id"], e["want"], e["ts"]) for e in host]
    counts: dict[str, int | None] = dict.fromkeys(COMPONENTS, 0)
    for node in {n for n, _, _ in labelled}:
        for component in COMPONENTS:
            stamps = sorted(ts for n, c, ts in labelled if n == node and c == component)
            previous = None
            for ts in stamps:
                if (previous is None or ts - previous > timedelta(hours=1)) and START <= ts < END:
                    counts[component] = (counts[component] or 0) + 1
                previous = ts
    return counts


def test_interruptions_by_component_match_an_independent_count(
    db: Database, settings: ServerSettings, fleet_rows: Any
) -> None:
    host = _host_rows()
    with db.write() as conn:
        conn.execute(insert(events), [{k: v for k, v in r.items() if k != "want"} for r in host])
    with db.read() as conn:
        report = compute_weekly(conn, parse_week(WEEK), settings=settings, now=NOW)
    got = report.interruptions["by_component"]
    assert got == _expected(fleet_rows["events"], host)
    # And by hand: gpu = n2's AER + n2's Xid 79 + n3's Xid 48; one fabric fault; one memory UE
    # in the week; two host faults on n3; n1's port down and n2's two flapping days.
    assert got == {"gpu": 3, "memory": 1, "nvlink": 1, "network": 3, "host": 2}
    html = render_html(report)
    assert "<td>NVLink / NVSwitch</td><td>1</td>" in html
    assert "<td>network</td><td>3</td>" in html


def test_a_fatal_host_error_confirms_a_drain(
    db: Database, settings: ServerSettings, fleet_rows: Any
) -> None:
    """n3's drain is unconfirmed in the fleet (conftest); a fatal SXid beside it confirms it."""
    with db.read() as conn:
        before = compute_weekly(conn, parse_week(WEEK), settings=settings, now=NOW)
    [drain] = [e for e in fleet_rows["evictions"] if e["node"] == "n3" and e["completed_at"]]
    fm = (
        SHARED / "nvswitch_fabric/gpud__fabricmanager-log_ERROR-lines_SXid20034-12028-multicast.log"
    )
    row = {"node_id": 3, "kind": "sxid", "details": _details(fm, "sxid", "fatal"),
           "ts": drain["completed_at"] - timedelta(hours=2)}  # fmt: skip
    row["received_at"] = row["ts"]
    with db.write() as conn:
        conn.execute(insert(events), [row])
    with db.read() as conn:
        after = compute_weekly(conn, parse_week(WEEK), settings=settings, now=NOW)
    assert after.drains["confirmed"] == before.drains["confirmed"] + 1
