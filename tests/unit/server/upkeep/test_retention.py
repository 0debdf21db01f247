"""The retention pass: raw samples and rollups age out, nothing within retention is lost, disk
stays flat, on SQLite (chunked deletes) and PostgreSQL (day partitions dropped whole)."""

from __future__ import annotations

import hashlib
import json
import uuid as uuidlib
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import insert, select, text
from tests.conftest import bearer
from tests.factories import make_batch
from tests.stored_samples import stored_samples

from fleetwatch.config import ServerSettings, load_server_settings
from fleetwatch.errors import ConfigError
from fleetwatch.server.db import partitions
from fleetwatch.server.db.migrate import upgrade
from fleetwatch.server.db.session import Database, make_engine
from fleetwatch.server.db.tables import gpu_hourly, ingest_batches
from fleetwatch.server.ingest.sample_writer import write_sample_rows
from fleetwatch.server.ingest.store import store_batch
from fleetwatch.server.repo.sample_reader import count_samples, read_samples, to_us
from fleetwatch.server.upkeep.retention import RetentionJob
from fleetwatch.telemetry import Batch

NOW = datetime(2026, 6, 15, 12, tzinfo=UTC)
RAW = timedelta(days=14)
CUTOFF = NOW - RAW  # 2026-06-01 12:00
US = timedelta(microseconds=1)


@pytest.fixture
def storage(database_url: str) -> Iterator[Database]:
    """A migrated database with no day partitions (PostgreSQL): rows land in DEFAULT until a
    retention pass creates their days, as on a server that was down for long."""
    db = Database(make_engine(ServerSettings(database_url=database_url)))
    upgrade(db.engine)
    if not db.is_sqlite:
        with db.write() as conn:
            for day in partitions.list_partitions(conn).days:
                partitions.drop_day(conn, day)
    yield db
    db.dispose()


def _store(db: Database, stamps: list[datetime], *, node: str = "node-a", gpus: int = 2) -> None:
    """One batch per stamp through the real ingest path, ``gpus`` samples each."""
    for ts in stamps:
        raw = make_batch(node, gpus=gpus, ticks=1, start=ts, batch_id=str(uuidlib.uuid4()))
        for i, sample in enumerate(raw["samples"]):
            sample["gpu_temp_c"] = 40.0 + i
        body = json.dumps(raw).encode()
        batch = Batch.model_validate_json(body)  # no limits: any time is taken
        digest = hashlib.sha256(body).hexdigest()
        store_batch(db, batch, content_sha256=digest, now=ts)


def _stamps(db: Database) -> list[datetime]:
    with db.read() as conn:
        return sorted({s["ts"] for s in stored_samples(conn)})


def _rows(db: Database) -> int:
    with db.read() as conn:
        return count_samples(conn)


def _where(db: Database) -> dict[str, int]:
    """Samples per partition (PostgreSQL)."""
    query = "SELECT tableoid::regclass::text, sum(n) FROM gpu_sample_blocks GROUP BY 1"
    with db.read() as conn:
        return {name: int(n) for name, n in conn.execute(text(query))}


def _job(db: Database, raw: timedelta = RAW, **kw: Any) -> RetentionJob:
    kw.setdefault("batch_id_retention", timedelta(days=31))
    return RetentionJob(db, raw_retention=raw, rollup_retention=timedelta(days=730), **kw)


