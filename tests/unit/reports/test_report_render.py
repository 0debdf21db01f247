"""The HTML page in headless Chromium, the PDF through pdftoppm, the CLI, the API and the job."""

from __future__ import annotations

import json
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from tests.conftest import bearer, require_tool
from tests.unit.reports.conftest import NOW, START, WEEK

from fleetwatch.cli import main
from fleetwatch.config import ServerSettings
from fleetwatch.reports.render import render_html, render_pdf
from fleetwatch.reports.weekly import WeeklyReport
from fleetwatch.reports.weeks import parse_week
from fleetwatch.rules.xid_catalog import XidCatalog
from fleetwatch.server.db.session import Database
from fleetwatch.server.repo.report_rows import compute_weekly
from fleetwatch.server.tell.weekly_report import WeeklyReportJob


@pytest.fixture
def built(db: Database, settings: ServerSettings, fleet_rows: Any) -> WeeklyReport:
    with db.read() as conn:
        return compute_weekly(conn, parse_week(WEEK), settings=settings, now=NOW)


def _not_blank(png: Path) -> None:
    assert png.exists() and png.stat().st_size > 5_000, png
    from PIL import Image, ImageStat

    with Image.open(png) as image:
        stddev = ImageStat.Stat(image.convert("L")).stddev[0]
    assert stddev > 5.0, f"{png} looks blank (grey-level stddev {stddev:.2f})"


@pytest.mark.slow
def test_report_html_renders_in_chromium(built: WeeklyReport, tmp_path: Path) -> None:
    chromium = require_tool("chromium")
    html = render_html(built)
    assert "data:image/png;base64," in html and WEEK in html
    page = tmp_path / "report.html"
    page.write_text(html, "utf-8")
    shot = tmp_path / "shot.png"
    subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
         "--window-size=1280,2000", "--hide-scrollbars", f"file://{page}"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    _not_blank(shot)


@pytest.mark.slow
def test_report_pdf_converts_to_pages(built: WeeklyReport, tmp_path: Path) -> None:
    pdftoppm = require_tool("pdftoppm")
    pdf = render_pdf(built)
    assert pdf.startswith(b"%PDF")
    path = tmp_path / "report.pdf"
    path.write_bytes(pdf)
    subprocess.run([pdftoppm, "-png", "-r", "50", str(path), str(tmp_path / "page")],
                   check=True, capture_output=True, timeout=120)  # fmt: skip
    pages = sorted(tmp_path.glob("page*.png"))
    assert len(pages) >= 1
    _not_blank(pages[0])


