"""A push whose samples go to the DEFAULT partition while the retention job creates their day's
partition is stored, in that day's partition, on real PostgreSQL (day partitions exist there
only).

CI failed two live tests with a 500 this way: the retention tests leave the worker's database
without today's partition, and the next live server's retention pass created it while the test
pushed. A COPY that started before the creation committed routed by the older partition list and
PostgreSQL refused its rows ("violates partition constraint"). The test holds a creation open,
sends the push, waits until the push's connection waits on a lock, then commits the creation.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import text
from tests.conftest import _truncate
from tests.factories import make_batch

from fleetwatch.config import ServerSettings
from fleetwatch.server.db import partitions
from fleetwatch.server.db.session import Database, make_engine
from fleetwatch.server.ingest.store import store_batch
from fleetwatch.telemetry import Batch

pytestmark = pytest.mark.postgres

WAIT_S = 60.0  # generous: a loaded 2-core CI


@pytest.fixture
def without_day_partitions(migrated_postgres_url: str) -> Iterator[Database]:
    """The worker's database with no day partition (rows go to DEFAULT); its days put back."""
    _truncate(migrated_postgres_url)
    db = Database(make_engine(ServerSettings(database_url=migrated_postgres_url)))
    with db.write() as conn:
        days = partitions.list_partitions(conn).days
        for day in days:
            partitions.drop_day(conn, day)
    yield db
    with db.write() as conn:
        have = set(partitions.list_partitions(conn).days)
    for day in (d for d in days if d not in have):
        with db.write() as conn:
            partitions.create_day(conn, day)
    db.dispose()


def _waiting_on_a_lock(db: Database) -> bool:
    with db.read() as conn:
        found = conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            )
        ).scalar_one()
    return bool(found)


def test_a_push_during_its_days_creation_is_stored_in_that_day(
    without_day_partitions: Database,
) -> None:
    db = without_day_partitions
    today = datetime.now(UTC).date()
    raw = make_batch("node-race", gpus=2, ticks=3)
    body = json.dumps(raw).encode()
    batch = Batch.model_validate_json(body)
    failures: list[BaseException] = []

    def push() -> None:
        try:
            digest = hashlib.sha256(body).hexdigest()
            store_batch(db, batch, content_sha256=digest, now=datetime.now(UTC))
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            failures.append(exc)

    with db.engine.connect() as creator:
        creation = creator.begin()
        partitions.create_day(creator, today)  # holds the DEFAULT partition until its commit
        pusher = threading.Thread(target=push)
        pusher.start()
        deadline = time.monotonic() + WAIT_S
        while not _waiting_on_a_lock(db):
            assert pusher.is_alive() and time.monotonic() < deadline, failures
            time.sleep(0.02)
        creation.commit()
    pusher.join(WAIT_S)
    assert not pusher.is_alive()
    assert failures == []
    with db.read() as conn:
        stored = conn.execute(
            text(f"SELECT count(*), sum(n) FROM {partitions.partition_name(today)}")
        ).one()
        in_default = partitions.default_rows(conn)
    assert tuple(stored) == (2, 6) and in_default == 0  # a block per GPU, 3 ticks each
