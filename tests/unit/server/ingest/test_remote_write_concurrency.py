"""Remote-write requests racing on PostgreSQL: four threads send the pieces of the same scrapes
in different orders, each piece twice (Prometheus' shards, its retries and a second sender at
once). Every GPU scrape is stored as exactly one sample holding every field of the page, and no
request fails (a deadlock would surface as an error here)."""

from __future__ import annotations

import random
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from tests.stored_samples import stored_samples

from fleetwatch.agent.parsers.dcgm_exporter import parse_dcgm_exporter
from fleetwatch.config import ServerSettings
from fleetwatch.remote_write.exposition import scrape_series
from fleetwatch.server.db.session import Database
from fleetwatch.server.ingest.remote_write_readings import limits_for, read_request
from fleetwatch.server.ingest.remote_write_store import store_request
from fleetwatch.server.upkeep.remote_write_seal import RemoteWriteSealer

PAGE = (
    Path(__file__).resolve().parents[4]
    / "../shared/fixtures/dcgm_exporter/metrics/datadog__dcgm_tests_fixtures_metrics.txt"
)
SCRAPES = 3
SENDERS = 4


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
@pytest.mark.postgres
def test_racing_pieces_of_the_same_scrapes_are_stored_once_and_whole(
    db: Database, settings: ServerSettings
) -> None:
    page = PAGE.read_text()
    now = datetime.now(UTC).replace(microsecond=0)
    start = now - timedelta(minutes=1)
    series = [
        one
        for i in range(SCRAPES)
        for one in scrape_series(page, int((start + timedelta(seconds=15 * i)).timestamp() * 1000))
    ]
    rng = random.Random(38)
    plans = []
    for _ in range(SENDERS):  # each sender: every series, shuffled, in requests of 7
        order = series[:]
        rng.shuffle(order)
        plans.append([order[i : i + 7] for i in range(0, len(order), 7)])
    barrier = threading.Barrier(SENDERS)
    errors: list[BaseException] = []

    def send(requests: list[list[object]]) -> None:
        barrier.wait(timeout=60)
        try:
            for request in requests:
                readings = read_request(request, limits_for(settings, now))  # type: ignore[arg-type]
                store_request(db, readings, settings, now)
        except BaseException as exc:  # reported below, with the others
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(plan,)) for plan in plans]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    clock = iter([now, now + timedelta(minutes=5)])
    assert RemoteWriteSealer(db, settings, clock=lambda: next(clock)).run_once() > 0
    expected = {r.identity["uuid"]: r.values for r in parse_dcgm_exporter(page) if r.values}
    with db.read() as conn:
        samples = stored_samples(conn)
    assert sorted((s["gpu_uuid"], s["ts"]) for s in samples) == sorted(
        (uuid, start + timedelta(seconds=15 * i)) for uuid in expected for i in range(SCRAPES)
    )
    for sample in samples:
        assert {k: sample[k] for k in expected[sample["gpu_uuid"]]} == pytest.approx(
            expected[sample["gpu_uuid"]]
        )