def test_retention_keeps_every_row_at_or_after_the_cutoff(storage: Database) -> None:
    db = storage
    cutoff_day = CUTOFF.replace(hour=0)
    inside = [CUTOFF, CUTOFF + US, cutoff_day + timedelta(days=1), NOW, NOW + timedelta(days=2)]
    same_day_before = [cutoff_day, CUTOFF - US]  # the cutoff's day, before the cutoff
    outside = [cutoff_day - US, cutoff_day - timedelta(days=1), NOW - timedelta(days=45)]
    _store(db, inside + same_day_before + outside)  # on PostgreSQL all into DEFAULT
    assert _rows(db) == 2 * 10

    done = _job(db, chunk_rows=3)(NOW)

    assert done is not None
    kept = set(_stamps(db))
    assert set(inside) <= kept
    assert kept.isdisjoint(outside)
    if db.is_sqlite:
        # Row by row: exactly the rows before the cutoff went (3 + 2 stamps, 2 GPUs each), in
        # chunks of 3 rows.
        assert kept == set(inside)
        assert done.samples_deleted == 2 * 5
        return
    # PostgreSQL drops whole days: the cutoff's day stays until all of it is past.
    assert kept == set(inside + same_day_before)
    assert done.samples_deleted == 2 * 3  # the expired rows of DEFAULT
    assert done.moved == 2 * (len(inside) + len(same_day_before))
    assert set(done.created) == {date(2026, 6, d) for d in (1, 2, 15, 16, 17, 18)}
    assert _where(db) == {
        "gpu_sample_blocks_p20260601": 2 * 4,
        "gpu_sample_blocks_p20260602": 2,
        "gpu_sample_blocks_p20260615": 2,
        "gpu_sample_blocks_p20260617": 2,
    }
    assert done.default_rows == 0
    assert done.partitions == len(done.created) + 1

    # A day later the cutoff's day is wholly past: its partition goes, the next day's stays.
    later = _job(db)(NOW + timedelta(days=1))
    assert later is not None
    assert later.dropped == (date(2026, 6, 1),)
    assert set(_stamps(db)) == {cutoff_day + timedelta(days=1), NOW, NOW + timedelta(days=2)}
    assert later.created == (date(2026, 6, 19),)


def test_rows_keep_their_values_through_partition_moves(storage: Database) -> None:
    db = storage
    stamps = [NOW - timedelta(days=3), NOW]
    _store(db, stamps)
    _job(db)(NOW)
    with db.read() as conn:
        rows = sorted(stored_samples(conn), key=lambda s: (s["ts"], s["gpu_temp_c"]))
    assert [(r["ts"], r["gpu_temp_c"]) for r in rows] == [
        (ts, temp) for ts in stamps for temp in (40.0, 41.0)
    ]
    assert len({r["gpu_uuid"] for r in rows}) == 2


def test_a_block_goes_only_once_its_last_tick_is_past(storage: Database) -> None:
    """A block of six ticks across the cutoff stays whole (its later ticks are within
    retention). On SQLite it is deleted once its last tick is past the cutoff; on PostgreSQL its
    day's partition is dropped once the whole day is past."""
    db = storage
    _store(db, [NOW])  # registers node-a and its GPUs
    ticks = [CUTOFF - timedelta(seconds=30) + timedelta(seconds=10 * k) for k in range(6)]
    with db.write() as conn:
        write_sample_rows(
            conn, [{"gpu_id": 1, "node_id": 1, "ts": t, "gpu_temp_c": 50.0} for t in ticks]
        )
    before = _rows(db)
    done = _job(db)(NOW)
    assert done is not None and done.samples_deleted == 0
    assert _rows(db) == before
    with db.read() as conn:
        kept = {
            t for c in read_samples(conn, [], gpu_ids=[1], before=NOW) for t in c.ts_us.tolist()
        }
    assert {to_us(t) for t in ticks} <= kept
    if db.is_sqlite:
        later = _job(db)(ticks[-1] + RAW + US)  # now its last tick is past the cutoff
        assert later is not None and later.samples_deleted == 1  # one block
    else:
        still = _job(db)(ticks[-1] + RAW + US)  # the rest of its day is not past yet
        assert still is not None and still.dropped == () and _rows(db) == before
        day_after = CUTOFF.replace(hour=0) + timedelta(days=1)
        later = _job(db)(day_after + RAW + US)
        assert later is not None and later.dropped == (CUTOFF.date(),)
    assert _rows(db) == before - 6


