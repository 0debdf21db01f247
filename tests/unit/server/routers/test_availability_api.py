"""GET /v1/availability: figures from stored drains, GPU failures, jobs and maintenance windows,
checked by hand; validation of since, until and by."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert
from tests.conftest import bearer

from fleetwatch.reports.availability import compute_availability
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import evictions, gpu_lifetimes, gpus, nodes
from fleetwatch.server.metrics import availability_exposition
from fleetwatch.server.metrics.availability_exposition import PERIOD, AvailabilityExposition
from fleetwatch.server.repo.availability_rows import load_period, sla_targets

T0 = datetime(2026, 11, 2, tzinfo=UTC)  # the period: 100 hours from here
H = timedelta(hours=1)
QUERY = {"since": T0.isoformat(), "until": (T0 + 100 * H).isoformat()}


def _fleet(db: Database) -> None:
    with db.write() as conn:
        for i, (name, rack) in enumerate([("n1", "r1"), ("n2", "r1"), ("n3", "r2")], start=1):
            seen = {"first_seen": T0 - 30 * 24 * H, "last_seen": T0 + 99 * H}
            conn.execute(
                insert(nodes).values(id=i, name=name, labels={"rack": rack}, interval_s=10, **seen)
            )
            sku = "H100" if i < 3 else "H200"
            conn.execute(insert(gpus).values(uuid=f"GPU-{i}", node_id=i, index=0, name=sku, **seen))
        # n1: drained 10 h .. 14 h (4 h down)
        conn.execute(insert(evictions).values(node="n1", state="returned", reason_kind="rule",
                     reason="Xid 79", dry_run=False, created_at=T0 + 10 * H, updated_at=T0,
                     completed_at=T0 + 10 * H, returned_at=T0 + 14 * H))  # fmt: skip
        # a dry run is not downtime
        conn.execute(insert(evictions).values(node="n2", state="recommended", reason_kind="risk",
                     reason="risk", dry_run=True, created_at=T0 + 20 * H, updated_at=T0,
                     completed_at=T0 + 20 * H))  # fmt: skip
        # n3: GPU failed at 50 h, slot refilled at 56 h (6 h down)
        for serial, installed, removed, kind in [
            ("A", T0 - 900 * H, T0 + 50 * H, "failure"),
            ("B", T0 + 56 * H, None, None),
        ]:
            conn.execute(insert(gpu_lifetimes).values(serial=serial, node_id=3, location="n3/0",
                         sku="H200", installed_at=installed, removed_at=removed, end_kind=kind,
                         source="observed"))  # fmt: skip


def _jobs(client: TestClient, agent: dict[str, str]) -> None:
    def post(job: str, what: str, body: dict[str, Any]) -> None:
        assert client.post(f"/v1/jobs/{job}/{what}", json=body, headers=agent).status_code == 200

    # A 4-rank job on n3 from 40 h, failed at 50 h 10 min: interrupted by the GPU failure.
    post("a", "start", {"started_at": (T0 + 40 * H).isoformat(), "nodes": ["n3"], "ranks": 4})
    post("a", "checkpoints", {"started_at": (T0 + 45 * H).isoformat(), "duration_s": 900})
    post("a", "end", {"outcome": "failed", "ended_at": (T0 + 50 * H + H / 6)
                      .isoformat()})  # fmt: skip
    # A 2-rank job on n1 from 60 h to 70 h, completed; restarted once (20 min down, 10 min redone).
    post("b", "start", {"started_at": (T0 + 60 * H).isoformat(), "nodes": ["n1"], "ranks": 2})
    post("b", "restarts", {"resumed_at": (T0 + 62 * H).isoformat(), "lost_s": 600,
                           "interrupted_at": (T0 + 62 * H - H / 3).isoformat()})  # fmt: skip
    post("b", "end", {"outcome": "completed", "ended_at": (T0 + 70 * H).isoformat()})


def test_availability_figures_from_stored_rows(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    _fleet(db)
    _jobs(client, bearer(tokens["agent"]))
    response = client.get("/v1/availability", params={**QUERY, "by": ["rack", "sku"]},
                          headers=bearer(tokens["read"]))  # fmt: skip
    assert response.status_code == 200, response.text
    out = response.json()
    fleet = out["fleet"]
    assert fleet["node_hours"] == 300
    assert fleet["unplanned_down_h"] == pytest.approx(10)
    assert fleet["planned_known"] is True and fleet["planned_down_h"] == 0  # no window: 0 h
    assert fleet["infrastructure_availability"] == pytest.approx(290 / 300)
    assert fleet["failures"] == 2 and fleet["mttr_h"] == pytest.approx(5)
    assert fleet["mtbf_h"] == pytest.approx(145)
    assert out["by"]["rack"]["r1"]["unplanned_down_h"] == pytest.approx(4)
    assert out["by"]["sku"]["H200"]["mttr_h"] == pytest.approx(6)
    jobs = out["jobs"]
    assert (jobs["completed"], jobs["failed"], jobs["interrupted_by_hardware"]) == (1, 1, 1)
    assert jobs["success_rate"] == 0.5
    gp = out["goodput"]
    assert gp["scheduled_gpu_h"] == pytest.approx(4 * (10 + 1 / 6) + 2 * 10)
    assert gp["checkpoint_gpu_h"] == pytest.approx(4 * 0.25)
    assert gp["restart_gpu_h"] == pytest.approx(2 * (1 / 3 + 1 / 6))
    resumed = out["time_to_recover"]["job_resumed"]
    assert resumed["count"] == 1 and resumed["mean_min"] == pytest.approx(20)
    assert out["time_to_recover"]["node_back"]["mean_min"] == pytest.approx(300)
    assert out["sla"]["recovery_basis"] == "job_resumed"
    assert out["sla"]["recovery_met"] is False  # 20 min > 15 min
    assert out["sla"]["availability_met"] is False  # 0.967 < 0.99


def test_availability_counts_maintenance_windows_as_planned(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    """n2 in a maintenance window from 30 h to 40 h, opened through /v1/maintenance; a window
    after the period and one on another rack's selector outside it change nothing."""
    _fleet(db)
    scheduler = bearer(tokens["scheduler"])
    for body in (
        {"nodes": ["n2"], "starts_at": (T0 + 30 * H).isoformat(),
         "ends_at": (T0 + 40 * H).isoformat(), "reason": "firmware"},
        {"nodes": ["n1"], "starts_at": (T0 + 120 * H).isoformat(),
         "ends_at": (T0 + 130 * H).isoformat(), "reason": "later"},
    ):  # fmt: skip
        response = client.post("/v1/maintenance", json=body, headers=scheduler)
        assert response.status_code in (200, 201), response.text
    fleet = client.get("/v1/availability", params=QUERY, headers=bearer(tokens["read"])).json()[
        "fleet"
    ]
    assert fleet["planned_known"] is True and fleet["planned_down_h"] == pytest.approx(10)
    assert fleet["planned_unplanned_ratio"] == pytest.approx(1.0)
    assert fleet["infrastructure_availability"] == pytest.approx(280 / 300)
    assert fleet["workload_availability"] == pytest.approx(280 / 290)


