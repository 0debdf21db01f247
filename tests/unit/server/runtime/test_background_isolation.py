"""Nothing a client sends can break a background job for everyone (issue 10, item 1).

On SQLite and PostgreSQL: the longest values ingest accepts go through every background pass,
and one item that fails (a row the database refuses, a bug hit by one node) is logged, counted on
/metrics and skipped while the rest of the fleet is still judged, drained and paged.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from tests.conftest import bearer
from tests.factories import make_batch, make_gpu, make_sample
from tests.unit.server.conftest import Push

from fleetwatch.rules.overrides import load_rules
from fleetwatch.server.act import planner
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import alerts, evictions, gpu_lifetimes, webhook_outbox
from fleetwatch.server.judge.judging import FleetJudge
from fleetwatch.server.repo.jobs import load_detector
from fleetwatch.server.repo.webhooks import enqueue
from fleetwatch.server.runtime.isolation import ItemGuard
from fleetwatch.server.runtime.scheduler import Waker, periodic
from fleetwatch.server.tell import alerting
from fleetwatch.server.tell.conditions import Condition
from fleetwatch.server.tell.outbox import OutboxWorker
from fleetwatch.server.upkeep.lifecycle import run_lifecycle
from fleetwatch.server.upkeep.rollups import RollupJob

# The longest values the wire accepts (tests/unit/server/db/test_column_lengths.py probes them).
LONG_NODE = "n" + "x" * 252  # 253
LONG_UUID = "GPU-" + "a" * 120  # 124
LONG_CLUSTER = "c" * 256


def _long_node_batch() -> dict[str, Any]:
    """A node with the longest name, GPU UUID and cluster label, and a GPU without a serial,
    that reports every second: three seconds of silence make it unreachable."""
    gpu = make_gpu(LONG_NODE, 0, uuid=LONG_UUID, serial=None, pci_bus_id="ffff:ff:1f.7")
    batch = make_batch(LONG_NODE, gpus=0, interval_s=1.0, labels={"cluster": LONG_CLUSTER})
    batch["gpus"] = [gpu]
    batch["samples"] = [make_sample(LONG_UUID, datetime.now(UTC) - timedelta(seconds=1))]
    return batch


def _xid79(node: str) -> dict[str, Any]:
    batch = make_batch(node, gpus=2)
    pci = batch["gpus"][0]["pci_bus_id"]
    batch["events"] = [
        {
            "kind": "xid",
            "ts": datetime.now(UTC).isoformat(),
            "xid": 79,
            "pci_bus_id": pci,
            "message": f"NVRM: Xid (PCI:{pci}): 79, GPU has fallen off the bus.",
        }
    ]
    return batch


def _state(client: TestClient) -> Any:
    return client.app.state  # type: ignore[attr-defined]


def _passes(client: TestClient, now: datetime) -> None:
    """One round of every pass that judges, drains and pages, as the background loop runs them."""
    state = _state(client)
    state.assessor.run_once(now)
    state.planner.run_once(now)
    state.alerter.run_once(now)


def _firing(db: Database) -> dict[str, Any]:
    with db.read() as conn:
        rows = conn.execute(select(alerts).where(alerts.c.state == "firing"))
        return {row.dedup_key: row for row in rows}


def _evicted(db: Database) -> set[str]:
    with db.read() as conn:
        return set(conn.execute(select(evictions.c.node)).scalars())


def _metric(client: TestClient, tokens: dict[str, str], name: str, job: str) -> float:
    text = client.get("/metrics", headers=bearer(tokens["read"])).text
    line = f'{name}{{job="{job}"}} '
    [value] = [row[len(line) :] for row in text.splitlines() if row.startswith(line)]
    return float(value)


def test_longest_node_goes_unreachable_and_an_xid_79_elsewhere_still_drains_and_pages(
    client: TestClient, db: Database, push: Push, tokens: dict[str, str]
) -> None:
    """The issue's reproduction: a 253-character node name falls silent (its alert key is 270
    characters) while another node reports a fatal Xid 79."""
    assert push(_long_node_batch()).status_code == 200, "ingest accepts the longest values"
    assert push(_xid79("node-b")).status_code == 200
    now = datetime.now(UTC) + timedelta(seconds=10)  # the long node is 3+ intervals silent
    for _ in range(2):  # a second round finds both still firing, nothing new
        _passes(client, now)
    firing = _firing(db)
    unreachable = firing[f"node:{LONG_NODE}:unreachable"]
    assert (unreachable.kind, unreachable.node, unreachable.cluster) == (
        "unreachable",
        LONG_NODE,
        LONG_CLUSTER,
    )
    assert unreachable.occurrences == 2
    xid = [row for row in firing.values() if row.node == "node-b" and row.kind == "xid"]
    assert [row.severity for row in xid] == ["fatal"]
    assert _evicted(db) == {LONG_NODE, "node-b"}
    # Lifetimes and rollups take the longest values too: the serial key of a GPU without a
    # serial is its UUID, its location node/slot (266 characters).
    settings = _state(client).settings
    catalog, _ = load_rules(settings.rules_file)
    run_lifecycle(db, settings, catalog, now=now)
    RollupJob(db, catalog)(now=now)
    with db.read() as conn:
        lifetime = conn.execute(
            select(gpu_lifetimes).where(gpu_lifetimes.c.gpu_uuid == LONG_UUID)
        ).one()
    assert (lifetime.serial, lifetime.location) == (LONG_UUID, f"{LONG_NODE}/ffff:ff:1f.7")
    for job in ("assessment", "planner", "alerts"):
        assert _metric(client, tokens, "fleetwatch_background_item_errors_total", job) == 0.0


def test_a_row_the_database_refuses_costs_one_alert_not_all(
    client: TestClient,
    db: Database,
    push: Push,
    tokens: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A condition whose alert row violates NOT NULL (a real database error: on PostgreSQL it
    aborts the transaction) is rolled back alone; the Xid 79 on another node still pages."""
    real = alerting.derive_conditions
    summary: list[str | None] = [None]

    def with_a_bad_one(*args: Any, **kwargs: Any) -> dict[str, Condition]:
        found = real(*args, **kwargs)
        bad = Condition("gpu:GPU-bad:poison", "xid", "critical", summary[0], None, {})  # type: ignore[arg-type]
        return {bad.dedup_key: bad, **found}  # first, so the group fails before the good ones

    monkeypatch.setattr(alerting, "derive_conditions", with_a_bad_one)
    assert push(_xid79("node-b")).status_code == 200
    caplog.set_level(logging.INFO, logger="fleetwatch.server.runtime.isolation")
    for _ in range(3):
        _passes(client, datetime.now(UTC))
    firing = _firing(db)
    assert "gpu:GPU-bad:poison" not in firing
    assert [row.kind for row in firing.values() if row.node == "node-b"] == ["xid"]
    assert _metric(client, tokens, "fleetwatch_background_item_errors_total", "alerts") == 3.0
    logged = [r for r in caplog.records if "gpu:GPU-bad:poison" in r.getMessage()]
    assert len(logged) == 1, "logged once while it keeps failing, not every pass"
    assert logged[0].exc_info is not None, "with its traceback"
    summary[0] = "now a proper alert"
    _passes(client, datetime.now(UTC))
    assert "gpu:GPU-bad:poison" in _firing(db)
    assert any(
        "recovered" in r.getMessage() and "GPU-bad" in r.getMessage() for r in caplog.records
    )