def test_a_second_pass_changes_nothing(storage: Database) -> None:
    db = storage
    _store(db, [NOW - timedelta(days=20), NOW - timedelta(days=1), NOW])
    first = _job(db)(NOW)
    second = _job(db)(NOW)
    assert first is not None and second is not None
    assert (second.samples_deleted, second.created, second.dropped, second.moved) == (0, (), (), 0)
    assert _rows(db) == 4


def test_ingest_after_the_days_ahead_lands_in_default_and_moves_later(storage: Database) -> None:
    if storage.is_sqlite:
        pytest.skip("PostgreSQL partitions")
    db = storage
    _job(db, days_ahead=1)(NOW)
    far = NOW + timedelta(days=4)  # past the days created ahead: ingest must still succeed
    _store(db, [far])
    assert _where(db) == {partitions.DEFAULT_PARTITION: 2}
    done = _job(db, days_ahead=1)(NOW + timedelta(days=4))
    assert done is not None and done.moved == 2
    assert _where(db) == {"gpu_sample_blocks_p20260619": 2}


def test_a_missing_default_partition_is_put_back(storage: Database) -> None:
    if storage.is_sqlite:
        pytest.skip("PostgreSQL partitions")
    db = storage
    with db.write() as conn:
        conn.execute(text(f"DROP TABLE {partitions.DEFAULT_PARTITION}"))
    _job(db)(NOW)
    with db.read() as conn:
        assert partitions.list_partitions(conn).has_default


def test_rollups_age_out_after_their_own_retention(storage: Database) -> None:
    db = storage
    rollup_cutoff = NOW - timedelta(days=730)
    hours = [rollup_cutoff - timedelta(hours=2), rollup_cutoff - US, rollup_cutoff, NOW]
    with db.write() as conn:
        conn.execute(
            insert(gpu_hourly),
            [
                {"gpu_uuid": "GPU-x", "hour": h, "node_id": 1, "samples": 1, "span_s": 0.0,
                 "throttle_reported": 0, "throttled": 0, "xid_hardware": 0, "xid_memory": 0,
                 "xid_interconnect": 0, "xid_power_thermal": 0, "xid_driver_firmware": 0}
                for h in hours
            ],
        )  # fmt: skip
    done = _job(db, chunk_rows=1)(NOW)
    assert done is not None and done.hourly_deleted == 2
    with db.read() as conn:
        left = conn.execute(select(gpu_hourly.c.hour).order_by(gpu_hourly.c.hour)).scalars()
        assert list(left) == [rollup_cutoff, NOW]


def test_batch_ids_are_forgotten_only_past_their_retention(storage: Database) -> None:
    db = storage
    kept = timedelta(days=31)
    _store(db, [NOW - kept - US, NOW - kept, NOW])  # received when sampled
    done = _job(db, batch_id_retention=kept)(NOW)
    assert done is not None and done.batch_ids_deleted == 1
    with db.read() as conn:
        received = conn.execute(select(ingest_batches.c.received_at)).scalars()
        assert sorted(received) == [NOW - kept, NOW]


def _size_bytes(db: Database) -> int:
    """Disk taken by the samples: every partition with its indexes, or the SQLite file."""
    with db.read() as conn:
        if db.is_sqlite:
            pages = conn.exec_driver_sql("PRAGMA page_count").scalar_one()
            return int(pages) * int(conn.exec_driver_sql("PRAGMA page_size").scalar_one())
        query = (
            "SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('gpu_sample_blocks') "
            "WHERE isleaf"
        )
        return int(conn.execute(text(query)).scalar_one())


