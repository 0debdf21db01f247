"""The weekly report's "Work saved by notices" section on the fixed week of ``conftest.py`` with
three jobs added, against figures worked out by hand from the rows.

The week's hardware failures (conftest): n1's GPU at 24th 06:00, n2's GPU at 28th 00:00, and
n2's rule drain at 29th 11:00. The jobs added here:

* ``ja`` (16 ranks, n1): started 23rd 00:00; notice 23rd 20:00; checkpoints done 23rd 10:10 and
  24th 02:30 (after the notice); failed at 24th 06:00 with n1's GPU.
* ``jb`` (8 ranks, n2): started 27th 00:00; checkpoint done 27th 12:15; notice 27th 18:00 (cleared
  28th 01:00, after the failure); no checkpoint after it; failed at 28th 00:00 with n2's GPU.
* ``jc`` (4 ranks, n2): started 29th 00:00; no notice of its own, no checkpoint; failed at 29th
  11:00 with n2's drain. jb's notice was cleared before then and the ``cleared`` row (opened 28th
  01:00) is not a notice, so this failure is not preceded by one.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import insert
from tests.unit.reports.conftest import NOW, WEEK, t

from fleetwatch.config import ServerSettings
from fleetwatch.reports.notice_savings import percentile
from fleetwatch.reports.render import render_html
from fleetwatch.reports.weeks import parse_week
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import job_checkpoints, job_notices, jobs
from fleetwatch.server.repo.report_rows import compute_weekly


def _job(job_id: str, node: str, ranks: int, start: Any, end: Any) -> dict[str, Any]:
    return {
        "job_id": job_id, "first_seen": start, "last_seen": end, "ranks": ranks, "nodes": [node],
        "started_at": start, "ended_at": end, "outcome": "failed",
    }  # fmt: skip


def _notice(job_id: str, node: str, kind: str, opened: Any, cleared: Any = None) -> dict[str, Any]:
    return {
        "job_id": job_id, "kind": kind, "node": node, "reason": "test", "action": "checkpoint_now",
        "opened_at": opened, "cleared_at": cleared,
    }  # fmt: skip


def _seed_jobs(db: Database, *, with_notices: bool = True) -> None:
    with db.write() as conn:
        conn.execute(
            insert(jobs),
            [
                _job("ja", "n1", 16, t(23), t(24, 6)),
                _job("jb", "n2", 8, t(27), t(28)),
                _job("jc", "n2", 4, t(29), t(29, 11)),
            ],
        )
        conn.execute(
            insert(job_checkpoints),
            [
                {"job_id": "ja", "started_at": t(23, 10), "duration_s": 600.0},
                {"job_id": "ja", "started_at": t(24, 2), "duration_s": 1800.0},
                {"job_id": "jb", "started_at": t(27, 12), "duration_s": 900.0},
            ],
        )
        if with_notices:
            conn.execute(
                insert(job_notices),
                [
                    _notice("ja", "n1", "drain_pending", t(23, 20)),
                    _notice("jb", "n2", "risk", t(27, 18), cleared=t(28, 1)),
                    _notice("jb", "n2", "cleared", t(28, 1)),
                ],
            )


def _report(db: Database, settings: ServerSettings) -> Any:
    with db.read() as conn:
        return compute_weekly(conn, parse_week(WEEK), settings=settings, now=NOW)


def test_notice_savings_match_the_rows_by_hand(
    db: Database, settings: ServerSettings, fleet_rows: Any
) -> None:
    _seed_jobs(db)
    report = _report(db, settings)
    n = report.notice_savings
    assert n is not None
    # All three failures hit a node a job was running on; n1's (lead 10 h) and n2's first
    # (lead 6 h) had an open notice, n2's drain did not.
    assert n["failures_on_job_nodes"] == 3
    assert n["preceded_by_notice"] == 2
    assert n["share_preceded"] == pytest.approx(2 / 3)
    assert n["lead_h"]["p50"] == pytest.approx(8.0)  # (6 + 10) / 2
    assert n["lead_h"]["p90"] == pytest.approx(9.6)  # 6 + 0.9 x (10 - 6)
    rows = {r["job_id"]: r for r in n["jobs"]}
    assert set(rows) == {"ja", "jb", "jc"} and n["interrupted_jobs"] == 3
    # ja: 16 x (24th 02:30 - 23rd 10:10) = 16 x 16 h 20 min; lost 16 x (06:00 - 02:30).
    assert rows["ja"]["saved_gpu_h"] == pytest.approx(16 * (16 + 20 / 60))
    assert rows["ja"]["lost_gpu_h"] == pytest.approx(16 * 3.5)
    assert rows["ja"]["notice_at"] == t(23, 20).isoformat()
    # jb: a notice but no checkpoint after it: 0 saved; lost 8 x (28th 00:00 - 27th 12:15).
    assert rows["jb"]["saved_gpu_h"] == 0.0
    assert rows["jb"]["lost_gpu_h"] == pytest.approx(8 * 11.75)
    # jc: no notice, so nothing saved is measured; lost 4 x (11:00 - its start at 00:00).
    assert rows["jc"]["notice_at"] is None and rows["jc"]["saved_gpu_h"] is None
    assert rows["jc"]["lost_gpu_h"] == pytest.approx(4 * 11)
    assert rows["jc"]["node"] == "n2" and rows["jc"]["failure_kind"] == "drain"
    assert n["saved_gpu_h"] == pytest.approx(16 * (16 + 20 / 60))
    assert n["lost_gpu_h"] == pytest.approx(56 + 94 + 44)
    body = report.to_dict()["notice_savings"]
    assert body["share_preceded"] == pytest.approx(2 / 3)
    html = render_html(report)
    assert "Work saved by notices" in html
    assert "66.67 %" in html  # 2 / 3 failures preceded
    assert "261.3" in html and "194.0" in html  # saved and lost GPU-h


def test_notice_savings_absent_without_notices(
    db: Database, settings: ServerSettings, fleet_rows: Any
) -> None:
    _seed_jobs(db, with_notices=False)
    n = _report(db, settings).notice_savings
    assert n is not None
    assert n["failures_on_job_nodes"] == 3  # measured: jobs ran on the failed nodes
    assert n["preceded_by_notice"] is None and n["share_preceded"] is None  # not 0
    assert n["lead_h"] == {"p50": None, "p90": None}
    assert n["saved_gpu_h"] is None
    assert n["lost_gpu_h"] == pytest.approx(56 + 94 + 44)  # still measured


def test_notice_savings_absent_without_jobs(
    db: Database, settings: ServerSettings, fleet_rows: Any
) -> None:
    report = _report(db, settings)
    n = report.notice_savings
    assert n is not None
    assert n["failures_on_job_nodes"] is None and n["interrupted_jobs"] is None
    assert n["share_preceded"] is None and n["saved_gpu_h"] is None and n["lost_gpu_h"] is None
    assert n["jobs"] == []
    assert "Work saved by notices" in render_html(report)


def test_percentile_interpolates_and_is_none_when_empty() -> None:
    assert percentile([], 50) is None
    assert percentile([4.0], 90) == 4.0
    assert percentile([10.0, 0.0, 5.0], 50) == 5.0
    assert percentile([0.0, 10.0], 90) == pytest.approx(9.0)


def test_notice_window_edges_from_plain_inputs() -> None:
    """A notice opened more than the lookback before the failure does not count; a checkpoint
    completed exactly at the notice counts as taken on it (``[T, F]``)."""
    from fleetwatch.reports.job_failures import NodeFailure
    from fleetwatch.reports.notice_savings import JobSpan, Notice, notice_savings

    f = NodeFailure("n1", t(28, 12), "gpu_failure", "test")
    job = JobSpan("j", ("n1",), 2, t(20), t(28, 12), "failed", t(28, 12))
    common: dict[str, Any] = {
        "since": t(23), "until": t(30), "failures": [f], "jobs": [job], "notices_known": True,
        "checkpoints_done": {"j": [t(21), t(26)]}, "before": timedelta(minutes=30),
        "after": timedelta(minutes=5),
    }  # fmt: skip
    stale = notice_savings(notices=[Notice("j", "n1", t(21, 11), None)], **common)
    assert stale["preceded_by_notice"] == 0 and stale["share_preceded"] == 0.0
    assert stale["jobs"][0]["saved_gpu_h"] is None  # no notice in the window
    fresh = notice_savings(notices=[Notice("j", "n1", t(26), None)], **common)
    assert fresh["lead_h"]["p50"] == pytest.approx(60.0)  # 26th 00:00 -> 28th 12:00
    # 2 ranks x (26th 00:00 - 21st 00:00), lost 2 x (28th 12:00 - 26th 00:00)
    assert fresh["jobs"][0]["saved_gpu_h"] == pytest.approx(2 * 120.0)
    assert fresh["jobs"][0]["lost_gpu_h"] == pytest.approx(2 * 60.0)