def test_one_failing_node_in_the_planner_and_the_judge_leaves_the_others_drained(
    client: TestClient,
    db: Database,
    push: Push,
    tokens: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_create, real_judge = planner.create_eviction, FleetJudge._judge_node

    def create(conn: Any, **kwargs: Any) -> int:
        if kwargs["node"] == "node-c":
            raise RuntimeError("node-c cannot be drained")
        return real_create(conn, **kwargs)

    def judge(self: FleetJudge, members: Any, *args: Any) -> None:
        if any(g.uuid == make_gpu("node-d", 0)["uuid"] for g in members):
            raise ZeroDivisionError("node-d's readings trip a rule up")
        real_judge(self, members, *args)

    monkeypatch.setattr(planner, "create_eviction", create)
    monkeypatch.setattr(FleetJudge, "_judge_node", judge)
    settings = _state(client).settings
    monkeypatch.setattr(settings, "drain_budget_pct", 100.0)
    for node in ("node-b", "node-c", "node-d"):
        assert push(_xid79(node)).status_code == 200
    _passes(client, datetime.now(UTC))
    assert _evicted(db) == {"node-b"}
    firing = _firing(db)
    # node-d went unjudged: no verdict of its Xid, but an alert that says so (issue 35).
    unjudged = firing.pop("node:node-d:unjudged_evidence")
    assert unjudged.kind == "unreadable_evidence" and unjudged.severity == "warning"
    assert "ZeroDivisionError: node-d's readings trip a rule up" in unjudged.summary
    assert {row.node for row in firing.values()} == {"node-b", "node-c"}
    assert _metric(client, tokens, "fleetwatch_background_item_errors_total", "planner") == 1.0
    assert _metric(client, tokens, "fleetwatch_background_item_errors_total", "assessment") == 1.0


def test_one_delivery_that_cannot_render_does_not_hold_up_the_others(
    client: TestClient, db: Database, tokens: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetwatch.server.tell import outbox

    made = client.post(
        "/v1/webhooks",
        json={"name": "ops", "kind": "generic", "url": "http://receiver.test/hook"},
        headers=bearer(tokens["admin"]),
    )
    assert made.status_code == 201, made.text
    now = datetime.now(UTC)
    with db.write() as conn:
        ids = [
            enqueue(
                conn,
                subscription_id=made.json()["id"],
                alert_id=None,
                event="trigger",
                key=f"k{i}",
                payload={"alerts": [], "n": i},
                now=now,
            )  # fmt: skip
            for i in range(3)
        ]
    real_render = outbox.render

    def render(**kwargs: Any) -> Any:
        if kwargs["idempotency_key"] == "k1":
            raise KeyError("alerts")
        return real_render(**kwargs)

    monkeypatch.setattr(outbox, "render", render)
    # The receiver answers with a NUL in its body: PostgreSQL text refuses NUL, the error is kept.
    receiver = httpx.MockTransport(lambda request: httpx.Response(500, text="bad\x00body"))
    worker = OutboxWorker(
        db, _state(client).settings, client=httpx.Client(transport=receiver), rng=lambda: 0.5,
        guard=ItemGuard("webhooks"),
    )  # fmt: skip
    result = worker.run_once(now)
    assert (result.claimed, result.retried, worker.guard.errors) == (3, 3, 1)
    with db.read() as conn:
        rows = {r.id: r for r in conn.execute(select(webhook_outbox))}
    assert rows[ids[1]].last_error == "KeyError: 'alerts'"  # type: ignore[index]
    assert rows[ids[0]].last_error == "HTTP 500: bad\\x00body"  # type: ignore[index]
    assert all(r.attempts == 1 and r.state == "pending" for r in rows.values())


def test_a_failing_pass_is_counted_and_retried() -> None:
    class Count:
        value = 0

        def inc(self, amount: float = 1) -> None:
            self.value += int(amount)

    failures = Count()

    def job() -> None:
        raise RuntimeError("the database is gone")

    async def run() -> None:
        task = asyncio.create_task(periodic("doomed", 0.01, job, failures=failures))
        async with asyncio.timeout(60):
            while failures.value < 3:
                await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(run())
    assert failures.value >= 3


@pytest.mark.parametrize("turns", [0, 1])
def test_a_wait_cancelled_as_its_wake_lands_stays_cancelled(turns: int) -> None:
    """The server's shutdown cancels each job's task; a wake landing in the same turn of the
    event loop must not swallow that cancellation (Python 3.11's ``wait_for`` did, and the job
    then outlived the shutdown, which waited for it for ever)."""

    async def run() -> bool:
        waker = Waker()
        waker.bind()
        task = asyncio.create_task(waker.wait(60))
        await asyncio.sleep(0)
        waker.poke()
        for _ in range(turns):
            await asyncio.sleep(0)
        assert not task.done()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return True
        return False

    assert asyncio.run(run()), "the cancellation was swallowed"


def test_completed_passes_are_timed_and_failed_ones_are_not() -> None:
    """Each completed pass's wall time reaches ``durations`` once; a failing pass only counts
    as a failure (its time would flatter the job)."""

    class Count:
        value = 0

        def inc(self, amount: float = 1) -> None:
            self.value += int(amount)

    class Timings:
        def __init__(self) -> None:
            self.seen: list[float] = []

        def observe(self, amount: float) -> None:
            self.seen.append(amount)

    runs, failures, durations = Count(), Count(), Timings()
    calls = 0

    def job() -> None:
        nonlocal calls
        calls += 1
        if calls % 2 == 0:
            raise RuntimeError("every second pass fails")

    async def run() -> None:
        task = asyncio.create_task(
            periodic("timed", 0.01, job, failures=failures, runs=runs, durations=durations)
        )
        async with asyncio.timeout(60):
            while runs.value < 3 or failures.value < 3:
                await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(run())
    assert len(durations.seen) == runs.value
    assert all(seconds >= 0 for seconds in durations.seen)


def test_item_guard_writes_the_good_rows_and_isolates_a_known_bad_one_up_front(
    db: Database,
) -> None:
    """``each`` and ``many`` against a real NOT NULL constraint: the good rows land, the bad one
    is counted every pass, and once known it runs alone so the group no longer fails."""
    from sqlalchemy import func, insert

    guard = ItemGuard("test")
    now = datetime.now(UTC)

    def row(key: str, summary: str | None) -> dict[str, Any]:
        fixed = {"state": "firing", "kind": "xid", "severity": "fatal", "occurrences": 1}
        return {"dedup_key": key, "summary": summary, "started_at": now, "updated_at": now, **fixed}

    groups: list[int] = []

    def write(rows: list[dict[str, Any]]) -> None:
        groups.append(len(rows))
        conn.execute(insert(alerts), rows)

    for n in range(2):
        rows = [row(f"k{n}-{i}", None if i == 1 else "ok") for i in range(4)]
        with db.write() as conn:
            assert guard.many(conn, rows, write, ident=lambda r: r["dedup_key"][3:]) == 3
            keys = [f"e{n}{key}" for key in "abc"]
            made = guard.each(conn, keys, lambda key: write([row(key, key)]))
            assert [key for key, _ in made] == keys
    with db.read() as conn:
        assert conn.execute(select(func.count()).select_from(alerts)).scalar_one() == 12
    assert guard.errors == 2 and guard.failing == {"1"}
    # First pass: the group of 4 fails, then 4 singles; second: the 3 good ones, the bad one apart.
    assert groups[:5] == [4, 1, 1, 1, 1] and groups[8:10] == [3, 1]


def test_one_failing_job_does_not_stop_the_straggler_pass(
    client: TestClient, tokens: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetwatch.server.judge.straggler_detector import StragglerDetector

    start = datetime.now(UTC) - timedelta(minutes=10)
    for job in ("job-bad", "job-good"):
        steps = [
            {"rank": r, "node": f"n{r}", "step": k, "duration_ms": 1000.0,
             "ts": (start + timedelta(seconds=k)).isoformat()}
            for k in range(0, 540, 10)
            for r in range(4)
        ]  # fmt: skip
        response = client.post(
            f"/v1/jobs/{job}/steps", json={"steps": steps}, headers=bearer(tokens["agent"])
        )
        assert response.status_code == 200, response.text
    real = StragglerDetector._run_job
    judged: dict[str, int] = {}

    def run_job(self: StragglerDetector, conn: Any, job: Any, *args: Any) -> int:
        judged[job.job_id] = real(self, conn, job, *args)
        if job.job_id == "job-bad":  # judged and its state written, then it fails
            raise ValueError("a step the detector cannot judge")
        return judged[job.job_id]

    monkeypatch.setattr(StragglerDetector, "_run_job", run_job)
    detector = _state(client).stragglers
    detector.run_once()
    assert judged["job-good"] > 0 and judged["job-bad"] > 0
    with _state(client).db.read() as conn:
        assert load_detector(conn, "job-good") is not None, "the good job's windows were judged"
        assert load_detector(conn, "job-bad") is None, "rolled back: judged again next pass"
    assert _metric(client, tokens, "fleetwatch_background_item_errors_total", "stragglers") == 1.0