def test_disk_stays_flat_once_retention_is_reached(storage: Database) -> None:
    """Retention 2 days, 6 simulated days of 8 GPUs every 10 minutes, a pass every 6 hours:
    from the third day on, the rows and the bytes on disk stop growing."""
    db = storage
    start = datetime(2026, 3, 1, tzinfo=UTC)
    job = _job(db, raw=timedelta(days=2), batch_id_retention=timedelta(days=2))
    per_day: list[tuple[int, int]] = []
    for day in range(6):
        for quarter in range(4):
            t0 = start + timedelta(days=day, hours=6 * quarter)
            _store(db, [t0 + timedelta(minutes=10 * i) for i in range(36)], gpus=8)
            job(t0 + timedelta(hours=6))
        per_day.append((_rows(db), _size_bytes(db)))
    rows = [r for r, _ in per_day]
    sizes = [s for _, s in per_day]
    day_rows = 8 * 144
    assert rows[:2] == [day_rows, 2 * day_rows]
    assert rows[2:] == [2 * day_rows] * 4  # never more than the retention holds
    assert sizes[1] < sizes[2] * 1.05
    assert max(sizes[2:]) <= sizes[2] * 1.05, sizes  # flat: freed space is reused


def test_retention_pass_is_on_metrics(client: TestClient, tokens: dict[str, str]) -> None:
    app: Any = client.app
    db: Database = app.state.db
    if not db.is_sqlite:
        with db.write() as conn:
            for day in partitions.list_partitions(conn).days:
                partitions.drop_day(conn, day)
    _store(db, [NOW - timedelta(days=20), NOW])
    _job(db, metrics=app.state.metrics)(NOW)
    page = client.get("/metrics", headers=bearer(tokens["read"]))
    assert page.status_code == 200
    samples = {
        (s.name, s.labels.get("table")): s.value
        for family in text_string_to_metric_families(page.text)
        for s in family.samples
        if "retention" in s.name or "partition" in s.name
    }
    assert samples[("fleetwatch_retention_rows_deleted_total", "gpu_sample_blocks")] == 2
    assert samples[("fleetwatch_retention_rows_deleted_total", "gpu_hourly")] == 0
    assert samples[("fleetwatch_retention_last_run_timestamp_seconds", None)] == NOW.timestamp()
    assert samples[("fleetwatch_retention_cutoff_timestamp_seconds", "gpu_sample_blocks")] == (
        (NOW - RAW).timestamp()
    )
    assert ("fleetwatch_retention_pass_duration_seconds", None) in samples
    if not db.is_sqlite:
        assert (
            samples[("fleetwatch_partitions", "gpu_sample_blocks")] == 1 + 4 + 0
        )  # DEFAULT, 4 days
        assert samples[("fleetwatch_partitions_created_total", "gpu_sample_blocks")] == 4
        assert samples[("fleetwatch_partition_default_rows", "gpu_sample_blocks")] == 0


def test_retention_settings_defaults_environment_and_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    defaults = ServerSettings(_env_file=None)  # type: ignore[call-arg]
    assert (defaults.raw_retention_days, defaults.rollup_retention_days) == (14.0, 730.0)
    monkeypatch.setenv("FLEETWATCH_SERVER_RAW_RETENTION_DAYS", "9")
    assert load_server_settings().raw_retention_days == 9.0
    with pytest.raises(ConfigError, match="at least 8: the hourly rollups"):
        load_server_settings(raw_retention_days=7.5)
    with pytest.raises(ConfigError, match=r"rollup_retention_days \(5\) must be at least"):
        load_server_settings(rollup_retention_days=5)
    job = RetentionJob.from_settings(Database(make_engine(defaults)), defaults)
    assert job.raw_retention == timedelta(days=14)
    assert job.batch_id_retention == timedelta(days=31, seconds=300)  # max_past_age + skew + 1 d


def test_the_leader_runs_the_retention_pass(settings: ServerSettings) -> None:
    from prometheus_client import CollectorRegistry

    from fleetwatch.server.background import BackgroundJobs
    from fleetwatch.server.db.secret_box import SecretBox
    from fleetwatch.server.runtime.metric_families import ServerMetrics

    db = Database(make_engine(settings))
    jobs = BackgroundJobs(
        db,
        settings,
        metrics=ServerMetrics(CollectorRegistry()),
        secrets=SecretBox([]),
        heard_since=NOW,
    )
    by_name = {job.name: job for job in jobs.leader_jobs()}
    assert by_name["retention"].interval_s == settings.retention_interval_s
    assert isinstance(by_name["retention"].run, RetentionJob)
    db.dispose()
