"""A full disk under the database: 507 with the reason, /readyz not ready, counted, recovered.

The disk is made full for real inside each database: SQLite's ``PRAGMA max_page_count`` makes the
file unable to grow (SQLITE_FULL, the same error as a full filesystem); on PostgreSQL a trigger
raises SQLSTATE 53100 ``disk_full``, the error PostgreSQL itself raises when it cannot extend a
file. The fault test with a real full tmpfs is tests/faults/test_server_full_disk.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, text
from tests.conftest import bearer
from tests.factories import make_batch
from tests.unit.server.conftest import Push, row_counts

from fleetwatch.config import ServerSettings
from fleetwatch.errors import StorageFull
from fleetwatch.server.app import create_app
from fleetwatch.server.db.session import Database, make_engine
from fleetwatch.server.db.storage import StorageHealth, disk_full_reason

_PG_FULL = """
CREATE OR REPLACE FUNCTION fw_test_disk_full() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'could not extend file: No space left on device' USING ERRCODE = 'disk_full';
END $$ LANGUAGE plpgsql
"""


@contextmanager
def full_disk(db: Database) -> Iterator[None]:
    """Every write that stores telemetry fails as on a full disk, until the block exits."""
    if db.is_sqlite:
        with db.read() as conn:
            pages = conn.exec_driver_sql("PRAGMA page_count").scalar_one()

        def cap(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.execute(f"PRAGMA max_page_count = {pages}")

        event.listen(db.engine, "connect", cap)
        db.engine.dispose()  # new connections, each capped
        try:
            yield
        finally:
            event.remove(db.engine, "connect", cap)
            db.engine.dispose()
        return
    with db.write() as conn:
        conn.execute(text(_PG_FULL))
        for table in ("gpu_sample_blocks", "events"):
            conn.execute(
                text(
                    f"CREATE TRIGGER fw_test_full BEFORE INSERT ON {table} "
                    "FOR EACH ROW EXECUTE FUNCTION fw_test_disk_full()"
                )
            )
    try:
        yield
    finally:
        with db.write() as conn:
            for table in ("gpu_sample_blocks", "events"):
                conn.execute(text(f"DROP TRIGGER fw_test_full ON {table}"))


def _metric(client: TestClient, token: str, name: str) -> float | None:
    for line in client.get("/metrics", headers=bearer(token)).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def test_full_disk_answers_507_and_readyz_recovers_with_the_next_write(
    client: TestClient, push: Push, db: Database, tokens: dict[str, str]
) -> None:
    assert push(make_batch("node-a", ticks=2)).status_code == 200
    before = row_counts(db)
    # Enough samples to need new pages: SQLite's cap bites only when the file must grow.
    big = make_batch("node-a", gpus=8, ticks=200)
    with full_disk(db):
        refused = push(big)
        assert refused.status_code == 507
        assert "storage is full" in refused.json()["error"]
        assert row_counts(db) == before  # nothing of the refused batch was stored
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert "storage full" in ready.json()["reason"]
        # Reads go on while the disk is full.
        assert client.get("/v1/nodes", headers=bearer(tokens["read"])).status_code == 200
        assert _metric(client, tokens["read"], "fleetwatch_storage_full_errors_total") == 1.0
        assert _metric(client, tokens["read"], "fleetwatch_storage_full") == 1.0
    assert push(big).status_code == 200  # space again: the same batch is taken
    assert client.get("/readyz").status_code == 503  # until no write failed for the hold time
    db.storage.hold_s = 0.0  # the hold runs out
    assert client.get("/readyz").status_code == 200
    assert _metric(client, tokens["read"], "fleetwatch_storage_full") == 0.0
    assert row_counts(db)["gpu_samples"] == before["gpu_samples"] + 8 * 200


def test_storage_full_error_carries_the_driver_reason(database_url: str) -> None:
    db = Database(make_engine(ServerSettings(database_url=database_url)))
    if db.is_sqlite:
        from fleetwatch.server.db.migrate import upgrade

        upgrade(db.engine)
    try:
        with full_disk(db), pytest.raises(StorageFull) as raised, db.write() as conn:
            conn.execute(
                text(
                    "INSERT INTO events (node_id, kind, ts, received_at, message) "
                    "VALUES (NULL, 'x', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, :m)"
                ),
                [{"m": "x" * 4000}] * 200,
            )
    finally:
        db.dispose()
    expected = "database or disk is full" if db.is_sqlite else "SQLSTATE 53100"
    assert expected in raised.value.reason
    assert db.storage.full_errors == 1


def test_other_database_errors_are_not_taken_for_a_full_disk(db: Database) -> None:
    with pytest.raises(Exception) as raised, db.write() as conn:
        conn.execute(text("SELECT * FROM no_such_table"))
    assert not isinstance(raised.value, StorageFull)
    assert db.storage.full_errors == 0 and db.storage.problem() is None


def test_readyz_reports_too_little_free_space_on_the_sqlite_filesystem(tmp_path: Path) -> None:
    # More than any disk has free: the threshold check must say not ready, with the numbers.
    settings = ServerSettings(  # type: ignore[call-arg]
        database_url=f"sqlite:///{tmp_path / 'fw.db'}",
        background_jobs=False,
        storage_min_free_bytes=2**62,
        _env_file=None,
    )
    with TestClient(create_app(settings)) as client:
        ready = client.get("/readyz")
    assert ready.status_code == 503
    assert "below storage_min_free_bytes" in ready.json()["reason"]


def test_storage_health_forgets_a_failure_after_the_hold_time() -> None:
    now = [100.0]
    health = StorageHealth(None, hold_s=60.0, clock=lambda: now[0])
    health.failed("SQLite: database or disk is full")
    now[0] += 59.0
    assert "database or disk is full" in (health.problem() or "")
    now[0] += 2.0
    assert health.problem() is None
    health.failed("again")
    assert health.problem() is not None and health.full_errors == 2


def test_a_sqlite_io_error_counts_as_full_only_when_the_filesystem_is(tmp_path: Path) -> None:
    import sqlite3
    import subprocess

    io_error = sqlite3.OperationalError("disk I/O error")
    assert disk_full_reason(io_error, tmp_path) is None  # plenty of space: a real I/O fault
    mount = tmp_path / "tiny"
    mount.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        with (mount / "filler").open("wb") as out:
            try:
                out.write(b"\0" * 1024 * 1024)
            except OSError:  # ENOSPC: the point
                pass
        reason = disk_full_reason(io_error, mount)
        assert reason is not None and "disk I/O error" in reason
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