@pytest.mark.parametrize(
    ("params", "loc"),
    [
        ({"since": "2026-11-02T00:00:00Z", "until": "2026-11-01T00:00:00Z"}, ["query", "since"]),
        ({"since": "last tuesday"}, ["query", "since"]),
        ({"since": "2000d"}, ["query", "since"]),
        ({"by": ["rack", "no spaces"]}, ["query", "by", 1]),
    ],
)
def test_availability_bad_query_is_422_naming_it(
    client: TestClient, tokens: dict[str, str], params: dict[str, Any], loc: list[Any]
) -> None:
    response = client.get("/v1/availability", params=params, headers=bearer(tokens["read"]))
    assert response.status_code == 422, response.text
    assert loc in [d["loc"] for d in response.json()["detail"]]


def test_availability_needs_a_read_token(client: TestClient, tokens: dict[str, str]) -> None:
    assert client.get("/v1/availability").status_code == 401
    assert client.get("/v1/availability", headers=bearer(tokens["agent"])).status_code == 403


def _samples(text: str) -> dict[str, float]:
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def test_availability_on_metrics_matches_the_api(
    client: TestClient, db: Database, tokens: dict[str, str], settings: Any
) -> None:
    _fleet(db)
    _jobs(client, bearer(tokens["agent"]))
    end = T0 + 100 * H
    text = AvailabilityExposition(db, settings).render(now=end)
    query = {"since": (end - PERIOD).isoformat(), "until": end.isoformat()}
    api = client.get("/v1/availability", headers=bearer(tokens["read"]), params=query).json()
    got = _samples(text)
    fleet = api["fleet"]
    assert got['fleetwatch_fleet_availability_ratio{kind="infrastructure"}'] == pytest.approx(
        fleet["infrastructure_availability"], rel=1e-5
    )
    assert got['fleetwatch_fleet_downtime_hours{kind="unplanned"}'] == pytest.approx(10)
    assert got['fleetwatch_fleet_downtime_hours{kind="planned"}'] == 0  # no window: a known 0
    assert got["fleetwatch_jobs_success_ratio"] == 0.5
    assert got["fleetwatch_jobs_interrupted_by_hardware"] == 1
    assert got['fleetwatch_sla_met{target="recovery"}'] == 0
    assert got['fleetwatch_time_to_recover_minutes{to="job_resumed"}'] == pytest.approx(20)
    assert len(got) <= 20  # fleet-level only, whatever the fleet's size