def test_report_api_json_and_html(
    client: TestClient, tokens: dict[str, str], fleet_rows: Any
) -> None:
    response = client.get(f"/v1/reports/weekly?week={WEEK}", headers=bearer(tokens["read"]))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert response.json()["headline"]["gpu_failures"] == 2
    response = client.get(
        f"/v1/reports/weekly?week={WEEK}&format=html", headers=bearer(tokens["read"])
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "<html" in response.text


def test_report_api_pdf(client: TestClient, tokens: dict[str, str]) -> None:
    response = client.get(
        f"/v1/reports/weekly?week={WEEK}&format=pdf", headers=bearer(tokens["read"])
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/pdf"
    assert response.content.startswith(b"%PDF")


@pytest.mark.parametrize("week", ["2026-48", "2026-W60"])
def test_report_api_bad_week_is_422(client: TestClient, tokens: dict[str, str], week: str) -> None:
    response = client.get(f"/v1/reports/weekly?week={week}", headers=bearer(tokens["read"]))
    assert response.status_code == 422
    assert "week" in response.text
    response = client.get("/v1/reports/weekly?format=doc", headers=bearer(tokens["read"]))
    assert response.status_code == 422


def test_report_cli_json(settings: ServerSettings, fleet_rows: Any, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    result = CliRunner().invoke(
        main, ["report", "weekly", "--week", WEEK, "--out", str(out),
               "--database-url", settings.database_url],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["headline"]["drains"] == 3


def test_report_cli_bad_week(settings: ServerSettings) -> None:
    result = CliRunner().invoke(
        main, ["report", "weekly", "--week", "W48", "--database-url", settings.database_url]
    )
    assert result.exit_code != 0 and "2026-W48" in result.output


def test_weekly_job_sends_each_week_once(
    db: Database, settings: ServerSettings, fleet_rows: Any
) -> None:
    sent: list[tuple[str, dict[str, Any]]] = []

    def enqueue(conn: Any, *, key: str, payload: dict[str, Any], now: Any) -> int:
        sent.append((key, payload))
        return 1

    # A stand-in outbox with one subscriber, who waits for each week until it is queued.
    job = WeeklyReportJob(
        db, settings, XidCatalog.load(), enqueue=enqueue,
        waiting=lambda conn, key: int(all(k != key for k, _ in sent)),
    )  # fmt: skip
    monday = START + timedelta(days=7)  # the Monday after 2026-W48
    assert job(monday + timedelta(hours=5)) == "2026-W47"  # before the delay: the week before
    sent.clear()
    assert job(monday + timedelta(hours=settings.report_delay_h, minutes=1)) == WEEK
    assert job(monday + timedelta(hours=9)) is None  # already sent
    assert [key for key, _ in sent] == [f"weekly:{WEEK}"]
    payload = sent[0][1]
    assert payload["kind"] == "weekly_report" and payload["headline"]["gpu_failures"] == 2
    assert "curve" not in payload["survival"]["H100"]
    json.dumps(payload, allow_nan=False)


def test_weekly_job_through_the_outbox(
    db: Database, settings: ServerSettings, fleet_rows: Any
) -> None:
    from sqlalchemy import insert, select

    from fleetwatch.server.db.tables import webhook_outbox, webhook_subscriptions

    with db.write() as conn:
        conn.execute(insert(webhook_subscriptions).values(
            name="ops", kind="generic", url="http://example.invalid/hook", secret=None,
            filters={"weekly_report": True}, enabled=True, created_at=NOW))  # fmt: skip
    job = WeeklyReportJob(db, settings, XidCatalog.load())
    when = START + timedelta(days=7, hours=settings.report_delay_h + 1)
    assert job(when) == WEEK
    WeeklyReportJob(db, settings, XidCatalog.load())(when)  # a restarted worker: no duplicate
    with db.read() as conn:
        rows = conn.execute(select(webhook_outbox.c.idempotency_key)).scalars().all()
    assert len(rows) == 1 and WEEK in rows[0]


def test_a_restarted_worker_does_not_rebuild_a_report_every_subscriber_has(
    db: Database, settings: ServerSettings, fleet_rows: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy import insert

    from fleetwatch.server.db.tables import webhook_subscriptions
    from fleetwatch.server.tell import weekly_report as schedule

    when = START + timedelta(days=7, hours=settings.report_delay_h + 1)
    builds: list[str] = []
    real = schedule.compute_weekly

    def counting(*args: Any, **kwargs: Any) -> Any:
        builds.append("built")
        return real(*args, **kwargs)

    monkeypatch.setattr(schedule, "compute_weekly", counting)
    WeeklyReportJob(db, settings, XidCatalog.load())(when)  # nobody subscribed: nothing built
    assert builds == []
    with db.write() as conn:
        conn.execute(insert(webhook_subscriptions).values(
            name="ops", kind="generic", url="http://example.invalid/hook", secret=None,
            filters={"weekly_report": True}, enabled=True, created_at=NOW))  # fmt: skip
    WeeklyReportJob(db, settings, XidCatalog.load())(when)
    WeeklyReportJob(db, settings, XidCatalog.load())(when)  # restarted: the week is queued
    assert builds == ["built"]


def test_weekly_job_queues_for_a_subscription_added_later_that_week(
    db: Database, settings: ServerSettings, fleet_rows: Any
) -> None:
    """The same job instance (one leader all along) does what a new leader would: the outbox,
    not the job's memory, says who still waits for the week."""
    from sqlalchemy import insert, select

    from fleetwatch.server.db.tables import webhook_outbox, webhook_subscriptions

    job = WeeklyReportJob(db, settings, XidCatalog.load())
    when = START + timedelta(days=7, hours=settings.report_delay_h + 1)
    assert job(when) is None  # nobody subscribed: nothing built, nothing queued
    with db.write() as conn:
        conn.execute(insert(webhook_subscriptions).values(
            name="late", kind="generic", url="http://example.invalid/hook", secret=None,
            filters={"weekly_report": True}, enabled=True, created_at=NOW))  # fmt: skip
    assert job(when + timedelta(days=2)) == WEEK
    assert job(when + timedelta(days=2, minutes=10)) is None  # queued once
    with db.read() as conn:
        keys = conn.execute(select(webhook_outbox.c.idempotency_key)).scalars().all()
    assert len(keys) == 1 and WEEK in keys[0]


def test_the_report_draws_the_fleet_at_the_weeks_end_and_says_what_to_do_per_table(
    built: WeeklyReport,
) -> None:
    import base64
    import re

    # n2: its GPU SN-n2-1 failed on the 28th with no replacement (and a rule drain on the 29th,
    # not returned): a failed GPU outranks the drain. n1's failed GPU was replaced on the 25th
    # and its drain returned; n3's drain returned the same day.
    assert {s["node"]: s["state"] for s in built.fleet_states or []} == {
        "n1": "healthy",
        "n2": "out",
        "n3": "healthy",
    }
    days = built.days or []
    assert len(days) == 28 and days[-1]["day"] == "2026-11-29"  # the week's Sunday
    week = [d for d in days if d["day"] >= "2026-11-23"]
    assert sum(d["failures"] for d in week) == 2  # SN-n1-0 on the 24th, SN-n2-1 on the 28th
    html = render_html(built)
    images = dict(
        re.findall(r'<img src="data:image/svg\+xml;base64,([^"]+)" alt="([^"]+)"', html)[::-1]
    )
    assert len(images) == 3, images.keys()
    fleet_map = base64.b64decode(next(k for k, v in images.items() if v.startswith("Fleet map")))
    assert b'data-state="out"' in fleet_map and b'data-node="n2"' in fleet_map
    todo = re.findall(r'<p class="todo">([^<]*)</p>', html)
    assert len(todo) == 13 and all(line.strip() for line in todo)
    assert "n2" in todo[0]  # the fleet's line names the node that ended the week out