def test_availability_families_are_on_the_default_metrics_page(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    _fleet(db)  # in the past: the last 7 days have three nodes up and no outage
    page = client.get("/metrics", headers=bearer(tokens["read"])).text
    assert "# TYPE fleetwatch_fleet_availability_ratio gauge" in page
    assert 'fleetwatch_fleet_downtime_hours{kind="unplanned"} 0' in page
    assert "fleetwatch_jobs_success_ratio " not in page  # no job ended: no sample


def test_fleet_figures_without_labels_equal_those_with_them(db: Database, settings: Any) -> None:
    _fleet(db)
    end = T0 + 100 * H
    with db.read() as conn:
        labelled = load_period(conn, end - PERIOD, end, settings=settings)
        bare = load_period(conn, end - PERIOD, end, settings=settings, with_labels=False)
    assert labelled.nodes == {
        "n1": {"rack": "r1", "sku": "H100"},
        "n2": {"rack": "r1", "sku": "H100"},
        "n3": {"rack": "r2", "sku": "H200"},
    }
    assert bare.nodes == {"n1": {}, "n2": {}, "n3": {}}
    assert bare.joined == labelled.joined
    targets = sla_targets(settings)
    assert compute_availability(bare, targets, by=()) == compute_availability(
        labelled, targets, by=()
    )


def test_a_nodes_sku_is_its_gpus_most_common_model(db: Database, settings: Any) -> None:
    _fleet(db)
    seen = {"first_seen": T0, "last_seen": T0}
    with db.write() as conn:  # n1: one H100 already, two H200 more; n2: an unnamed GPU more
        for i, name in enumerate(["H200", "H200"], start=1):
            conn.execute(insert(gpus).values(uuid=f"GPU-1-{i}", node_id=1, index=i, name=name,
                                             **seen))  # fmt: skip
        conn.execute(insert(gpus).values(uuid="GPU-2-1", node_id=2, index=1, name=None, **seen))
    end = T0 + 100 * H
    with db.read() as conn:
        period = load_period(conn, end - PERIOD, end, settings=settings)
    assert period.nodes["n1"]["sku"] == "H200"
    assert period.nodes["n2"]["sku"] == "H100"


class _Figures:
    """Stands in for the figures' computation: counts it, and can hold it until released."""

    def __init__(self) -> None:
        self.computed = 0
        self.release = threading.Event()
        self.release.set()

    def text(self, figures: dict[str, Any]) -> str:
        assert self.release.wait(timeout=60)
        self.computed += 1
        return f"# figures {self.computed}\n"


def test_stale_figures_are_served_while_a_thread_recomputes_them(
    db: Database, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fleet(db)
    figures = _Figures()
    monkeypatch.setattr(availability_exposition, "availability_text", figures.text)
    clock = [1000.0]
    exposition = AvailabilityExposition(db, settings, refresh_s=300.0, clock=lambda: clock[0])
    assert exposition.render() == "# figures 1\n"  # the first render computes
    clock[0] += 299.0
    assert exposition.render() == "# figures 1\n"
    assert figures.computed == 1  # fresh: not computed again
    clock[0] += 1.0
    figures.release.clear()  # the recomputation waits until the test lets it go
    served: list[str] = []
    scrape = threading.Thread(target=lambda: served.append(exposition.render()))
    scrape.start()
    scrape.join(timeout=60)
    assert not scrape.is_alive() and served == ["# figures 1\n"]  # served without waiting
    assert exposition.render() == "# figures 1\n"  # one recomputation at a time
    figures.release.set()
    running = exposition._background
    assert running is not None
    running.join(timeout=60)
    assert figures.computed == 2
    assert exposition.render() == "# figures 2\n"


def test_refresh_computes_ahead_of_the_first_render(db: Database, settings: Any) -> None:
    _fleet(db)
    clock = [0.0]
    exposition = AvailabilityExposition(db, settings, refresh_s=300.0, clock=lambda: clock[0])
    assert exposition.is_stale()
    text = exposition.refresh(now=T0 + 100 * H)
    assert not exposition.is_stale()
    assert exposition.render() is text  # no second computation
    assert "fleetwatch_fleet_availability_ratio" in text
